"""AdamATan2 (Everett et al., 2024, "Scaling Exponents Across Parameterizations and Optimizers").

Adam with the ``m / (sqrt(v) + eps)`` ratio replaced by ``atan2`` (no epsilon; bounded, scale-invariant update).
Per parameter tensor, with step count t (1-based):

    p  <- p * (1 - lr * weight_decay)                                  (decoupled weight decay, applied first)
    m  <- beta1 * m + (1 - beta1) * g
    v  <- beta2 * v + (1 - beta2) * g^2
    p  <- p - lr * a / (1 - beta1^t) * atan2(m, b * sqrt(v / (1 - beta2^t)))

with ``a = b = 1`` (the paper's tuned variant uses a = 1.27). This is the update of the ``adam-atan2`` package
used by HRM/TRM (its CUDA kernel, csrc/adam_atan2.cu: the first bias correction scales the step, outside the
atan2), so all three implementations below compute the published numbers. (Bias-correcting m *inside* the atan2,
``atan2(m / (1 - beta1^t), ...)``, is a different number while ``1 - beta1^t`` is far from 1: up to 27% larger
steps in the first tens of steps.) Defaults as that package: lr 1e-3, betas (0.9, 0.999), weight_decay 1e-2.

Implementations (``impl``; ``AdamATan2.implementation`` names the one in use, the training start line prints it):

* ``"fused"``: the CUDA kernel of the ``adam-atan2`` package (``adam_atan2_backend``). Built only by
  ``pip install --no-build-isolation adam-atan2`` with a CUDA torch and nvcc present (``scripts/setup_env.sh
  --cuda``); CUDA parameters and ``a == b == 1`` only. Its update is the package's formula above.
* ``"triton"``: ``training.optim_triton``, one fused Triton kernel per parameter tensor, the same math as
  ``"torch"`` (fp32 tolerance). CUDA parameters (or CPU tensors under ``TRITON_INTERPRET=1``, for tests);
  fp32 / fp16 / bf16 (fp64 or non-contiguous tensors of a group take the torch math).
* ``"torch"``: ``torch._foreach_*`` ops, any device and dtype.
* ``"auto"`` (default): ``fused`` when the backend imports, every parameter is on CUDA and ``a == b == 1``;
  else ``triton`` when triton imports and every parameter is on CUDA; else ``torch``. Decided per parameter
  group at every step from where the parameters are. An explicit choice that cannot run raises.

``lr`` may be a float or a 0-dim tensor, and the training loop may change ``param_groups[i]["lr"]`` before every
step.
"""

from __future__ import annotations

import math
import warnings
from types import ModuleType
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor

try:  # the fused kernel (optional; see docs/getting_started.md for the command that really builds it)
    import adam_atan2_backend as _fused_backend  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - any failure (missing package, ABI mismatch) means: not available
    _fused_backend = None

IMPLEMENTATIONS = ("fused", "triton", "torch")
FUSED_INSTALL_HINT = (
    "install a CUDA build of torch and nvcc, then `pip install --no-build-isolation adam-atan2` "
    "(or `bash scripts/setup_env.sh --cuda`)"
)
_triton_mod: Optional[ModuleType] = None
_triton_error: Optional[str] = None


def fused_available() -> bool:
    """True when the fused CUDA kernel of the ``adam-atan2`` package can be used."""
    return _fused_backend is not None and torch.cuda.is_available()


def triton_module() -> Optional[ModuleType]:
    """``training.optim_triton`` (imports triton on first use), or None when triton cannot be imported."""
    global _triton_mod, _triton_error
    if _triton_mod is None and _triton_error is None:
        try:
            from training import optim_triton

            _triton_mod = optim_triton
        except Exception as e:  # noqa: BLE001 - missing package, broken install: not available
            _triton_error = f"{type(e).__name__}: {e}"
    return _triton_mod


def triton_available() -> bool:
    """True when the Triton kernel can run here: triton imports, and CUDA is available (or the kernel is in
    interpreter mode, ``TRITON_INTERPRET=1`` at import, which runs it on CPU tensors)."""
    mod = triton_module()
    return mod is not None and (mod.INTERPRETED or torch.cuda.is_available())


def available_implementations() -> List[str]:
    """The AdamATan2 implementations that can run on this machine, preferred first (``torch`` always)."""
    return [name for name, ok in (("fused", fused_available()), ("triton", triton_available()), ("torch", True)) if ok]


class AdamATan2(torch.optim.Optimizer):
    """Adam-atan2 with decoupled weight decay. ``impl``: ``auto`` | ``fused`` | ``triton`` | ``torch`` (module
    docstring); an explicit one that cannot run on the parameters raises ``RuntimeError``."""

    def __init__(
        self,
        params: Iterable,
        lr: Union[float, Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 1e-2,
        a: float = 1.0,
        b: float = 1.0,
        impl: str = "auto",
    ) -> None:
        if not float(lr) >= 0.0:
            raise ValueError(f"AdamATan2: invalid learning rate {lr}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"AdamATan2: invalid betas[{i}] = {beta} (must be in [0, 1))")
        if not weight_decay >= 0.0:
            raise ValueError(f"AdamATan2: invalid weight_decay {weight_decay}")
        if a <= 0 or b <= 0:
            raise ValueError(f"AdamATan2: a and b must be > 0, got a={a}, b={b}")
        if impl not in ("auto",) + IMPLEMENTATIONS:
            raise ValueError(f"AdamATan2: unknown impl {impl!r} (auto, {', '.join(IMPLEMENTATIONS)})")
        if impl == "fused" and _fused_backend is None:
            raise RuntimeError(
                f"AdamATan2(impl='fused'): the adam-atan2 CUDA backend is not importable; {FUSED_INSTALL_HINT}"
            )
        if impl == "triton" and triton_module() is None:
            raise RuntimeError(
                f"AdamATan2(impl='triton'): triton is not importable ({_triton_error}); pip install triton"
            )
        self.impl = impl
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, a=a, b=b))

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])

    def _check_group(self, group: Dict[str, Any]) -> None:
        """An explicit ``fused`` / ``triton`` that cannot run on this group's parameters: a clear error now."""
        params = group["params"]
        if self.impl == "fused":
            if not torch.cuda.is_available() or not all(p.is_cuda for p in params):
                raise RuntimeError("AdamATan2(impl='fused'): the fused kernel needs every parameter on CUDA")
            if group["a"] != 1.0 or group["b"] != 1.0:
                raise RuntimeError(
                    f"AdamATan2(impl='fused'): the fused kernel has a == b == 1 only "
                    f"(got a={group['a']}, b={group['b']}); use impl='triton' or 'torch'"
                )
        elif self.impl == "triton":
            mod = triton_module()
            if not (mod.INTERPRETED or (torch.cuda.is_available() and all(p.is_cuda for p in params))):
                raise RuntimeError(
                    "AdamATan2(impl='triton'): the Triton kernel needs every parameter on CUDA "
                    "(or TRITON_INTERPRET=1, which interprets it on CPU tensors)"
                )
            bad = sorted({str(p.dtype) for p in params if p.dtype not in mod.SUPPORTED_DTYPES})
            if bad:
                raise RuntimeError(
                    f"AdamATan2(impl='triton'): the Triton kernel handles float32 / float16 / "
                    f"bfloat16 parameters, not {', '.join(bad)}; use impl='torch'"
                )

    def _resolve(self, group: Dict[str, Any], params: List[Tensor]) -> str:
        if self.impl != "auto":
            return self.impl
        on_cuda = bool(params) and all(p.is_cuda for p in params)
        if on_cuda and _fused_backend is not None and group["a"] == 1.0 and group["b"] == 1.0:
            return "fused"
        if on_cuda and triton_module() is not None:
            return "triton"
        return "torch"

    @property
    def implementation(self) -> str:
        """The implementation the next step uses (``fused`` / ``triton`` / ``torch``; ``a+b`` when parameter groups
        differ, e.g. ``fused+triton`` when one group has a != 1)."""
        names = sorted(
            {self._resolve(g, list(g["params"])) for g in self.param_groups if g["params"]}, key=IMPLEMENTATIONS.index
        )
        return "+".join(names) if names else self._resolve({"a": 1.0, "b": 1.0}, [])

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamATan2 does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if not params:
                continue
            lr = group["lr"]
            lr = float(lr) if isinstance(lr, Tensor) else lr
            beta1, beta2 = group["betas"]
            impl = self._resolve(group, params)
            if impl == self.impl:  # an explicit choice: parameters may have moved since the group was added
                self._check_group(group)
            if impl == "fused":
                self._fused_step(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, group["weight_decay"])
                continue
            # torch / triton: the step counters live on the CPU (host bias corrections, no device sync)
            for i, p in enumerate(params):
                if steps[i].device.type != "cpu":
                    self.state[p]["step"] = steps[i] = steps[i].cpu()
            hyper = dict(
                lr=lr, beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], a=group["a"], b=group["b"]
            )
            if impl == "triton":
                self._triton_step(params, grads, exp_avgs, exp_avg_sqs, steps, **hyper)
            else:
                _adam_atan2_foreach(params, grads, exp_avgs, exp_avg_sqs, steps, **hyper)
        return loss

    def _triton_step(self, params, grads, exp_avgs, exp_avg_sqs, steps, **hyper) -> None:
        mod = triton_module()
        kernel = [mod.kernel_applies(*x) for x in zip(params, grads, exp_avgs, exp_avg_sqs)]
        rest = [i for i, k in enumerate(kernel) if not k]  # non-contiguous / fp64: the torch math
        if rest:
            _adam_atan2_foreach(
                [params[i] for i in rest],
                [grads[i] for i in rest],
                [exp_avgs[i] for i in rest],
                [exp_avg_sqs[i] for i in rest],
                [steps[i] for i in rest],
                **hyper,
            )
        idx = [i for i, k in enumerate(kernel) if k]
        for i in idx:
            steps[i].add_(1)
        mod.adam_atan2_triton(
            [params[i] for i in idx],
            [grads[i] for i in idx],
            [exp_avgs[i] for i in idx],
            [exp_avg_sqs[i] for i in idx],
            [float(steps[i]) for i in idx],
            **hyper,
        )

    def _fused_step(self, params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, weight_decay) -> None:
        # The kernel reads the step counter from device memory: keep it there.
        steps = []
        for p in params:
            state = self.state[p]
            if state["step"].device != p.device:
                state["step"] = state["step"].to(p.device)
            steps.append(state["step"])
        grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype(
            [params, grads, exp_avgs, exp_avg_sqs, steps]
        )
        for (_device, _dtype), ((d_params, d_grads, d_m, d_v, d_steps), _) in grouped.items():
            torch._foreach_add_(d_steps, 1)
            _fused_backend.adam_atan2_cuda_impl_(d_params, d_grads, d_m, d_v, d_steps, lr, beta1, beta2, weight_decay)


def _adam_atan2_foreach(
    params: List[Tensor],
    grads: List[Tensor],
    exp_avgs: List[Tensor],
    exp_avg_sqs: List[Tensor],
    steps: List[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    a: float,
    b: float,
) -> None:
    """The PyTorch implementation (grouped by device/dtype, foreach kernels). ``steps`` are CPU 0-dim tensors,
    so the bias corrections are host scalars (no device sync)."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[int]] = {}
    for i, p in enumerate(params):
        steps[i].add_(1)
        groups.setdefault((p.device, p.dtype), []).append(i)
    for idx in groups.values():
        d_params = [params[i] for i in idx]
        d_grads = [grads[i] for i in idx]
        d_m = [exp_avgs[i] for i in idx]
        d_v = [exp_avg_sqs[i] for i in idx]
        t = [float(steps[i]) for i in idx]  # may differ when a parameter had no grad at some step
        if weight_decay != 0.0:
            torch._foreach_mul_(d_params, 1.0 - lr * weight_decay)
        torch._foreach_lerp_(d_m, d_grads, 1.0 - beta1)
        torch._foreach_mul_(d_v, beta2)
        torch._foreach_addcmul_(d_v, d_grads, d_grads, value=1.0 - beta2)
        den = torch._foreach_sqrt(d_v)
        torch._foreach_div_(den, [math.sqrt(1.0 - beta2**ti) / b for ti in t])
        upd = [m_t.atan2(d_t) for m_t, d_t in zip(d_m, den)]
        torch._foreach_mul_(upd, [-lr * a / (1.0 - beta1**ti) for ti in t])  # the package's step size lr / bc1
        torch._foreach_add_(d_params, upd)


def describe_optimizers(optimizers: Iterable[torch.optim.Optimizer]) -> str:
    """``optimizer AdamATan2 (triton) + SignSGDSparse`` for the run's start line: each optimizer, with its
    implementation when it has several (AdamATan2: fused / triton / torch)."""
    names = []
    for opt in optimizers:
        impl = getattr(opt, "implementation", None)
        names.append(type(opt).__name__ + (f" ({impl})" if impl else ""))
    return "optimizer " + " + ".join(names) if names else "no optimizer"


def global_grad_norm(params: Iterable[torch.nn.Parameter], device: Any = None) -> Tensor:
    """L2 norm of every gradient of ``params`` together (0 when none has a gradient)."""
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def apply_update(
    optimizers: Dict[str, torch.optim.Optimizer],
    trainable: List[torch.nn.Parameter],
    frozen_params: List[torch.nn.Parameter],
    *,
    frozen: bool,
    total_norm: Tensor,
    grad_clip: Optional[float],
    schedulers: Dict[str, Any],
) -> None:
    """One optimizer update on gradients already reduced over ranks. ``frozen``: the decoder is frozen this step
    -- ``frozen_params`` lose their gradients (per parameter, whatever the optimizer count: pitfall 3) and the
    ``puzzle_emb`` optimizer (part of the decoder) does not step. ``grad_clip``: the global norm (``total_norm``,
    or the norm of what is left when frozen) is clipped to it. Every optimizer's lr scheduler then advances (a
    skipped optimizer's too, so that it resumes at the schedule's current lr).
    Gradients are cleared afterwards."""
    if frozen:
        for t in frozen_params:
            t.grad = None
    if grad_clip:
        clip_params = [t for t in trainable if t.grad is not None]
        norm = global_grad_norm(clip_params, total_norm.device) if frozen else total_norm
        coef = torch.clamp(grad_clip / (norm + 1e-6), max=1.0)
        for t in clip_params:
            t.grad.mul_(coef.to(t.grad.dtype))
    for name, opt in optimizers.items():
        if name == "puzzle_emb" and frozen:
            for g in opt.param_groups:
                for t in g["params"]:
                    t.grad = None
            with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": deliberate here
                warnings.simplefilter("ignore", UserWarning)
                schedulers[name].step()
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
        schedulers[name].step()
    for t in trainable:
        t.grad = None

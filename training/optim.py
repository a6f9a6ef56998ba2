"""AdamATan2 (Everett et al., 2024, "Scaling Exponents Across Parameterizations and Optimizers").

Adam with the ``m / (sqrt(v) + eps)`` ratio replaced by ``atan2`` (no epsilon; bounded, scale-invariant update).
Per parameter tensor, with step count t (1-based), as in the ``adam-atan2`` package used by HRM/TRM:

    p  <- p * (1 - lr * weight_decay)                                  (decoupled weight decay, applied first)
    m  <- beta1 * m + (1 - beta1) * g
    v  <- beta2 * v + (1 - beta2) * g^2
    p  <- p - lr * a * atan2(m / (1 - beta1^t), b * sqrt(v / (1 - beta2^t)))

with ``a = b = 1`` (the package's formula; the paper's tuned variant uses a = 1.27). Defaults as the package:
lr 1e-3, betas (0.9, 0.999), weight_decay 1e-2.

Implementation: the fused CUDA kernel of the ``adam_atan2`` package when it imports, every parameter is on
CUDA and ``a == b == 1`` (``fused=None``, the default), otherwise a pure-PyTorch ``torch._foreach_*``
implementation of the same update (any device). ``lr`` may be a float or a 0-dim tensor, and the training
loop may change ``param_groups[i]["lr"]`` before every step.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor

try:  # the fused kernel (optional; compiling it is opt-in: pip install '.[cuda]')
    import adam_atan2_backend as _fused_backend  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - any failure (missing package, ABI mismatch) means: use the fallback
    _fused_backend = None


def fused_available() -> bool:
    """True when the fused CUDA kernel of the ``adam-atan2`` package can be used."""
    return _fused_backend is not None and torch.cuda.is_available()


class AdamATan2(torch.optim.Optimizer):
    """Adam-atan2 with decoupled weight decay. ``fused``: None = auto, True = require the CUDA kernel
    (error if unavailable), False = always the PyTorch implementation."""

    def __init__(self, params: Iterable, lr: Union[float, Tensor] = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 1e-2, a: float = 1.0, b: float = 1.0, fused: Optional[bool] = None) -> None:
        if not float(lr) >= 0.0:
            raise ValueError(f"AdamATan2: invalid learning rate {lr}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"AdamATan2: invalid betas[{i}] = {beta} (must be in [0, 1))")
        if not weight_decay >= 0.0:
            raise ValueError(f"AdamATan2: invalid weight_decay {weight_decay}")
        if a <= 0 or b <= 0:
            raise ValueError(f"AdamATan2: a and b must be > 0, got a={a}, b={b}")
        if fused and _fused_backend is None:
            raise RuntimeError("AdamATan2(fused=True) needs the 'adam-atan2' package (pip install '.[cuda]')")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, a=a, b=b))
        self.fused = fused

    def _use_fused(self, group, params: List[Tensor]) -> bool:
        if self.fused is False or _fused_backend is None:
            return False
        ok = group["a"] == 1.0 and group["b"] == 1.0 and all(p.is_cuda for p in params)
        if self.fused and not ok:
            raise RuntimeError("AdamATan2(fused=True): the fused kernel needs CUDA parameters and a == b == 1")
        return ok

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
            if self._use_fused(group, params):
                self._fused_step(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, group["weight_decay"])
            else:
                for i, p in enumerate(params):
                    if steps[i].device.type != "cpu":
                        self.state[p]["step"] = steps[i] = steps[i].cpu()
                _adam_atan2_foreach(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, beta1=beta1, beta2=beta2,
                                    weight_decay=group["weight_decay"], a=group["a"], b=group["b"])
        return loss

    def _fused_step(self, params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, weight_decay) -> None:
        # The kernel reads the step counter from device memory: keep it there.
        steps = []
        for p in params:
            state = self.state[p]
            if state["step"].device != p.device:
                state["step"] = state["step"].to(p.device)
            steps.append(state["step"])
        grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype([params, grads, exp_avgs, exp_avg_sqs, steps])
        for (_device, _dtype), ((d_params, d_grads, d_m, d_v, d_steps), _) in grouped.items():
            torch._foreach_add_(d_steps, 1)
            _fused_backend.adam_atan2_cuda_impl_(d_params, d_grads, d_m, d_v, d_steps, lr, beta1, beta2, weight_decay)


def _adam_atan2_foreach(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                        steps: List[Tensor], *, lr: float, beta1: float, beta2: float, weight_decay: float,
                        a: float, b: float) -> None:
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
        num = torch._foreach_div(d_m, [1.0 - beta1 ** ti for ti in t])
        den = torch._foreach_sqrt(d_v)
        torch._foreach_div_(den, [math.sqrt(1.0 - beta2 ** ti) / b for ti in t])
        for n_t, d_t in zip(num, den):
            n_t.atan2_(d_t)
        torch._foreach_add_(d_params, num, alpha=-lr * a)


def global_grad_norm(params: Iterable[torch.nn.Parameter], device: Any = None) -> Tensor:
    """L2 norm of every gradient of ``params`` together (0 when none has a gradient)."""
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def apply_update(optimizers: Dict[str, torch.optim.Optimizer], trainable: List[torch.nn.Parameter],
                 frozen_params: List[torch.nn.Parameter], *, frozen: bool, total_norm: Tensor,
                 grad_clip: Optional[float], schedulers: Dict[str, Any]) -> None:
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

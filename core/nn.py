"""Neural-network primitives shared by the model core (models/) and the demo encoders (encoders/), defined once:
the truncated-normal initialiser, the weight-free RMSNorm and the SwiGLU MLP.

The two callers keep their own conventions, which checkpoints depend on (parameter names and shapes) and which the
reported runs were trained with (initialisation, hidden width); each is a constructor argument here, never a
second implementation:

============  ==============================================  =================================================
              models/ (the TRM core, published layout)        encoders/
============  ==============================================  =================================================
init          std of the *truncated* distribution = std        torch's ``trunc_normal_`` (std of the underlying
              (``std_of="truncated"``, as JAX / Flax)          normal, ``std_of="normal"``); SwiGLU weights:
                                                               ``torch.nn.Linear``'s default (``init="torch"``)
SwiGLU width  ``round(e * d * 2/3)`` rounded *up* to a         ``e * d * 2/3`` rounded to the *nearest* multiple
              multiple of 256 (``multiple=256, rounding="up"``) of 64, at least 64 (``multiple=64,
                                                               rounding="nearest"``)
SwiGLU names  ``gate_up_proj`` / ``down_proj``                 ``gate_up`` / ``down``
============  ==============================================  =================================================
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from core.ops import linear_chunks


def trunc_normal_init_(
    tensor: torch.Tensor,
    std: float = 1.0,
    lower: float = -2.0,
    upper: float = 2.0,
    *,
    std_of: Literal["truncated", "normal"] = "truncated",
) -> torch.Tensor:
    """Fill ``tensor`` in place with a normal distribution truncated to ``[lower, upper]`` (in units of the
    underlying normal's std) and return it. ``std_of="truncated"`` (the model core): the distribution is rescaled so
    that the standard deviation *of the truncated distribution* is ``std`` (as JAX / Flax; torch's own
    ``trunc_normal_`` does not correct for the truncation). ``std_of="normal"`` (the encoders): the underlying
    normal has std ``std``, exactly ``torch.nn.init.trunc_normal_(tensor, std=std, a=lower*std, b=upper*std)``.
    ``std == 0`` gives zeros."""
    if std_of not in ("truncated", "normal"):
        raise ValueError(f"std_of must be 'truncated' or 'normal', got {std_of!r}")
    with torch.no_grad():
        if std == 0:
            return tensor.zero_()
        if std_of == "normal":
            return nn.init.trunc_normal_(tensor, std=std, a=lower * std, b=upper * std)
        # Variance of a standard normal truncated to [lower, upper].
        phi = lambda x: math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)  # noqa: E731
        cdf = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2)))  # noqa: E731
        mass = cdf(upper) - cdf(lower)
        mean_t = (phi(lower) - phi(upper)) / mass
        var_t = 1.0 + (lower * phi(lower) - upper * phi(upper)) / mass - mean_t**2
        scale = std / math.sqrt(var_t)
        # Inverse-CDF sampling: u ~ U(erf(lower/sqrt2), erf(upper/sqrt2)) -> sqrt2 * erfinv(u).
        tensor.uniform_(math.erf(lower / math.sqrt(2)), math.erf(upper / math.sqrt(2)))
        tensor.erfinv_()
        tensor.mul_(math.sqrt(2) * scale)
        tensor.clamp_(lower * scale, upper * scale)
    return tensor


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weight-free RMSNorm over the last dimension, computed in fp32, returned in the input dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)).to(dtype)


def swiglu_width(dim: int, expansion: float, multiple: int = 256, rounding: Literal["up", "nearest"] = "up") -> int:
    """Hidden width of :class:`SwiGLU` for input width ``dim``: ``expansion * dim * 2/3`` made a multiple of
    ``multiple``. ``rounding="up"`` (the model core): rounded to an integer, then up to the next multiple.
    ``rounding="nearest"`` (the encoders): to the nearest multiple, at least one ``multiple``."""
    if rounding == "up":
        return -(-round(expansion * dim * 2 / 3) // multiple) * multiple
    if rounding == "nearest":
        return round(expansion * dim * 2 / 3 / multiple) * multiple or multiple
    raise ValueError(f"rounding must be 'up' or 'nearest', got {rounding!r}")


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, bias-free, with gate and up one fused projection ``[2 * width, dim]`` (on
    CPU applied as one matmul per half, ``core.ops.linear_chunks``). Weights are fp32 and cast to the input's dtype
    at use (bf16 compute keeps fp32 master weights).

    ``width = swiglu_width(dim, expansion, multiple, rounding)``; ``init``: ``"trunc_normal"`` (truncated LeCun
    normal, std 1/sqrt(fan_in), as the TRM core's ``CastedLinear``) or ``"torch"`` (``torch.nn.Linear``'s default:
    kaiming uniform, a = sqrt(5)); ``names``: the two projections' attribute names, i.e. their state_dict keys
    ``<name>.weight``. The defaults are the TRM core's (the published checkpoints' layout); the encoders use
    ``encoders.layers.swiglu`` (the module docstring lists both)."""

    def __init__(
        self,
        dim: int,
        expansion: float,
        *,
        multiple: int = 256,
        rounding: Literal["up", "nearest"] = "up",
        init: Literal["trunc_normal", "torch"] = "trunc_normal",
        names: tuple[str, str] = ("gate_up_proj", "down_proj"),
    ) -> None:
        super().__init__()
        if init not in ("trunc_normal", "torch"):
            raise ValueError(f"init must be 'trunc_normal' or 'torch', got {init!r}")
        self.width = swiglu_width(dim, expansion, multiple, rounding)
        self.names = tuple(names)
        for name, (fan_out, fan_in) in zip(self.names, ((2 * self.width, dim), (dim, self.width))):
            self.add_module(name, _bias_free_linear(fan_in, fan_out, init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, down = (self._modules[n] for n in self.names)
        gate, up = linear_chunks(x, gate_up.weight.to(x.dtype), (self.width, self.width))
        h = F.silu(gate) * up
        return F.linear(h, down.weight.to(h.dtype))


def _bias_free_linear(fan_in: int, fan_out: int, init: str) -> nn.Linear:
    """An ``nn.Linear(fan_in, fan_out, bias=False)`` whose weight is drawn once, by ``init`` (no other draw from
    the random generator, so a model initialises as its published version did)."""
    weight = torch.empty(fan_out, fan_in)
    if init == "torch":
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # what nn.Linear.reset_parameters draws
    else:
        trunc_normal_init_(weight, std=1.0 / math.sqrt(fan_in))
    linear = nn.Linear(fan_in, fan_out, bias=False, device="meta")  # no draw, no memory
    linear.weight = nn.Parameter(weight)
    return linear


__all__ = ["SwiGLU", "rms_norm", "swiglu_width", "trunc_normal_init_"]


# --- compile boundaries -----------------------------------------------------------------------------------------
# torch.compiler.disable imports torch._dynamo (about a second of every process's start-up, and every evaluate.py /
# pretrain*.py the tests and the science command start pays it). So the functions that must run eagerly under
# torch.compile are marked here, and disabled only when something compiles (compile_module).
_BOUNDARIES: list = []  # the one-element slots through which the marked functions are called


def compile_boundary(fn):
    """Decorator: ``fn`` (a function or a method) runs eagerly, outside the graph, under torch.compile, as
    ``torch.compiler.disable`` would, without importing torch._dynamo until something compiles: it is called through a
    one-element slot (``fn.__compile_slot__``) that :func:`apply_compile_boundaries` fills with the disabled function,
    so every module that imported it sees the change."""
    slot = [fn]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return slot[0](*args, **kwargs)

    call.__compile_slot__ = slot
    _BOUNDARIES.append(slot)
    return call


def apply_compile_boundaries() -> int:
    """Fill every slot with ``torch.compiler.disable`` of its function (idempotent). Returns how many are marked."""
    for slot in _BOUNDARIES:
        if not getattr(slot[0], "_torchdynamo_disable", False):
            slot[0] = torch.compiler.disable(slot[0])
    return len(_BOUNDARIES)


def compile_module(module, **kwargs):
    """``torch.compile(module, **kwargs)`` with the compile boundaries applied first."""
    apply_compile_boundaries()
    return torch.compile(module, **kwargs)

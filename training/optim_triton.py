"""Triton implementation of the AdamATan2 update (``training.optim``): one fused elementwise kernel per
parameter tensor, reading parameter, gradient and both moments once and writing parameter and moments once
(the ``torch._foreach_*`` path makes ~9 passes over memory plus one ``atan2_`` launch per tensor).

Same math, same order of operations as ``training.optim._adam_atan2_foreach`` (fp32 arithmetic; fp16 / bf16
tensors are computed in fp32 and stored back in their dtype):

    p <- p * (1 - lr * wd);   m <- lerp(m, g, 1 - beta1);   v <- v * beta2 + (1 - beta2) * g * g
    p <- p - lr * a / bc1 * atan2(m, sqrt(v) / (sqrt(bc2) / b))      bc1 = 1 - beta1^t, bc2 = 1 - beta2^t

``atan2`` is written here with Triton primitives (octant reduction + a degree-4 odd minimax polynomial for atan on
[-tan(pi/8), tan(pi/8)], relative error < 1e-9 in exact arithmetic, so a few fp32 ulps in practice) instead of
libdevice's: Triton's interpreter (``TRITON_INTERPRET=1``) cannot run extern (libdevice) calls, and with this
one the very kernel that runs on the GPU is the one tested on CPU tensors against the torch path.

Import this module only when the Triton path is wanted (``training.optim`` does it lazily): it imports triton,
and whether the kernel is compiled (GPU) or interpreted (CPU tensors) is fixed by ``TRITON_INTERPRET`` at import.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Dict, List

import torch
import triton
import triton.language as tl
from torch import Tensor

#: True when the kernel was created in interpreter mode: it then runs on CPU tensors (slowly; for tests).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on", "y")
#: The dtypes the kernel handles (computed in fp32). Other dtypes (fp64) take the torch path.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_SIZE = 1024

# (globals read inside a kernel must be tl.constexpr)
_PI = tl.constexpr(math.pi)
_PI_2 = tl.constexpr(math.pi / 2)
_PI_4 = tl.constexpr(math.pi / 4)
_TAN_PI_8 = tl.constexpr(math.tan(math.pi / 8))
# atan(s) = s + s * z * P(z), z = s^2, |s| <= tan(pi/8); P fitted (weighted least squares, Lawson-iterated
# towards minimax) to the relative error of atan on that interval.
_C0 = tl.constexpr(-0.33333315188570134)
_C1 = tl.constexpr(0.19998471513361943)
_C2 = tl.constexpr(-0.14243533310279466)
_C3 = tl.constexpr(0.10593813503472867)
_C4 = tl.constexpr(-0.06078220887894805)


@triton.jit
def _atan2(y, x):
    """Elementwise fp32 atan2(y, x), torch's conventions (atan2(0, 0) = 0, a NaN input gives NaN)."""
    ax = tl.abs(x)
    ay = tl.abs(y)
    hi = tl.maximum(ax, ay)
    lo = tl.minimum(ax, ay)
    t = tl.div_rn(lo, tl.where(hi == 0.0, 1.0, hi))  # in [0, 1]; 0 / 1 when both are 0 (no 0 / 0)
    big = t > _TAN_PI_8
    s = tl.where(big, tl.div_rn(t - 1.0, t + 1.0), t)  # |s| <= tan(pi/8)
    z = s * s
    poly = _C0 + z * (_C1 + z * (_C2 + z * (_C3 + z * _C4)))
    r = s + s * z * poly  # atan(s)
    r = tl.where(big, r + _PI_4, r)  # atan(t), t in [0, 1]
    r = tl.where(ay > ax, _PI_2 - r, r)  # atan(|y| / |x|) in [0, pi/2]
    r = tl.where(x < 0.0, _PI - r, r)
    r = tl.where(y < 0.0, -r, r)
    r = tl.where(x == x, r, x)  # NaN in, NaN out (max/min may drop a NaN operand)
    return tl.where(y == y, r, y)


@triton.jit
def _downcast(x, dtype: tl.constexpr):
    """fp32 -> the stored dtype, rounded to nearest (ties to even) as torch's casts are. bf16 is rounded here on
    the bits: the GPU's cast is cvt.rn (to nearest), but Triton's interpreter truncates (round toward zero, which
    moved a bf16 parameter an ulp towards 0 at every weight-decay step: 0.3 after 20 steps, measured), so the
    kernel tested on CPU and the GPU's would not round alike."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = bits + (((bits >> 16) & 1) + 0x7FFF)  # carries into the upper half when the lower rounds up
        out = (rounded >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        nan = ((bits >> 16) | 0x40).to(tl.uint16).to(tl.bfloat16, bitcast=True)  # quiet NaN, sign kept
        return tl.where(x == x, out, nan)
    else:
        return x.to(dtype)


@triton.jit
def _adam_atan2_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, n_elements, decay, w1, beta2, w2, den_scale, neg_step, BLOCK: tl.constexpr
):
    """One parameter tensor (contiguous p, g, m, v of ``n_elements``). Scalars: ``decay = 1 - lr * wd``,
    ``w1 = 1 - beta1`` (lerp weight), ``w2 = 1 - beta2``, ``den_scale = sqrt(1 - beta2^t) / b``,
    ``neg_step = -lr * a / (1 - beta1^t)`` (the package's step size)."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    p = p * decay
    # torch.lerp(m, g, w): m + w * (g - m) for w < 0.5, else g - (g - m) * (1 - w)
    diff = g - m
    m = tl.where(w1 < 0.5, m + w1 * diff, g - diff * (1.0 - w1))
    v = v * beta2
    v = v + w2 * g * g
    den = tl.div_rn(tl.sqrt_rn(v), den_scale)
    p = p + neg_step * _atan2(m, den)
    tl.store(p_ptr + offs, _downcast(p, p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + offs, _downcast(m, m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, _downcast(v, v_ptr.dtype.element_ty), mask=mask)


def kernel_applies(p: Tensor, g: Tensor, m: Tensor, v: Tensor) -> bool:
    """Whether the kernel can update this tensor: a supported dtype, all four contiguous with one dtype, and on
    CUDA (or on any device when interpreted)."""
    if p.dtype not in SUPPORTED_DTYPES or not (g.dtype == m.dtype == v.dtype == p.dtype):
        return False
    if not (p.is_contiguous() and g.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
        return False
    return INTERPRETED or p.is_cuda


def adam_atan2_(
    p: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
    *,
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    a: float,
    b: float,
) -> None:
    """In-place AdamATan2 update of one parameter tensor (``step`` = t, already incremented). The caller checks
    :func:`kernel_applies` first."""
    n = p.numel()
    if n == 0:
        return
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    _adam_atan2_kernel[grid](
        p,
        g,
        m,
        v,
        n,
        1.0 - lr * weight_decay,
        1.0 - beta1,
        beta2,
        1.0 - beta2,
        math.sqrt(1.0 - beta2**step) / b,
        -lr * a / (1.0 - beta1**step),
        BLOCK=BLOCK_SIZE,
        enable_fp_fusion=False,
    )


def adam_atan2_triton(
    params: List[Tensor],
    grads: List[Tensor],
    exp_avgs: List[Tensor],
    exp_avg_sqs: List[Tensor],
    steps: List[float],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    a: float,
    b: float,
) -> None:
    """The update of a list of tensors (one kernel launch each), every one of which :func:`kernel_applies` to.
    Triton launches on the current CUDA device: each device's tensors are launched with that device current."""
    by_device: Dict[torch.device, List[int]] = {}
    for i, p in enumerate(params):
        by_device.setdefault(p.device, []).append(i)
    for device, idx in by_device.items():
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            for i in idx:
                adam_atan2_(
                    params[i],
                    grads[i],
                    exp_avgs[i],
                    exp_avg_sqs[i],
                    step=steps[i],
                    lr=lr,
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=weight_decay,
                    a=a,
                    b=b,
                )

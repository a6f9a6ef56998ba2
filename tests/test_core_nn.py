"""core.nn: the one SwiGLU, RMSNorm and truncated-normal initialiser, with the two conventions its callers keep
(models/: the TRM core's published layout; encoders/: their own) -- widths, parameter names, initialisation and
numbers each equal to what the caller computed before the primitives were shared."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.nn import SwiGLU, rms_norm, swiglu_width, trunc_normal_init_
from encoders.layers import swiglu
from models.layers import CastedLinear


@pytest.mark.parametrize("dim,expansion", [(512, 4.0), (64, 4.0), (64, 2.0), (32, 2.0), (96, 2.67), (7, 4.0)])
def test_the_two_swiglu_widths(dim, expansion):
    """models/: round(e * d * 2/3) rounded up to a multiple of 256; encoders/: e * d * 2/3 rounded to the nearest
    multiple of 64, at least 64 (the formulas as each caller wrote them)."""
    core = -(-round(expansion * dim * 2 / 3) // 256) * 256
    enc = int(round(expansion * dim * 2 / 3 / 64)) * 64 or 64
    assert swiglu_width(dim, expansion) == core == SwiGLU(dim, expansion).width
    assert swiglu_width(dim, expansion, 64, "nearest") == enc == swiglu(dim, expansion).width
    assert (swiglu_width(512, 4.0), swiglu_width(512, 4.0, 64, "nearest")) == (1536, 1344)


def test_the_two_swiglu_layouts_parameter_names_and_initialisation():
    """The core's SwiGLU: gate_up_proj / down_proj drawn like CastedLinear (truncated LeCun normal); the encoders':
    gate_up / down drawn like nn.Linear (kaiming uniform). Same seed, same numbers as those layers."""
    torch.manual_seed(0)
    core = SwiGLU(64, 4.0)
    torch.manual_seed(0)
    ref = (CastedLinear(64, 512, bias=False), CastedLinear(256, 64, bias=False))
    assert [(n, tuple(p.shape)) for n, p in core.named_parameters()] == [
        ("gate_up_proj.weight", (512, 64)),
        ("down_proj.weight", (64, 256)),
    ]
    assert torch.equal(core.gate_up_proj.weight, ref[0].weight) and torch.equal(core.down_proj.weight, ref[1].weight)
    torch.manual_seed(0)
    enc = swiglu(64, 4.0)
    torch.manual_seed(0)
    ref = (nn.Linear(64, 384, bias=False), nn.Linear(192, 64, bias=False))
    assert [(n, tuple(p.shape)) for n, p in enc.named_parameters()] == [
        ("gate_up.weight", (384, 64)),
        ("down.weight", (64, 192)),
    ]
    assert torch.equal(enc.gate_up.weight, ref[0].weight) and torch.equal(enc.down.weight, ref[1].weight)
    with pytest.raises(ValueError, match="init"):
        SwiGLU(8, 2.0, init="xavier")


@pytest.mark.parametrize("make", [lambda: SwiGLU(32, 4.0), lambda: swiglu(32, 4.0)], ids=["core", "encoders"])
def test_swiglu_computes_down_of_silu_gate_times_up_and_casts_its_weights(make):
    m = make()
    gate_up, down = (getattr(m, n).weight for n in m.names)
    x = torch.randn(3, 5, 32)
    g, u = F.linear(x, gate_up).chunk(2, -1)
    torch.testing.assert_close(m(x), F.linear(F.silu(g) * u, down), atol=1e-6, rtol=1e-5)
    y = m(x.bfloat16())  # fp32 master weights, bf16 compute
    assert y.dtype == torch.bfloat16 and gate_up.dtype == torch.float32


def test_trunc_normal_init_both_conventions():
    """std_of="truncated" (the core): the truncated distribution has the requested std; std_of="normal" (the
    encoders): torch's trunc_normal_ exactly (the underlying normal has it), cut at +-2 std."""
    t = trunc_normal_init_(torch.empty(200_000), std=0.5)
    assert abs(float(t.std()) - 0.5) < 0.01 and float(t.abs().max()) <= 2 * 0.5 / 0.8796 + 1e-6
    torch.manual_seed(3)
    a = trunc_normal_init_(torch.empty(64, 8), 0.2, std_of="normal")
    torch.manual_seed(3)
    b = nn.init.trunc_normal_(torch.empty(64, 8), std=0.2, a=-0.4, b=0.4)
    assert torch.equal(a, b)
    assert torch.equal(trunc_normal_init_(torch.ones(4), std=0.0, std_of="normal"), torch.zeros(4))
    with pytest.raises(ValueError, match="std_of"):
        trunc_normal_init_(torch.empty(2), 1.0, std_of="uniform")


def test_rms_norm_is_weight_free_in_fp32_and_keeps_the_dtype():
    x = torch.randn(4, 16).bfloat16()
    y = rms_norm(x, 1e-5)
    ref = x.float() / torch.sqrt(x.float().square().mean(-1, keepdim=True) + 1e-5)
    assert y.dtype == torch.bfloat16 and torch.equal(y, ref.bfloat16())
    assert math.isclose(float(rms_norm(torch.randn(2, 64), 0.0).square().mean()), 1.0, rel_tol=1e-5)

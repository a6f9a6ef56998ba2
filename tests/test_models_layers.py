"""Blocks: init statistics, casting, RoPE properties, attention numerics, SwiGLU width, norms, mlp_t."""

import math

import pytest
import torch
import torch.nn.functional as F

from models.layers import (
    Attention,
    CastedEmbedding,
    CastedLinear,
    RotaryEmbedding,
    SwiGLU,
    TransformerBlock,
    apply_rotary_pos_emb,
    resolve_dtype,
    rms_norm,
    rotate_half,
    swiglu_intermediate_size,
    trunc_normal_init_,
)


def test_trunc_normal_has_requested_std_and_bounds():
    torch.manual_seed(0)
    t = trunc_normal_init_(torch.empty(200_000), std=0.5)
    assert abs(t.std().item() - 0.5) < 0.005  # the std *after* truncation (torch's trunc_normal_ gives ~0.44)
    assert abs(t.mean().item()) < 0.005
    scale = 0.5 / math.sqrt(0.7737413)  # std of the underlying normal: var of N(0,1) cut at +-2 is 0.7737
    assert t.abs().max().item() <= 2 * scale + 1e-6
    assert t.abs().max().item() > 1.9 * scale
    assert torch.equal(trunc_normal_init_(torch.ones(5), std=0.0), torch.zeros(5))


def test_casted_linear_init_and_dtype():
    torch.manual_seed(0)
    lin = CastedLinear(256, 512, bias=True)
    assert lin.weight.dtype == torch.float32
    assert abs(lin.weight.std().item() - 1 / 16) < 0.002  # LeCun: 1/sqrt(fan_in)
    assert torch.count_nonzero(lin.bias) == 0
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    y = lin(x)
    assert y.dtype == torch.bfloat16
    ref = F.linear(x.float(), lin.weight.bfloat16().float(), lin.bias).bfloat16()
    assert torch.allclose(y.float(), ref.float(), atol=0.05)


def test_casted_embedding_casts():
    emb = CastedEmbedding(10, 8, init_std=0.1, cast_to=torch.bfloat16)
    out = emb(torch.tensor([[1, 2]]))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2, 8)
    assert torch.equal(out[0, 0], emb.embedding_weight[1].bfloat16())


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    # "auto" follows the device the model runs on, not the machine: fp32 on CPU even where CUDA is available
    assert (
        resolve_dtype("auto", "cuda") is torch.bfloat16
        and resolve_dtype("auto", torch.device("cuda", 1)) is torch.bfloat16
    )
    assert resolve_dtype("auto", "cpu") is torch.float32 and resolve_dtype("auto") is torch.float32
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    with pytest.raises(ValueError, match="forward_dtype"):
        resolve_dtype("fp8")


def test_swiglu_intermediate_size_rounding():
    assert swiglu_intermediate_size(512, 4) == 1536  # round(1365.33) = 1365 -> next multiple of 256
    assert swiglu_intermediate_size(64, 4) == 256
    m = SwiGLU(512, 4)
    assert m.gate_up_proj.weight.shape == (3072, 512) and m.down_proj.weight.shape == (512, 1536)
    x = torch.randn(2, 512)
    gate, up = F.linear(x, m.gate_up_proj.weight).chunk(2, -1)
    assert torch.allclose(m(x), F.linear(F.silu(gate) * up, m.down_proj.weight), atol=1e-5)


def test_rope_preserves_norm_and_depends_only_on_relative_position():
    torch.manual_seed(0)
    rope = RotaryEmbedding(dim=16, max_position_embeddings=32, base=10000.0)
    cos, sin = rope()
    assert cos.shape == (32, 16)
    q = torch.randn(1, 1, 1, 16).expand(1, 32, 1, 16).contiguous()  # same vector at every position
    k = torch.randn(1, 1, 1, 16).expand(1, 32, 1, 16).contiguous()
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    dots = torch.einsum("bihd,bjhd->ij", qr, kr)
    # <R_i q, R_j k> depends only on j - i
    assert torch.allclose(dots[3, 7], dots[10, 14], atol=1e-4)
    assert torch.allclose(dots[0, 5], dots[20, 25], atol=1e-4)
    assert not torch.allclose(dots[0, 5], dots[0, 6], atol=1e-3)
    # position 0 is the identity
    assert torch.allclose(qr[:, 0], q[:, 0], atol=1e-6)


def test_attention_matches_manual_softmax_attention():
    torch.manual_seed(0)
    attn = Attention(hidden_size=16, head_dim=4, num_heads=4, num_key_value_heads=4)
    x = torch.randn(2, 5, 16)
    out = attn(None, x)
    qkv = F.linear(x, attn.qkv_proj.weight).view(2, 5, 12, 4)
    q, k, v = qkv[:, :, :4], qkv[:, :, 4:8], qkv[:, :, 8:]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / 2.0
    probs = scores.softmax(-1)  # non-causal: every position sees every other
    ref = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(2, 5, 16)
    assert torch.allclose(out, F.linear(ref, attn.o_proj.weight), atol=1e-5)


def test_rms_norm_values_and_dtype():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
    y = rms_norm(x, 0.0)
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), torch.tensor([[3.0, 4.0]]) / math.sqrt(12.5), atol=1e-2)


def test_post_norm_block_output_is_normalised():
    torch.manual_seed(0)
    blk = TransformerBlock(16, 4, 4, 1e-5)
    out = blk(None, torch.randn(2, 6, 16) * 10)
    assert torch.allclose(out.pow(2).mean(-1), torch.ones(2, 6), atol=1e-3)  # last op is RMSNorm


def test_mlp_t_mixes_along_sequence_not_attention():
    torch.manual_seed(0)
    blk = TransformerBlock(8, 2, 4, 1e-5, mlp_t=True, total_seq_len=6)
    assert not hasattr(blk, "self_attn")
    assert blk.mlp_t.gate_up_proj.weight.shape[1] == 6  # acts on the sequence axis
    x = torch.randn(1, 6, 8)
    y = blk(None, x)
    x2 = x.clone()
    x2[0, 5] += 1.0  # changing the last position changes the first one's output
    assert not torch.allclose(blk(None, x2)[0, 0], y[0, 0])
    with pytest.raises(ValueError, match="sequence length"):
        TransformerBlock(8, 2, 4, 1e-5, mlp_t=True)


def test_rope_swap_halves_equals_rotate_half_bit_for_bit():
    """apply_rotary_pos_emb moves the sign of rotate_half onto the sin table: the same bits as the textbook form."""
    torch.manual_seed(0)
    cos, sin = RotaryEmbedding(dim=16, max_position_embeddings=10)()
    q, k = torch.randn(3, 10, 4, 16), torch.randn(3, 10, 4, 16)
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    assert torch.equal(qr, q * c + rotate_half(q) * s) and torch.equal(kr, k * c + rotate_half(k) * s)


@pytest.mark.parametrize("kind", ["attention", "gqa", "mlp_t"])
def test_split_projections_match_one_fused_matmul(monkeypatch, kind):
    """The CPU path (one matmul per qkv / gate-up chunk) and the CUDA path (one matmul, then split) give the same
    block output (bit for bit) and the same gradients."""
    from core import ops

    torch.manual_seed(0)
    if kind == "gqa":
        blk = torch.nn.Module()
        blk.attn = Attention(hidden_size=32, head_dim=8, num_heads=4, num_key_value_heads=2)
        fwd = lambda x: blk.attn(RotaryEmbedding(8, 7)(), x)  # noqa: E731
    else:
        blk = TransformerBlock(32, 4, 4, 1e-5, mlp_t=kind == "mlp_t", total_seq_len=7)
        cs = None if kind == "mlp_t" else RotaryEmbedding(8, 7)()
        fwd = lambda x: blk(cs, x)  # noqa: E731
    x0 = torch.randn(3, 7, 32)
    res = []
    for split in (True, False):
        monkeypatch.setattr(ops, "split_projections", lambda x, split=split: split)
        x = x0.clone().requires_grad_()
        y = fwd(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        res.append((y.detach(), x.grad, [p.grad.clone() for p in blk.parameters()]))
        blk.zero_grad(set_to_none=True)
    (ya, gxa, gpa), (yb, gxb, gpb) = res
    assert torch.equal(ya, yb)
    torch.testing.assert_close(gxa, gxb, atol=1e-6, rtol=1e-5)
    for a, b in zip(gpa, gpb):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- grid coordinates
def _reference_coords(canvas, side: int):
    """Offsets of every cell from the edges of the bounding box of the colour cells (tokens >= 2), numpy."""
    import numpy as np

    g = canvas.reshape(side, side) >= 2
    rows, cols = np.nonzero(g.any(1))[0], np.nonzero(g.any(0))[0]
    r0, r1 = (rows.min(), rows.max()) if len(rows) else (0, -1)
    c0, c1 = (cols.min(), cols.max()) if len(cols) else (0, -1)
    r, c = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    out = np.stack([r - r0, r1 - r, c - c0, c1 - c], -1).reshape(side * side, 4)
    return np.clip(out, -side, side) + side


def test_grid_coordinates_are_offsets_from_the_grid_edges_wherever_the_grid_sits():
    import numpy as np

    from core.ops import grid_coordinates
    from dataset.canvas import grid_to_canvas

    rng, side = np.random.default_rng(0), 7
    canvases = []
    for _ in range(40):
        h, w = rng.integers(1, side, size=2)
        grid = rng.integers(0, 10, size=(h, w))
        off = (int(rng.integers(0, side - h + 1)), int(rng.integers(0, side - w + 1)))
        canvases.append(grid_to_canvas(grid, offset=off, size=side))
    canvases.append(np.zeros(side * side, dtype=np.uint8))  # no grid at all: an empty box at the origin
    t = torch.from_numpy(np.stack(canvases)).long()
    got = grid_coordinates(t, side)
    assert got.shape == (41, side * side, 4) and got.dtype == torch.long
    assert np.array_equal(got.numpy(), np.stack([_reference_coords(c, side) for c in canvases]))
    # a 3x2 grid at (1, 2): cell (2, 3) is 1 below the top, 1 above the bottom, 1 right of the left edge, 0 from the
    # right
    one = grid_to_canvas(np.ones((3, 2), dtype=int), offset=(1, 2), size=side)
    assert (grid_coordinates(torch.from_numpy(one)[None].long(), side)[0, 2 * side + 3] - side).tolist() == [1, 1, 1, 0]
    # a cropped tail (the encoders keep a prefix of the canvas) counts as empty canvas
    crop = int(np.nonzero(canvases[0])[0].max()) + 1
    assert torch.equal(grid_coordinates(t[:1, :crop], side), got[:1])
    with pytest.raises(ValueError, match="do not fit"):
        grid_coordinates(torch.zeros(1, side * side + 1, dtype=torch.long), side)

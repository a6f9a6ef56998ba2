"""TRM's research variants (models/variants/): trm_grid (grid offsets) and trm_pointer (pointer RoPE) -- each is TRM
plus its own parameters, trains every parameter (pitfall 1), compiles without graph breaks, and checks its own
config. Configs written before the variants had modules: tests/test_models_legacy.py."""

import numpy as np
import pytest
import torch

from models import ARCH_REGISTRY, ArchConfigError, TRMGrid, TRMPointer, build_loss_head, build_model, parse_arch_config
from models.variants.trm_grid import GridCoordEmbedding
from models.variants.trm_pointer import PointerAttention, PointerRoPE

VOCAB, SIDE, NPUZ = 12, 4, 6
SEQ = SIDE * SIDE  # the variants read grid coordinates: a square canvas
TRM = dict(
    name="trm",
    hidden_size=16,
    num_heads=2,
    H_cycles=2,
    L_cycles=2,
    L_layers=2,
    halt_max_steps=3,
    puzzle_emb_ndim=16,
    puzzle_emb_len=2,
    forward_dtype="float32",
)
VARIANTS = {"trm_grid": {**TRM, "name": "trm_grid"}, "trm_pointer": {**TRM, "name": "trm_pointer"}}


def make(cfg, seq_len=SEQ, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg, vocab_size=VOCAB, seq_len=seq_len, num_puzzle_identifiers=NPUZ, batch_size=4)


def grid_batch(b=4, seed=0):
    """Canvases with a random 3x3 grid (tokens 2..11) at a random corner offset, PAD elsewhere."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.zeros(b, SIDE, SIDE, dtype=torch.int32)
    for i in range(b):
        r, c = torch.randint(0, 2, (2,), generator=g).tolist()
        inputs[i, r : r + 3, c : c + 3] = torch.randint(2, VOCAB, (3, 3), generator=g, dtype=torch.int32)
    return {
        "inputs": inputs.view(b, SEQ),
        "labels": torch.randint(0, VOCAB, (b, SEQ), generator=g).long(),
        "puzzle_identifiers": torch.randint(1, NPUZ, (b,), generator=g, dtype=torch.int32),
    }


# ---------------------------------------------------------------------------------------------- every variant
def test_every_registered_architecture_has_a_tiny_config_here_or_in_test_models_trm():
    from tests.test_models_trm import TINY

    assert set(ARCH_REGISTRY) == set(TINY) | set(VARIANTS) | {
        "trm_memory",
        "trm_pointer_memory",
        "trm_views",
    }  # ETRM-only: tests/test_models_memory.py, tests/test_models_views.py


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_trainable_parameter_of_a_variant_gets_gradient(name):
    """Pitfall 1 for the variants (their own parameters start at zero weights: the pointer projection)."""
    model = make({**VARIANTS[name], "no_ACT_continue": False})
    model.train()
    head = build_loss_head(model)
    batch = grid_batch()
    _, loss, _, _, _ = head(head.initial_carry(batch), batch)
    loss.backward()
    dead = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert dead == []


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_compiles_without_graph_breaks(name):
    """Pitfall 18 for the variants' hooks (pointer positions are a dataclass handed to every layer)."""
    torch._dynamo.reset()
    model = make({**VARIANTS[name], "L_layers": 1})
    model.train()
    head = build_loss_head(model)
    compiled = torch.compile(head, backend="eager", fullgraph=True)
    batch = grid_batch()
    carry = head.initial_carry(batch)
    for _ in range(2):
        carry, loss, _, _, _ = compiled(carry, batch)
        loss.backward()
    assert carry.steps.tolist() == [2] * 4
    torch._dynamo.reset()


def test_a_variant_is_trm_plus_its_own_parameters():
    """trm_grid = TRM + ``inner.embed_grid``; trm_pointer = trm_grid + a pointer projection per attention layer; the
    config of each is TRMConfig's plus the variant's own fields."""
    trm, grid, ptr = make(TRM), make(VARIANTS["trm_grid"]), make(VARIANTS["trm_pointer"])
    assert isinstance(grid, TRMGrid) and isinstance(ptr, TRMPointer) and isinstance(ptr, TRMGrid)
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert set(shapes(grid)) - set(shapes(trm)) == {"inner.embed_grid.embedding_weight"}
    assert shapes(grid)["inner.embed_grid.embedding_weight"] == (4, 2 * SIDE + 1, 16)
    assert set(shapes(ptr)) - set(shapes(grid)) == {
        f"inner.L_level.layers.{i}.self_attn.pointer.{w}" for i in range(2) for w in ("weight", "bias")
    }
    assert all(shapes(trm)[k] == s for k, s in shapes(grid).items() if k in shapes(trm))
    assert set(type(ptr.config).model_fields) - set(type(trm.config).model_fields) == {"pointer_init", "pointer_source"}
    assert set(type(grid.config).model_fields) == set(type(trm.config).model_fields)


def test_grid_variant_averages_each_token_with_its_grid_offsets_and_needs_a_square_canvas():
    model = make(VARIANTS["trm_grid"]).eval()
    inner, batch = model.inner, grid_batch()
    want = 0.707106781 * (inner.embed_tokens(batch["inputs"]) + inner.embed_grid(batch["inputs"]))
    assert torch.equal(inner.token_embeddings(batch["inputs"]), want)
    with pytest.raises(ValueError, match="square canvas"):
        make(VARIANTS["trm_grid"], seq_len=8)


def test_pointer_variant_builds_pointer_rope_and_trains_its_pointers():
    """arch=trm_pointer builds PointerRoPE (source from the config) and a pointer projection in every attention
    layer, starting at the configured maps; the pointer weights get gradient (from their zero start), and changing
    them changes the output. Refused without a square canvas."""
    from core.ops import DIHEDRAL_POINTERS

    model = make({**VARIANTS["trm_pointer"], "pointer_source": "token"})
    assert isinstance(model.inner.rotary_emb, PointerRoPE) and model.inner.rotary_emb.source == "token"
    pointers = [m.pointer for m in model.modules() if isinstance(m, PointerAttention)]
    assert len(pointers) == 2
    start = torch.tensor([DIHEDRAL_POINTERS[h % 8] for h in range(2)], dtype=torch.float32).flatten()
    assert all(torch.equal(p.bias, start) and not p.weight.any() for p in pointers)  # the default: dihedral
    batch = grid_batch()
    _, out = model(model.initial_carry(batch), batch)
    out["logits"].square().sum().backward()
    assert all(p.weight.grad.abs().sum() > 0 for p in pointers)
    with torch.no_grad():
        for p in pointers:
            p.bias.view(-1, 2, 5)[:, 1] = torch.tensor([0.0, 0, 0, 1, 0])  # every head: (top, right)
    _, out2 = model(model.initial_carry(batch), batch)
    assert not torch.allclose(out["logits"], out2["logits"], atol=1e-4)
    with pytest.raises(ValueError, match="square canvas"):
        make(VARIANTS["trm_pointer"], seq_len=8)


def test_pointer_config_checks():
    """The pointer variant's own checks (its config class): its fields, mlp_t (no attention), the head dimension,
    a context source without a context slot."""
    ptr = VARIANTS["trm_pointer"]
    cfg = parse_arch_config(ptr)
    assert (cfg.pos_encodings, cfg.pointer_init, cfg.pointer_source) == ("pointer", "dihedral", "context")
    with pytest.raises(ArchConfigError, match="pointer_source"):
        parse_arch_config({**ptr, "pointer_source": "sample"})
    with pytest.raises(ArchConfigError, match="pos_encodings"):
        parse_arch_config({**ptr, "pos_encodings": "rope"})  # the variant's positions are pointer RoPE
    with pytest.raises(ArchConfigError, match="mlp_t"):
        parse_arch_config({**ptr, "mlp_t": True})
    with pytest.raises(ArchConfigError, match="at least 8"):
        parse_arch_config({**ptr, "hidden_size": 8, "num_heads": 2})
    with pytest.raises(ArchConfigError, match="first context slot"):
        parse_arch_config({**ptr, "puzzle_emb_len": 0, "puzzle_emb_ndim": 0})
    parse_arch_config({**ptr, "puzzle_emb_len": 0, "puzzle_emb_ndim": 0, "pointer_source": "token"})
    with pytest.raises(ArchConfigError, match="unknown key 'arch.pointer_init'"):  # not a TRM key any more
        parse_arch_config({**VARIANTS["trm_grid"], "pointer_init": "dihedral"})


def test_grid_coord_embedding_follows_the_grid_and_tells_widths_apart():
    from dataset.canvas import grid_to_canvas

    torch.manual_seed(0)
    side = 6
    emb = GridCoordEmbedding(side, 16, init_std=0.25)
    grid = np.arange(12).reshape(3, 4) % 10
    at = lambda g, off: emb(torch.from_numpy(grid_to_canvas(g, offset=off, size=side))[None].long())[0]
    e0, e1 = at(grid, (0, 0)), at(grid, (2, 1))
    cell = lambda r, c: r * side + c
    for r in range(3):  # every grid cell keeps its embedding when the grid moves on the canvas
        for c in range(4):
            assert torch.equal(e0[cell(r, c)], e1[cell(r + 2, c + 1)])
    # a narrower grid: the same cell (0, 0) is nearer the right edge, so its embedding differs
    assert not torch.allclose(at(grid[:, :2], (0, 0))[cell(0, 0)], e0[cell(0, 0)])
    # cell (0, 1) of the 3x4 grid: 0 below the top, 2 above the bottom, 1 right of the left edge, 2 from the right
    w = emb.embedding_weight
    assert torch.allclose(e0[cell(0, 1)], w[0, side + 0] + w[1, side + 2] + w[2, side + 1] + w[3, side + 2])
    # std: the four tables sum to the variance of one embedding of std init_std
    big = GridCoordEmbedding(8, 4096, init_std=0.25)
    assert big.embedding_weight.std().item() == pytest.approx(0.125, rel=0.02)


# ---------------------------------------------------------------------------------------------- pointer RoPE
def _pointer_attention(heads=2, head_dim=8):
    torch.manual_seed(0)
    return PointerAttention(heads * head_dim, head_dim, heads, heads, init="identity")


def _canvas(side, grid, r0, c0):
    """Tokens of a side x side canvas with ``grid`` (colours 0..9 -> tokens 2..11) at (r0, c0), PAD elsewhere."""
    canvas = torch.zeros(side, side, dtype=torch.int32)
    h, w = grid.shape
    canvas[r0 : r0 + h, c0 : c0 + w] = torch.as_tensor(grid, dtype=torch.int32) + 2
    return canvas.view(1, -1)


def _pointer_scores(attn, pos, prefix):
    """[heads, S, S] q.k after pointer RoPE of constant q = k (the score then depends on positions only)."""
    b, S = pos.feats.shape[:2]
    h = torch.randn(b, S, attn.hidden_size)  # the pointer weights are zero: the hidden state must not matter
    ones = torch.ones(b, S, attn.num_heads, attn.head_dim)
    q, k = attn.rotate(pos, h, ones, ones)
    return torch.einsum("bshd,bthd->bhst", q, k)[0]


def test_pointer_rope_starts_as_translation_invariant_grid_relative_2d_rope():
    """At initialisation (zero pointer weights, identity bias) every head points at its own cell: each query's best
    key is itself, scores depend only on the (row, column) offset between cells, and moving the grid on the
    canvas (translation augmentation) leaves every cell-to-cell score unchanged."""
    side, P = 8, 2
    attn = _pointer_attention()
    rope = PointerRoPE(attn.head_dim, side, prefix=P)
    grid = np.random.default_rng(0).integers(0, 10, (3, 5))
    s_a = _pointer_scores(attn, rope(_canvas(side, grid, 0, 0)), P)
    s_b = _pointer_scores(attn, rope(_canvas(side, grid, 4, 2)), P)
    cells_a = [P + r * side + c for r in range(3) for c in range(5)]
    cells_b = [P + (r + 4) * side + (c + 2) for r in range(3) for c in range(5)]
    assert torch.allclose(s_a[:, cells_a][:, :, cells_a], s_b[:, cells_b][:, :, cells_b], atol=1e-5)
    assert (s_a[:, P:, :].argmax(-1) == torch.arange(P, P + side * side)).all()  # each cell points at itself
    # the same offset anywhere gives the same score; context slots are never a cell's best key
    assert torch.allclose(s_a[0, P + 0, P + 9], s_a[0, P + 20, P + 29], atol=1e-5)  # (+1, +1) both
    assert (s_a[:, P:, :P].amax(-1) < s_a[:, P:, P:].amax(-1) - 1).all()


@pytest.mark.parametrize("d", range(8))
def test_pointer_rope_expresses_every_dihedral_map_as_a_linear_pointer(d):
    """With the pointer bias set to a map's coefficients, every output cell's best key is exactly the input cell
    the map copies into it (dataset.dihedral.dihedral_transform), for grids of several shapes anywhere on the canvas:
    one linear pointer per map serves every grid size. A wrong coefficient fails it."""
    from core.ops import DIHEDRAL_POINTERS
    from dataset.dihedral import dihedral_transform

    side, P = 8, 2
    attn = _pointer_attention(heads=2)
    rope = PointerRoPE(attn.head_dim, side, prefix=P)
    row, col = DIHEDRAL_POINTERS[d]
    with torch.no_grad():
        bias = torch.tensor([row, col], dtype=torch.float32)
        attn.pointer.bias.copy_(bias.expand(attn.num_heads, 2, 5).flatten())
    for (h, w), (r0, c0) in (((3, 5), (0, 0)), ((4, 4), (2, 1)), ((2, 6), (1, 2)), ((5, 3), (1, 3))):
        index = np.arange(h * w).reshape(h, w)
        out = dihedral_transform(index, d)  # out[u, v] = index of the input cell it comes from
        grid = np.random.default_rng(d).integers(0, 10, (h, w))
        scores = _pointer_scores(attn, rope(_canvas(side, grid, r0, c0)), P)
        for u in range(out.shape[0]):
            for v in range(out.shape[1]):
                src_r, src_c = divmod(int(out[u, v]), w)
                query = P + (r0 + u) * side + (c0 + v)
                assert (scores[:, query].argmax(-1) == P + (r0 + src_r) * side + (c0 + src_c)).all(), (d, h, w, u, v)


def test_pointer_source_context_gives_every_query_of_a_sample_the_pointer_of_its_first_context_slot():
    """pointer_source=context: the pointers come from the first context slot's hidden state alone -- the same for
    every query of a sample, unchanged when any other token's state changes, changed with slot 0's; token reads
    each query's own state. Without a context slot it is refused."""
    side, P = 4, 2
    attn = _pointer_attention(heads=2)
    torch.manual_seed(1)
    with torch.no_grad():
        attn.pointer.weight.normal_()
    inputs = _canvas(side, np.random.default_rng(0).integers(0, 10, (3, 4)), 0, 0).expand(2, -1)
    h = torch.randn(2, P + side * side, attn.hidden_size)
    ctx = attn.pointed_positions(h, PointerRoPE(attn.head_dim, side, P, source="context")(inputs))
    tok = attn.pointed_positions(h, PointerRoPE(attn.head_dim, side, P, source="token")(inputs))
    coef = attn.pointer(h[:, :1]).view(2, 1, attn.num_heads, 2, 5)
    feats = PointerRoPE(attn.head_dim, side, P)(inputs).feats
    assert torch.allclose(ctx, (coef * feats[:, :, None, None, :]).sum(-1), atol=1e-5)
    h2 = h.clone()
    h2[:, 1:] += torch.randn_like(h2[:, 1:])  # every state but the first context slot's
    assert torch.equal(attn.pointed_positions(h2, PointerRoPE(attn.head_dim, side, P, source="context")(inputs)), ctx)
    assert not torch.allclose(attn.pointed_positions(h2, PointerRoPE(attn.head_dim, side, P)(inputs)), tok)
    h3 = h.clone()
    h3[:, 0] += 1.0
    assert not torch.allclose(
        attn.pointed_positions(h3, PointerRoPE(attn.head_dim, side, P, source="context")(inputs)), ctx
    )
    with pytest.raises(ValueError, match="context slot"):
        PointerRoPE(attn.head_dim, side, 0, source="context")

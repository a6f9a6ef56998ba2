"""TRM's research variants (models/variants/): trm_grid (grid offsets) is TRM plus its own parameters, trains every
parameter (pitfall 1), compiles without graph breaks, and checks its own
config. Configs written before the variants had modules: tests/test_models_legacy.py."""

import numpy as np
import pytest
import torch

from models import ARCH_REGISTRY, GridTRM, build_loss_head, build_model
from models.variants.views_parts import GridCoordEmbedding

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
VARIANTS = {"trm_grid": {**TRM, "name": "trm_grid"}}


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
        "trm_local",
        "trm_views",
    }  # ETRM-only: tests/test_models_memory.py (+ test_models_local.py), tests/test_models_views.py


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_trainable_parameter_of_a_variant_gets_gradient(name):
    """Pitfall 1 for the variants ."""
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
    """Pitfall 18 for the variants' hooks ."""
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
    """trm_grid = TRM + ``inner.embed_grid`` (the grid core with its other components off); its config is TRMConfig's
    fields."""
    trm, grid = make(TRM), make(VARIANTS["trm_grid"])
    assert isinstance(grid, GridTRM) and grid.inner.memory_read is None and grid.inner.views is None
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert set(shapes(grid)) - set(shapes(trm)) == {"inner.embed_grid.embedding_weight"}
    assert shapes(grid)["inner.embed_grid.embedding_weight"] == (4, 2 * SIDE + 1, 16)
    assert all(shapes(trm)[k] == s for k, s in shapes(grid).items() if k in shapes(trm))
    assert set(type(grid.config).model_fields) == set(type(trm.config).model_fields)


def test_grid_variant_averages_each_token_with_its_grid_offsets_and_needs_a_square_canvas():
    model = make(VARIANTS["trm_grid"]).eval()
    inner, batch = model.inner, grid_batch()
    want = 0.707106781 * (inner.embed_tokens(batch["inputs"]) + inner.embed_grid(batch["inputs"]))
    assert torch.equal(inner.token_embeddings(batch["inputs"]), want)
    with pytest.raises(ValueError, match="square canvas"):
        make(VARIANTS["trm_grid"], seq_len=8)


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

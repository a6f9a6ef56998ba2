"""Cell features of arch=trm_views (``cell_features``): per-cell counts the core cannot compute in two layers, added
to the colour embedding of the test input and of the demo inputs the memory keys. ``core.ops.object_sizes`` equals
a breadth-first search of each colour's 4-connected objects and ``core.ops.ray_counts`` numpy's counts, on grids of
every size and place; the counts reach the embedding; every feature table trains."""

import numpy as np
import pytest
import torch

from dataset.canvas import grid_to_canvas
from dataset.synthetic_rules import _components
from encoders.interface import DemoMemory
from models.variants.views_ops import object_sizes, ray_counts
from tests.test_models_memory import build, dead_parameters

SIDE = 8


def grids(n=150, seed=0):
    """Random grids of 1-7 x 1-7 cells and 1-4 colours (sparse and dense), placed anywhere on an 8 x 8 canvas."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(1, SIDE, 2))
        k = int(rng.integers(1, 5))
        g = rng.choice(k, size=(h, w), p=rng.dirichlet(np.ones(k))).astype(np.uint8)
        top, left = int(rng.integers(0, SIDE - h + 1)), int(rng.integers(0, SIDE - w + 1))
        yield g, top, left, torch.from_numpy(grid_to_canvas(g, (top, left), SIDE).astype(np.int64))[None]


def on_canvas(values: np.ndarray, top: int, left: int) -> np.ndarray:
    c = np.zeros((SIDE, SIDE), dtype=np.int64)
    c[top : top + values.shape[0], left : left + values.shape[1]] = values
    return c.reshape(-1)


def test_object_sizes_are_the_sizes_of_each_colours_4_connected_objects():
    for g, top, left, canvas in grids():
        want = np.zeros(g.shape, dtype=np.int64)
        for colour in np.unique(g):
            for comp in _components(g == colour):
                ys, xs = zip(*comp)
                want[list(ys), list(xs)] = len(comp)
        got = object_sizes(canvas, SIDE)[0].numpy()
        np.testing.assert_array_equal(got, on_canvas(want, top, left), err_msg=f"{g}\nat ({top}, {left})")


def test_a_snake_shaped_object_is_one_object():
    """The longest label path on an 8 x 8 canvas (a serpentine of one colour): pointer jumping must not stop early."""
    g = np.zeros((7, 7), dtype=np.uint8)
    g[::2, :] = 1
    for r in range(1, 7, 2):
        g[r, 6 if r % 4 == 1 else 0] = 1
    sizes = object_sizes(torch.from_numpy(grid_to_canvas(g, (0, 0), SIDE).astype(np.int64))[None], SIDE)
    assert sizes.view(SIDE, SIDE)[:7, :7][torch.from_numpy(g == 1)].unique().tolist() == [int((g == 1).sum())]


def test_ray_counts_are_the_non_background_cells_beyond_each_cell_up_to_each_edge():
    for g, top, left, canvas in grids(seed=1):
        solid = (g > 0).astype(np.int64)
        h, w = g.shape
        want = np.zeros((4, h, w), dtype=np.int64)
        for r in range(h):
            for c in range(w):
                want[:, r, c] = solid[:r, c].sum(), solid[r + 1 :, c].sum(), solid[r, :c].sum(), solid[r, c + 1 :].sum()
        got = ray_counts(canvas, SIDE)[0].numpy()
        for k, name in enumerate(("up", "down", "left", "right")):
            np.testing.assert_array_equal(got[k], on_canvas(want[k], top, left), err_msg=f"{name}: {g}")


@pytest.mark.parametrize("name", ["trm_views", "trm_local"])
@pytest.mark.parametrize("features", [["object_size"], ["rays"], ["object_size", "rays"]])
def test_the_counts_reach_the_cells_embedding_and_every_feature_table_trains(features, name):
    """Two inputs with the same colour and grid at a cell but another object size / ray count there: equal
    embeddings without the features, different with them (the same method keys the demo memory's cells); in
    trm_local (the candidate-free cores) too, where the counts are off by default."""
    a = torch.tensor([[2, 3, 3, 1], [2, 2, 2, 1], [3, 2, 2, 1], [1, 1, 1, 0]]).view(1, -1)
    b = torch.tensor([[2, 3, 2, 1], [2, 2, 2, 1], [2, 2, 3, 1], [1, 1, 1, 0]]).view(1, -1)  # cell 1: object 2 -> 1
    plain, feat = build(name=name, cell_features=[]), build(name=name, cell_features=features)
    with torch.no_grad():
        e_plain = plain.inner.token_embeddings(torch.cat([a, b]))
        e_feat = feat.inner.token_embeddings(torch.cat([a, b]))
    torch.testing.assert_close(e_plain[0, 1], e_plain[1, 1])
    assert not torch.allclose(e_feat[0, 1], e_feat[1, 1])
    assert feat.inner.cell_features(a)[0, 3:].abs().sum() > 0 and feat.inner.cell_features(a)[0, 15].abs().sum() == 0
    assert dead_parameters(feat) == []


def test_the_demo_lookup_gives_what_the_demo_cells_of_the_cells_colour_and_object_size_became():
    """recolour-by-size demos: a test cell of an object of size 1 gets the small colour's embedding, of size 3 the big
    one's, a size no demo shows gets "none seen"; an invalid demo counts nothing; outside the grid 0; it trains."""
    model = build(name="trm_views", demo_lookup=["colour", "object"])
    lookup, by_colour = model.inner.demo_lookup[1], model.inner.demo_lookup[0]
    E = lookup.embed.embedding_weight
    # 4 x 4 canvases (tests.test_models_memory's side); colour 1 (token 3) objects, big (>= 3) -> 2, small -> 4
    di = torch.tensor([[3, 2, 3, 3], [2, 2, 3, 2], [3, 2, 2, 2], [1, 1, 1, 1]])  # objects of size 1, 3, 1
    dl = torch.tensor([[6, 2, 4, 4], [2, 2, 4, 2], [6, 2, 2, 2], [1, 1, 1, 1]])
    junk = torch.full((4, 4), 5)
    demo_inputs = torch.stack([di, junk]).view(1, 2, 16)
    demo_labels = torch.stack([dl, junk]).view(1, 2, 16)
    test = torch.tensor([[3, 3, 3, 2], [2, 2, 2, 3], [3, 3, 2, 1], [1, 1, 1, 0]]).view(1, 16)  # sizes 3, 1, 2
    with torch.no_grad():
        got = lookup(test, demo_inputs, demo_labels, torch.tensor([[True, False]]))[0]
    v = model.inner.vocab_size
    torch.testing.assert_close(got[0], E[4])  # size 3: big
    torch.testing.assert_close(got[7], E[6])  # size 1: small
    torch.testing.assert_close(got[8], E[v])  # size 2: no demo cell has it
    torch.testing.assert_close(got[3], E[v])  # background of size 1: the demos' background is one object of 7
    assert got[15].abs().sum() == 0
    with torch.no_grad():
        none = lookup(test, demo_inputs, demo_labels, torch.tensor([[False, False]]))[0]
    torch.testing.assert_close(none[0], E[v])
    other = torch.where(dl == 4, 7, dl)  # a second demo whose big objects become 5 (token 7): shares 1/2 each
    with torch.no_grad():
        mixed = lookup(
            test,
            torch.stack([di, di]).view(1, 2, 16),
            torch.stack([dl, other]).view(1, 2, 16),
            torch.ones(1, 2, dtype=torch.bool),
        )
    torch.testing.assert_close(mixed[0][0], (E[4] + E[7]) / 2)
    with torch.no_grad():  # by colour alone: colour 1 became 2 in 3 cells and 4 in 2 of the demo
        colour = by_colour(test, demo_inputs, demo_labels, torch.tensor([[True, False]]))[0]
    Ec = by_colour.embed.embedding_weight
    for cell in (0, 7, 8):
        torch.testing.assert_close(colour[cell], (3 * Ec[4] + 2 * Ec[6]) / 5)
    assert dead_parameters(model) == []


def test_the_candidate_free_cores_draw_the_counts_from_a_forked_stream_and_key_the_memory_with_them():
    """trm_counted_roles' parents (trm_local + gather + counted form): the counts are off by default; on, every other
    weight starts bit-equal (a paired run differs only by them), and the demo memory's keys (``MemoryRead.keys``, as
    the forward builds them) change with a demo cell's object size, the same demo output and encoder states given."""
    kw = dict(grid_gather=True, gather_demo_form=True, gather_demo_form_roles=True)
    off, on = build(name="trm_local", **kw), build(name="trm_local", cell_features=["object_size", "rays"], **kw)
    assert off.inner.cell_features is None and off.config.cell_features == []
    a, b = dict(off.named_parameters()), dict(on.named_parameters())
    assert set(b) - set(a) == {"inner.cell_features.embed.object_size.embedding_weight",
                               "inner.cell_features.embed.rays.embedding_weight"}  # fmt: skip
    for k, v in a.items():
        torch.testing.assert_close(b[k], v, rtol=0, atol=0, msg=k)
    demo = torch.tensor([[2, 3, 3, 1], [2, 2, 2, 1], [3, 2, 2, 1], [1, 1, 1, 0]]).view(1, 1, -1)
    split = torch.tensor([[2, 3, 2, 1], [2, 2, 2, 1], [2, 2, 3, 1], [1, 1, 1, 0]]).view(1, 1, -1)  # cell 1: size 2 -> 1
    S = demo.shape[-1]
    states = torch.randn(1, S, off.inner.memory_read.in_proj.weight.shape[1])
    every = torch.ones(1, S, dtype=torch.bool)
    memory = DemoMemory(states, every, torch.zeros(S, dtype=torch.long), torch.arange(S)[None])

    def key(model, demo_inputs):  # [heads, 1 + S, d]: the null key, then one per demo cell
        inner = model.inner
        with torch.no_grad():
            return inner.memory_read.keys(memory, demo_inputs, demo, inner.token_embeddings, torch.float32)[0][0]

    torch.testing.assert_close(key(off, demo)[:, 2], key(off, split)[:, 2])
    assert (key(on, demo)[:, 2] - key(on, split)[:, 2]).abs().max() > 1e-3

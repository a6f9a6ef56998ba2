"""arch=trm_views (models/variants/trm_views.py): every test-input cell gets the colour each dihedral map sends to it,
gated per sample by the context. A gate on map d gives exactly map d's embedding of the transformed grid (every map,
square and non-square grids, wherever the grid sits); the gate follows the context; the rest is trm_memory's (its
tests run on trm_views too: tests/test_models_memory.py ARCHS)."""

import numpy as np
import pytest
import torch

from dataset.dihedral import dihedral_transform
from tests.test_models_memory import HID, SIDE, V, batch, build, eval_logits


def canvas(g: np.ndarray, top: int = 0, left: int = 0) -> torch.Tensor:
    c = np.zeros((SIDE, SIDE), dtype=np.int64)
    c[top : top + g.shape[0], left : left + g.shape[1]] = g
    return torch.from_numpy(c).view(-1)


def test_a_gate_on_map_d_gives_map_d_of_the_grid_at_every_cell():
    views = build(name="trm_views", views=["dihedral"]).inner.views  # without a match: the context term alone
    rng = np.random.default_rng(0)
    ctx = torch.zeros(1, 2, HID)
    for h, w, top, left in [
        (3, 3, 0, 0),
        (2, 3, 0, 0),
        (3, 2, 1, 0),
        (1, 4, 0, 0),
        (1, 3, 0, 1),
        (2, 3, 1, 1),
        (2, 2, 2, 1),
    ]:
        g = rng.integers(2, V, size=(h, w))
        inputs = canvas(g, top, left)[None]
        for d in range(8):
            with torch.no_grad():
                views.gate.bias.copy_(torch.where(torch.arange(8) == d, 50.0, 0.0))
                got = views(inputs, ctx)[0]
            want_ids = canvas(dihedral_transform(g, d), top, left)  # PAD (0) where the map sends no cell; one table
            want = views.embed.embedding_weight[want_ids]
            torch.testing.assert_close(got, want, msg=f"map {d}, grid {h}x{w} at ({top}, {left})")


def test_the_gate_is_read_from_the_context_and_is_uniform_without_one():
    views = build(name="trm_views").inner.views  # called without a match: the context term alone
    inputs = batch()["inputs"]
    uniform = views(inputs, None)
    torch.testing.assert_close(views(inputs, torch.randn(4, 2, HID)), uniform)  # zero-initialised gate: uniform
    with torch.no_grad():
        views.gate.weight.normal_()
    a, b = views(inputs, torch.randn(4, 2, HID)), views(inputs, torch.randn(4, 2, HID))
    assert not torch.allclose(a, b, atol=1e-4)
    g = views.gates(torch.randn(4, 2, HID), 4, "cpu")
    torch.testing.assert_close(g.sum(-1), torch.ones(4))


def test_the_views_reach_the_answer():
    model = build(name="trm_views")
    data = batch()
    ref = eval_logits(model, data)
    with torch.no_grad():
        model.inner.views.embed.embedding_weight.mul_(3.0)
    assert not torch.allclose(eval_logits(model, data), ref, atol=1e-4)


def views_of(g: np.ndarray, side: int, top: int, left: int, kinds) -> tuple[np.ndarray, torch.Tensor]:
    """(the canvas [side, side] with grid g at (top, left), each view of ``kinds`` of it [V, side, side]: the colour
    the view sends to every cell, 0 where none)."""
    from core.ops import view_sources

    c = np.zeros((side, side), dtype=np.int64)
    c[top : top + g.shape[0], left : left + g.shape[1]] = g
    inputs = torch.from_numpy(c).view(1, -1)
    src = view_sources(inputs, side, kinds)[0]
    return c, torch.where(src >= 0, inputs[0][src.clamp_min(0)], 0).view(-1, side, side)


def test_shift_views_are_the_shifted_grid_and_roll_views_the_rolled_one():
    """core.ops.shift_sources against numpy: view (dr, dc) at grid cell (r, c) is the input at (r - dr, c - dc),
    PAD off the grid (shift) or taken modulo the grid's sides (roll = np.roll); PAD outside the grid."""
    from core.ops import VIEW_SHIFTS

    rng = np.random.default_rng(1)
    side = 7
    for h, w, top, left in [(3, 4, 0, 0), (5, 2, 1, 3), (1, 1, 6, 6), (7, 7, 0, 0)]:
        g = rng.integers(2, V, size=(h, w))
        c, got = views_of(g, side, top, left, ("shift", "roll"))
        got = got.view(2, len(VIEW_SHIFTS), side, side)
        for k, (dr, dc) in enumerate(VIEW_SHIFTS):
            shifted = np.zeros_like(c)
            for r in range(h):
                for col in range(w):
                    if 0 <= r - dr < h and 0 <= col - dc < w:
                        shifted[top + r, left + col] = g[r - dr, col - dc]
            rolled = np.zeros_like(c)
            rolled[top : top + h, left : left + w] = np.roll(g, (dr, dc), axis=(0, 1))
            np.testing.assert_array_equal(got[0, k].numpy(), shifted, err_msg=f"shift {(dr, dc)}, {h}x{w}")
            np.testing.assert_array_equal(got[1, k].numpy(), rolled, err_msg=f"roll {(dr, dc)}, {h}x{w}")


def test_the_encoder_marks_the_shift_each_demo_shows():
    """encoder=dihedral_views with views [dihedral, shift, roll]: for a demo whose output is its input translated by
    (dr, dc), no output cell differs under that shift view and every cell with a source agrees
    (core.ops.view_agreement: cells the content leaves have no source, "none")."""
    from core.ops import VIEW_SHIFTS, view_agreement
    from dataset.synthetic_rules import rule_apply

    side, g = 8, np.zeros((5, 6), dtype=np.int64)
    g[1:3, 2:4] = [[3, 4], [5, 3]]
    for k, (dr, dc) in enumerate(VIEW_SHIFTS):
        out = rule_apply("translate", {"dr": dr, "dc": dc})(g)
        if out is None:
            continue
        ci, co = np.zeros((side, side), np.int64), np.zeros((side, side), np.int64)
        ci[:5, :6], co[:5, :6] = g + 2, out + 2
        inp, outp = torch.from_numpy(ci).view(1, -1), torch.from_numpy(co).view(1, -1)
        _, agree = view_agreement(inp, outp, side, ("dihedral", "shift"))
        a = agree[0, 8 + k]
        assert (a == 1).sum() == 0 and (a == 2).sum() + (a == 0).sum() == side * side, (dr, dc)
        assert (a == 2).sum() >= 30 - 6 * (abs(dr) + abs(dc)), (dr, dc)


def test_every_kind_of_view_trains():
    from tests.test_models_memory import dead_parameters

    model = build(name="trm_views", views=["dihedral", "shift", "roll"])
    assert model.inner.views.num_views == 8 + 48 + 48
    assert dead_parameters(model) == []


def test_the_encoder_summarises_the_shift_views_of_each_demo():
    """encoder=dihedral_views with views [dihedral, shift, roll]: every token of a demo gets its summary of the 96
    shift / roll views (per view: the fraction of output cells with a source that equal it, that differ), checked
    against a numpy count."""
    from core.ops import VIEW_SHIFTS
    from encoders.dihedral_views import DihedralViewsEncoderConfig, DihedralViewsTrunk

    side = 6
    cfg = DihedralViewsEncoderConfig(hidden_size=16, num_heads=2, views=["dihedral", "shift", "roll"])
    trunk = DihedralViewsTrunk(cfg, V, side * side, pooling="mean")
    with torch.no_grad():
        trunk.view_tok.zero_()
        trunk.view_eq.zero_()
    rng = np.random.default_rng(2)
    g = rng.integers(2, V, size=(4, 5))
    o = rng.integers(2, V, size=(4, 5))
    o[1:, 1:] = g[:-1, :-1]  # mostly the shift (1, 1) of g
    ci, co = np.zeros((side, side), np.int64), np.zeros((side, side), np.int64)
    ci[:4, :5], co[:4, :5] = g, o
    feats = trunk.cell_features(torch.from_numpy(ci).view(1, -1), torch.from_numpy(co).view(1, -1))
    want = []
    for wrap in (False, True):
        eq, ne = [], []
        for dr, dc in VIEW_SHIFTS:
            src = np.roll(g, (dr, dc), axis=(0, 1)) if wrap else None
            n_eq = n_ne = 0
            for r in range(4):
                for c in range(5):
                    if wrap:
                        s = src[r, c]
                    elif 0 <= r - dr < 4 and 0 <= c - dc < 5:
                        s = g[r - dr, c - dc]
                    else:
                        continue
                    n_eq, n_ne = n_eq + (s == o[r, c]), n_ne + (s != o[r, c])
            eq.append(n_eq / max(1, n_eq + n_ne))
            ne.append(n_ne / max(1, n_eq + n_ne))
        want.append((eq, ne))
    frac = torch.tensor(want[0][0] + want[1][0] + want[0][1] + want[1][1], dtype=torch.float32)
    assert frac[VIEW_SHIFTS.index((1, 1))] == 1.0  # the shift view (1, 1) agrees wherever it has a source
    expected = (frac @ trunk.view_summary).expand(side * side, -1)
    torch.testing.assert_close(feats[0], expected)


def test_the_match_gate_picks_the_view_every_demo_shows_and_sees_only_the_demos_the_encoder_saw():
    """views_gate=match: demos whose outputs are their inputs under dihedral map d (or shifted by (dr, dc)) put the
    gate on that view; a sample without a valid demo (the zero-demo control's empty memory) gets match 0."""
    from core.ops import VIEW_SHIFTS

    views = build(name="trm_views", views=["dihedral", "shift"], views_gate="match").inner.views
    rng = np.random.default_rng(3)
    cases = [(d, lambda g, d=d: dihedral_transform(g, d)) for d in range(1, 8)]
    for k in (VIEW_SHIFTS.index((1, 0)), VIEW_SHIFTS.index((0, -1))):
        dr, dc = VIEW_SHIFTS[k]

        def shift(g, dr=dr, dc=dc):
            out = np.full_like(g, 2)  # background colour 0 comes in
            h, w = g.shape
            out[max(0, dr) : h + min(0, dr), max(0, dc) : w + min(0, dc)] = g[
                max(0, -dr) : h - max(0, dr), max(0, -dc) : w - max(0, dc)
            ]
            return out

        cases.append((8 + k, shift))
    for want, f in cases:
        di = torch.zeros(1, 3, SIDE * SIDE, dtype=torch.int64)
        dl = torch.zeros_like(di)
        for j in range(3):
            g = rng.integers(2, V, size=(3, 4))
            di[0, j], dl[0, j] = canvas(g), canvas(f(g))
        valid = torch.tensor([[True, True, False]])
        match = views.match(di, dl, valid)
        assert match[0, want] == 1.0 and int(views.gates(None, 1, "cpu", match).argmax()) == want, want
        torch.testing.assert_close(views.match(di, dl, torch.zeros(1, 3, dtype=torch.bool)), torch.zeros_like(match))


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"demo_lookup": ["colour", "object"], "cell_features": []},
        {"demo_lookup": ["object"], "cell_features": ["rays"]},
        {"views_gate": "tiebreak", "views_embed": "kind"},
    ],
)
def test_test_time_training_decodes_a_demo_without_its_own_answer_in_the_view_match(extra):
    """The match (and the demo lookup) read the demo tensors of the batch, but only the demos the encoder saw (the
    memory's): in a leave-one-out decode (models.ttt), changing demo j's own output changes nothing in demo j's
    logits, while changing another visible demo's output does."""
    import models.ttt as mttt

    model = build(name="trm_views", **extra).eval()
    data = batch(demos_per_sample=(3, 3, 2, 3))
    demos = mttt.demo_set(data)
    di, dl, mask = mttt.loo_demos(data, demos, True)

    def logits(labels):
        with torch.no_grad():
            prefix = model.encoder(di, labels, mask).context
            return mttt.decode_logits(model, demos.inputs, prefix, (di, labels, mask))

    ref = logits(dl)
    own, other = dl.clone(), dl.clone()
    for k in range(demos.n):
        j = int(demos.slot[k])
        own[k, j] = torch.where(own[k, j] > 1, 2 + (own[k, j] - 1) % (V - 2), own[k, j])
        other[k, (j + 1) % 2] = torch.where(other[k, (j + 1) % 2] > 1, 2, other[k, (j + 1) % 2])
    torch.testing.assert_close(logits(own), ref)
    assert not torch.allclose(logits(other), ref, atol=1e-4)


def test_scale_and_tile_views_are_numpys_kron_and_the_tiling_of_copy_pattern():
    """core.ops.block_sources against numpy: scale view (ky, kx) is np.kron(grid, ones(ky, kx)); tile view (ry, rx)
    (plain, then mirrored) is dataset.synthetic_rules's copy_pattern without recolouring; PAD outside that output."""
    from core.ops import VIEW_FACTORS
    from dataset.synthetic_rules import rule_apply

    rng = np.random.default_rng(4)
    side = 9
    for h, w, top, left in [(2, 3, 0, 0), (3, 1, 0, 2), (1, 2, 1, 1), (3, 3, 0, 0)]:
        g = rng.integers(2, V, size=(h, w))
        c, got = views_of(g, side, top, left, ("scale", "tile"))
        got = got.numpy()
        K = len(VIEW_FACTORS)
        for k, (a, b) in enumerate(VIEW_FACTORS):
            for view, want in (
                (k, np.kron(g, np.ones((a, b), dtype=np.int64))),
                (K + k, rule_apply("copy_pattern", {"ry": a, "rx": b, "mirror": False, "recolour": None})(g)),
                (2 * K + k, rule_apply("copy_pattern", {"ry": a, "rx": b, "mirror": True, "recolour": None})(g)),
            ):
                full = np.zeros_like(c)
                H, W = min(want.shape[0], side - top), min(want.shape[1], side - left)
                full[top : top + H, left : left + W] = want[:H, :W]
                np.testing.assert_array_equal(got[view], full, err_msg=f"view {view} ({a}, {b}) of {h}x{w}")


def test_the_view_table_gives_the_views_definition_for_every_grid_size_and_place():
    """core.ops.view_sources (a table of every grid size, two gathers) == view_sources_reference (the views'
    arithmetic) on grids of every size at random places, with end-of-grid markers and empty canvases."""
    from core.ops import VIEW_KINDS, view_sources, view_sources_reference

    g = torch.Generator().manual_seed(0)
    for side in (4, 7):
        canvases = []
        for h in range(side + 1):
            for w in range(side + 1):
                c = torch.zeros(side, side, dtype=torch.long)
                top = int(torch.randint(0, side - h + 1, (1,), generator=g))
                left = int(torch.randint(0, side - w + 1, (1,), generator=g))
                c[top : top + h, left : left + w] = torch.randint(2, V, (h, w), generator=g)
                if h and w and top + h < side:
                    c[top + h, left : left + w] = 1  # the end-of-grid marker under the grid
                canvases.append(c.view(-1))
        tokens = torch.stack(canvases)
        for kinds in (tuple(VIEW_KINDS), ("settle",), ("tile", "settle", "dihedral")):  # settle anywhere in the order
            torch.testing.assert_close(view_sources(tokens, side, kinds), view_sources_reference(tokens, side, kinds))


def test_the_agree_match_is_the_agreement_count_of_every_view():
    """views_match=agree against core.ops.view_agreement: (equal - differing) / both per demo, a colour drawn outside
    the output grid counted as differing, the worst over the valid demos."""
    from core.ops import view_agreement

    views = build(name="trm_views", views_match="agree").inner.views
    data = batch(demos_per_sample=(3, 2, 1, 3))
    di, dl, valid = data["demo_inputs"].long(), data["demo_labels"].long(), data["demo_mask"]
    b, D, S = di.shape
    colour, agree = view_agreement(di.view(b * D, S), dl.view(b * D, S), SIDE, views.kinds)
    eq = (agree == 2).sum(-1).float()
    ne = ((agree == 1) | ((colour > 0) & (dl.view(b * D, S) < 2)[:, None])).sum(-1).float()
    score = ((eq - ne) / (eq + ne).clamp_min(1)).view(b, D, -1)
    want = torch.stack([score[i, valid[i]].amin(0) for i in range(b)])
    torch.testing.assert_close(views.match(di, dl, valid), want)


def test_the_explain_match_is_the_share_of_cells_the_view_explains_up_to_a_recolouring():
    """InputViews.match against a loop over demos, views and cells: the share of the cells the output colours or the
    view draws on where the output is the majority output colour of the cell's view colour ("no source" counted as a
    colour of its own), a view colour outside the output grid never explained; 2 x share - 1, the worst over the
    valid demos."""
    from core.ops import view_sources

    views = build(name="trm_views", views_match="explain").inner.views
    data = batch(demos_per_sample=(3, 2, 1, 3))
    di, dl, valid = data["demo_inputs"].long(), data["demo_labels"].long(), data["demo_mask"]
    b, D, S = di.shape
    src = view_sources(di.view(b * D, S), SIDE, views.kinds).view(b, D, -1, S)
    want = torch.zeros(b, src.shape[2])
    for i in range(b):
        scores = []
        for j in range(D):
            if not valid[i, j]:
                continue
            row = []
            for v in range(src.shape[2]):
                pairs, outside = {}, 0
                for p in range(S):
                    a = int(di[i, j, src[i, j, v, p]]) if src[i, j, v, p] >= 0 else 0
                    c = int(dl[i, j, p])
                    if c >= 2:
                        pairs.setdefault(a, []).append(c)
                    elif a:
                        outside += 1
                explained = sum(max(cs.count(c) for c in set(cs)) for cs in pairs.values())
                total = sum(len(cs) for cs in pairs.values()) + outside
                row.append(2 * explained / max(1, total) - 1)
            scores.append(row)
        want[i] = torch.tensor(scores).amin(0)
    torch.testing.assert_close(views.match(di, dl, valid), want)


def test_settle_views_are_the_gravity_rule_for_every_direction_and_wall():
    """core.ops.settle_sources: view d * 10 + w draws dataset.synthetic_rules' gravity (direction d, wall colour w,
    none for 0) of grids of every size and place, the background where no cell lands, nothing outside the grid."""
    from core.ops import SETTLE_DIRECTIONS, settle_sources
    from dataset.canvas import grid_to_canvas
    from dataset.synthetic_rules import _gravity_apply

    rng, side = np.random.default_rng(0), 8
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(1, side, 2))
        g = rng.integers(0, 5, (h, w)).astype(np.uint8)
        top, left = int(rng.integers(0, side - h + 1)), int(rng.integers(0, side - w + 1))
        c = torch.from_numpy(grid_to_canvas(g, (top, left), side).astype(np.int64))[None]
        src = settle_sources(c, side)[0].view(-1, side, side)
        for d, name in enumerate(SETTLE_DIRECTIONS):
            for wall in range(10):
                s = src[d * 10 + wall]
                drawn = torch.where(s >= 0, c[0][s.clamp_min(0)], 2)[top : top + h, left : left + w] - 2
                want = _gravity_apply({"direction": name, "wall": wall or None})(g)
                np.testing.assert_array_equal(drawn.numpy(), want, err_msg=f"{name}, wall {wall}: {g}")
                s[top : top + h, left : left + w] = -1
                assert (s == -1).all(), "a settle view draws outside the grid"


def test_the_match_names_the_settle_view_of_gravity_demos_and_settle_views_train():
    """Demos of gravity (direction, wall) match that settle view fully (1.0, the best); with every kind of view on, the
    settle tables get gradient like the others."""
    from core.ops import SETTLE_DIRECTIONS, VIEW_KINDS
    from dataset.synthetic_rules import _gravity_apply
    from tests.test_models_memory import dead_parameters

    model = build(name="trm_views", views=list(VIEW_KINDS))
    views = model.inner.views
    first = views.num_views - VIEW_KINDS["settle"]
    rng = np.random.default_rng(5)
    for d, name in enumerate(SETTLE_DIRECTIONS):
        wall = 4
        di = torch.zeros(1, 3, SIDE * SIDE, dtype=torch.int64)
        dl = torch.zeros_like(di)
        for j in range(3):
            g = rng.choice([0, 1, 2, wall], size=(4, 4), p=[0.5, 0.2, 0.15, 0.15]).astype(np.uint8)
            g[0, 0] = wall
            di[0, j], dl[0, j] = canvas(g + 2), canvas(_gravity_apply({"direction": name, "wall": wall})(g) + 2)
        match = views.match(di, dl, torch.tensor([[True, True, True]]))
        assert match[0, first + d * 10 + wall] == 1.0 == match.max(), name
    assert dead_parameters(model) == []


def _fit_views_then_apply_held_out_shifts(embed: str, held_out: list, steps: int = 120, side: int = 7):
    """InputViews (shift views, match gate) plus a linear read-out trained to output the colour the demos' shift
    sends to each cell, on every shift but ``held_out``; -> cell accuracy on training shifts and on held-out ones."""
    from core.ops import VIEW_SHIFTS, view_sources
    from models.variants.trm_views import InputViews

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    views = InputViews(side, V, 16, ["shift"], 0.1, torch.float32, match_scale=10.0, embed=embed)
    head = torch.nn.Linear(16, V)
    opt = torch.optim.Adam([*views.parameters(), *head.parameters()], lr=3e-2)
    train = [k for k in range(len(VIEW_SHIFTS)) if k not in held_out]

    def sample(ks: list, n: int = 48):
        shift = torch.tensor(ks)[torch.randint(len(ks), (n,), generator=gen)]
        grids = torch.zeros(n, 3, side, side, dtype=torch.long)
        for i in range(n):  # one grid size per puzzle (4-side), random colours, at the canvas origin
            h, w = torch.randint(4, side + 1, (2,), generator=gen).tolist()
            grids[i, :, :h, :w] = torch.randint(2, V, (3, h, w), generator=gen)
        flat = grids.view(n * 3, side * side)
        src = view_sources(flat, side, ["shift"]).view(n, 3, -1, side * side)
        src = src[torch.arange(n), :, shift]  # [n, 3, S]: the puzzle's shift
        out = flat.view(n, 3, -1).gather(2, src.clamp_min(0)).masked_fill(src < 0, 0)
        out = out.masked_fill(flat.view(n, 3, -1) == 0, 0)  # outside the grid: nothing
        valid = torch.ones(n, 2, dtype=torch.bool)
        match = views.match(flat.view(n, 3, -1)[:, :2], out[:, :2], valid)  # demos 0, 1; query 2
        return flat.view(n, 3, -1)[:, 2], match, out[:, 2]

    def accuracy(ks: list) -> float:
        with torch.no_grad():
            x, m, y = sample(ks, 96)
            cells = x > 0
            return float((head(views(x, None, m)).argmax(-1) == y)[cells].float().mean())

    for _ in range(steps):
        x, m, y = sample(train)
        loss = torch.nn.functional.cross_entropy(head(views(x, None, m)).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return accuracy(train), accuracy(held_out)


def test_a_kind_or_shared_view_table_applies_a_held_out_shift():
    """views_embed: with one table for every view (or for every shift) the colour a shift never chosen in training
    sends is read like any other's (one table per view, removed, applied it with its initial rows: 0.43,
    docs/record/2026-11-27-view-tables.md). Both fit the training shifts. Per kind, each view uses its kind's table."""
    from core.ops import VIEW_SHIFTS
    from models.variants.trm_views import InputViews

    held_out = [VIEW_SHIFTS.index(s) for s in [(1, 2), (-2, 1), (0, -2), (2, 2), (-1, -1)]]
    fit_shared, held_shared = _fit_views_then_apply_held_out_shifts("shared", held_out)
    fit_kind, held_kind = _fit_views_then_apply_held_out_shifts("kind", held_out)
    assert min(fit_shared, fit_kind) > 0.9, (fit_shared, fit_kind)
    assert held_shared > 0.9 and held_kind > 0.9, (held_shared, held_kind)
    kinds = InputViews(SIDE, V, 8, ["dihedral", "settle", "shift"], 0.1, torch.float32, embed="kind")
    torch.testing.assert_close(kinds.table_of_view, torch.tensor([0] * 8 + [1] * 40 + [2] * 48))
    assert kinds.embed.embedding_weight.shape == (3 * V, 8)


def test_the_tiebreak_gate_lets_the_context_choose_only_among_the_best_matching_views():
    """views_gate=tiebreak: a context that prefers view 5 cannot outvote the match of view 3 (with views_gate=match
    it does); between two views tied at the best match it chooses; with no demo (every view ties) it alone
    chooses, as the context gate does."""
    from models.variants.trm_views import InputViews

    kw = dict(side=SIDE, vocab=V, hidden=HID, kinds=["dihedral"], init_std=0.1, cast_to=torch.float32)
    tie, plain = InputViews(**kw, match_scale=10.0, tiebreak=True), InputViews(**kw, match_scale=10.0)
    for views in (tie, plain):
        with torch.no_grad():
            views.gate.bias.copy_(torch.where(torch.arange(8) == 5, 30.0, 0.0))
    ctx = torch.zeros(3, 2, HID)
    match = torch.full((3, 8), -0.5)
    match[0, 3] = 1.0  # view 3 explains the demos, view 5 does not
    match[1, 3] = match[1, 5] = 1.0  # both do
    match[2] = 0.0  # no valid demo
    g, g_plain = tie.gates(ctx, 3, "cpu", match), plain.gates(ctx, 3, "cpu", match)
    assert g[0, 3] == 1.0 and int(g_plain[0].argmax()) == 5
    assert g[1, 5] > 0.99 and g[1, [0, 1, 2, 4, 6, 7]].sum() == 0
    torch.testing.assert_close(g[2], torch.softmax(tie.gate.bias, -1))


def test_the_tiebreak_core_trains_every_parameter_and_has_no_match_scale():
    """views_gate=tiebreak reads the match but never scales it: no match_scale parameter, every other one trains."""
    from tests.test_models_memory import dead_parameters

    model = build(name="trm_views", views_gate="tiebreak", views_embed="kind")
    assert model.inner.views.match_scale is None and model.inner.views.tiebreak
    assert dead_parameters(model) == []


def test_the_compiled_core_reads_its_view_table_and_never_builds_one():
    """The shape views' table is the module's buffer (core.ops.view_table): a compiled forward on a cold process-wide
    cache reads the buffer and builds nothing (traced, the build became a CPU kernel inside the CUDA graph that
    inductor failed to compile on an H200), one graph, the eager numbers."""
    import core.ops as ops
    from tests.test_models_memory import compiled_core_logits

    model = build(
        name="trm_views", views=["dihedral", "settle", "shift"], cell_features=[], demo_lookup=[]
    )  # counts: break
    ops._VIEW_TABLES.clear()
    logits, eager = compiled_core_logits(model)
    assert ops._VIEW_TABLES == {}
    torch.testing.assert_close(logits, eager())

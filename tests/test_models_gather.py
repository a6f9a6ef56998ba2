"""arch=trm_local with ``grid_gather`` (models/variants/views_parts.GridGather): a learned gather keyed by position
only. One bilinear form of the cells' one-hot edge offsets expresses a flip, a transpose, a two-fold scaling and a
shift exactly, on any grid size and wherever the grid sits on the canvas (checked cell by cell against numpy); cells
outside the grid are never read; the demos' match scores the form that reproduces them (up to a recolouring) at 1
and selects it; with its output projection at zero the core is trm_local exactly, and the first update moves every
gather weight."""

import numpy as np
import pytest
import torch

import models
from core.ops import grid_coordinates
from models.variants.gather import GridGather
from models.variants.views_parts import FIRST_COLOUR
from tests.test_models_memory import batch, build, dead_parameters, eval_logits

SIDE, VOCAB = 8, 12


def canvas(grid: np.ndarray, top: int = 0, left: int = 0) -> torch.Tensor:
    """A SIDE x SIDE canvas of tokens (PAD 0 outside) holding ``grid`` (colours 0-9) at (top, left)."""
    c = np.zeros((SIDE, SIDE), dtype=np.int64)
    c[top : top + grid.shape[0], left : left + grid.shape[1]] = grid + FIRST_COLOUR
    return torch.from_numpy(c).view(1, -1)


def form(pairs, shift=lambda a: a) -> torch.Tensor:
    """The bilinear form whose logit counts the edge-offset blocks where the source's offset in block p equals
    ``shift`` of the target's offset in block q, for each (p, q) of ``pairs`` (0 top, 1 bottom, 2 left, 3 right;
    offsets shifted by SIDE as in core.ops.grid_coordinates)."""
    n = 2 * SIDE + 1
    A = torch.zeros(4 * n, 4 * n)  # [source slot, target slot]
    for p, q in pairs:
        for b in range(n):
            a = shift(b - SIDE) + SIDE
            if 0 <= a < n:
                A[p * n + a, q * n + b] = 1.0
    return A


def gather_reads(forms: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[S, VOCAB] what each cell reads under the first form, made sharp (x 30), the colour table one-hot."""
    g = GridGather(SIDE, hidden=VOCAB, vocab=VOCAB, maps=forms.shape[0], heads=1, width=VOCAB, prefix=0)
    with torch.no_grad():
        g.forms.copy_(30 * forms)
        g.null.fill_(1.5 * 30)  # between one and two matched blocks: a cell without a full source reads nothing
        g.colour.embedding_weight.copy_(torch.eye(VOCAB))
        g.gate.weight.zero_()
        g.gate.bias.copy_(torch.tensor([100.0] + [0.0] * (forms.shape[0] - 1)))  # every cell uses the first form
        g.out_proj.weight.copy_(torch.eye(VOCAB))
    return g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(tokens))[0]


def expect(tokens: torch.Tensor, source) -> torch.Tensor:
    """[S, VOCAB] one-hot of the input colour at ``source(r, c, grid box)`` for every canvas cell; zero where the
    source is outside the grid or the cell has none."""
    t = tokens.view(SIDE, SIDE).numpy()
    rows, cols = np.nonzero(t >= FIRST_COLOUR)
    box = rows.min(), rows.max(), cols.min(), cols.max()
    want = torch.zeros(SIDE * SIDE, VOCAB)
    for r in range(SIDE):
        for c in range(SIDE):
            src = source(r, c, box)
            if src is None:
                continue
            sr, sc = src
            if box[0] <= sr <= box[1] and box[2] <= sc <= box[3]:
                want[r * SIDE + c, t[sr, sc]] = 1.0
    return want


@pytest.mark.parametrize("h, w, top, left", [(3, 5, 0, 0), (4, 4, 2, 1), (2, 6, 5, 2)])
def test_one_form_is_a_flip_a_transpose_a_scaling_or_a_shift_on_any_grid(h, w, top, left):
    rng = np.random.default_rng(h * 100 + w)
    tokens = canvas(rng.integers(0, 10, (h, w)), top, left)
    within = lambda r, c, box: box[0] <= r <= box[1] and box[2] <= c <= box[3]  # noqa: E731
    cases = {
        # horizontal flip: same offset from the top, the source's offset from the right = the target's from the left
        "flip": (form([(0, 0), (3, 2)]), lambda r, c, box: (r, box[3] - (c - box[2])) if within(r, c, box) else None),
        # transpose (h == w only reads inside the grid): source row offset = target column offset and vice versa
        "transpose": (
            form([(0, 2), (2, 0)]),
            lambda r, c, box: (box[0] + c - box[2], box[2] + r - box[0]) if r >= box[0] and c >= box[2] else None,
        ),
        # each cell a 2 x 2 block, anchored at the grid's top-left corner
        "scale": (
            form([(0, 0), (2, 2)], shift=lambda a: a // 2),
            lambda r, c, box: (
                (box[0] + (r - box[0]) // 2, box[2] + (c - box[2]) // 2) if r >= box[0] and c >= box[2] else None
            ),
        ),
        # content shifted one row down and two columns right (what moves in from outside reads nothing)
        "shift": (
            form([(0, 0)], shift=lambda a: a - 1) + form([(2, 2)], shift=lambda a: a - 2),
            lambda r, c, box: (r - 1, c - 2),
        ),
    }
    for name, (A, source) in cases.items():
        got = gather_reads(torch.stack([A, torch.randn_like(A)]), tokens)
        want = expect(tokens, source)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_cells_outside_the_grid_are_never_read_and_an_empty_canvas_reads_nothing():
    g = GridGather(SIDE, hidden=16, vocab=VOCAB, maps=3, heads=2, width=4, prefix=2)
    with torch.no_grad():
        g.out_proj.weight.normal_()
    tokens = canvas(np.arange(6).reshape(2, 3), 1, 1)
    T, off, colour, bias = g.tables(tokens)
    grid = (tokens[0] >= FIRST_COLOUR).nonzero().squeeze(-1)
    assert (~off[0]).nonzero().squeeze(-1).tolist() == grid.tolist() + [SIDE * SIDE]  # the grid's cells + null
    # a cell's read moves only with colours inside the grid: paint PAD cells differently -> the same read
    h = torch.randn(1, 2 + SIDE * SIDE, 16)
    out = g(h, (T, off, colour, bias))
    assert out[:, :2].abs().sum() == 0 and out[:, 2:].abs().sum() > 0  # the prefix positions get nothing
    with torch.no_grad():
        g.colour.embedding_weight[0].normal_()  # the PAD token's row: never read
    torch.testing.assert_close(g(h, g.tables(tokens)), out)
    empty = torch.zeros(1, SIDE * SIDE, dtype=torch.long)
    torch.testing.assert_close(g(h, g.tables(empty)), torch.zeros_like(out))  # only the null key: zero
    assert grid_coordinates(tokens, SIDE).shape == (1, SIDE * SIDE, 4)


def test_the_gather_starts_as_a_no_op_and_every_weight_then_learns():
    """At zero output projection the core is trm_local exactly (trm_local's weights loaded, every other weight drawn
    as without it); one training step's loss reaches the output projection, and with it moved, every gather weight."""
    data = batch()
    plain = build(name="trm_local")
    gath = build(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4)
    missing, unexpected = gath.load_state_dict(plain.state_dict(), strict=False)
    names = ["colour.embedding_weight", "forms", "gate.bias", "gate.weight", "match_scale", "null", "out_proj.weight"]
    assert unexpected == [] and sorted(missing) == [f"inner.gather.{n}" for n in names]
    ref = eval_logits(plain, data)
    torch.testing.assert_close(eval_logits(gath, data), ref, atol=1e-5, rtol=1e-5)
    fresh = build(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
    dead = dead_parameters(fresh)
    assert "inner.gather.out_proj.weight" not in dead
    assert {f"inner.gather.{n}" for n in names if n != "out_proj.weight"} <= set(dead)  # behind the zero projection
    with torch.no_grad():
        fresh.inner.gather.out_proj.weight.normal_(0, 0.5)
    assert not torch.allclose(eval_logits(fresh, data), ref, atol=1e-4)
    assert [n for n in dead_parameters(fresh) if ".gather." in n] == []


def test_the_demos_select_the_form_that_reproduces_them_up_to_a_recolouring():
    """``match``: a flip form explains demos made by a flip and a recolouring in full (1.0), the identity form does
    not; a demo the row may not see changes nothing; a row without one scores 0. With the match in the gate (state
    term zero), every cell reads through the flip form: the test input's flip."""
    flip, ident = form([(0, 0), (3, 2)]), form([(0, 0), (2, 2)])
    g = GridGather(SIDE, hidden=VOCAB, vocab=VOCAB, maps=2, heads=1, width=VOCAB, prefix=0, match=True)
    with torch.no_grad():
        g.forms.copy_(30 / g.scale * torch.stack([ident, flip]))
        g.null.fill_(1.5 * 30 / g.scale)
    rng = np.random.default_rng(0)
    recolour = np.array([3, 1, 2, 0, 4, 5, 6, 7, 8, 9])  # 0 <-> 3 swapped, 1 -> 2 -> ... a permutation
    demos_in, demos_out = [], []
    for h, w in [(3, 4), (5, 2), (4, 4)]:
        x = rng.integers(0, 4, (h, w))
        demos_in.append(canvas(x)[0])
        demos_out.append(canvas(recolour[x[:, ::-1]])[0])
    di = torch.stack(demos_in)[None].repeat(2, 1, 1)  # [2 rows, 3 demos, S]
    dl = torch.stack(demos_out)[None].repeat(2, 1, 1)
    valid = torch.tensor([[True, True, False], [False, False, False]])
    m = g.match(di, dl, valid)
    assert m[0, 1].item() == pytest.approx(1.0, abs=1e-4) and m[0, 0].item() < 0.9
    assert m[1].abs().sum() == 0  # no demo: no evidence
    dl2 = dl.clone()
    dl2[:, 2] = canvas(rng.integers(0, 10, (6, 6)))[0]  # the demo row 0 may not see
    torch.testing.assert_close(g.match(di, dl2, valid), m)
    # the gate follows the match: the test input is read through the flip form
    with torch.no_grad():
        g.colour.embedding_weight.copy_(torch.eye(VOCAB))
        g.gate.weight.zero_()
        g.gate.bias.zero_()
        g.out_proj.weight.copy_(torch.eye(VOCAB))
    x = canvas(rng.integers(0, 10, (4, 3)))
    got = g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(x, m[:1]))[0]
    within = lambda r, c, box: box[0] <= r <= box[1] and box[2] <= c <= box[3]  # noqa: E731
    want = expect(x, lambda r, c, box: (r, box[3] - (c - box[2])) if within(r, c, box) else None)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)


def _flip_demos(rng, n, recolour=None):
    """[n, 3, S] demo inputs and outputs made by a left-right flip (and ``recolour``), grids of 3-5 cells a side."""
    ins, outs = [], []
    for _ in range(n * 3):
        x = rng.integers(0, 4, tuple(rng.integers(3, 6, 2)))
        y = x[:, ::-1] if recolour is None else recolour[x[:, ::-1]]
        ins.append(canvas(x)[0])
        outs.append(canvas(y)[0])
    return torch.stack(ins).view(n, 3, -1), torch.stack(outs).view(n, 3, -1)


def test_the_demo_fit_loss_alone_teaches_a_form_the_map_the_demos_show():
    """``copy_nll`` + ``fit_loss``: from random forms, Adam on the demo-fit loss alone (no answer, no core) makes a
    form read flipped demos exactly (match 1.0, from under 0.6), and the same form reads the flip of new grids; the
    responsibilities are held fixed, and a sample without demos gives no gradient."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    g = GridGather(SIDE, hidden=VOCAB, vocab=VOCAB, maps=4, heads=1, width=VOCAB, prefix=0, match=True)
    di, dl = _flip_demos(rng, 8)
    valid = torch.ones(8, 3, dtype=torch.bool)
    assert g.match(di, dl, valid).amax(-1).max() < 0.6
    opt = torch.optim.Adam([g.forms, g.null], lr=0.05)
    for _ in range(60):
        loss = GridGather.fit_loss(g.copy_nll(di, dl, valid), tau=1.0).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert g.copy_nll(di, dl, valid).amin(-1).max() < 1e-3
    assert g.match(di, dl, valid).amax(-1).min() > 0.999
    held = _flip_demos(np.random.default_rng(1), 4)  # new grids and sizes: the same form reads their flip
    assert g.match(*held, torch.ones(4, 3, dtype=torch.bool)).amax(-1).min() > 0.999
    nll = torch.tensor([[2.0, 0.5, 3.0], [1.0, 1.0, 1.0]], requires_grad=True)
    GridGather.fit_loss(nll, tau=1.0).sum().backward()
    torch.testing.assert_close(nll.grad, torch.softmax(-nll.detach(), -1))  # d/dnll of sum r nll with r fixed
    two = g.copy_nll(di[:2], dl[:2], torch.tensor([[True, True, True], [False, False, False]]))
    assert two[1].abs().sum() == 0
    grads = torch.autograd.grad(GridGather.fit_loss(two, 1.0)[1], g.forms, allow_unused=True, retain_graph=True)[0]
    assert grads is None or grads.abs().sum() == 0  # the row without demos
    assert torch.autograd.grad(GridGather.fit_loss(two, 1.0)[0], g.forms)[0].abs().sum() > 0


def test_the_demo_fit_loss_reaches_the_loss_head_and_needs_a_gather():
    """``arch.gather_fit_weight=w``: the ETRM's loss adds w x the per-sample ``gather_fit`` of every step, the forms
    get gradient from it even while the gather's output projection is still zero; refused without a gather."""
    data = batch()
    losses = {}
    for w in (0.0, 2.0):
        m = build(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4,
                  gather_fit_weight=w).train()  # fmt: skip
        head = models.build_loss_head(m)
        carry = head.initial_carry(data)
        _, loss, metrics, _, _ = head(carry, data)
        losses[w] = (loss, metrics)
        loss.backward()
        moved = m.inner.gather.forms.grad
        assert (moved is not None and moved.abs().sum() > 0) == (w > 0)  # out_proj is zero: only the fit reaches
    fit = losses[2.0][1]["gather_fit"]
    assert fit > 0 and "gather_fit" not in losses[0.0][1]
    torch.testing.assert_close(losses[2.0][0], losses[0.0][0] + 2.0 * fit, atol=1e-4, rtol=1e-5)
    with pytest.raises(Exception, match="gather_fit_weight=1.0 .* needs grid_gather=true"):
        build(name="trm_local", gather_fit_weight=1.0)

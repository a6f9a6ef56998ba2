"""The program row (experiments/science/program.py): trm_views' candidates with no learned weight answer the puzzles
whose rule is a candidate (a view and a colour table, or the demo lookups) and not the others; dropping a candidate
kind drops it from the program."""

import numpy as np

from dataset.augment import ArcPuzzle
from dataset.families import family_apply
from experiments.science.program import DEFAULT_KINDS, candidates_of, program_predictions, solve

RNG = np.random.default_rng(0)


def _puzzle(family, params, n=4, shape=(4, 5), colours=(0, 1, 2, 3)):
    f = family_apply(family, params)
    pairs = []
    while len(pairs) < n:
        x = RNG.choice(np.array(colours, dtype=np.uint8), size=shape)
        y = f(x)
        if y is not None and not (y.shape == x.shape and (y == x).all()):
            pairs.append((x, y))
    return pairs[:-1], pairs[-1:]


def _right(demos, test, **kw):
    outs, part = solve(demos, [x for x, _ in test], 8, **kw)
    return all(o.shape == y.shape and (o == y).all() for o, (_, y) in zip(outs, test)), part


def test_a_view_with_its_colour_table_answers_a_flip_with_a_recolour():
    demos, test = _puzzle("flip_rotate", {"dihedral": 1, "recolour": [2, 7]})
    assert _right(demos, test) == (True, "view")
    # without the dihedral views no other view reproduces the demos: the lookups answer, wrongly
    assert _right(demos, test, kinds=("shift", "scale")) == (False, "lookup")


def test_scaling_and_colour_maps_are_views_and_object_sizes_are_lookups():
    assert _right(*_puzzle("scale_up", {"ky": 2, "kx": 1, "recolour": None})) == (True, "view")
    assert _right(*_puzzle("colour_map", {"map": {"1": 2, "2": 3, "3": 1}})) == (True, "view")
    demos, test = _puzzle("recolour_by_size", {"src": 1, "big": 4, "small": 5, "threshold": 3}, n=6, colours=(0, 1))
    ok, part = _right(demos, test)
    assert part == "lookup" and ok


def test_an_open_rule_is_not_answered_and_the_rows_score_like_a_runs():
    demos, test = _puzzle("count_to_bar", {"colour": 1, "orientation": "row", "unit": "cells"}, colours=(0, 0, 0, 1))
    assert _right(demos, test)[0] is False
    flip = _puzzle("flip_rotate", {"dihedral": 5, "recolour": None})
    puzzles = [ArcPuzzle("evaluation", "a", *flip), ArcPuzzle("evaluation", "b", demos, test)]
    rows = program_predictions(puzzles, 8)
    assert [r["correct_rank"] for r in rows["a"]] == [1] and [r["correct_rank"] for r in rows["b"]] == [None]


def test_a_drop_one_candidate_recipe_drops_it_from_the_program():
    arch = {"name": "trm_views", "views": ["dihedral", "shift"], "demo_lookup": []}
    assert candidates_of({"arch": arch}) == (("dihedral", "shift"), False)
    assert candidates_of({"arch": {"name": "trm_memory"}}) == (DEFAULT_KINDS, True)
    assert "settle" in DEFAULT_KINDS and "dihedral" in DEFAULT_KINDS
    demos, test = _puzzle("gravity", {"direction": "down", "wall": None}, colours=(0, 0, 1, 2))
    assert _right(demos, test) == (True, "view")  # a settle view
    outs, part = solve(demos, [x for x, _ in test], 8, kinds=("dihedral", "shift"), lookups=False)
    assert part == "none" and (outs[0] == test[0][0]).all()


def test_the_drop_one_candidate_ablation_is_an_override_of_the_command():
    """``--override arch=trm_views --override 'arch.views=[dihedral,shift,roll,scale,tile]'`` (gravity's settle
    views dropped) composes, and the program beside that run holds the same candidates; the recipe's own core
    (no candidates) and trm_views' full set are scored against all of them."""
    from experiments.science.recipe import resolve_recipe

    views = ["arch=trm_views", "arch.views=[dihedral,shift,roll,scale,tile]"]
    recipe = resolve_recipe("cfg_science", "standard", 10, views)
    assert candidates_of(recipe) == (("dihedral", "shift", "roll", "scale", "tile"), True)
    assert candidates_of(resolve_recipe("cfg_science", "standard", 10, views[:1])) == (DEFAULT_KINDS, True)
    full = resolve_recipe("cfg_science", "standard", 10, [])
    assert full["arch"]["name"] == "trm_local" and candidates_of(full) == (DEFAULT_KINDS, True)

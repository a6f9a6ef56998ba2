"""Training-only breadth families (dataset/breadth_families.py) and the builder's --breadth-families
(dataset/synthetic_breadth.py): each rule on hand-made grids, instances that make pairs and are all enumerated, the
conjugate instance of an augmented copy, the same draw of the evaluated families with them added, and no breadth
instance that produces an evaluation copy's pairs."""

import json

import numpy as np
import pytest

from dataset.augment import Augmentation, read_augmentation_lists
from dataset.breadth_families import (
    BREADTH_FAMILIES,
    breadth_apply,
    breadth_conjugate_params,
    breadth_instances,
    breadth_structure,
)
from dataset.build_synthetic_dataset import generate_synthetic_arc
from dataset.errors import DatasetError
from dataset.families import ALL_FAMILIES, family_apply, family_group, structure
from dataset.rule_grids import rule_key
from dataset.rule_identity import demos_determine_rule
from dataset.synthetic_breadth import forbidden_instances
from dataset.synthetic_rules import GridSpec, make_pairs


def A(rows):
    return np.array(rows, dtype=np.uint8)


CASES = [
    ("border_frame", {"colour": 4}, A([[0, 1, 0], [0, 2, 0], [0, 0, 0]]), A([[4, 4, 4], [4, 2, 4], [4, 4, 4]])),
    ("invert_mask", {"colour": 3}, A([[3, 0], [0, 0]]), A([[0, 3], [3, 3]])),
    (  # rows holding a 2 get their background painted 2; the 5 stays
        "fill_lines",
        {"colour": 2, "orientation": "rows"},
        A([[0, 2, 5], [0, 0, 0], [5, 0, 0]]),
        A([[2, 2, 5], [0, 0, 0], [5, 0, 0]]),
    ),
    (
        "fill_lines",
        {"colour": 2, "orientation": "columns"},
        A([[0, 2, 5], [0, 0, 0], [5, 0, 0]]),
        A([[0, 2, 5], [0, 2, 0], [5, 2, 0]]),
    ),
    ("erase_colour", {"colour": 7}, A([[7, 1], [1, 7]]), A([[0, 1], [1, 0]])),
    (
        "recolour_extreme",
        {"which": "smallest", "colour": 9},
        A([[1, 1, 0], [1, 1, 0], [0, 0, 2]]),
        A([[1, 1, 0], [1, 1, 0], [0, 0, 9]]),
    ),
    ("draw_cross", {"mark": 3, "line": 6}, A([[0, 0, 0], [0, 3, 0], [1, 0, 0]]), A([[0, 6, 0], [6, 3, 6], [1, 6, 0]])),
    (  # the lone 2 touches the 1s' block only diagonally: 4-neighbours remove both lone cells, 8 keeps the corner one
        "denoise",
        {"neighbours": 4},
        A([[1, 1, 0, 0], [1, 1, 0, 2], [0, 0, 1, 0]]),
        A([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]),
    ),
    (
        "denoise",
        {"neighbours": 8},
        A([[1, 1, 0, 0], [1, 1, 0, 2], [0, 0, 1, 0]]),
        A([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]]),
    ),
    (
        "surround_cells",
        {"centre": 5, "ring": 8},
        A([[0, 0, 0, 0], [0, 5, 0, 0], [0, 0, 0, 1]]),
        A([[8, 8, 8, 0], [8, 5, 8, 0], [8, 8, 8, 1]]),
    ),
]


@pytest.mark.parametrize("family, params, grid, want", CASES)
def test_each_breadth_rule_on_a_hand_made_grid(family, params, grid, want):
    got = family_apply(family, params)(grid)
    assert got is not None and got.shape == want.shape and (got == want).all(), got


def test_the_breadth_families_are_apart_from_the_evaluated_ones():
    assert not set(BREADTH_FAMILIES) & set(ALL_FAMILIES) and len(ALL_FAMILIES) == 16  # rule-label slots unchanged
    assert {family_group(f) for f in BREADTH_FAMILIES} == {"breadth"}
    assert {c[0] for c in CASES} == set(BREADTH_FAMILIES)


@pytest.mark.parametrize("family", sorted(BREADTH_FAMILIES))
def test_instances_make_pairs_every_instance_is_enumerated_and_copies_show_the_conjugate(family):
    """Every drawn instance is one of breadth_instances (the set the builder checks against the evaluation copies),
    its pairs keep the grid's shape, its mapping follows from (family, params), and an augmented copy of its pairs
    is produced by breadth_conjugate_params' instance."""
    keys = {rule_key(family, p) for p in breadth_instances(family)}
    spec, made, checked = GridSpec(3, 8), 0, 0
    rng = np.random.default_rng(sum(map(ord, family)))
    for _ in range(25):
        inst = BREADTH_FAMILIES[family](rng, spec)
        assert inst.key in keys and structure(family, inst.params) == breadth_structure(family, inst.params)
        pairs = make_pairs(inst, rng, 4, max_side=8)
        if pairs is None:
            continue
        made += 1
        for x, y in pairs:
            assert x.shape == y.shape and (breadth_apply(family, inst.params)(x) == y).all()
        for _ in range(3):
            g = Augmentation.random(rng)
            f = breadth_apply(family, breadth_conjugate_params(family, inst.params, g.dihedral, g.colour_map))
            for x, y in pairs:
                got = f(g.apply(x))
                assert got is not None and (got == g.apply(y)).all(), (inst.params, g)
                checked += 1
    assert made >= 20 and checked >= 200, (made, checked)


def test_demos_that_the_other_structural_choice_explains_do_not_determine_the_rule():
    rows = {"colour": 2, "orientation": "rows"}
    x = A([[0, 0, 0], [0, 2, 0], [0, 0, 0]])  # one mark: rows paint a row, columns a column: told apart
    assert demos_determine_rule("fill_lines", rows, [(x, breadth_apply("fill_lines", rows)(x))])
    y = A([[2, 0], [0, 2]])  # marks on every row and every column: rows and columns paint the same cells
    assert not demos_determine_rule("fill_lines", rows, [(y, breadth_apply("fill_lines", rows)(y))])
    keep = {"which": "largest", "colour": 9}  # two objects: the largest is not the smallest
    assert demos_determine_rule(
        "recolour_extreme", keep, [(x := A([[1, 1, 0, 2]]), breadth_apply("recolour_extreme", keep)(x))]
    )


def test_an_instance_that_produces_an_evaluation_copys_pairs_is_refused():
    """forbidden_instances: erase_colour 3 produces a held-out puzzle's pairs (identity copy); its copy recoloured
    3 -> 5 is produced by erase_colour 5, which is refused as well; a puzzle no breadth rule produces refuses none."""
    x1, x2 = A([[3, 1, 0], [0, 3, 1]]), A([[1, 3], [3, 3]])
    pairs = [(x, np.where(x == 3, 0, x).astype(np.uint8)) for x in (x1, x2)]
    test = [("e0", {}, pairs[:1], pairs[1:])]
    lut = np.arange(10, dtype=np.uint8)
    lut[3], lut[5] = 5, 3
    lists = {"e0": (np.array([0, 0]), np.stack([np.arange(10, dtype=np.uint8), lut]))}
    got = forbidden_instances(["erase_colour", "invert_mask"], test, lists)
    assert got == {rule_key("erase_colour", {"colour": 3}), rule_key("erase_colour", {"colour": 5})}
    rot = [(x, np.rot90(x).copy()) for x in (A([[1, 2, 0]]), A([[0, 4], [4, 0]]))]
    assert forbidden_instances(list(BREADTH_FAMILIES), [("e1", {}, rot[:1], rot[1:])], {}) == set()


def test_no_breadth_puzzle_or_copy_shows_a_refused_instance():
    """draw_breadth: with erase_colour 3 producing a held-out puzzle's pairs, no drawn erase_colour puzzle is of
    colour 3 and none of its copies shows colour 3 (without the refusal, 3 is one of 9 colours of 30 puzzles x 3
    copies)."""
    from dataset.synthetic_breadth import draw_breadth
    from dataset.synthetic_heldout import LeakGuard

    pairs = [(x, np.where(x == 3, 0, x).astype(np.uint8)) for x in (A([[3, 1, 0], [0, 3, 1]]), A([[1, 3], [3, 3]]))]
    guard = LeakGuard([], num_aug=2, seed=0)
    out, lists = draw_breadth(
        ["erase_colour"], 30, GridSpec(3, 6), guard, [("e0", {}, pairs[:1], pairs[1:])], {},
        first_index=0, prefix="t", seed=0, canvas_size=8, progress=False,
    )  # fmt: skip
    assert len(out) == 30 and set(lists) == {n for n, *_ in out}
    shown = {
        breadth_conjugate_params("erase_colour", m["params"], int(d), lut)["colour"]
        for n, m, *_ in out
        for d, lut in zip(*lists[n])
    }
    assert 3 not in shown and len(shown) >= 6, shown
    assert guard.counts["erase_colour: puzzles redrawn by refused instance"] > 0


def test_a_family_whose_every_instance_is_refused_is_named_or_left_out_with_all():
    """keep_extreme's 'remove the smallest' on a lone cell is denoise (both neighbourhoods): named, denoise is an
    error; with --breadth-families all (skip_refused) it is left out and counted, the other families drawn."""
    from dataset.synthetic_breadth import draw_breadth
    from dataset.synthetic_heldout import LeakGuard

    xs = (A([[1, 1, 0, 0], [1, 1, 0, 2], [0, 0, 0, 0]]), A([[0, 0, 3], [4, 4, 0], [4, 4, 0]]))
    pairs = [(x, breadth_apply("denoise", {"neighbours": 4})(x)) for x in xs]
    test = [("e0", {}, pairs[:1], pairs[1:])]
    kw = dict(first_index=0, prefix="t", seed=0, canvas_size=8, progress=False)
    with pytest.raises(DatasetError, match="every instance of denoise produces the pairs of some evaluation copy"):
        draw_breadth(["denoise", "draw_cross"], 2, GridSpec(3, 6), LeakGuard([], 0, 0), test, {}, **kw)
    guard = LeakGuard([], 0, 0)
    out, _ = draw_breadth(["denoise", "draw_cross"], 2, GridSpec(3, 6), guard, test, {}, skip_refused=True, **kw)
    assert [m["family"] for _, m, *_ in out] == ["draw_cross", "draw_cross"]
    assert guard.counts["denoise: family left out (every instance produces an evaluation copy's pairs)"] == 1


def test_breadth_puzzles_are_added_to_the_same_draw_and_none_shows_an_evaluation_copy(tmp_path):
    """--breadth-families: the held-out puzzles, the other training puzzles and their copies are the build without
    it byte for byte; the breadth puzzles (per family as asked, with copies) are training only, and no breadth
    instance a training copy shows produces any evaluation copy's pairs; unknown names are refused before the draw."""
    fams = ["colour_map", "fill_enclosed", "outline"]
    kw = dict(num_train=18, num_test=6, families=fams, canvas_size=8, seed=2, num_aug=2, progress=False)
    base = generate_synthetic_arc(str(tmp_path / "base"), "t", **kw)
    wide = generate_synthetic_arc(str(tmp_path / "wide"), "t", breadth_families=["all"], breadth_puzzles=3, **kw)
    read = lambda p, k: json.load(open(p[k]))  # noqa: E731
    for k in ("evaluation_challenges", "evaluation_solutions"):
        assert read(wide, k) == read(base, k)
    a, b = read(base, "training_challenges"), read(wide, "training_challenges")
    assert all(b[n] == a[n] for n in a) and len(b) == len(a) + 3 * len(BREADTH_FAMILIES)
    rules = read(wide, "rules")
    extra = {n: rules[n] for n in b if n not in a}
    assert all(m["subset"] == "training" and m["family"] in BREADTH_FAMILIES for m in extra.values())
    lists = read_augmentation_lists(wide["augmentations"], 2, 2)
    old = read_augmentation_lists(base["augmentations"], 2, 2)
    assert all(np.array_equal(lists[n][1], old[n][1]) for n in old) and set(extra) <= set(lists)
    evals = []
    for n, m in rules.items():
        if m["subset"] == "evaluation":
            ch, sol = read(wide, "evaluation_challenges")[n], read(wide, "evaluation_solutions")[n]
            pairs = [(A(p["input"]), A(p["output"])) for p in ch["train"]]
            pairs += [(A(t["input"]), A(o)) for t, o in zip(ch["test"], sol)]
            for d, lut in zip(*lists[n]):
                aug = Augmentation(int(d), tuple(int(c) for c in lut))
                evals.append([(aug.apply(x), aug.apply(y)) for x, y in pairs])
    for n, m in extra.items():
        for d, lut in zip(*lists[n]):
            f = breadth_apply(m["family"], breadth_conjugate_params(m["family"], m["params"], int(d), lut))
            for pairs in evals:
                assert not all((y := f(x)) is not None and np.array_equal(y, o) for x, o in pairs), (n, d)
    with pytest.raises(DatasetError, match="unknown training-only family 'gravity'"):
        generate_synthetic_arc(str(tmp_path / "x"), breadth_families=["gravity"], **kw)
    assert not (tmp_path / "x").exists()


def test_the_science_command_passes_breadth_families_and_refuses_them_with_rule_labels():
    from experiments.science.common import ScienceError
    from experiments.science.settings import ScienceSettings

    s = ScienceSettings(out="o", breadth_families=("all",))
    assert s.synthetic_data(s.check()[0])["breadth_families"] == ["all"]
    assert "breadth_families" not in ScienceSettings(out="o").synthetic_data(list(ALL_FAMILIES))
    with pytest.raises(ScienceError, match="unknown training-only family 'roll'"):
        ScienceSettings(out="o", breadth_families=("roll",)).check()
    with pytest.raises(ScienceError, match="--rule-readout"):
        ScienceSettings(out="o", breadth_families=("denoise",), rule_readout=0.5).check()


def test_the_builder_command_counts_breadth_puzzles_apart(tmp_path, capsys):
    from dataset.build_synthetic_dataset import main

    main(
        ["--output-dir", str(tmp_path), "--num-train", "8", "--num-test", "4", "--families", "colour_map", "outline"]
        + ["--canvas-size", "8", "--num-aug", "0", "--no-progress", "--drop-training-families", "outline"]
        + ["--breadth-families", "draw_cross", "--breadth-puzzles", "2"]
    )
    out = capsys.readouterr().out
    assert (
        "wrote 4 training (4 of 8 left out by --drop-training-families) + 2 of --breadth-families + 4 evaluation" in out
    )


def test_the_train_fit_sample_takes_breadth_puzzles_apart():
    """With breadth puzzles in the data, the train-fit set samples the evaluated families' puzzles exactly as the
    build without them (so train-fit rows compare run for run), plus n // 16 of each breadth family."""
    from experiments.science.data import fit_sample

    rules = {f"p{i:04d}": {"family": sorted(ALL_FAMILIES)[i % 16], "subset": "training"} for i in range(640)}
    rules.update({f"e{i:03d}": {"family": "roll", "subset": "evaluation"} for i in range(40)})
    base = fit_sample(rules, 64, 3)
    assert len(base) == 64 and all(rules[p]["subset"] == "training" for p in base)
    more = dict(rules)  # breadth ids interleave with the others when sorted: a joint sample would differ
    more.update({f"p{i:04d}b": {"family": f, "subset": "training"} for i, f in enumerate(list(BREADTH_FAMILIES) * 50)})
    both = fit_sample(more, 64, 3)
    assert sorted(p for p in both if more[p]["family"] in ALL_FAMILIES) == base
    counts = {f: sum(more[p]["family"] == f for p in both) for f in BREADTH_FAMILIES}
    assert counts == {f: 4 for f in BREADTH_FAMILIES}
    assert fit_sample(more, 64, 4) != both

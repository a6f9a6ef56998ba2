"""Benchmark v3 (dataset/families.py, dataset/synthetic_heldout.py): every evaluation copy is itself a held-out rule
instance, no behaviour leak in either direction, whole structures held out per family, the open families beside the
covered ones. Checked on the written files, independently of the builder's own bookkeeping."""

import json

import numpy as np
import pytest

from dataset.arc_sources import load_puzzles
from dataset.augment import ArcPuzzle, read_augmentation_lists, select_augmentations
from dataset.build_synthetic_dataset import generate_synthetic_arc
from dataset.families import (
    ALL_FAMILIES,
    COVERED,
    GROUPS,
    OPEN,
    choose_heldout_structures,
    family_group,
    generalisations,
    structure,
)
from dataset.open_families import OPEN_FAMILIES
from dataset.rule_identity import HeldOutBehaviour, conjugate_params, in_training_orbit
from dataset.synthetic_heldout import trained_copy_counts
from dataset.synthetic_rules import BENCHMARK_VERSION, FAMILIES, GridSpec, rule_key

NUM_AUG = 4


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    d = tmp_path_factory.mktemp("v3")
    paths = generate_synthetic_arc(
        str(d), "v", num_train=320, num_test=64, canvas_size=8, num_aug=NUM_AUG, seed=5, progress=False
    )
    rules = json.load(open(paths["rules"]))
    lists = read_augmentation_lists(paths["augmentations"], NUM_AUG, 5)
    return paths, rules, lists


def _shown(meta, lists, name):
    dih, luts = lists.get(name, (np.zeros(1, np.int64), np.arange(10, dtype=np.uint8)[None]))
    return [conjugate_params(meta["family"], meta["params"], d, lut) for d, lut in zip(dih.tolist(), luts)]


def test_every_family_is_in_the_default_build_and_open_ones_are_their_own_group(v3):
    _, rules, _ = v3
    evaluated = {m["family"] for m in rules.values() if m["subset"] == "evaluation"}
    assert evaluated == set(ALL_FAMILIES) and len(OPEN_FAMILIES) >= 6 and BENCHMARK_VERSION == 3
    assert set(GROUPS[OPEN]) == set(OPEN_FAMILIES) and "roll" not in GROUPS[COVERED]
    assert {family_group(f) for f in OPEN_FAMILIES} == {OPEN} and {family_group(f) for f in FAMILIES} == {COVERED}


def test_no_evaluation_copy_shows_a_trained_instance(v3):
    """Counted from the files: 0 per family. The same held-out puzzles with the copies the ARC builder would draw for
    them unrestricted (benchmark v2's evaluation copies) show trained instances, so the count can see a leak."""
    paths, rules, lists = v3
    counts = trained_copy_counts(rules, lists)
    assert set(counts) == set(ALL_FAMILIES) and not any(counts.values()), counts
    assert json.load(open(paths["leaks"]))["evaluation copies that are trained instances"] == counts
    # every evaluation puzzle has its own copy list, and they are copies (not only the puzzle itself)
    evals = [n for n, m in rules.items() if m["subset"] == "evaluation"]
    assert all(n in lists for n in evals) and sum(len(lists[n][0]) for n in evals) > 2.5 * len(evals)
    v2 = dict(lists)
    for p in load_puzzles(["evaluation"], None, paths["prefix"]):
        v2[p.name] = select_augmentations(ArcPuzzle("evaluation", p.name, p.train, p.test), NUM_AUG, 5)
    assert sum(trained_copy_counts(rules, v2).values()) >= 20


def test_the_count_sees_a_single_trained_copy():
    rules = {
        "t": {"subset": "training", "family": "flip_rotate", "params": {"dihedral": 1, "recolour": None}},
        "e": {"subset": "evaluation", "family": "flip_rotate", "params": {"dihedral": 3, "recolour": None}},
    }
    ident = np.arange(10, dtype=np.uint8)
    # the copies of "e" through each transform g show g . 3 . g^-1; find one that shows the trained map 1
    g = next(d for d in range(8) if conjugate_params("flip_rotate", rules["e"]["params"], d, ident)["dihedral"] == 1)
    assert trained_copy_counts(rules, {"e": (np.array([0, g]), np.stack([ident, ident]))}) == {"flip_rotate": 1}
    assert trained_copy_counts(rules, {}) == {"flip_rotate": 0}


def test_a_held_out_instance_a_dihedral_map_from_a_trained_one_is_in_its_orbit():
    """in_training_orbit: a quarter turn of flip_rotate's quarter turn, or gravity in another direction, is a trained
    structure seen through a map of the whole puzzle; the half turn (its own class) and a colour_map structure that no
    map reaches (a 3-cycle against a swap) are not; colours do not count (the structure leaves them out)."""
    flip = lambda d: {"dihedral": d, "recolour": None}  # noqa: E731
    rules = {
        "t1": {"subset": "training", "family": "flip_rotate", "params": flip(1)},
        "t2": {"subset": "training", "family": "gravity", "params": {"direction": "down", "wall": 5}},
        "t3": {"subset": "training", "family": "colour_map", "params": {"map": {"1": 2, "2": 1}}},
        "e1": {"subset": "evaluation", "family": "flip_rotate", "params": flip(3)},
        "e2": {"subset": "evaluation", "family": "flip_rotate", "params": flip(2)},
        "e3": {"subset": "evaluation", "family": "gravity", "params": {"direction": "left", "wall": 7}},
        "e4": {"subset": "evaluation", "family": "gravity", "params": {"direction": "left", "wall": None}},
        "e5": {"subset": "evaluation", "family": "colour_map", "params": {"map": {"1": 2, "2": 3, "3": 1}}},
    }
    got = in_training_orbit(rules)
    assert got == {"e1": True, "e2": False, "e3": True, "e4": False, "e5": False}


def test_no_behaviour_leak_in_either_direction(v3):
    """No trained instance (a training puzzle's or one of its copies') produces a held-out puzzle's pairs, and no
    held-out instance produces a training puzzle's pairs (the copies: tests/test_synthetic_leak.py)."""
    paths, rules, lists = v3
    trained = [
        (m["family"], q)
        for n, m in rules.items()
        if m["subset"] == "training"
        for q in _shown(m, lists, n)
        if q is not None
    ]
    held = [(m["family"], m["params"]) for m in rules.values() if m["subset"] == "evaluation"]
    by_trained, by_held = HeldOutBehaviour(trained), HeldOutBehaviour(held)
    puzzles = {p.name: p for p in load_puzzles(["training", "evaluation"], "evaluation", paths["prefix"])}
    checked = 0
    for name, m in rules.items():
        p = puzzles[name]
        other = by_trained if m["subset"] == "evaluation" else by_held
        assert other.realised_by(p.train + p.test) is None, name
        checked += 1
    assert checked == 384
    # the check itself: a held-out puzzle is found by its own instance
    name = next(n for n, m in rules.items() if m["subset"] == "evaluation")
    p = puzzles[name]
    assert HeldOutBehaviour([(rules[name]["family"], rules[name]["params"])]).realised_by(p.train + p.test)


def test_every_family_holds_out_whole_structures(v3):
    """Each held-out puzzle's structure (and every evaluation copy's) is one no training puzzle or copy shows; the
    builder's table names what is new about each."""
    paths, rules, lists = v3
    trained = {
        structure(m["family"], q)
        for n, m in rules.items()
        if m["subset"] == "training"
        for q in _shown(m, lists, n)
        if q is not None
    }
    for n, m in rules.items():
        if m["subset"] == "evaluation":
            shown = [structure(m["family"], q) for q in _shown(m, lists, n)]
            assert shown and not set(shown) & trained, (n, shown)
    table = json.load(open(paths["structures"]))["families"]
    assert set(table) == set(ALL_FAMILIES)
    for fam, row in table.items():
        with_puzzles = {k: v for k, v in row["heldout"].items() if v["puzzles"]}
        assert with_puzzles and all(v["novelty"].startswith("new ") for v in with_puzzles.values()), fam
        assert len(row["training"]) >= 1 and not set(row["heldout"]) & set(row["training"]), fam


@pytest.mark.parametrize("family", ["gravity", "colour_map", "flip_rotate", "extend_lines", "scale_up"])
def test_a_held_out_special_case_takes_its_generalisation_with_it(family):
    """Gravity without a wall is gravity with a wall colour the grid lacks: holding out the first while training the
    second would let trained instances reproduce the held-out puzzles. The choice is closed under generalisations."""
    for seed in range(12):
        held = set(choose_heldout_structures(np.random.default_rng(seed), family, GridSpec(3, 6)))
        assert held, seed
        for k in held:
            assert set(generalisations(k)) <= held, (seed, k)
    assert generalisations(structure("gravity", {"direction": "up", "wall": None})) == [
        structure("gravity", {"direction": "up", "wall": 4})
    ]
    assert generalisations(structure("colour_map", {"map": {"1": 2, "2": 1}})) == [
        structure("colour_map", {"map": {"1": 2, "2": 1, "3": 4, "4": 3}})
    ]


def test_structure_leaves_colours_out_for_the_covered_families():
    a = {"dihedral": 3, "recolour": [1, 2]}
    assert structure("flip_rotate", a) == structure("flip_rotate", dict(a, recolour=[5, 6]))
    assert structure("flip_rotate", a) != structure("flip_rotate", dict(a, recolour=None))
    assert structure("colour_map", {"map": {"1": 2, "2": 3, "3": 1}}) == structure(
        "colour_map", {"map": {"4": 5, "5": 6, "6": 4, "7": 7}}
    )  # one 3-cycle, a no-op entry left out
    assert rule_key("colour_map", {"map": {"1": 2, "2": 1}}) != rule_key("colour_map", {"map": {"3": 4, "4": 3}})


def test_training_only_families_widen_training_and_are_never_evaluated(tmp_path):
    """Breadth of training rules (issue 46): --train-only-families are drawn for training, none of their instances is
    held out, and the science command records them only when given."""
    from dataset.errors import DatasetError
    from experiments.science.common import ScienceError
    from experiments.science.settings import ScienceSettings

    fams = ["colour_map", "flip_rotate", "outline"]
    paths = generate_synthetic_arc(
        str(tmp_path), "t", num_train=24, num_test=6, families=fams, train_only_families=["outline"],
        canvas_size=8, seed=1, progress=False,
    )  # fmt: skip
    rules = json.load(open(paths["rules"]))
    train = {m["family"] for m in rules.values() if m["subset"] == "training"}
    held = [m["family"] for m in rules.values() if m["subset"] == "evaluation"]
    assert train == set(fams) and sorted(set(held)) == ["colour_map", "flip_rotate"] and len(held) == 6
    with pytest.raises(DatasetError, match="--train-only-families: 'gravity' must be one of --families"):
        generate_synthetic_arc(str(tmp_path / "x"), families=fams, train_only_families=["gravity"], progress=False)
    s = ScienceSettings(out="o", families=tuple(fams), train_only_families=("outline",))
    assert s.synthetic_data(s.check()[0])["train_only_families"] == ["outline"]
    assert "train_only_families" not in ScienceSettings(out="o").synthetic_data(fams)
    with pytest.raises(ScienceError, match="--train-only-families"):
        ScienceSettings(out="o", families=tuple(fams), train_only_families=("gravity",)).check()


def test_dropping_training_families_keeps_the_same_draw_without_them(tmp_path):
    """The breadth ablation (issue 46): --drop-training-families gives the same held-out puzzles and the same
    training puzzles (and copies) of the other families as the full build, with the dropped families' training
    puzzles left out; an unknown family, or dropping every one, is refused before any work."""
    from dataset.errors import DatasetError
    from experiments.science.common import ScienceError
    from experiments.science.settings import ScienceSettings

    fams = ["colour_map", "flip_rotate", "outline"]
    kw = dict(num_train=24, num_test=6, families=fams, canvas_size=8, seed=1, num_aug=2, progress=False)
    full = generate_synthetic_arc(str(tmp_path / "full"), "t", **kw)
    part = generate_synthetic_arc(str(tmp_path / "part"), "t", drop_training_families=["outline"], **kw)
    read = lambda p, k: json.load(open(p[k]))  # noqa: E731
    for k in ("evaluation_challenges", "evaluation_solutions"):
        assert read(part, k) == read(full, k)
    a, b = read(full, "training_challenges"), read(part, "training_challenges")
    assert set(b) == {n for n in a if not n.endswith("-outline")} and len(b) == 16  # 8 puzzles per family
    assert all(b[n] == a[n] for n in b)
    rules = read(part, "rules")
    assert {m["family"] for m in rules.values() if m["subset"] == "evaluation"} == set(fams)
    lists_full = read_augmentation_lists(full["augmentations"], 2, 1)
    lists_part = read_augmentation_lists(part["augmentations"], 2, 1)
    assert set(lists_part) == set(b) | {n for n, m in rules.items() if m["subset"] == "evaluation"}
    assert all(np.array_equal(lists_part[n][0], lists_full[n][0]) for n in lists_part)
    with pytest.raises(DatasetError, match="--drop-training-families: 'gravity' is not one of --families"):
        generate_synthetic_arc(str(tmp_path / "x"), drop_training_families=["gravity"], **kw)
    with pytest.raises(DatasetError, match="no training puzzle left"):
        generate_synthetic_arc(str(tmp_path / "y"), drop_training_families=fams, **kw)
    s = ScienceSettings(out="o", families=tuple(fams), drop_training_families=("outline",))
    assert s.synthetic_data(s.check()[0])["drop_training_families"] == ["outline"]
    assert "drop_training_families" not in ScienceSettings(out="o").synthetic_data(fams)
    with pytest.raises(ScienceError, match="every training family is dropped"):
        ScienceSettings(out="o", families=tuple(fams), drop_training_families=tuple(fams)).check()

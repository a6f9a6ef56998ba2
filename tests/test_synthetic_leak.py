"""Held-out rule instances stay held out under augmentation.

The ARC builder trains on dihedral x colour copies of every training puzzle; a copy of instance R under
augmentation g is a puzzle of the mapping g . R . g^-1, which for colour- or orientation-parameterised families is
often another instance of the same family. These tests check (1) ``conjugate_params`` against the mappings
themselves, and (2) end to end, on the copies the ARC builder really wrote, that no held-out puzzle's rule
reproduces any augmented training copy -- and that the same check does find such copies when the generator
does not account for the augmentation.
"""

import filecmp
import hashlib
import json
import os

import numpy as np
import pytest

from dataset.arc_sources import load_puzzles
from dataset.augment import PUZZLE_ID_SEPARATOR, ArcPuzzle, Augmentation, select_augmentations
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_arc_dataset import main as arc_main
from dataset.build_synthetic_dataset import LeakGuard, generate_synthetic_arc, main
from dataset.families import family_apply
from dataset.rule_identity import HeldOutBehaviour, conjugate_params, demos_determine_rule
from dataset.synthetic_rules import FAMILIES, GridSpec, make_pairs, rule_apply, rule_key


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_conjugate_params_is_the_augmented_mapping(family):
    """For random instances R and augmentations g: the instance conjugate_params names maps g(x) to g(R(x)) on
    the instance's own inputs (None exactly when no instance of the family does, checked for copy_pattern)."""
    rng = np.random.default_rng(sum(map(ord, family)))
    spec = GridSpec(3, 6)
    checked = none = 0
    for _ in range(30):
        rule = FAMILIES[family](rng, spec)
        xs = [rule.make_input(rng) for _ in range(4)]
        for _ in range(4):
            g = Augmentation.random(rng)
            p = conjugate_params(family, rule.params, g.dihedral, g.colour_map)
            want = [None if rule.apply(x) is None else g.apply(rule.apply(x)) for x in xs]
            if p is None:
                none += 1
                assert family == "copy_pattern" and rule.params["mirror"]
                # the same tiling with swapped counts (the only candidate) does not reproduce the copy
                cand = dict(rule.params, recolour=None)
                if g.dihedral in (1, 3, 6, 7):
                    cand.update(ry=rule.params["rx"], rx=rule.params["ry"])
                plain = Augmentation(g.dihedral)
                base = rule_apply(family, dict(rule.params, recolour=None))
                assert not all(_same(rule_apply(family, cand)(plain.apply(x)), plain.apply(base(x))) for x in xs)
                continue
            got = [rule_apply(family, p)(g.apply(x)) for x in xs]
            assert all(_same(a, b) for a, b in zip(got, want)), (rule.params, g, p)
            checked += 1
    assert checked >= 60
    if family == "copy_pattern":
        assert none > 0  # both branches exercised
    # the identity augmentation changes nothing
    rule = FAMILIES[family](rng, spec)
    assert rule_key(family, conjugate_params(family, rule.params, 0, range(10))) == rule.key


def test_rule_key_is_the_mapping():
    a = {"border": 1, "fill": 2, "noise": None}
    assert rule_key("fill_enclosed", a) == rule_key("fill_enclosed", dict(a, noise=7))  # noise: inputs only
    assert rule_key("fill_enclosed", a) != rule_key("fill_enclosed", dict(a, fill=3))
    m = {"map": {"1": 7, "3": 1, "6": 6, "7": 3}}  # 6 -> 6 is a no-op
    assert rule_key("colour_map", m) == rule_key("colour_map", {"map": {"1": 7, "3": 1, "7": 3}})
    g = np.arange(10, dtype=np.uint8).reshape(2, 5)
    assert np.array_equal(
        rule_apply("colour_map", m)(g), rule_apply("colour_map", {"map": {"1": 7, "3": 1, "7": 3}})(g)
    )


def _copies(build_dir: str) -> dict[str, list[Augmentation]]:
    """Base puzzle name -> the augmentations the ARC builder actually wrote (from identifiers.json)."""
    out: dict[str, list[Augmentation]] = {}
    for name in json.load(open(os.path.join(build_dir, "identifiers.json"))):
        if name == "<blank>" or PUZZLE_ID_SEPARATOR not in name:
            continue
        base, aug = Augmentation.parse_name(name)
        out.setdefault(base, []).append(aug)
    return out


def _leaks(raw_prefix: str, build_dir: str) -> list[tuple[str, str]]:
    """(held-out puzzle, training copy) pairs that show the same rule: the held-out puzzle's rule maps every pair
    of the augmented training copy onto its output, and the copy's mapping g . R . g^-1 (computed from the
    training rule R and g themselves) maps every pair of the held-out puzzle onto its output."""
    rules = json.load(open(f"{raw_prefix}_rules.json"))
    train = {p.name: p for p in load_puzzles(["training"], None, raw_prefix)}
    held = {p.name: p for p in load_puzzles(["evaluation"], None, raw_prefix)}
    copies = _copies(build_dir)
    assert set(copies) >= set(train)  # every training puzzle was augmented
    found = []
    for tname, puzzle in train.items():
        fam = rules[tname]["family"]
        rule = family_apply(fam, rules[tname]["params"])
        for g in copies[tname]:
            pairs = [(g.apply(i), g.apply(o)) for i, o in puzzle.train + puzzle.test]

            def copy_rule(x, g=g, rule=rule):
                y = rule(g.invert(x))
                return None if y is None else g.apply(y)

            for hname, hp in held.items():
                r = rules[hname]
                if (
                    r["family"] == fam
                    and all(_same(family_apply(fam, r["params"])(i), o) for i, o in pairs)
                    and all(_same(copy_rule(i), o) for i, o in hp.train + hp.test)
                ):
                    found.append((hname, f"{tname} under {g.tag()}"))
    return found


def test_no_heldout_instance_in_the_augmented_training_copies(tmp_path):
    kw = dict(num_train=64, num_test=24, max_grid=5, seed=3)
    raw = str(tmp_path / "raw")
    main(
        [
            "--output-dir",
            raw,
            "--output-prefix",
            "s",
            "--num-train",
            "64",
            "--num-test",
            "24",
            "--max-grid",
            "5",
            "--seed",
            "3",
            "--canvas-size",
            "10",
            "--build-dir",
            str(tmp_path / "built"),
            "--num-aug",
            "8",
            "--mode",
            "etrm",
            "--no-progress",
        ]
    )
    assert _leaks(os.path.join(raw, "s"), str(tmp_path / "built")) == []
    rules = json.load(open(os.path.join(raw, "s_rules.json")))
    assert sum(r["subset"] == "evaluation" for r in rules.values()) == 24

    # the check itself: data drawn without telling the generator about the augmentation (num_aug=0: training
    # puzzles avoid the held-out instances, their copies do not), built with 8 copies, leaks
    paths = generate_synthetic_arc(str(tmp_path / "raw0"), "s", progress=False, canvas_size=10, **kw)
    build_arc_dataset(
        str(tmp_path / "built0"),
        load_puzzles(["training", "evaluation"], "evaluation", paths["prefix"]),
        test_set_name="evaluation",
        num_aug=8,
        seed=3,
        mode="etrm",
        progress=False,
        canvas_size=10,
    )
    leaks = _leaks(paths["prefix"], str(tmp_path / "built0"))
    assert leaks, "the leak check found nothing on data built without the exclusion"


def test_parameter_shift_notes_flag_a_value_common_held_out_and_rare_in_training():
    from experiments.science.data import parameter_shift_notes
    from experiments.science.report import _data_note_lines

    def rule(subset, family, **params):
        return {"subset": subset, "family": family, "params": params}

    rules = {f"t{i}": rule("training", "translate", dr=1, dc=0, wrap=i >= 4) for i in range(40)}  # 4 of 40 = 10%
    rules.update({f"e{i}": rule("evaluation", "translate", dr=1, dc=0, wrap=i >= 6) for i in range(10)})  # 60%
    rules.update(
        {f"g{i}": rule("training" if i < 30 else "evaluation", "gravity", direction="up", wall=None) for i in range(36)}
    )  # every value as common in both: nothing to say
    rules.update(
        {f"f{i}": rule("evaluation" if i < 3 else "training", "scale_up", ky=2 if i < 3 else 3) for i in range(10)}
    )  # 3 held-out puzzles: too few to say anything
    notes = parameter_shift_notes(rules)
    assert notes == [
        "translate: `wrap=False` is 6 of its 10 held-out puzzles (60%) but 4 of its 40 training "
        "puzzles (10%): its held-out score also measures this shift"
    ]
    assert parameter_shift_notes(rules, train_share=0.09) == []  # 10% of training is over the bound
    lines = _data_note_lines({"settings": {"data_notes": notes}})
    assert lines[0].startswith("**Held-out puzzles unlike the training ones**") and lines[2] == "- " + notes[0]
    assert _data_note_lines({"settings": {}}) == []


def test_translate_alone_shows_no_parameter_shift(tmp_path):
    """Benchmark v1's translate (30% wrapped) trained on 16 unwrapped against 384 wrapped puzzles while most held-out
    shifts were unwrapped, which the report flagged (e68a4fc, docs/record/2026-11-26-translate-wrap.md). Translate
    is unwrapped only now (roll is the wrapped shift): nothing to flag, with or without the augmented copies."""
    from experiments.science.data import parameter_shift_notes

    kw = dict(num_train=160, num_test=40, seed=0, progress=False, canvas_size=8, families=["translate"], max_grid=6)
    for aug in (8, 0):
        paths = generate_synthetic_arc(str(tmp_path / f"aug{aug}"), "s", num_aug=aug, **kw)
        rules = json.load(open(paths["rules"]))
        assert all(set(r["params"]) == {"dr", "dc"} for r in rules.values())
        assert parameter_shift_notes(rules) == []


# ---------------------------------------------------------------------------------------------------------------
# Benchmark v2: leak-free by copy (a leaking copy is replaced, not its puzzle) and by behaviour
# ---------------------------------------------------------------------------------------------------------------
def _heldout_instances(rules: dict) -> list[tuple[str, dict]]:
    return [(r["family"], r["params"]) for r in rules.values() if r["subset"] == "evaluation"]


def test_no_kept_copy_realises_a_heldout_instance_by_key_or_by_behaviour(tmp_path):
    """End to end on the copies the ARC builder wrote (--build-dir, and a separate build that finds the copy lists
    itself): no copy of a training puzzle shows a held-out instance by key (its conjugate instance) nor by
    behaviour (every held-out instance, of any family, applied to every pair of the copy; brute force, without the
    builder's filters). The checks refused copies, and the puzzles kept almost all their copies."""
    raw, built = str(tmp_path / "raw"), str(tmp_path / "built")
    common = ["--num-train", "90", "--num-test", "36", "--max-grid", "6", "--canvas-size", "8", "--seed", "2"]
    paths = main(["--output-dir", raw, "--output-prefix", "s", "--build-dir", built, "--no-progress", *common])
    rules = json.load(open(paths["rules"]))
    held = _heldout_instances(rules)
    held_keys = {rule_key(f, p) for f, p in held}
    train = {p.name: p for p in load_puzzles(["training"], None, paths["prefix"])}
    copies = _copies(built)
    n_copies = 0
    for name, puzzle in train.items():
        fam, params = rules[name]["family"], rules[name]["params"]
        for g in [Augmentation()] + copies.get(name, []):
            n_copies += 1
            q = conjugate_params(fam, params, g.dihedral, g.colour_map)
            assert q is None or rule_key(fam, q) not in held_keys, (name, g)
            pairs = [(g.apply(i), g.apply(o)) for i, o in puzzle.train + puzzle.test]
            for hf, hp in held:
                f = family_apply(hf, hp)
                assert not all(_same(f(i), o) for i, o in pairs), (name, g.tag(), hf, hp)
    leaks = json.load(open(paths["leaks"]))["total"]
    assert leaks["copies refused by key"] >= 10 and leaks["copies refused by structure"] >= 10
    assert n_copies == leaks["copies kept (identity included)"] > 0.97 * 90 * 9
    # the copy lists are what the build wrote, and a separate ARC build of the raw files reads them by itself
    lists = json.load(open(paths["augmentations"]))["puzzles"]
    assert {n: sorted(g.tag() for g in gs) for n, gs in copies.items() if n in train} == {
        n: sorted(t[1:]) for n, t in lists.items() if n in train
    }
    again = str(tmp_path / "again")
    arc_main(["--input-file-prefix", paths["prefix"], "--output-dir", again, "--num-aug", "8", "--seed", "2",
              "--canvas-size", "8", "--mode", "etrm", "--num-workers", "1", "--no-progress"])  # fmt: skip
    assert filecmp.cmp(os.path.join(built, "identifiers.json"), os.path.join(again, "identifiers.json"), shallow=False)
    # without the lists the builder draws its own copies, among them the refused ones
    arc_main(["--input-file-prefix", paths["prefix"], "--output-dir", str(tmp_path / "drawn"), "--num-aug", "8",
              "--seed", "2", "--canvas-size", "8", "--augmentations", "none", "--no-progress"])  # fmt: skip
    drawn = _copies(str(tmp_path / "drawn"))
    differ = sum(len(set(drawn[n]) - set(copies.get(n, []))) for n in train)
    assert 10 <= differ <= sum(leaks.get(f"copies refused by {w}", 0) for w in ("key", "structure", "behaviour"))
    with pytest.raises(SystemExit):  # lists made for 8 copies, asked for 4
        arc_main(["--input-file-prefix", paths["prefix"], "--output-dir", str(tmp_path / "x"), "--num-aug", "4",
                  "--seed", "2", "--no-progress"])  # fmt: skip


def test_a_puzzle_with_a_leaking_copy_is_kept_with_that_copy_replaced():
    """Hold out the instance that one copy of a colour_map puzzle shows: the puzzle itself is no leak and keeps all
    its 9 copies, the leaking copy replaced by a fresh one, the others as the ARC builder draws them."""
    g = lambda *rows: np.array(rows, dtype=np.uint8)  # noqa: E731
    params = {"map": {"1": 2, "2": 1}}
    f = rule_apply("colour_map", params)
    demo = [(x, f(x)) for x in (g([1, 0, 3], [2, 2, 0]), g([0, 1], [3, 2], [1, 0]))]
    test = [(x, f(x)) for x in (g([2, 1, 1], [0, 3, 0]),)]
    name = "p-train-00000-colour_map"
    dih, luts = select_augmentations(ArcPuzzle("training", name, demo, test), 8, 0)
    leaking = conjugate_params("colour_map", params, int(dih[3]), luts[3])
    assert leaking != params  # the copy shows another instance, which we hold out
    key = rule_key("colour_map", leaking)
    guard = LeakGuard([("colour_map", leaking)], num_aug=8, seed=0)
    rule = FAMILIES["colour_map"](np.random.default_rng(0), GridSpec(3, 6))
    rule.params = params
    assert guard.puzzle_leak(rule, demo + test) is None
    kd, kl = guard.copies(name, "colour_map", params, demo, test)
    shows = [rule_key("colour_map", conjugate_params("colour_map", params, d, lut)) for d, lut in zip(kd.tolist(), kl)]
    assert len(kd) == 9 and key not in shows
    before = {(d, lut.tobytes()) for d, lut in zip(dih.tolist(), luts)}
    after = {(d, lut.tobytes()) for d, lut in zip(kd.tolist(), kl)}
    assert (int(dih[3]), luts[3].tobytes()) in before - after and len(after - before) >= 1
    assert {b for b in before if rule_key("colour_map", conjugate_params("colour_map", params, b[0],
            np.frombuffer(b[1], np.uint8))) != key} <= after  # fmt: skip
    assert guard.counts["copies refused by key"] >= 1


def test_a_wrapped_shift_that_never_crosses_an_edge_leaks_the_heldout_unwrapped_shift():
    """A roll puzzle whose content never crosses an edge is the unwrapped shift by behaviour: caught as a leak of a
    held-out translate instance (and its demos do not determine the rule); one that crosses is not. The same
    with the roles swapped (a translate puzzle is a held-out roll), and across families (gravity without a wall is
    a held-out gravity with a wall colour the inputs lack)."""
    roll, shift = {"dr": 1, "dc": -1}, rule_apply("roll", {"dr": 1, "dc": -1})
    inner = [np.zeros((4, 4), np.uint8) for _ in range(3)]
    inner[0][1, 1], inner[1][2, 2], inner[2][1:3, 1] = 3, 4, 3  # away from the edges the shift crosses
    pairs = [(x, shift(x)) for x in inner]
    translate_held = HeldOutBehaviour([("translate", dict(roll)), ("gravity", {"direction": "up", "wall": None})])
    assert translate_held.realised_by(pairs) == rule_key("translate", roll)
    rule = FAMILIES["roll"](np.random.default_rng(0), GridSpec(3, 6))
    rule.params = roll
    guard = LeakGuard([("translate", dict(roll))], num_aug=0, seed=0)  # not roll's key: caught by behaviour
    assert guard.puzzle_leak(rule, pairs) == "behaviour"
    assert not demos_determine_rule("roll", roll, pairs)
    crossing = inner[0].copy()
    crossing[3, 0] = 5  # the shift carries it to (0, 3)
    assert translate_held.realised_by(pairs + [(crossing, shift(crossing))]) is None
    # the other way: every translate puzzle is the roll of the same shift
    assert HeldOutBehaviour([("roll", roll)]).realised_by(pairs) == rule_key("roll", roll)
    # another family: a wall colour absent from the inputs changes nothing
    fall = rule_apply("gravity", {"direction": "down", "wall": None})
    gpairs = [(x, fall(x)) for x in inner]
    assert HeldOutBehaviour([("gravity", {"direction": "down", "wall": 7})]).realised_by(gpairs) is not None
    assert HeldOutBehaviour([("gravity", {"direction": "down", "wall": 3})]).realised_by(gpairs) is None


@pytest.mark.parametrize("family", list(FAMILIES))
def test_behaviour_filters_never_hide_a_real_match(family):
    """The builder's cheap filters (output shape, colour counts, the change's footprint) keep every instance that
    does produce the pairs: each instance is found on its own puzzles' augmented copies through the conjugate."""
    rng = np.random.default_rng(7 + len(family))
    spec = GridSpec(3, 6)
    found = 0
    for _ in range(20):
        rule = FAMILIES[family](rng, spec)
        pairs = make_pairs(rule, rng, 3, max_side=30)
        if pairs is None:
            continue
        g = Augmentation.random(rng)
        q = conjugate_params(family, rule.params, g.dihedral, g.colour_map)
        if q is None:
            continue
        check = HeldOutBehaviour([(family, q), (family, rule.params)])
        assert check.realised_by([(g.apply(x), g.apply(y)) for x, y in pairs]) == rule_key(family, q)
        assert HeldOutBehaviour([(family, rule.params)]).realised_by(pairs) == rule.key
        found += 1
    assert found >= 10


def test_select_augmentations_without_a_predicate_is_unchanged(tmp_path):
    """ARC builds without copy lists are byte-identical to benchmark v1's: the draws of select_augmentations (values
    recorded from the code before the acceptance predicate existed), an accept-everything predicate changes
    nothing, and a build given the default draws as lists writes the same bytes as one without."""
    g = lambda *rows: np.array(rows, dtype=np.uint8)  # noqa: E731
    asym = ArcPuzzle(
        "training",
        "golden-a",
        [(g([1, 2, 0], [0, 3, 0]), g([2, 1, 0], [0, 0, 3]))],
        [(g([4, 0], [0, 1]), g([0, 4], [1, 0]))],
    )
    sym = ArcPuzzle(
        "evaluation", "golden-s", [(g([1, 0, 1], [0, 2, 0], [1, 0, 1]), g([2, 0, 2], [0, 1, 0], [2, 0, 2]))], []
    )
    golden = {
        ("golden-a", 8, 0): ([0, 3, 2, 2, 4, 7, 3, 3, 3], "51fa325ece3497ed"),
        ("golden-a", 3, 7): ([0, 5, 5, 6], "5980571191345872"),
        ("golden-s", 8, 0): ([0, 0, 3, 2, 5, 6, 3, 6, 3], "7ac9bcd65ad76188"),
        ("golden-s", 3, 7): ([0, 0, 5, 7], "d86f3ada92e87d6f"),
    }
    for p in (asym, sym):
        for n, seed in ((8, 0), (3, 7)):
            d, lut = select_augmentations(p, n, seed)
            assert (d.tolist(), hashlib.sha256(lut.tobytes()).hexdigest()[:16]) == golden[(p.name, n, seed)]
            d2, lut2 = select_augmentations(p, n, seed, accept=lambda *_: True)
            assert np.array_equal(d, d2) and np.array_equal(lut, lut2)
    paths = generate_synthetic_arc(str(tmp_path / "raw"), "s", num_train=12, num_test=9, max_grid=5, num_aug=0,
                                   canvas_size=8, progress=False)  # fmt: skip
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", paths["prefix"])
    kw = dict(test_set_name="evaluation", num_aug=4, seed=1, mode="etrm", progress=False, canvas_size=8)
    build_arc_dataset(str(tmp_path / "plain"), puzzles, **kw)
    lists = {p.name: select_augmentations(p, 4, 1) for p in puzzles}
    build_arc_dataset(str(tmp_path / "listed"), puzzles, augmentations=lists, **kw)
    cmp = filecmp.dircmp(str(tmp_path / "plain"), str(tmp_path / "listed"))
    assert not cmp.diff_files and not cmp.left_only and not cmp.right_only
    for sub in ("train", "test"):
        c = filecmp.dircmp(str(tmp_path / "plain" / sub), str(tmp_path / "listed" / sub))
        assert not c.diff_files and not c.left_only and not c.right_only

"""Held-out rule instances stay held out under augmentation.

The ARC builder trains on dihedral x colour copies of every training puzzle; a copy of instance R under
augmentation g is a puzzle of the mapping g . R . g^-1, which for colour- or orientation-parameterised families is
often another instance of the same family. These tests check (1) ``conjugate_params`` against the mappings
themselves, and (2) end to end, on the copies the ARC builder really wrote, that no held-out puzzle's rule
reproduces any augmented training copy -- and that the same check does find such copies when the generator
does not account for the augmentation.
"""

import json
import os

import numpy as np
import pytest

from dataset.arc_sources import load_puzzles
from dataset.augment import PUZZLE_ID_SEPARATOR, Augmentation
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_synthetic_dataset import generate_synthetic_arc, main
from dataset.rule_identity import conjugate_params
from dataset.synthetic_rules import FAMILIES, GridSpec, rule_apply, rule_key


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
        rule = rule_apply(fam, rules[tname]["params"])
        for g in copies[tname]:
            pairs = [(g.apply(i), g.apply(o)) for i, o in puzzle.train + puzzle.test]

            def copy_rule(x, g=g, rule=rule):
                y = rule(g.invert(x))
                return None if y is None else g.apply(y)

            for hname, hp in held.items():
                r = rules[hname]
                if (
                    r["family"] == fam
                    and all(_same(rule_apply(fam, r["params"])(i), o) for i, o in pairs)
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


def test_the_leak_free_split_leaves_translate_training_few_unwrapped_shifts(tmp_path):
    """The real case: translate alone, 8 augmented copies excluded from showing a held-out instance, trains on a few
    percent non-wrapped shifts while most held-out ones are (at 400 training / 40 held-out puzzles: 16 against 28;
    e68a4fc, docs/record/2026-11-26-translate-wrap.md)."""
    from experiments.science.data import parameter_shift_notes

    kw = dict(
        num_train=160,
        num_test=40,
        seed=0,
        progress=False,
        canvas_size=8,
        families=["translate"],
        min_grid=3,
        max_grid=6,
    )
    notes = {}
    for aug in (8, 0):
        paths = generate_synthetic_arc(str(tmp_path / f"aug{aug}"), "s", num_aug=aug, **kw)
        notes[aug] = parameter_shift_notes(json.load(open(paths["prefix"] + "_rules.json")))
    assert len(notes[8]) == 1 and notes[8][0].startswith("translate: `wrap=False` is ")
    assert notes[0] == []  # without the copies to exclude, training keeps its unwrapped shifts

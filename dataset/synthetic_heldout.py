"""Held-out rule instances of the synthetic builder (:mod:`dataset.build_synthetic_dataset`) and what keeps them out
of training: drawing a puzzle whose demos determine its rule, reserving the held-out instances (the shift families
hold out shifts spread over the (|dr|, |dc|) cells), the :class:`LeakGuard` that refuses training puzzles and
augmented copies showing a held-out instance, and the sidecars that report on it (``<prefix>_leaks.json``, the shift
table ``<prefix>_shifts.json``)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from dataset.augment import ArcPuzzle, Augmentation, select_augmentations
from dataset.errors import DatasetError
from dataset.families import ALL_FAMILIES, choose_heldout_structures, novelty, structure
from dataset.rule_identity import HeldOutBehaviour, conjugate_params, demos_determine_rule
from dataset.synthetic_rules import (
    MAX_SHIFT,
    SHIFT_CELLS,
    SHIFT_FAMILIES,
    GridSpec,
    RuleInstance,
    make_pairs,
    rule_key,
    shift_cells,
    shift_instance,
)

log = logging.getLogger(__name__)
# the copy list of a puzzle without augmented copies (dihedral indices, colour tables): the puzzle itself
IDENTITY_COPY = (np.zeros(1, np.int64), np.arange(10, dtype=np.uint8)[None])


def _draw_puzzle(rng: np.random.Generator, rule: RuleInstance, canvas_size: int) -> Optional[tuple[list, list]]:
    """(demo pairs, test pairs) of one puzzle of ``rule``, or None (no pairs fit, or the demos do not determine
    the rule: :func:`dataset.rule_identity.demos_determine_rule`)."""
    n_demo, n_test = int(rng.integers(2, 6)), int(rng.integers(1, 3))
    pairs = make_pairs(rule, rng, n_demo + n_test, max_side=canvas_size)
    if pairs is None or not demos_determine_rule(rule.family, rule.params, pairs[:n_demo]):
        return None
    return pairs[:n_demo], pairs[n_demo:]


def _try_puzzle(rng: np.random.Generator, rule: RuleInstance, canvas_size: int, tries: int = 5):
    """:func:`_draw_puzzle`, up to ``tries`` times (an instance whose demos rarely determine it, a roll by 2 on grids
    of 4 rows, is not thereby made rarer than the others)."""
    for _ in range(tries):
        drawn = _draw_puzzle(rng, rule, canvas_size)
        if drawn is not None:
            return drawn
    return None


@dataclass
class LeakGuard:
    """Keeps the held-out rule instances out of training, by key and by behaviour, puzzle by puzzle and copy by
    copy. A training candidate is redrawn when its own instance is held out (by key) or when a held-out instance
    (any family) maps every one of its pair inputs to the pair's output (by behaviour:
    :class:`dataset.rule_identity.HeldOutBehaviour`). Its augmented copies (:meth:`copies`) are drawn as the
    ARC builder draws them, except that a copy that would show a held-out instance -- its conjugate instance
    (:func:`dataset.rule_identity.conjugate_params`) is held out, or a held-out instance produces its pairs -- is
    refused and the next candidate drawn in its place; the builder then gets these lists
    (``<prefix>_augmentations.json``). ``counts``: what was refused."""

    heldout: list  # the held-out instances, (family, params)
    num_aug: int
    seed: int
    counts: Counter = field(default_factory=Counter)
    structures: frozenset = frozenset()  # the held-out structures (dataset.families.structure keys)

    def __post_init__(self) -> None:
        self.heldout_keys = {rule_key(f, p) for f, p in self.heldout}
        self.behaviour = HeldOutBehaviour(self.heldout)

    def _count(self, family: str, what: str) -> None:
        self.counts[what] += 1
        self.counts[f"{family}: {what}"] += 1

    def taken_shifts(self, family: str) -> set:
        """The shifts (dr, dc) a training puzzle of shift family ``family`` may not show: those held out as that
        family and, for translate, those held out as roll (an unwrapped shift is the wrapped one on content that
        stays on the grid)."""
        fams = ("translate", "roll") if family == "translate" else (family,)
        return {(p["dr"], p["dc"]) for f, p in self.heldout if f in fams}

    def puzzle_leak(self, rule: RuleInstance, pairs: list) -> Optional[str]:
        """ "key" / "behaviour" when the puzzle itself shows a held-out instance, else None."""
        if rule.key in self.heldout_keys:
            return "key"
        if structure(rule.family, rule.params) in self.structures:
            return "structure"
        if len(self.behaviour) and self.behaviour.realised_by(pairs) is not None:
            return "behaviour"
        return None

    def copies(self, name: str, family: str, params: dict, demo: list, test: list) -> tuple[np.ndarray, np.ndarray]:
        """The puzzle's copies (identity first): :func:`dataset.augment.select_augmentations` with the leaking
        candidates refused."""
        pairs = demo + test

        def accept(d: int, lut: np.ndarray) -> bool:
            p = conjugate_params(family, params, d, lut)
            if p is not None and rule_key(family, p) in self.heldout_keys:
                self._count(family, "copies refused by key")
                return False
            if p is not None and structure(family, p) in self.structures:
                self._count(family, "copies refused by structure")
                return False
            aug = Augmentation(d, tuple(int(c) for c in lut))
            if (
                len(self.behaviour)
                and self.behaviour.realised_by([(aug.apply(x), aug.apply(y)) for x, y in pairs]) is not None
            ):
                self._count(family, "copies refused by behaviour")
                return False
            return True

        dih, luts = select_augmentations(ArcPuzzle("training", name, demo, test), self.num_aug, self.seed, accept)
        if len(dih) < self.num_aug + 1:
            self.counts["copies missing (candidates ran out)"] += self.num_aug + 1 - len(dih)
        return dih, luts


class TrainedInstances:
    """What training shows, for the reverse checks of benchmark v3: every training puzzle's instance and the
    instance each of its kept augmented copies shows (:func:`dataset.rule_identity.conjugate_params`), by key and as
    mappings. A held-out puzzle whose pairs one of them produces is redrawn (:meth:`realised_by`); an evaluation copy
    that shows one of them, or any structure that is not held out, is refused (:meth:`eval_copies`), so that every
    evaluation copy is itself a held-out instance."""

    def __init__(self, train: list, lists: dict, structures: frozenset, num_aug: int, seed: int):
        self.structures, self.num_aug, self.seed = structures, num_aug, seed
        self.trained_families = {meta["family"] for _, meta, _, _ in train}
        instances = []
        for name, meta, _, _ in train:
            fam, p = meta["family"], meta["params"]
            instances.append((fam, p))
            dih, luts = lists.get(name, IDENTITY_COPY)
            for d, lut in zip(dih.tolist(), luts):
                q = conjugate_params(fam, p, d, lut)
                if q is not None:
                    instances.append((fam, q))
        self.keys = {rule_key(f, p) for f, p in instances}
        self.behaviour = HeldOutBehaviour(instances)
        self.counts: Counter = Counter()

    def realised_by(self, pairs: list) -> Optional[str]:
        """The key of a trained instance that maps every input of ``pairs`` to its output, or None."""
        return self.behaviour.realised_by(pairs)

    def eval_copies(self, name: str, family: str, params: dict, demo: list, test: list):
        """The evaluation puzzle's copies (identity first): candidate copies whose instance is not a held-out one --
        a structure that is not held out (a gravity held out as down-with-wall seen turned to the left), a key
        training shows, or pairs a trained instance of any family produces -- are refused and the next drawn."""

        def accept(d: int, lut: np.ndarray) -> bool:
            p = conjugate_params(family, params, d, lut)
            if p is None or (family in self.trained_families and structure(family, p) not in self.structures):
                self.counts[f"{family}: evaluation copies refused (not a held-out structure)"] += 1
                return False
            if rule_key(family, p) in self.keys:
                self.counts[f"{family}: evaluation copies refused (a trained instance)"] += 1
                return False
            aug = Augmentation(d, tuple(int(c) for c in lut))
            if self.realised_by([(aug.apply(x), aug.apply(y)) for x, y in demo + test]) is not None:
                self.counts[f"{family}: evaluation copies refused (a trained instance produces them)"] += 1
                return False
            return True

        return select_augmentations(ArcPuzzle("evaluation", name, demo, test), self.num_aug, self.seed, accept)


def trained_copy_counts(rules: dict, lists: dict) -> dict[str, int]:
    """Per family of the evaluation puzzles: how many evaluation copies (each puzzle itself and its listed copies)
    show a rule instance that a training puzzle or one of its copies shows, from the written files alone
    (``<prefix>_rules.json``: name -> subset, family, params; ``<prefix>_augmentations.json``'s lists). Benchmark v3
    requires 0 for every family; a v2 build counts hundreds (its evaluation copies were not restricted)."""

    def shown(name: str, meta: dict) -> list[str]:
        dih, luts = lists.get(name, IDENTITY_COPY)
        out = []
        for d, lut in zip(dih.tolist(), luts):
            q = conjugate_params(meta["family"], meta["params"], d, lut)
            out.append("?" if q is None else rule_key(meta["family"], q))
        return out

    trained = {k for n, m in rules.items() if m["subset"] == "training" for k in shown(n, m)}
    counts: dict[str, int] = {}
    for n, m in sorted(rules.items()):
        if m["subset"] == "evaluation":
            counts[m["family"]] = counts.get(m["family"], 0) + sum(k in trained for k in shown(n, m))
    return counts


def _free_shift(rng: np.random.Generator, spec: GridSpec, rule: RuleInstance, taken: set) -> RuleInstance:
    """A shift-family candidate whose shift is held out becomes another sign variant of the same (|dr|, |dc|) cell
    that is not (when there is one), so a cell with a held-out shift stays as common in training as the others."""
    dr, dc = rule.params["dr"], rule.params["dc"]
    if (dr, dc) not in taken:
        return rule
    free = sorted({(sr * abs(dr), sc * abs(dc)) for sr in (1, -1) for sc in (1, -1)} - taken)
    if not free:
        return rule
    return shift_instance(rule.family, rng, spec, *free[int(rng.integers(len(free)))])


def _shift_plan(rng: np.random.Generator, spec: GridSpec, n: int) -> list[tuple[int, int]]:
    """``n`` distinct shifts (at most all of them) spread over the (|dr|, |dc|) cells: cycles through the cells in
    seeded orders, taking one unused sign variant of each, so that no cell is held out more than the others."""
    cells = shift_cells(spec)
    variants = {}
    for a, b in cells:
        signed = sorted({(sr * a, sc * b) for sr in (1, -1) for sc in (1, -1)})
        variants[(a, b)] = [signed[i] for i in rng.permutation(len(signed))]
    plan: list[tuple[int, int]] = []
    while len(plan) < n and any(variants.values()):
        for i in rng.permutation(len(cells)):
            if variants[cells[i]] and len(plan) < n:
                plan.append(variants[cells[i]].pop())
    return plan


def _reserve_heldout(
    rng: np.random.Generator, counts: dict[str, int], spec: GridSpec, per_instance: int, canvas_size: int
) -> tuple[dict[str, list[RuleInstance]], dict[str, list[str]]]:
    """Per family, ceil(count / per_instance) distinct rule instances (that can make a puzzle) to hold out, all of
    the family's held-out structures (:func:`dataset.families.choose_heldout_structures`) -> (instances, held-out
    structure keys per family). The shift families (translate, roll) hold out the same shifts
    (:func:`_shift_plan`; the first ones of one plan; a shift is the structure): an unwrapped shift is also a
    wrapped one on content that stays on the grid, so a shift held out as roll alone would take that shift from
    translate's training puzzles as well (a leak by behaviour)."""
    held: dict[str, list[RuleInstance]] = {}
    structures: dict[str, list[str]] = {}
    plan = _shift_plan(rng, spec, 4 * len(SHIFT_CELLS)) if any(f in SHIFT_FAMILIES for f in counts) else []
    for fam, count in counts.items():
        want, rules, keys = -(-count // per_instance), [], set()
        if fam in SHIFT_FAMILIES:  # the plan's first shifts that make a puzzle
            for dr, dc in plan:
                if len(rules) == want:
                    break
                rule = shift_instance(fam, rng, spec, dr, dc)
                if _try_puzzle(rng, rule, canvas_size) is not None:
                    rules.append(rule)
        else:
            chosen = set(choose_heldout_structures(rng, fam, spec)) if count else set()
            for _ in range(2000 + 80 * want):
                if len(rules) == want:
                    break
                rule = ALL_FAMILIES[fam](rng, spec)
                if chosen and structure(fam, rule.params) not in chosen:
                    continue
                if rule.key not in keys and _try_puzzle(rng, rule, canvas_size) is not None:
                    rules.append(rule)
                    keys.add(rule.key)
        if count and not rules:
            raise DatasetError(
                f"--families: family {fam!r} makes no puzzle within the grid limits "
                f"(--max-grid {spec.max_grid}, --canvas-size {canvas_size})"
            )
        held[fam] = rules
        if fam in SHIFT_FAMILIES:
            structures[fam] = sorted({structure(fam, r.params) for r in rules})
        else:
            structures[fam] = sorted(chosen)
    return held, structures


SHIFTS_SUFFIX = "_shifts.json"
SHIFT_TABLE_COLUMNS = ("training", "training_copies", "heldout")


def shift_table(train: list, test: list, lists: dict) -> dict:
    """Per shift family present (translate, roll): how often each (|dr|, |dc|) occurs, a 4 x 4 count table (rows
    |dr| 0..3, columns |dc| 0..3; the (0, 0) cell is empty by construction) for the training puzzles, every
    copy training sees (the identity and the augmented copies of ``lists``; a copy shows the conjugate shift) and
    the held-out puzzles. Empty when no shift family is present."""
    size = MAX_SHIFT + 1
    out: dict = {}

    def count(fam: str, column: str, dr: int, dc: int) -> None:
        if fam not in out:
            out[fam] = {c: [[0] * size for _ in range(size)] for c in SHIFT_TABLE_COLUMNS}
        out[fam][column][abs(dr)][abs(dc)] += 1

    for name, meta, _, _ in train:
        fam, p = meta["family"], meta["params"]
        if fam not in SHIFT_FAMILIES:
            continue
        count(fam, "training", p["dr"], p["dc"])
        dih, luts = lists.get(name, IDENTITY_COPY)
        for d, lut in zip(dih.tolist(), luts):
            q = conjugate_params(fam, p, d, lut)
            count(fam, "training_copies", q["dr"], q["dc"])
    for _, meta, _, _ in test:
        if meta["family"] in SHIFT_FAMILIES:
            count(meta["family"], "heldout", meta["params"]["dr"], meta["params"]["dc"])
    return (
        {
            "doc": "per shift family and column: counts[|dr|][|dc|] (rows |dr| 0..3, columns |dc| 0..3)",
            "families": out,
        }
        if out
        else {}
    )


def format_shift_table(table: dict) -> list[str]:
    """The shift table as text lines: per family one row per |dr|, the three columns side by side."""
    lines = []
    for fam, cols in table.get("families", {}).items():
        lines.append(f"shift table, {fam}: rows |dr| 0..3 x columns |dc| 0..3 -- " + " | ".join(SHIFT_TABLE_COLUMNS))
        for a in range(MAX_SHIFT + 1):
            lines.append(
                f"  |dr|={a}: "
                + " | ".join(" ".join(f"{cols[c][a][b]:5d}" for b in range(MAX_SHIFT + 1)) for c in cols)
            )
    return lines


def leak_summary(counts: Counter, num_aug: int, lists: dict) -> dict:
    """What the leak checks refused (``<prefix>_leaks.json``): in total and per family."""
    total = {k: v for k, v in sorted(counts.items()) if ": " not in k}
    total["copies kept (identity included)"] = int(sum(len(d) for d, _ in lists.values()))
    per_family: dict = {}
    for k, v in sorted(counts.items()):
        if ": " in k:
            fam, what = k.split(": ", 1)
            per_family.setdefault(fam, {})[what] = v
    return {
        "doc": "training candidates redrawn because they show a held-out rule instance (by key: their own "
        "instance; by behaviour: a held-out instance of any family produces their pairs) and augmented copies "
        "refused for the same reasons (each replaced by the next candidate copy where one was left)",
        "num_aug": num_aug,
        "total": total,
        "per_family": per_family,
    }


STRUCTURES_SUFFIX = "_structures.json"


def structure_table(train: list, test: list, lists: dict, heldout: dict[str, list[str]]) -> dict:
    """Per family: its held-out structures (what is new about each against training, puzzles and copies that show
    it) and the structures training shows (puzzles, copies): ``<prefix>_structures.json``."""
    fams: dict = {}

    def add(side: str, name: str, meta: dict) -> None:
        fam = meta["family"]
        row = fams.setdefault(fam, {"heldout": {}, "training": {}})[side]
        own = structure(fam, meta["params"])
        row.setdefault(own, {"puzzles": 0, "copies": 0})["puzzles"] += 1
        dih, luts = lists.get(name, IDENTITY_COPY)
        for d, lut in zip(dih.tolist(), luts):
            q = conjugate_params(fam, meta["params"], d, lut)
            key = "(not an instance of the family)" if q is None else structure(fam, q)
            row.setdefault(key, {"puzzles": 0, "copies": 0})["copies"] += 1

    for name, meta, _, _ in train:
        add("training", name, meta)
    for name, meta, _, _ in test:
        add("heldout", name, meta)
    for fam, keys in heldout.items():
        row = fams.setdefault(fam, {"heldout": {}, "training": {}})
        trained = set(row["training"])
        for k in keys:
            row["heldout"].setdefault(k, {"puzzles": 0, "copies": 0})["novelty"] = (
                novelty(k, trained) if trained else "family never trained"
            )
    return {
        "doc": "per family: held-out structures (novelty against the training structures; puzzles = evaluation "
        "puzzles of that structure, copies = evaluation copies showing it, the puzzle itself included) and the "
        "structures the training puzzles and their copies show",
        "families": {f: fams[f] for f in sorted(fams)},
    }


def format_structure_table(table: dict) -> list[str]:
    """One line per family: the held-out structures with what is new about them, and how many structures and
    puzzles training has."""
    lines = []
    for fam, row in table.get("families", {}).items():
        held = "; ".join(
            f"{k.split(':', 1)[1]} ({v.get('novelty', '?')}: {v['puzzles']} puzzles, {v['copies']} copies)"
            for k, v in sorted(row["heldout"].items())
        )
        n_train = sum(v["puzzles"] for v in row["training"].values())
        lines.append(
            f"structures, {fam}: held out {held or 'none'} | training {len(row['training'])} structures, "
            f"{n_train} puzzles"
        )
    return lines


def family_split(
    families: Optional[Sequence[str]],
    holdout_families: Sequence[str],
    train_only_families: Sequence[str],
    num_train: int,
    num_test: int,
) -> tuple[list[str], list[str], list[str]]:
    """(every family, the training families, the evaluation families) of the builder's options, checked."""
    families = list(families) if families else list(ALL_FAMILIES)
    for f in list(families) + list(holdout_families):
        if f not in ALL_FAMILIES:
            raise DatasetError(f"--families/--holdout-families: unknown family {f!r} (known: {sorted(ALL_FAMILIES)})")
    for f in train_only_families:
        if f not in families or f in holdout_families:
            raise DatasetError(
                f"--train-only-families: {f!r} must be one of --families and not held out (families: {families})"
            )
    train_fams = [f for f in families if f not in holdout_families]
    test_fams = list(holdout_families) if holdout_families else [f for f in families if f not in train_only_families]
    if num_test and not test_fams:
        raise DatasetError("--train-only-families: every family is training-only; nothing left to evaluate")
    if num_train and not train_fams:
        raise DatasetError("--holdout-families: every family is held out; nothing left for training")
    return families, train_fams, test_fams


def check_drop(drop: Sequence[str], families: list[str], train_fams: list[str]) -> None:
    """Refuse ``--drop-training-families`` before the draw: a family not in ``families``, or every training family."""
    for f in drop:
        if f not in families:
            raise DatasetError(f"--drop-training-families: {f!r} is not one of --families ({families})")
    if drop and set(train_fams) <= set(drop):
        raise DatasetError(f"--drop-training-families {' '.join(drop)}: every training family; no training puzzle left")


def drop_training(train: list, lists: dict, drop: Sequence[str]) -> tuple[list, dict]:
    """``train`` and the copy lists without the training puzzles of the ``drop`` families (checked by
    :func:`check_drop` before the draw)."""
    if not drop:
        return train, lists
    kept = [t for t in train if t[1]["family"] not in drop]
    dropped = {t[0] for t in train} - {t[0] for t in kept}
    log.info("synthetic: %d training puzzles of %s left out (--drop-training-families)", len(dropped), list(drop))
    return kept, {n: v for n, v in lists.items() if n not in dropped}

"""The science command's data: where its puzzles come from and how its table groups them.

Two sources, one pipeline (:func:`experiments.science.run.run_science_command` trains and evaluates both alike):

* the synthetic rule families (default): ``python -m dataset.build_synthetic_dataset ... --build-dir
  OUT/data/built`` (:func:`prepare_synthetic`); the table's rows are the rule families of the builder's
  ``synth_rules.json``;
* your own puzzles (``--input-file-prefix P``): the kaggle-layout files ``P_training_challenges.json``,
  ``P_training_solutions.json``, ``P_evaluation_challenges.json``, ``P_evaluation_solutions.json`` (a
  ``_solutions.json`` file may be left out when its challenges carry the test outputs), built by ``python -m
  dataset.build_arc_dataset --input-file-prefix P --subsets training evaluation --test-set-name evaluation
  --mode etrm`` (:func:`prepare_files`): the evaluation puzzles are the held-out ones. The table's rows are the
  groups of a ``--groups`` JSON file (puzzle id -> group name, or -> an object with a ``family`` / ``group``
  field, e.g. the synthetic builder's ``_rules.json``) covering every puzzle id, else the **id prefix**: the part
  of the id before its first ``_`` or ``-`` (the whole id when it has neither; :func:`id_prefix`).

Colour / dihedral augmentation of your own files defaults to none (``num_aug`` 0): the ARC builder's copies of a
training puzzle can show a held-out parameter of its rule (a recolouring into the held-out colours, a held-out
orientation), so augmentation can leak a held-out rule instance into training. Opt in with ``--num-aug K``
(docs/science_command.md, "Augmentation can leak a held-out rule instance into training").

The train-fit set (:func:`prepare_fit`): a seeded sample of the training puzzles, built as a test split
(``OUT/data/fit/built``) so that ``evaluate.py`` scores each run on puzzles it was trained on, with the same
augmented copies; the table shows this next to the held-out score of every family / group.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from core.io import read_json, write_json_atomic
from dataset.arc_sources import check_canvas_size, load_kaggle_subset
from dataset.augment import AUGMENTATION_LISTS_SUFFIX, ArcPuzzle
from dataset.breadth_families import BREADTH_FAMILIES
from dataset.errors import DatasetError
from dataset.families import GROUPS
from dataset.tokens import ARC_MAX_GRID
from experiments.science.common import TOTAL_ROW, ScienceError, check_same, read_json_or_none, run_logged, say

DATA_PREFIX = "synth"
SUBSETS = ("training", "evaluation")
FIT_PREFIX = "fit"
ID_SEPARATORS = ("_", "-")
FIT_SEED = 0xF17  # with the data seed: which training puzzles the train-fit set samples


@dataclass
class ScienceData:
    """The built data of one --out: ``settings`` (data/settings.json: what it was built with; compared on reuse),
    the built dataset dir, ``rules`` (puzzle id -> {"subset": training | evaluation, "family": its row of the
    table}), how the rows were found (``grouping``, for the report) and the kaggle-layout prefix of its training
    puzzles (the train-fit set samples them)."""

    settings: dict
    built: str
    rules: dict
    grouping: str
    training_prefix: str
    notes: list = field(default_factory=list)  # what the report says about the data (parameter_shift_notes)
    headline: Optional[list] = None  # the families of the table's headline row (headline_families); None: all
    groups: Optional[dict] = None  # the group rows (group_rows): covered / open families


@dataclass
class UserPuzzles:
    """Your own puzzles, read and validated before any work (:func:`load_user_puzzles`)."""

    prefix: str
    files: dict  # file name -> sha256 of its bytes (the data's identity in data/settings.json)
    puzzles: dict  # subset -> [ArcPuzzle]
    rules: dict  # as ScienceData.rules
    grouping: str
    max_side: int  # the largest grid side of any pair (the default canvas)


# ---------------------------------------------------------------------------------------------------------------
# Building (shared by both sources)
# ---------------------------------------------------------------------------------------------------------------
def _built(built: str) -> bool:
    return os.path.exists(os.path.join(built, "test", "dataset.json"))


def _build_once(out: str, settings: dict, cmd: list[str], *, what: str, no_train: bool, ready: bool = True) -> str:
    """Stage 1: run the builder ``cmd`` into OUT/data/built unless it was built with the same ``settings``
    (``ready``: the source's own outputs exist too). Data built with other settings is refused."""
    data = os.path.join(out, "data")
    built, spath = os.path.join(data, "built"), os.path.join(data, "settings.json")
    saved = read_json_or_none(spath)
    if saved is not None and ("files" in saved) != ("files" in settings):
        held = "your files (--input-file-prefix)" if "files" in saved else "the synthetic rule families"
        asked = "your files (--input-file-prefix)" if "files" in settings else "the synthetic rule families"
        raise ScienceError(f"{spath}: {out} holds data of {held}, this command asks for {asked}; use a new --out")
    if saved is not None and "files" not in settings and saved.get("benchmark") != settings.get("benchmark"):
        raise ScienceError(
            f"{spath}: {out} holds data of synthetic benchmark v{saved.get('benchmark', 1)}, this command builds "
            f'v{settings.get("benchmark")} (docs/science.md, "The benchmark"); use a new --out (its runs were '
            "trained on the other benchmark)"
        )
    if _built(built) and ready:
        check_same(spath, saved, settings, "the data")
        if saved == settings:
            say(f"data: {built} already built, reused")
            return built
    if no_train:
        raise ScienceError(
            f"--no-train: {out} has no data built by an earlier science command (run it without --no-train first)"
        )
    say(f"data: {what} -> {built}")
    log = os.path.join(data, "build.log")
    rc, secs, last = run_logged(cmd, log)
    if rc != 0:
        raise ScienceError(f"data build failed (exit {rc}): {last} (log: {log})")
    write_json_atomic(spath, settings)
    say(f"data: built in {secs:.0f} s")
    return built


def _synthetic_command(settings: dict, raw: str, built: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "dataset.build_synthetic_dataset",
        "--output-dir",
        raw,
        "--output-prefix",
        DATA_PREFIX,
        "--num-train",
        str(settings["num_train"]),
        "--num-test",
        str(settings["num_test"]),
        "--min-grid",
        str(settings["min_grid"]),
        "--max-grid",
        str(settings["max_grid"]),
        "--canvas-size",
        str(settings["canvas_size"]),
        "--seed",
        str(settings["seed"]),
        "--heldout-puzzles-per-instance",
        str(settings["heldout_puzzles_per_instance"]),
        "--families",
        *settings["families"],
    ]
    if settings["holdout_families"]:
        cmd += ["--holdout-families", *settings["holdout_families"]]
    if settings.get("train_only_families"):
        cmd += ["--train-only-families", *settings["train_only_families"]]
    if settings.get("drop_training_families"):
        cmd += ["--drop-training-families", *settings["drop_training_families"]]
    if settings.get("breadth_families"):
        cmd += ["--breadth-families", *settings["breadth_families"]]
    return cmd + [
        "--build-dir",
        built,
        "--num-aug",
        str(settings["num_aug"]),
        "--mode",
        "etrm",
        "--overwrite",
        "--num-workers",
        "1",
        "--no-progress",
    ]


def _arc_command(
    prefix: str, subsets: list[str], test_set: str, built: str, *, num_aug: int, seed: int, canvas_size: int
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dataset.build_arc_dataset",
        "--input-file-prefix",
        prefix,
        "--output-dir",
        built,
        "--subsets",
        *subsets,
        "--test-set-name",
        test_set,
        "--mode",
        "etrm",
        "--num-aug",
        str(num_aug),
        "--seed",
        str(seed),
        "--canvas-size",
        str(canvas_size),
        "--overwrite",
        "--num-workers",
        "1",
        "--no-progress",
    ]


def headline_families(families: list[str]) -> Optional[list[str]]:
    """The families of the headline figure: those of ``families`` that are in a group of
    :data:`dataset.families.GROUPS` (the covered headline families and the open ones; roll is in neither), or None
    when that is all of them (the table's total row is then the headline) or none of them."""
    inside = [f for f in families if any(f in g for g in GROUPS.values())]
    return inside if inside and len(inside) < len(families) else None


def group_rows(families: list[str]) -> Optional[dict[str, list[str]]]:
    """The table's group rows (:data:`dataset.families.GROUPS`: covered, open) over ``families``, when both groups
    are present; else None."""
    groups = {g: [f for f in families if f in fams] for g, fams in GROUPS.items()}
    return groups if all(groups.values()) else None


def synthetic_rules_path(out: str) -> str:
    """The synthetic builder's rules.json of an --out (puzzle id -> family, params)."""
    return os.path.join(out, "data", "raw", f"{DATA_PREFIX}_rules.json")


def prepare_synthetic(out: str, settings: dict, *, no_train: bool = False) -> ScienceData:
    """The synthetic rule families built by the user-facing builder (skipped when already built with the same
    settings); rows of the table = rule families (the builder's rules.json)."""
    raw = os.path.join(out, "data", "raw")
    rules_path = synthetic_rules_path(out)
    nf = len(settings["families"])
    what = (
        f"{settings['num_train']} training + {settings['num_test']} held-out puzzles, {nf} "
        f"famil{'y' if nf == 1 else 'ies'}, canvas {settings['canvas_size']}"
    )
    built = _build_once(
        out,
        settings,
        _synthetic_command(settings, raw, os.path.join(out, "data", "built")),
        what=what,
        no_train=no_train,
        ready=os.path.exists(rules_path),
    )
    rules = read_json(rules_path, ScienceError)
    notes = parameter_shift_notes(rules)
    for note in notes:
        say("data: " + note.replace("`", ""))
    return ScienceData(
        settings,
        built,
        rules,
        f"rule family (the builder's {os.path.relpath(rules_path, out)})",
        os.path.join(raw, DATA_PREFIX),
        notes,
        headline_families(list(settings["families"])),
        group_rows(list(settings["families"])),
    )


def parameter_shift_notes(
    rules: dict, *, heldout_share: float = 0.5, train_share: float = 0.1, min_heldout: int = 4
) -> list[str]:
    """Rule parameters whose value dominates a family's held-out puzzles but is rare in its training puzzles
    (shares of puzzles; at least ``min_heldout`` held-out puzzles of the family). The leak-free split can cause
    this: a value whose instances are mostly held out (with their dihedral / colour conjugates) all but leaves
    training; on benchmark v1 translate alone trained on 4% non-wrapped shifts while 70% of its held-out shifts
    were non-wrapped (e68a4fc, docs/record/2026-11-26-translate-wrap.md; benchmark v2 splits the wrapped shift off
    as roll, docs/record/2026-11-27-benchmark-v2.md). The held-out score of such a family measures that shift as
    well as reading the rule."""
    counts: dict[tuple[str, str], Counter] = {}  # (family, subset) -> Counter of its puzzles' (key, value)
    sizes: Counter = Counter()  # (family, subset) -> puzzles
    for meta in rules.values():
        if isinstance(meta, dict) and isinstance(meta.get("params"), dict):
            fs = (meta["family"], meta.get("subset"))
            sizes[fs] += 1
            counts.setdefault(fs, Counter()).update(
                (k, v) for k, v in meta["params"].items() if isinstance(v, (bool, int, str))
            )
    notes = []
    for fam in sorted({f for f, _ in counts}):
        n_train, n_held = sizes[(fam, "training")], sizes[(fam, "evaluation")]
        if n_held < min_heldout or not n_train:
            continue
        train = counts.get((fam, "training"), Counter())
        for (key, value), h in sorted(counts[(fam, "evaluation")].items(), key=repr):
            t = train[(key, value)]
            if h / n_held >= heldout_share and t / n_train <= train_share:
                notes.append(
                    f"{fam}: `{key}={value}` is {h} of its {n_held} held-out puzzles ({h / n_held:.0%}) "
                    f"but {t} of its {n_train} training puzzles ({t / n_train:.0%}): its held-out score "
                    f"also measures this shift"
                )
    return notes


# ---------------------------------------------------------------------------------------------------------------
# Your own puzzles
# ---------------------------------------------------------------------------------------------------------------
def id_prefix(puzzle_id: str) -> str:
    """A puzzle's group when no --groups file is given: the part of its id before the first '_' or '-' (the whole
    id when it has neither, or starts with one). ``flip_003`` -> ``flip``, ``recol-12-b`` -> ``recol``."""
    cut = min((i for i in (puzzle_id.find(s) for s in ID_SEPARATORS) if i > 0), default=len(puzzle_id))
    return puzzle_id[:cut]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_subset(prefix: str, subset: str) -> list[ArcPuzzle]:
    cfile, sfile = f"{prefix}_{subset}_challenges.json", f"{prefix}_{subset}_solutions.json"
    if not os.path.isfile(cfile):
        raise ScienceError(
            f"--input-file-prefix {prefix}: {cfile}: no such file (the science command reads "
            f"{os.path.basename(prefix)}_{{training,evaluation}}_{{challenges,solutions}}.json)"
        )
    try:
        return load_kaggle_subset(prefix, subset)
    except DatasetError as e:
        if not os.path.exists(sfile):  # the challenges lack test outputs and there is no solutions file
            raise ScienceError(f"--input-file-prefix {prefix}: {sfile}: no such file, and {e}") from None
        raise ScienceError(f"--input-file-prefix {prefix}: {e}") from None


def _group_of(path: str, pid: str, value: Any) -> str:
    if isinstance(value, dict):  # e.g. the synthetic builder's rules.json: id -> {"family": ..., ...}
        value = value.get("group", value.get("family"))
    if not isinstance(value, str) or not value.strip():
        raise ScienceError(
            f"--groups {path}: puzzle {pid!r}: the group must be a non-empty string (or an object "
            f"with a 'group' / 'family' string), got {value!r}"
        )
    if value == TOTAL_ROW:
        raise ScienceError(
            f"--groups {path}: puzzle {pid!r}: group name {TOTAL_ROW!r} is reserved (the table's total row); rename it"
        )
    return value


def load_groups(path: str, ids: dict[str, list[str]]) -> dict[str, str]:
    """puzzle id -> group from a ``--groups`` JSON file, which must name every puzzle of ``ids`` (subset -> ids);
    ids it names beyond those are ignored."""
    if not os.path.isfile(path):
        raise ScienceError(f"--groups {path}: no such file")
    raw = read_json(path, ScienceError)
    if not isinstance(raw, dict) or not raw:
        raise ScienceError(
            f"--groups {path}: the top level must be a non-empty object mapping puzzle id -> group, "
            f"got {type(raw).__name__ if raw else 'an empty object'}"
        )
    groups = {}
    for subset, names in ids.items():
        missing = [n for n in names if n not in raw]
        if missing:
            raise ScienceError(
                f"--groups {path}: {len(missing)} of the {len(names)} {subset} puzzles have no group, "
                f"e.g. {', '.join(repr(m) for m in missing[:3])}; the file must name every puzzle id"
            )
        groups.update({n: _group_of(path, n, raw[n]) for n in names})
    return groups


def load_user_puzzles(prefix: str, groups_file: Optional[str] = None) -> UserPuzzles:
    """Read and validate your kaggle-layout files (every puzzle, grid and solution, as the ARC builder reads them)
    and the groups, before any work; errors name the file, puzzle and field."""
    prefix = os.path.abspath(prefix)
    puzzles = {s: _load_subset(prefix, s) for s in SUBSETS}
    train_ids = {p.name for p in puzzles["training"]}
    both = [p.name for p in puzzles["evaluation"] if p.name in train_ids]
    if both:
        raise ScienceError(
            f"--input-file-prefix {prefix}: puzzle {both[0]!r} is in both "
            f"{os.path.basename(prefix)}_training_challenges.json and _evaluation_challenges.json "
            f"({len(both)} such ids); a held-out puzzle must not be a training puzzle"
        )
    ids = {s: [p.name for p in puzzles[s]] for s in SUBSETS}
    if groups_file is not None:
        groups = load_groups(groups_file, ids)
        grouping = f"groups file {os.path.abspath(groups_file)}"
    else:
        groups = {n: id_prefix(n) for names in ids.values() for n in names}
        grouping = "id prefix (the part of the puzzle id before its first '_' or '-')"
        bad = next((n for n, g in groups.items() if g == TOTAL_ROW), None)
        if bad is not None:
            raise ScienceError(
                f"--input-file-prefix {prefix}: puzzle {bad!r}: its id prefix {TOTAL_ROW!r} is the "
                "name of the table's total row; give a --groups file"
            )
    rules = {n: {"subset": s, "family": groups[n]} for s in SUBSETS for n in ids[s]}
    files = {}
    paths = [f"{prefix}_{s}_{kind}.json" for s in SUBSETS for kind in ("challenges", "solutions")]
    for p in paths + [prefix + AUGMENTATION_LISTS_SUFFIX]:  # the copy lists the ARC build reads, when present
        if os.path.exists(p):
            files[os.path.basename(p)] = _sha256(p)
    max_side = max(
        max(g.shape) for ps in puzzles.values() for p in ps for pair in p.train + p.test for g in pair if g is not None
    )
    return UserPuzzles(prefix, files, puzzles, rules, grouping, max_side)


def files_settings(user: UserPuzzles, *, canvas_size: Optional[int], num_aug: int, seed: int) -> dict:
    """data/settings.json of your files: their content (sha256 per file, so an edited file is noticed), the
    canvas (default: the largest grid side), the augmented copies and the seed. Checks that every grid fits."""
    canvas = user.max_side if canvas_size is None else canvas_size
    if not 1 <= canvas <= ARC_MAX_GRID:
        raise ScienceError(f"--canvas-size must be in 1..{ARC_MAX_GRID}, got {canvas}")
    try:
        check_canvas_size([p for ps in user.puzzles.values() for p in ps], canvas)
    except DatasetError as e:
        raise ScienceError(f"--input-file-prefix {user.prefix}: {e} (largest grid side: {user.max_side})") from None
    return {
        "files": user.files,
        "canvas_size": canvas,
        "num_aug": num_aug,
        "seed": seed,
        "num_train": len(user.puzzles["training"]),
        "num_test": len(user.puzzles["evaluation"]),
    }


def prepare_files(out: str, user: UserPuzzles, settings: dict, *, no_train: bool = False) -> ScienceData:
    """Your files built by the ARC builder (skipped when already built from the same files and settings)."""
    built = os.path.join(out, "data", "built")
    cmd = _arc_command(
        user.prefix,
        list(SUBSETS),
        "evaluation",
        built,
        num_aug=settings["num_aug"],
        seed=settings["seed"],
        canvas_size=settings["canvas_size"],
    )
    what = (
        f"{settings['num_train']} training + {settings['num_test']} held-out puzzles from "
        f"{user.prefix}_*.json, canvas {settings['canvas_size']}, {settings['num_aug']} augmented copies"
    )
    built = _build_once(out, settings, cmd, what=what, no_train=no_train)
    write_json_atomic(os.path.join(out, "groups.json"), {n: r["family"] for n, r in user.rules.items()})
    return ScienceData(settings, built, user.rules, user.grouping, user.prefix)


# ---------------------------------------------------------------------------------------------------------------
# The train-fit set
# ---------------------------------------------------------------------------------------------------------------
def fit_sample(rules: dict, n: int, seed: int) -> list[str]:
    """``n`` training puzzle ids (all when fewer), a seeded sample independent of the grouping (another --groups
    file reuses the evaluations), of the evaluated families' puzzles alone (the sample of the build without
    ``--breadth-families``: train-fit rows compare run for run), plus ``n // 16`` (at least 1) per breadth family."""
    train = {p: r for p, r in rules.items() if r["subset"] == "training"}
    breadth = {p for p, r in train.items() if r.get("family") in BREADTH_FAMILIES}
    ids = sorted(set(train) - breadth)
    pick = np.random.default_rng([seed, FIT_SEED]).permutation(len(ids))[:n]
    chosen = [ids[i] for i in pick]
    for k, family in enumerate(sorted({train[p]["family"] for p in breadth})):
        of = sorted(p for p in breadth if train[p]["family"] == family)
        pick = np.random.default_rng([seed, FIT_SEED, k + 1]).permutation(len(of))[: max(1, n // 16)]
        chosen += [of[i] for i in pick]
    return sorted(chosen)


def prepare_fit(out: str, data: ScienceData, n: int) -> Optional[tuple[str, list[str]]]:
    """(built dir, puzzle ids) of the train-fit set: ``n`` training puzzles (:func:`fit_sample`) written as the
    test subset of ``OUT/data/fit/fit_training_challenges.json`` and built with the data's augmentations and seed
    (so they are the copies training saw; the synthetic builder's ``synth_augmentations.json`` lists them), or None
    for ``n`` = 0. Rebuilt when the sample or the data change."""
    chosen = fit_sample(data.rules, n, data.settings["seed"]) if n > 0 else []
    if not chosen:
        return None
    fit = os.path.join(out, "data", "fit")
    built, spath = os.path.join(fit, "built"), os.path.join(fit, "settings.json")
    settings = {"data": data.settings, "puzzles": chosen}
    if _built(built) and read_json_or_none(spath) == settings:
        return built, chosen
    want = set(chosen)
    try:
        puzzles = [p for p in load_kaggle_subset(data.training_prefix, "training") if p.name in want]
    except DatasetError as e:
        raise ScienceError(f"train-fit set: {e}") from None
    prefix = os.path.join(fit, FIT_PREFIX)
    write_json_atomic(f"{prefix}_training_challenges.json", {p.name: p.to_json() for p in puzzles}, compact=True)
    say(f"data: train-fit set of {len(chosen)} training puzzles -> {built}")
    log = os.path.join(fit, "build.log")
    cmd = _arc_command(
        prefix,
        ["training"],
        "training",
        built,
        num_aug=data.settings["num_aug"],
        seed=data.settings["seed"],
        canvas_size=data.settings["canvas_size"],
    )
    lists = data.training_prefix + AUGMENTATION_LISTS_SUFFIX  # the synthetic builder's copies of every puzzle
    if os.path.isfile(lists):
        cmd += ["--augmentations", lists]
    rc, _, last = run_logged(cmd, log)
    if rc != 0:
        raise ScienceError(f"train-fit data build failed (exit {rc}): {last} (log: {log})")
    write_json_atomic(spath, settings)
    return built, chosen

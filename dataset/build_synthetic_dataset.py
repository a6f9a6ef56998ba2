"""Synthetic few-shot ARC puzzles from parameterised rule families (dataset/synthetic_rules.py).

    python -m dataset.build_synthetic_dataset --output-dir data/synth-raw --num-train 400 --num-test 100 \\
        --max-grid 8 --seed 0 [--holdout-families gravity] [--build-dir data/synth --num-aug 8] [--canvas-size 10]

Writes the kaggle layout ``<output-dir>/<prefix>_{training,evaluation}_{challenges,solutions}.json`` plus
``<prefix>_rules.json`` (family and parameters of every puzzle). Each puzzle is one sampled rule instance with
2-5 demo pairs (which determine the rule) and 1-2 test pairs. Evaluation puzzles come from held-out rule
instances, reserved first (``--heldout-puzzles-per-instance`` puzzles each, ``--num-test`` split evenly over the
families), that training never shows, by key or by behaviour (no held-out instance of any family produces a
training puzzle's pairs), also not through augmentation: the ARC builder's ``--num-aug`` dihedral x colour copies
of a training puzzle show other instances (colour_map {1: 2} recoloured is colour_map {pi(1): pi(2)}), so a copy
that would show a held-out instance is refused and another drawn in its place; every training puzzle's copies go
to ``<prefix>_augmentations.json``, which the ARC build uses (``--build-dir`` does, and so does a later
``python -m dataset.build_arc_dataset --input-file-prefix <prefix>`` with the same ``--num-aug`` and ``--seed``).
``<prefix>_leaks.json`` counts what the checks refused; with translate or roll, ``<prefix>_shifts.json`` holds
(and the log prints) the (|dr|, |dc|) table of their shifts. With ``--holdout-families`` the evaluation puzzles
come only from those families and training never sees them.
``--build-dir`` runs the ARC builder on the result (subsets training + evaluation, test set evaluation).
``--max-puzzles N`` (smoke set) caps both ``--num-train`` and ``--num-test`` at N: at most N puzzles per subset,
drawn as ``--num-train N --num-test N`` would draw them (a smaller draw, not the first N of the full one).
``--canvas-size N`` (default 30) is the canvas of that build; every generated grid (inputs and outputs) then has
sides <= N, and ``--max-grid`` defaults to N - 2, at most 10 (:func:`default_max_grid`: room for the loader's
translations) and may not exceed N.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from core.errors import user_errors
from core.io import write_json_atomic
from dataset.arc_sources import load_puzzles
from dataset.augment import AUGMENTATION_LISTS_SUFFIX, read_augmentation_lists, write_augmentation_lists
from dataset.breadth_families import BREADTH_FAMILIES
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_options import add_max_puzzles_argument, bar_disable, cap
from dataset.errors import DatasetError
from dataset.families import ALL_FAMILIES
from dataset.synthetic_breadth import check_breadth, draw_breadth
from dataset.synthetic_heldout import (  # noqa: F401  (LeakGuard, shift_table: re-exported for the tests)
    SHIFTS_SUFFIX,
    STRUCTURES_SUFFIX,
    LeakGuard,
    TrainedInstances,
    _draw_puzzle,
    _free_shift,
    _reserve_heldout,
    _try_puzzle,
    check_drop,
    drop_training,
    family_split,
    format_shift_table,
    format_structure_table,
    leak_summary,
    shift_table,
    structure_table,
    trained_copy_counts,
)
from dataset.synthetic_rules import SHIFT_FAMILIES, GridSpec, RuleInstance, shift_cells
from dataset.tokens import ARC_MAX_GRID

log = logging.getLogger(__name__)


def _sample_training(
    rng: np.random.Generator,
    families: list[str],
    n: int,
    spec: GridSpec,
    guard: LeakGuard,
    prefix: str,
    progress: bool,
    canvas_size: int,
) -> tuple[list[tuple[str, dict, list, list]], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """``n`` training puzzles, families in balanced seeded cycles, and (with ``guard.num_aug``) every puzzle's
    augmented copies. A candidate is redrawn when it shows a held-out instance itself (:meth:`LeakGuard.puzzle_leak`);
    a copy that would show one is replaced by another copy (:meth:`LeakGuard.copies`)."""
    out, lists = [], {}
    exhausted: set[str] = set()
    bar = tqdm(total=n, desc="synthetic training", unit="puzzle", disable=bar_disable(progress))
    cycle: list[str] = []
    fam, fails = None, 0
    while len(out) < n:
        if fam is None:
            live = [f for f in families if f not in exhausted]
            if not live:
                raise DatasetError(
                    f"--families {families}: no training puzzle left that avoids the held-out rule "
                    f"instances after {len(out)} puzzles; lower --num-train"
                )
            if not cycle:  # balanced: every family once per cycle, in a seeded order
                cycle = [live[i] for i in rng.permutation(len(live))]
            fam, fails = cycle.pop(), 0
            if fam in exhausted:
                fam = None
                continue
        rule = ALL_FAMILIES[fam](rng, spec)
        if fam in SHIFT_FAMILIES:
            rule = _free_shift(rng, spec, rule, guard.taken_shifts(fam))
        name = f"{prefix}-train-{len(out):05d}-{fam}"
        leak = "key" if rule.key in guard.heldout_keys else None
        drawn = None if leak else _try_puzzle(rng, rule, canvas_size)
        if drawn is not None:
            leak = guard.puzzle_leak(rule, drawn[0] + drawn[1])
        if leak:
            guard.counts[f"puzzles redrawn by {leak}"] += 1
            guard.counts[f"{fam}: puzzles redrawn by {leak}"] += 1
        if drawn is None or leak:
            fails += 1
            if fails > 500:
                log.warning(
                    "synthetic training: family %s: no further puzzle avoids the held-out instances; its "
                    "remaining puzzles go to the other families",
                    fam,
                )
                exhausted.add(fam)
                fam = None
            continue
        if guard.num_aug:
            lists[name] = guard.copies(name, fam, rule.params, *drawn)
        out.append((name, {"family": fam, "params": rule.params, "key": rule.key}, *drawn))
        fam = None
        bar.update(1)
    bar.close()
    return out, lists


def _family_counts(rng: np.random.Generator, families: list[str], n: int) -> dict[str, int]:
    """``n`` split over ``families`` as evenly as possible; the remainder goes to a seeded choice of families."""
    counts = {f: n // len(families) for f in families}
    for i in rng.permutation(len(families))[: n % len(families)]:
        counts[families[i]] += 1
    return counts


def _heldout_puzzles(
    rng: np.random.Generator,
    held: dict[str, list[RuleInstance]],
    counts: dict[str, int],
    prefix: str,
    canvas_size: int,
    trained: TrainedInstances,
    lists: dict,
) -> list[tuple[str, dict, list, list]]:
    """``counts[f]`` evaluation puzzles of family f, cycling through its held-out instances; seeded order. A puzzle
    whose pairs a trained instance (any family, a training puzzle's or one of its copies') produces is redrawn;
    with copies, each puzzle's evaluation copies (:meth:`TrainedInstances.eval_copies`) go to ``lists``."""
    schedule = [f for f, c in counts.items() for _ in range(c)]
    schedule = [schedule[i] for i in rng.permutation(len(schedule))]
    used = {f: 0 for f in counts}
    out = []
    for fam in schedule:
        drawn = None
        for k in range(len(held[fam])):  # the next instance in turn; another one when it makes no clean puzzle
            rule = held[fam][(used[fam] + k) % len(held[fam])]
            for _ in range(200):
                drawn = _draw_puzzle(rng, rule, canvas_size)
                if drawn is not None and trained.realised_by(drawn[0] + drawn[1]) is not None:
                    trained.counts["held-out puzzles redrawn by behaviour (a trained instance produces them)"] += 1
                    trained.counts[f"{fam}: held-out puzzles redrawn by behaviour"] += 1
                    drawn = None
                if drawn is not None:
                    break
            if drawn is not None:
                break
        used[fam] += 1
        if drawn is None:  # on grids this small every puzzle of the family's held-out instances is a trained one's
            log.warning("synthetic evaluation: family %s: no held-out puzzle that no trained instance makes", fam)
            trained.counts[f"{fam}: held-out puzzles left out (every draw a trained instance's)"] += 1
            continue
        name = f"{prefix}-evalu-{len(out):05d}-{fam}"
        if trained.num_aug:
            lists[name] = trained.eval_copies(name, fam, rule.params, *drawn)
        out.append((name, {"family": fam, "params": rule.params, "key": rule.key}, *drawn))
    return out


def _to_kaggle(puzzles) -> tuple[dict, dict]:
    chal, sol = {}, {}
    for name, _, demo, test in puzzles:
        chal[name] = {
            "train": [{"input": i.tolist(), "output": o.tolist()} for i, o in demo],
            "test": [{"input": i.tolist()} for i, _ in test],
        }
        sol[name] = [o.tolist() for _, o in test]
    return chal, sol


def default_max_grid(canvas_size: int) -> int:
    """Largest input side by default: two cells less than the canvas (room for the loader's translations), at
    most 10. The one default for the builder and the science command."""
    return max(1, min(10, canvas_size - 2))


def _grid_spec(families: list[str], min_grid: int, max_grid: Optional[int], canvas_size: int) -> GridSpec:
    """The input sizes of the builder's options (``max_grid`` None: :func:`default_max_grid`), checked."""
    if not 1 <= canvas_size <= ARC_MAX_GRID:
        raise DatasetError(f"--canvas-size must be in 1..{ARC_MAX_GRID}, got {canvas_size}")
    if max_grid is None:
        max_grid = default_max_grid(canvas_size)
    if not 1 <= min_grid <= max_grid <= canvas_size:
        raise DatasetError(
            f"--min-grid/--max-grid: need 1 <= min-grid ({min_grid}) <= max-grid ({max_grid}) <= "
            f"--canvas-size ({canvas_size})"
        )
    spec = GridSpec(min_grid, max_grid)
    shifting = sorted(set(families) & set(SHIFT_FAMILIES))
    if shifting and not shift_cells(spec):
        raise DatasetError(f"--families {' '.join(shifting)}: a shift needs grids of side >= 2 (--max-grid {max_grid})")
    return spec


def generate_synthetic_arc(
    out_dir: str,
    prefix: str = "synth",
    *,
    num_train: int = 400,
    num_test: int = 100,
    families: Optional[Sequence[str]] = None,
    holdout_families: Sequence[str] = (),
    train_only_families: Sequence[str] = (),
    drop_training_families: Sequence[str] = (),
    breadth_families: Sequence[str] = (),
    breadth_puzzles: int = 100,
    min_grid: int = 3,
    max_grid: Optional[int] = None,
    seed: int = 0,
    progress: bool = True,
    canvas_size: int = ARC_MAX_GRID,
    num_aug: int = 0,
    heldout_puzzles_per_instance: int = 2,
    max_puzzles: Optional[int] = None,
) -> dict:
    """Write the kaggle-layout files; returns ``{"prefix": <out_dir>/<prefix>, "<subset>_challenges": path, ...}``.

    First, per evaluation family (``holdout_families`` when given, else ``families``), a set of held-out rule
    instances is reserved: ceil(puzzles of the family / ``heldout_puzzles_per_instance``) of them. Training puzzles
    (``families`` minus ``holdout_families``) never show one, by key or by behaviour -- neither the puzzle itself
    (else it is redrawn) nor, with ``num_aug`` > 0, any of its augmented copies (a leaking copy is replaced by the
    next one the ARC builder's draw offers; :class:`LeakGuard`). Every training puzzle's copies are written to
    ``<prefix>_augmentations.json`` (``paths["augmentations"]``), the copies the ARC build must use
    (``dataset.build_arc_dataset`` reads it). The evaluation puzzles are then drawn from the held-out instances.
    Every puzzle's demos determine its rule (:func:`dataset.rule_identity.demos_determine_rule`). Every grid (input
    and output) has sides <= ``canvas_size``; ``max_grid`` (input side) defaults to :func:`default_max_grid`. Same
    arguments -> identical bytes. ``max_puzzles`` N caps ``num_train`` and ``num_test`` at N (a smoke set).
    ``train_only_families``: families drawn for training only (none of their instances held out or evaluated).
    ``drop_training_families``: the same draw (the same held-out puzzles, the same training puzzles of the other
    families), with these families' training puzzles and their copies left out before anything is written: the
    breadth ablation. ``breadth_families`` (``["all"]``: every one): ``breadth_puzzles`` puzzles each of these
    training-only rules added to the same draw (:mod:`dataset.synthetic_breadth`)."""
    if num_train < 0 or num_test < 0:
        raise DatasetError("--num-train/--num-test must be >= 0")
    num_train, num_test = cap(num_train, max_puzzles), cap(num_test, max_puzzles)
    if num_aug < 0:
        raise DatasetError(f"--num-aug must be >= 0, got {num_aug}")
    if heldout_puzzles_per_instance < 1:
        raise DatasetError(f"--heldout-puzzles-per-instance must be >= 1, got {heldout_puzzles_per_instance}")
    families, train_fams, test_fams = family_split(families, holdout_families, train_only_families, num_train, num_test)
    check_drop(drop_training_families, families, train_fams)
    breadth = check_breadth(breadth_families, breadth_puzzles)
    spec = _grid_spec(families, min_grid, max_grid, canvas_size)
    rng = np.random.default_rng([seed, 0x5E7])
    counts = _family_counts(rng, test_fams, num_test) if num_test else {}
    held, held_structures = _reserve_heldout(rng, counts, spec, heldout_puzzles_per_instance, canvas_size)
    structures = frozenset(k for keys in held_structures.values() for k in keys)
    heldout = [(r.family, r.params) for rules in held.values() for r in rules]
    guard = LeakGuard(heldout, num_aug, seed, structures=structures)
    train, lists = _sample_training(rng, train_fams, num_train, spec, guard, prefix, progress, canvas_size)
    trained = TrainedInstances(train, lists, structures, num_aug, seed)
    test = _heldout_puzzles(rng, held, counts, prefix, canvas_size, trained, lists)
    train, lists = drop_training(train, lists, drop_training_families)
    more, more_lists = draw_breadth(
        breadth, breadth_puzzles, spec, guard, test, lists, first_index=num_train, prefix=prefix, seed=seed,
        canvas_size=canvas_size, progress=progress, skip_refused=list(breadth_families) == ["all"],
    )  # fmt: skip
    train, lists = train + more, {**lists, **more_lists}
    guard.counts.update(trained.counts)
    log.info(
        "synthetic: %d training puzzles; %d held-out puzzles of %d held-out rule instances, shown by no "
        "training puzzle%s (by key or by behaviour)",
        len(train),
        len(test),
        len(guard.heldout_keys),
        f" nor any of its {num_aug} augmented copies" if num_aug else "",
    )
    train_names = {name for name, _, _, _ in train}
    leaks = leak_summary(guard.counts, num_aug, {n: v for n, v in lists.items() if n in train_names})
    leaks["total"]["evaluation copies kept (identity included)"] = int(
        sum(len(d) for n, (d, _) in lists.items() if n not in train_names)
    )
    log.info("synthetic: leak checks: %s", json.dumps(leaks["total"]))

    rules = {name: {"subset": "training", **meta} for name, meta, _, _ in train}
    rules.update({name: {"subset": "evaluation", **meta} for name, meta, _, _ in test})
    leaks["evaluation copies that are trained instances"] = seen = trained_copy_counts(rules, lists)
    log.info("synthetic: evaluation copies that are trained instances, per family: %s", json.dumps(seen))
    if any(seen.values()):  # the checks above make this impossible; the count reads the written lists again
        raise DatasetError(f"synthetic: evaluation copies show trained rule instances: {seen}")
    table = structure_table(train, test, lists, held_structures)
    for line in format_structure_table(table):
        log.info("%s", line)
    return _write_outputs(out_dir, prefix, train, test, lists, leaks, num_aug, seed, table)


def _write_outputs(
    out_dir: str,
    prefix: str,
    train: list,
    test: list,
    lists: dict,
    leaks: dict,
    num_aug: int,
    seed: int,
    structures: dict,
):
    """The kaggle-layout files, ``<prefix>_rules.json`` and the sidecars (every training puzzle's copies for the ARC
    build, the leak counts, the shift table); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, prefix)
    paths = {"prefix": base}
    for subset, puzzles in (("training", train), ("evaluation", test)):
        chal, sol = _to_kaggle(puzzles)
        for kind, obj in (("challenges", chal), ("solutions", sol)):
            p = f"{base}_{subset}_{kind}.json"
            write_json_atomic(p, obj, compact=True)
            paths[f"{subset}_{kind}"] = p
    rules = {
        name: {"subset": s, "family": meta["family"], "params": meta["params"]}
        for s, puzzles in (("training", train), ("evaluation", test))
        for name, meta, _, _ in puzzles
    }
    with open(f"{base}_rules.json", "w") as f:
        json.dump(rules, f, indent=0, sort_keys=True)
    aug_path = base + AUGMENTATION_LISTS_SUFFIX
    if num_aug:
        write_augmentation_lists(aug_path, lists, num_aug, seed)
        paths["augmentations"] = aug_path
    elif os.path.exists(aug_path):
        os.remove(aug_path)  # a stale list of an earlier --num-aug
    write_json_atomic(f"{base}_leaks.json", leaks)
    paths["leaks"] = f"{base}_leaks.json"
    shift_path = f"{base}{SHIFTS_SUFFIX}"
    table = shift_table(train, test, lists)
    if table:
        write_json_atomic(shift_path, table)
        paths["shifts"] = shift_path
        for line in format_shift_table(table):
            log.info("%s", line)
    elif os.path.exists(shift_path):
        os.remove(shift_path)
    paths["rules"] = f"{base}_rules.json"
    write_json_atomic(f"{base}{STRUCTURES_SUFFIX}", structures)
    paths["structures"] = f"{base}{STRUCTURES_SUFFIX}"
    return paths


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dataset.build_synthetic_dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--output-dir", required=True, help="where the kaggle-layout json files go")
    ap.add_argument("--output-prefix", default="synth", help="file name prefix (<prefix>_<subset>_challenges.json)")
    ap.add_argument("--num-train", type=int, default=400)
    ap.add_argument("--num-test", type=int, default=100)
    ap.add_argument("--families", nargs="+", default=None, help=f"default: all of {list(ALL_FAMILIES)}")
    ap.add_argument("--holdout-families", nargs="+", default=[])
    ap.add_argument(
        "--train-only-families",
        nargs="+",
        default=[],
        help="families drawn for training only, never evaluated (breadth of training rules)",
    )
    ap.add_argument(
        "--drop-training-families",
        nargs="+",
        default=[],
        help="the same draw with these families' training puzzles left out (their held-out puzzles stay): the "
        "breadth ablation",
    )
    ap.add_argument(
        "--breadth-families",
        nargs="+",
        default=[],
        help="training-only rule families (dataset/breadth_families.py, or all) added to the training puzzles",
    )
    ap.add_argument("--breadth-puzzles", type=int, default=100, help="training puzzles per --breadth-families family")
    ap.add_argument("--min-grid", type=int, default=3)
    ap.add_argument(
        "--max-grid", type=int, default=None, help="largest input side (default: --canvas-size - 2, at most 10)"
    )
    ap.add_argument(
        "--canvas-size",
        type=int,
        default=ARC_MAX_GRID,
        help=f"canvas side of the --build-dir build; every grid fits it (default {ARC_MAX_GRID})",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--heldout-puzzles-per-instance",
        type=int,
        default=2,
        help="evaluation puzzles per held-out rule instance (default 2: 20 puzzles of a family come "
        "from 10 held-out instances)",
    )
    ap.add_argument("--build-dir", default=None, help="also run the ARC builder into this directory")
    ap.add_argument(
        "--num-aug",
        type=int,
        default=8,
        help="augmented copies per puzzle in the ARC build (--build-dir, or a later build with the same "
        "--num-aug and --seed, which reads <prefix>_augmentations.json); a copy of a training puzzle that would "
        "show a held-out rule instance is replaced by another (0: only the training puzzles themselves avoid "
        "them)",
    )
    ap.add_argument("--mode", choices=["trm", "etrm"], default="etrm", help="split mode for --build-dir")
    ap.add_argument("--overwrite", action="store_true", help="for --build-dir")
    ap.add_argument("--num-workers", type=int, default=1, help="for --build-dir")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (without it: only on a terminal)")
    add_max_puzzles_argument(ap, "at most N training and N evaluation puzzles (caps --num-train and --num-test)")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with user_errors(code=2):  # bad input: one line, exit 2 (core.errors)
        paths = generate_synthetic_arc(
            args.output_dir,
            args.output_prefix,
            num_train=args.num_train,
            num_test=args.num_test,
            families=args.families,
            holdout_families=args.holdout_families,
            train_only_families=args.train_only_families,
            drop_training_families=args.drop_training_families,
            breadth_families=args.breadth_families,
            breadth_puzzles=args.breadth_puzzles,
            min_grid=args.min_grid,
            max_grid=args.max_grid,
            seed=args.seed,
            progress=not args.no_progress,
            canvas_size=args.canvas_size,
            num_aug=args.num_aug,
            heldout_puzzles_per_instance=args.heldout_puzzles_per_instance,
            max_puzzles=args.max_puzzles,
        )
        n_train, n_test = cap(args.num_train, args.max_puzzles), cap(args.num_test, args.max_puzzles)
        with open(paths["training_challenges"]) as f:
            names = list(json.load(f))
        wide = sum(n.rsplit("-", 1)[-1] in BREADTH_FAMILIES for n in names)  # names end with their family
        kept = len(names) - wide
        left = f" ({n_train - kept} of {n_train} left out by --drop-training-families)" if kept < n_train else ""
        more = f" + {wide} of --breadth-families" if wide else ""
        print(f"wrote {kept} training{left}{more} + {n_test} evaluation puzzles to {paths['prefix']}_*.json")
        if args.build_dir:
            puzzles = load_puzzles(["training", "evaluation"], "evaluation", paths["prefix"])
            s = build_arc_dataset(
                args.build_dir,
                puzzles,
                test_set_name="evaluation",
                num_aug=args.num_aug,
                seed=args.seed,
                mode=args.mode,
                overwrite=args.overwrite,
                num_workers=args.num_workers,
                source=f"synthetic:{args.output_prefix}",
                progress=not args.no_progress,
                canvas_size=args.canvas_size,
                augmentations=read_augmentation_lists(paths["augmentations"], args.num_aug, args.seed)
                if "augmentations" in paths
                else None,
            )
            paths["build_dir"] = args.build_dir
            print(
                f"built {args.build_dir}: train {s['train_examples']} / test {s['test_examples']} examples, "
                f"{s['seconds']} s"
            )
    return paths


if __name__ == "__main__":
    main()

"""Synthetic few-shot ARC puzzles from parameterised rule families (dataset/synthetic_rules.py).

    python -m dataset.build_synthetic_dataset --output-dir data/synth-raw --num-train 400 --num-test 100 \\
        --max-grid 8 --seed 0 [--holdout-families gravity] [--build-dir data/synth --num-aug 8] [--canvas-size 10]

Writes the kaggle layout ``<output-dir>/<prefix>_{training,evaluation}_{challenges,solutions}.json`` plus
``<prefix>_rules.json`` (family and parameters of every puzzle). Each puzzle is one sampled rule instance with
2-5 demo pairs (which determine the rule) and 1-2 test pairs. Evaluation puzzles come from held-out rule
instances, reserved first (``--heldout-puzzles-per-instance`` puzzles each, ``--num-test`` split evenly over the
families), that training never shows, also not through augmentation: the ARC builder's ``--num-aug`` dihedral x
colour copies of a training puzzle show other instances (colour_map {1: 2} recoloured is colour_map
{pi(1): pi(2)}), so a training puzzle one of whose copies would show a held-out instance is redrawn -- build with
the same ``--num-aug`` and ``--seed`` (``--build-dir`` does). With ``--holdout-families`` the evaluation puzzles
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
from dataset.augment import ArcPuzzle, select_augmentations
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_options import add_max_puzzles_argument, bar_disable, cap
from dataset.errors import DatasetError
from dataset.rule_identity import conjugate_params, demos_determine_rule
from dataset.synthetic_rules import FAMILIES, GridSpec, RuleInstance, make_pairs, rule_key
from dataset.tokens import ARC_MAX_GRID

log = logging.getLogger(__name__)


def _draw_puzzle(rng: np.random.Generator, rule: RuleInstance, canvas_size: int) -> Optional[tuple[list, list]]:
    """(demo pairs, test pairs) of one puzzle of ``rule``, or None (no pairs fit, or the demos do not determine
    the rule: :func:`dataset.rule_identity.demos_determine_rule`)."""
    n_demo, n_test = int(rng.integers(2, 6)), int(rng.integers(1, 3))
    pairs = make_pairs(rule, rng, n_demo + n_test, max_side=canvas_size)
    if pairs is None or not demos_determine_rule(rule.family, rule.params, pairs[:n_demo]):
        return None
    return pairs[:n_demo], pairs[n_demo:]


def augmented_keys(name: str, family: str, params: dict, demo: list, test: list, num_aug: int, seed: int) -> set[str]:
    """Rule keys that the ARC builder's copies of training puzzle ``name`` show (the identity included): the
    builder gives it the copies :func:`dataset.augment.select_augmentations` (``num_aug``, ``seed``)
    draws, and a copy under augmentation g of an instance R is a puzzle of g . R . g^-1
    (:func:`dataset.rule_identity.conjugate_params`) -- e.g. colour_map {1: 2} under a colour permutation is
    colour_map {pi(1): pi(2)}."""
    dih, luts = select_augmentations(ArcPuzzle("training", name, demo, test), num_aug, seed)
    keys = set()
    for d, lut in zip(dih.tolist(), luts):
        p = conjugate_params(family, params, d, lut)
        if p is not None:
            keys.add(rule_key(family, p))
    return keys


def _sample_training(
    rng: np.random.Generator,
    families: list[str],
    n: int,
    spec: GridSpec,
    heldout: set,
    prefix: str,
    progress: bool,
    canvas_size: int,
    num_aug: int,
    seed: int,
) -> list[tuple[str, dict, list, list]]:
    """``n`` training puzzles, families in balanced seeded cycles. A candidate is redrawn when its instance is
    held out or, with ``num_aug``, when one of the ARC builder's augmented copies of it shows a held-out instance."""
    out = []
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
                    f"instances after {len(out)} puzzles; lower --num-train or --num-aug"
                )
            if not cycle:  # balanced: every family once per cycle, in a seeded order
                cycle = [live[i] for i in rng.permutation(len(live))]
            fam, fails = cycle.pop(), 0
            if fam in exhausted:
                fam = None
                continue
        rule = FAMILIES[fam](rng, spec)
        name = f"{prefix}-train-{len(out):05d}-{fam}"
        drawn = None if rule.key in heldout else _draw_puzzle(rng, rule, canvas_size)
        if drawn is None or (
            num_aug and heldout and augmented_keys(name, fam, rule.params, *drawn, num_aug, seed) & heldout
        ):
            fails += 1
            if fails > 500:
                log.warning(
                    "synthetic training: family %s: no further puzzle avoids the held-out instances (with "
                    "its augmented copies); its remaining puzzles go to the other families",
                    fam,
                )
                exhausted.add(fam)
                fam = None
            continue
        out.append((name, {"family": fam, "params": rule.params, "key": rule.key}, *drawn))
        fam = None
        bar.update(1)
    bar.close()
    return out


def _family_counts(rng: np.random.Generator, families: list[str], n: int) -> dict[str, int]:
    """``n`` split over ``families`` as evenly as possible; the remainder goes to a seeded choice of families."""
    counts = {f: n // len(families) for f in families}
    for i in rng.permutation(len(families))[: n % len(families)]:
        counts[families[i]] += 1
    return counts


def _reserve_heldout(
    rng: np.random.Generator, counts: dict[str, int], spec: GridSpec, per_instance: int, canvas_size: int
) -> dict[str, list[RuleInstance]]:
    """Per family, ceil(count / per_instance) distinct rule instances (that can make a puzzle) to hold out."""
    held: dict[str, list[RuleInstance]] = {}
    for fam, count in counts.items():
        want, rules, keys = -(-count // per_instance), [], set()
        for _ in range(500 + 20 * want):
            if len(rules) == want:
                break
            rule = FAMILIES[fam](rng, spec)
            if rule.key not in keys and any(_draw_puzzle(rng, rule, canvas_size) for _ in range(5)):
                rules.append(rule)
                keys.add(rule.key)
        if count and not rules:
            raise DatasetError(
                f"--families: family {fam!r} makes no puzzle within the grid limits "
                f"(--max-grid {spec.max_grid}, --canvas-size {canvas_size})"
            )
        held[fam] = rules
    return held


def _heldout_puzzles(
    rng: np.random.Generator, held: dict[str, list[RuleInstance]], counts: dict[str, int], prefix: str, canvas_size: int
) -> list[tuple[str, dict, list, list]]:
    """``counts[f]`` evaluation puzzles of family f, cycling through its held-out instances; seeded order."""
    schedule = [f for f, c in counts.items() for _ in range(c)]
    schedule = [schedule[i] for i in rng.permutation(len(schedule))]
    used = {f: 0 for f in counts}
    out = []
    for fam in schedule:
        rule = held[fam][used[fam] % len(held[fam])]
        used[fam] += 1
        for _ in range(200):
            drawn = _draw_puzzle(rng, rule, canvas_size)
            if drawn is not None:
                break
        else:
            raise DatasetError(f"synthetic evaluation: held-out instance {rule.key} made no puzzle in 200 tries")
        out.append(
            (f"{prefix}-evalu-{len(out):05d}-{fam}", {"family": fam, "params": rule.params, "key": rule.key}, *drawn)
        )
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


def generate_synthetic_arc(
    out_dir: str,
    prefix: str = "synth",
    *,
    num_train: int = 400,
    num_test: int = 100,
    families: Optional[Sequence[str]] = None,
    holdout_families: Sequence[str] = (),
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
    instances is reserved: ceil(puzzles of the family / ``heldout_puzzles_per_instance``) of them. Training
    puzzles (``families`` minus ``holdout_families``) never show one -- neither the puzzle itself nor, with
    ``num_aug`` > 0, any of the ``num_aug`` augmented copies the ARC builder draws for it with ``seed``
    (:func:`augmented_keys`; build with the same ``--num-aug`` and ``--seed`` to keep that guarantee). The
    evaluation puzzles are then drawn from the held-out instances. Every puzzle's demos determine its rule
    (:func:`dataset.rule_identity.demos_determine_rule`). Every grid (input and output) has sides <=
    ``canvas_size``; ``max_grid`` (input side) defaults to :func:`default_max_grid`. Same arguments -> identical
    bytes. ``max_puzzles`` N caps ``num_train`` and ``num_test`` at N (a smoke set)."""
    families = list(families) if families else list(FAMILIES)
    for f in list(families) + list(holdout_families):
        if f not in FAMILIES:
            raise DatasetError(f"--families/--holdout-families: unknown family {f!r} (known: {sorted(FAMILIES)})")
    if not 1 <= canvas_size <= ARC_MAX_GRID:
        raise DatasetError(f"--canvas-size must be in 1..{ARC_MAX_GRID}, got {canvas_size}")
    if max_grid is None:
        max_grid = default_max_grid(canvas_size)
    if not 1 <= min_grid <= max_grid <= canvas_size:
        raise DatasetError(
            f"--min-grid/--max-grid: need 1 <= min-grid ({min_grid}) <= max-grid ({max_grid}) <= "
            f"--canvas-size ({canvas_size})"
        )
    if num_train < 0 or num_test < 0:
        raise DatasetError("--num-train/--num-test must be >= 0")
    num_train, num_test = cap(num_train, max_puzzles), cap(num_test, max_puzzles)
    if num_aug < 0:
        raise DatasetError(f"--num-aug must be >= 0, got {num_aug}")
    train_fams = [f for f in families if f not in holdout_families]
    test_fams = list(holdout_families) if holdout_families else families
    if num_train and not train_fams:
        raise DatasetError("--holdout-families: every family is held out; nothing left for training")
    if heldout_puzzles_per_instance < 1:
        raise DatasetError(f"--heldout-puzzles-per-instance must be >= 1, got {heldout_puzzles_per_instance}")
    spec = GridSpec(min_grid, max_grid)
    rng = np.random.default_rng([seed, 0x5E7])
    counts = _family_counts(rng, test_fams, num_test) if num_test else {}
    held = _reserve_heldout(rng, counts, spec, heldout_puzzles_per_instance, canvas_size)
    held_keys = {r.key for rules in held.values() for r in rules}
    train = _sample_training(rng, train_fams, num_train, spec, held_keys, prefix, progress, canvas_size, num_aug, seed)
    test = _heldout_puzzles(rng, held, counts, prefix, canvas_size)
    log.info(
        "synthetic: %d training puzzles; %d held-out puzzles of %d held-out rule instances, shown by no "
        "training puzzle%s",
        len(train),
        len(test),
        len(held_keys),
        f" nor any of its {num_aug} augmented copies" if num_aug else "",
    )

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
    paths["rules"] = f"{base}_rules.json"
    return paths


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m dataset.build_synthetic_dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--output-dir", required=True, help="where the kaggle-layout json files go")
    ap.add_argument("--output-prefix", default="synth", help="file name prefix (<prefix>_<subset>_challenges.json)")
    ap.add_argument("--num-train", type=int, default=400)
    ap.add_argument("--num-test", type=int, default=100)
    ap.add_argument("--families", nargs="+", default=None, help=f"default: all of {list(FAMILIES)}")
    ap.add_argument("--holdout-families", nargs="+", default=[])
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
        "--num-aug and --seed); a training puzzle one of whose copies would show a held-out rule "
        "instance is redrawn (0: only the training puzzles themselves avoid them)",
    )
    ap.add_argument("--mode", choices=["trm", "etrm"], default="etrm", help="split mode for --build-dir")
    ap.add_argument("--overwrite", action="store_true", help="for --build-dir")
    ap.add_argument("--num-workers", type=int, default=1, help="for --build-dir")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (without it: only on a terminal)")
    add_max_puzzles_argument(ap, "at most N training and N evaluation puzzles (caps --num-train and --num-test)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with user_errors(code=2):  # bad input: one line, exit 2 (core.errors)
        paths = generate_synthetic_arc(
            args.output_dir,
            args.output_prefix,
            num_train=args.num_train,
            num_test=args.num_test,
            families=args.families,
            holdout_families=args.holdout_families,
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
        print(f"wrote {n_train} training + {n_test} evaluation puzzles to {paths['prefix']}_*.json")
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
            )
            paths["build_dir"] = args.build_dir
            print(
                f"built {args.build_dir}: train {s['train_examples']} / test {s['test_examples']} examples, "
                f"{s['seconds']} s"
            )
    return paths


if __name__ == "__main__":
    main()

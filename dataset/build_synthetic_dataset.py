"""Synthetic few-shot ARC puzzles from parameterised rule families (dataset/synthetic_rules.py).

    python -m dataset.build_synthetic_dataset --output-dir data/synth-raw --num-train 400 --num-test 100 \\
        --max-grid 8 --seed 0 [--holdout-families gravity] [--build-dir data/synth --num-aug 8] [--canvas-size 10]

Writes the kaggle layout ``<output-dir>/<prefix>_{training,evaluation}_{challenges,solutions}.json`` plus
``<prefix>_rules.json`` (family and parameters of every puzzle). Each puzzle is one sampled rule instance with
2-5 demo pairs and 1-2 test pairs. Evaluation puzzles are rule instances that never occur in training; with
``--holdout-families`` the evaluation puzzles come only from those families and training never sees them.
``--build-dir`` runs the ARC builder on the result (subsets training + evaluation, test set evaluation).
``--canvas-size N`` (default 30) is the canvas of that build; every generated grid (inputs and outputs) then has
sides <= N, and ``--max-grid`` defaults to min(10, N) and may not exceed N.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from dataset.common import ARC_MAX_GRID, DatasetError
from dataset.synthetic_rules import FAMILIES, GridSpec, make_pairs

log = logging.getLogger(__name__)


def _sample_puzzles(rng: np.random.Generator, families: list[str], n: int, spec: GridSpec, forbidden: set,
                    prefix: str, subset: str, progress: bool, canvas_size: int = ARC_MAX_GRID
                    ) -> list[tuple[str, dict, list, list]]:
    out = []
    exhausted: set[str] = set()
    bar = tqdm(total=n, desc=f"synthetic {subset}", unit="puzzle", disable=not progress)
    cycle: list[str] = []
    fam, fails = None, 0
    while len(out) < n:
        if fam is None:
            live = [f for f in families if f not in exhausted]
            if not live:
                raise DatasetError(f"--families {families}: no usable rule instances left for {subset} after "
                                   f"{len(out)} puzzles (all unseen instances used); lower the puzzle count or "
                                   "widen --families")
            if not cycle:  # balanced: every family once per cycle, in a seeded order
                cycle = [live[i] for i in rng.permutation(len(live))]
            fam, fails = cycle.pop(), 0
            if fam in exhausted:
                fam = None
                continue
        rule = FAMILIES[fam](rng, spec)
        if rule.key in forbidden:
            fails += 1
            if fails > 500:  # small families can run out of instances unseen in training
                exhausted.add(fam)
                fam = None
            continue
        n_demo, n_test = int(rng.integers(2, 6)), int(rng.integers(1, 3))
        pairs = make_pairs(rule, rng, n_demo + n_test, max_side=canvas_size)
        if pairs is None:
            fails += 1
            if fails > 500:
                exhausted.add(fam)
                fam = None
            continue
        name = f"{prefix}-{subset[:5]}-{len(out):05d}-{fam}"
        out.append((name, {"family": fam, "params": rule.params, "key": rule.key}, pairs[:n_demo], pairs[n_demo:]))
        fam = None
        bar.update(1)
    bar.close()
    return out


def _to_kaggle(puzzles) -> tuple[dict, dict]:
    chal, sol = {}, {}
    for name, _, demo, test in puzzles:
        chal[name] = {"train": [{"input": i.tolist(), "output": o.tolist()} for i, o in demo],
                      "test": [{"input": i.tolist()} for i, _ in test]}
        sol[name] = [o.tolist() for _, o in test]
    return chal, sol


def generate_synthetic_arc(out_dir: str, prefix: str = "synth", *, num_train: int = 400, num_test: int = 100,
                           families: Optional[Sequence[str]] = None, holdout_families: Sequence[str] = (),
                           min_grid: int = 3, max_grid: Optional[int] = None, seed: int = 0, progress: bool = True,
                           canvas_size: int = ARC_MAX_GRID) -> dict:
    """Write the kaggle-layout files; returns ``{"prefix": <out_dir>/<prefix>, "<subset>_challenges": path, ...}``.

    Training puzzles use ``families`` minus ``holdout_families``; evaluation puzzles use ``holdout_families``
    when given (else ``families``) and never reuse a training rule instance. Every grid (input and output) has
    sides <= ``canvas_size``; ``max_grid`` (input side) defaults to min(10, canvas_size). Same seed -> identical
    bytes."""
    families = list(families) if families else list(FAMILIES)
    for f in list(families) + list(holdout_families):
        if f not in FAMILIES:
            raise DatasetError(f"--families/--holdout-families: unknown family {f!r} (known: {sorted(FAMILIES)})")
    if not 1 <= canvas_size <= ARC_MAX_GRID:
        raise DatasetError(f"--canvas-size must be in 1..{ARC_MAX_GRID}, got {canvas_size}")
    if max_grid is None:
        max_grid = min(10, canvas_size)
    if not 1 <= min_grid <= max_grid <= canvas_size:
        raise DatasetError(f"--min-grid/--max-grid: need 1 <= min-grid ({min_grid}) <= max-grid ({max_grid}) <= "
                           f"--canvas-size ({canvas_size})")
    if num_train < 0 or num_test < 0:
        raise DatasetError("--num-train/--num-test must be >= 0")
    train_fams = [f for f in families if f not in holdout_families]
    test_fams = list(holdout_families) if holdout_families else families
    if num_train and not train_fams:
        raise DatasetError("--holdout-families: every family is held out; nothing left for training")
    spec = GridSpec(min_grid, max_grid)
    rng = np.random.default_rng([seed, 0x5E7])
    train = _sample_puzzles(rng, train_fams, num_train, spec, set(), prefix, "training", progress, canvas_size)
    train_keys = {meta["key"] for _, meta, _, _ in train}
    test = _sample_puzzles(rng, test_fams, num_test, spec, train_keys, prefix, "evaluation", progress, canvas_size)

    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, prefix)
    paths = {"prefix": base}
    for subset, puzzles in (("training", train), ("evaluation", test)):
        chal, sol = _to_kaggle(puzzles)
        for kind, obj in (("challenges", chal), ("solutions", sol)):
            p = f"{base}_{subset}_{kind}.json"
            tmp = p + ".tmp"
            with open(tmp, "w") as f:
                json.dump(obj, f, separators=(",", ":"))
            os.replace(tmp, p)
            paths[f"{subset}_{kind}"] = p
    rules = {name: {"subset": s, "family": meta["family"], "params": meta["params"]}
             for s, puzzles in (("training", train), ("evaluation", test)) for name, meta, _, _ in puzzles}
    with open(f"{base}_rules.json", "w") as f:
        json.dump(rules, f, indent=0, sort_keys=True)
    paths["rules"] = f"{base}_rules.json"
    return paths


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m dataset.build_synthetic_dataset", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output-dir", required=True, help="where the kaggle-layout json files go")
    ap.add_argument("--output-prefix", default="synth", help="file name prefix (<prefix>_<subset>_challenges.json)")
    ap.add_argument("--num-train", type=int, default=400)
    ap.add_argument("--num-test", type=int, default=100)
    ap.add_argument("--families", nargs="+", default=None, help=f"default: all of {list(FAMILIES)}")
    ap.add_argument("--holdout-families", nargs="+", default=[])
    ap.add_argument("--min-grid", type=int, default=3)
    ap.add_argument("--max-grid", type=int, default=None, help="largest input side (default: min(10, --canvas-size))")
    ap.add_argument("--canvas-size", type=int, default=ARC_MAX_GRID,
                    help=f"canvas side of the --build-dir build; every grid fits it (default {ARC_MAX_GRID})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build-dir", default=None, help="also run the ARC builder into this directory")
    ap.add_argument("--num-aug", type=int, default=8, help="augmentations for --build-dir")
    ap.add_argument("--mode", choices=["trm", "etrm"], default="etrm", help="split mode for --build-dir")
    ap.add_argument("--overwrite", action="store_true", help="for --build-dir")
    ap.add_argument("--num-workers", type=int, default=1, help="for --build-dir")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = generate_synthetic_arc(args.output_dir, args.output_prefix, num_train=args.num_train,
                                       num_test=args.num_test, families=args.families,
                                       holdout_families=args.holdout_families, min_grid=args.min_grid,
                                       max_grid=args.max_grid, seed=args.seed, progress=not args.no_progress,
                                       canvas_size=args.canvas_size)
        print(f"wrote {args.num_train} training + {args.num_test} evaluation puzzles to {paths['prefix']}_*.json")
        if args.build_dir:
            from dataset.build_arc_dataset import build_arc_dataset, load_puzzles
            puzzles = load_puzzles(["training", "evaluation"], "evaluation", paths["prefix"])
            s = build_arc_dataset(args.build_dir, puzzles, test_set_name="evaluation", num_aug=args.num_aug,
                                  seed=args.seed, mode=args.mode, overwrite=args.overwrite,
                                  num_workers=args.num_workers, source=f"synthetic:{args.output_prefix}",
                                  progress=not args.no_progress, canvas_size=args.canvas_size)
            paths["build_dir"] = args.build_dir
            print(f"built {args.build_dir}: train {s['train_examples']} / test {s['test_examples']} examples, "
                  f"{s['seconds']} s")
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    return paths


if __name__ == "__main__":
    main()

"""Core-fit probes for the spatial families: can the TRM core *apply* a dihedral map, before any encoder has to
read it? First measured at 076a67b (docs/record/2026-11-25-spatial-core-fit-probes.md); with grid offsets the
science core fits one fixed flip, 0.98 train exact in 400 steps (1fd0952,
docs/record/2026-11-25-grid-relative-positions.md).

    python -m experiments.science.probes --out data/probe-hflip --dihedral 4            # one fixed map (flip)
    python -m experiments.science.probes --out data/probe-hflip6 --dihedral 4 --sizes 6 6
    python -m experiments.science.probes --out data/probe-dih --dihedral 1 2 3 4 5 6 7 --oracle
    python -m experiments.science.probes --out data/probe-shift --shift 1 1            # one fixed shift
    python -m experiments.science.probes --out data/probe-shifts --shift 1 1 --shift -2 0 --oracle [--wrap]

Each puzzle: 3 demo pairs + 1 query of random grids (sides in ``--sizes``, 3 colours of 1..9 at density 0.5)
under one of the ``--dihedral`` maps (dataset.dihedral.dihedral_transform ids; one drawn per puzzle). Written as
kaggle-layout files (``DIR/probe_{training,evaluation}_{challenges,solutions}.json``, ``DIR/probe_rules.json``:
puzzle id -> map id) and built with the ARC builder into ``DIR/built`` (``--mode trm``, no augmentation, canvas
``--canvas-size``). ``--oracle`` then replaces every example's puzzle identifier with its map id (1..7), so a TRM
with a puzzle embedding is *told* the map: the core's fit without any rule reading. Train on it with
``pretrain.py --config-name cfg_demo data_paths=[DIR/built] ...`` (the exact overrides: the "Reproduce" commands
of docs/record/2026-11-25-pointer-rope.md), and score
fresh puzzles with ``evaluate.py checkpoint=... data_path=DIR/built halt_early=true arc_voting=false`` (per copy:
with rule ids as puzzle ids, ARC voting per puzzle does not apply).

``--shift DR DC`` (repeatable) replaces the maps by shifts, the translate family's mapping
(``dataset.synthetic_rules.rule_apply``): output cell (r, c) = input cell (r - DR, c - DC), the background 0 where
that lies outside the grid, or with ``--wrap`` taken modulo the grid's sides (the roll family's mapping). Inputs
are drawn at density 0.25 (the translate family's) and, without ``--wrap``, with no colour on the cells the shift
would push off the grid, so no content is lost (as in the family's pairs). Map ids are then 1 + the shift's
position in the list.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Optional, Sequence

import numpy as np

from dataset.arc_sources import load_kaggle_subset
from dataset.build_arc_dataset import build_arc_dataset
from dataset.dihedral import dihedral_transform
from dataset.synthetic_rules import rule_apply

PREFIX = "probe"


def _grid(rng: np.random.Generator, sizes: tuple[int, int], density: float = 0.5) -> np.ndarray:
    h, w = rng.integers(sizes[0], sizes[1] + 1, size=2)
    colours = rng.choice(np.arange(1, 10), 3, replace=False)
    return np.where(rng.random((h, w)) < density, rng.choice(colours, (h, w)), 0)


def _shift_input(rng: np.random.Generator, sizes: tuple[int, int], dr: int, dc: int, wrap: bool) -> np.ndarray:
    """A random grid (density 0.25) whose content the shift keeps: without ``wrap``, larger than the shift and
    with no colour on the cells it would push off the grid (as the translate family's pairs), never all background."""
    for _ in range(1000):
        g = _grid(rng, sizes, 0.25)
        h, w = g.shape
        if not wrap:
            if abs(dr) >= h or abs(dc) >= w:
                continue
            keep = np.zeros_like(g, dtype=bool)
            keep[max(0, -dr) : h - max(0, dr), max(0, -dc) : w - max(0, dc)] = True
            g = np.where(keep, g, 0)
        if g.any():
            return g
    raise ValueError(f"--shift {dr} {dc}: no grid of sides {sizes} keeps its content; use larger --sizes")


def write_probe_files(
    out: str,
    maps: Sequence[int],
    *,
    num_train: int,
    num_eval: int,
    sizes: tuple[int, int],
    seed: int = 0,
    shifts: Sequence[tuple[int, int]] = (),
    wrap: bool = False,
) -> str:
    """Write the kaggle-layout files; returns their prefix. With ``shifts`` the transforms are those shifts (map
    id = 1 + index) instead of the dihedral ``maps``."""
    rng = np.random.default_rng(seed)
    if shifts:
        maps = list(range(1, len(shifts) + 1))
    prefix, rules = os.path.join(out, PREFIX), {}
    os.makedirs(out, exist_ok=True)
    for subset, n in (("training", num_train), ("evaluation", num_eval)):
        challenges, solutions = {}, {}
        for i in range(n):
            pid = f"{subset[:2]}{i:05d}"
            tid = int(maps[rng.integers(len(maps))]) if len(maps) > 1 else int(maps[0])
            rules[pid] = tid
            if shifts:
                dr, dc = shifts[tid - 1]
                shift = rule_apply("roll" if wrap else "translate", {"dr": dr, "dc": dc})  # the families' mappings
                pairs = [(g, shift(g)) for g in (_shift_input(rng, sizes, dr, dc, wrap) for _ in range(4))]
            else:
                pairs = [(g, dihedral_transform(g, tid)) for g in (_grid(rng, sizes) for _ in range(4))]
            challenges[pid] = {
                "train": [{"input": a.tolist(), "output": b.tolist()} for a, b in pairs[:3]],
                "test": [{"input": pairs[3][0].tolist()}],
            }
            solutions[pid] = [pairs[3][1].tolist()]
        for kind, obj in (("challenges", challenges), ("solutions", solutions)):
            with open(f"{prefix}_{subset}_{kind}.json", "w") as f:
                json.dump(obj, f)
    with open(f"{prefix}_rules.json", "w") as f:
        json.dump(rules, f)
    return prefix


def give_map_ids(built: str, rules: dict[str, int]) -> None:
    """``--oracle``: every example's puzzle identifier becomes its map id (identifiers.json names the puzzles)."""
    with open(os.path.join(built, "identifiers.json")) as f:
        names = json.load(f)
    lut = np.array([0] + [rules[name.split("|")[0]] for name in names[1:]])
    for split in ("train", "test"):
        path = os.path.join(built, split, "all__puzzle_identifiers.npy")
        ids = np.load(path)
        np.save(path, lut[ids].astype(ids.dtype))


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.science.probes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--dihedral",
        type=int,
        nargs="+",
        default=None,
        help="map ids (1..7), one drawn per puzzle (default: 4, a horizontal flip)",
    )
    ap.add_argument(
        "--shift",
        type=int,
        nargs=2,
        action="append",
        default=[],
        metavar=("DR", "DC"),
        help="a shift instead of the maps (repeatable; one drawn per puzzle)",
    )
    ap.add_argument("--wrap", action="store_true", help="--shift wraps around the grid's sides")
    ap.add_argument("--sizes", type=int, nargs=2, default=(2, 6), metavar=("MIN", "MAX"), help="grid sides")
    ap.add_argument("--num-train", type=int, default=1000)
    ap.add_argument("--num-eval", type=int, default=100)
    ap.add_argument("--canvas-size", type=int, default=8)
    ap.add_argument("--oracle", action="store_true", help="puzzle identifier := map id")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.wrap and not a.shift:
        ap.error("--wrap needs --shift")
    if a.shift and a.dihedral:
        ap.error("--shift and --dihedral are alternatives: a probe applies shifts or dihedral maps")
    a.dihedral = a.dihedral or ([] if a.shift else [4])
    if any(s == [0, 0] for s in a.shift):
        ap.error("--shift 0 0 is the identity")
    if any(not 1 <= t <= 7 for t in a.dihedral):
        ap.error(f"--dihedral ids must be in 1..7, got {a.dihedral}")
    if not 1 <= a.sizes[0] <= a.sizes[1] <= a.canvas_size - 1:
        ap.error(f"--sizes must satisfy 1 <= MIN <= MAX <= canvas-size - 1 (room for the end marker), got {a.sizes}")
    what = f"shifts {a.shift}{' (wrapped)' if a.wrap else ''}" if a.shift else f"maps {a.dihedral}"
    source = f"probe shift {a.shift}{' wrap' if a.wrap else ''}" if a.shift else f"probe dihedral {a.dihedral}"
    prefix = write_probe_files(
        a.out,
        a.dihedral,
        num_train=a.num_train,
        num_eval=a.num_eval,
        sizes=tuple(a.sizes),
        seed=a.seed,
        shifts=[tuple(x) for x in a.shift],
        wrap=a.wrap,
    )
    puzzles = load_kaggle_subset(prefix, "training") + load_kaggle_subset(prefix, "evaluation")
    built = os.path.join(a.out, "built")
    build_arc_dataset(
        built,
        puzzles,
        test_set_name="evaluation",
        num_aug=0,
        seed=a.seed,
        mode="trm",
        overwrite=True,
        source=source,
        progress=False,
        canvas_size=a.canvas_size,
    )
    if a.oracle:
        with open(f"{prefix}_rules.json") as f:
            give_map_ids(built, json.load(f))
    print(
        f"[probe] {built}: {a.num_train} training + {a.num_eval} evaluation puzzles, {what}"
        f"{' (puzzle identifier = map id)' if a.oracle else ''}"
    )
    return built


if __name__ == "__main__":
    main()

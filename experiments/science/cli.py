"""ETRM science: does a demonstration encoder infer a rule it never saw, from the demos alone?

``python -m experiments.science --out DIR`` runs the whole experiment through the user-facing commands, each stage
a subprocess whose log lands in DIR (``python -m encoders.science``, the old name, runs the same command):

1. data: ``python -m dataset.build_synthetic_dataset ... --canvas-size N --build-dir DIR/data/built --mode etrm``
   (all 8 rule families of dataset/synthetic_rules.py; evaluation puzzles are rule instances never seen in
   training, and with ``--holdout-families`` whole families never seen in training);
2. training: ``python pretrain_encoder.py --config-name cfg_science encoder=<name> ...`` once per encoder
   (standard, variational, lpn, hybrid, recurrent) and for the zero-demo control (``control`` = standard with
   ``encoder.zero_demos=true``: the encoder sees only PAD demos, so it cannot know the rule). The recipe is
   config/cfg_science.yaml; ``--override key=value`` passes Hydra overrides through;
3. evaluation: ``python evaluate.py checkpoint=... data_path=...`` (voting over the augmented copies, pass@K);
4. report: held-out pass@1 / pass@2 per rule family (the family of each evaluated puzzle comes from the
   builder's ``<prefix>_rules.json``, its score from evaluate.py's ``predictions.json``) for every run, written to
   DIR/science.json and DIR/science.md and printed.

Resumable: a run whose summary.json says ``finished`` is not trained again, an evaluation whose metrics.json and
predictions.json exist is not repeated; a DIR built with other settings is refused (name a new --out).

    python -m experiments.science --out runs/science                       # standard + control (the quick check)
    python -m experiments.science --out runs/science-all --encoders all     # the benchmark: 5 encoders + control
    python -m experiments.science --out runs/s --holdout-families gravity --steps 2000 --override lr=3e-4

The older single-family check (``recolour``: repaint colour a as b; train and test instances disjoint), trained
in-process with ``training.loop.train``, stays available for quick encoder experiments:

    python -m experiments.science --recolour --out /tmp/etrm_recolour     # the recipe: 3000 steps, ~8 min
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional, Sequence

import torch

from core.errors import fail, user_errors
from experiments.science.common import CONTROL, ENCODERS
from experiments.science.recolour import RECOLOUR_STEPS, run_science
from experiments.science.run import DEFAULT_CONFIG, run_science_command

PROG = "python -m experiments.science"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (data, runs, science.json, science.md)")
    ap.add_argument("--encoders", nargs="+", default=["standard", CONTROL],
                    help=f"runs: any of {', '.join(ENCODERS)}, {CONTROL} (zero-demo standard), or all")
    ap.add_argument("--families", nargs="+", default=None, help="rule families (default: all 8)")
    ap.add_argument("--holdout-families", nargs="+", default=[], help="families never seen in training")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: max_steps of the config)")
    ap.add_argument("--canvas-size", type=int, default=8)
    ap.add_argument("--max-grid", type=int, default=None, help="largest input side (default: canvas - 2, at most 10)")
    ap.add_argument("--min-grid", type=int, default=3)
    ap.add_argument("--num-train", type=int, default=800)
    ap.add_argument("--num-test", type=int, default=160)
    ap.add_argument("--num-aug", type=int, default=8, help="augmented copies per puzzle (evaluation votes over them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override for pretrain_encoder.py (repeatable), e.g. --override lr=3e-4")
    ap.add_argument("--eval-override", action="append", default=[], metavar="KEY=VALUE",
                    help="override for evaluate.py (repeatable), e.g. --eval-override batch_size=256")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="training config name under config/")
    ap.add_argument("--recolour", action="store_true", help="run the older in-process recolour check instead")
    ap.add_argument("--encoder", default="standard", help="--recolour only: the encoder")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.recolour:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        res = run_science(args.out, steps=args.steps or RECOLOUR_STEPS, seed=args.seed, encoder=args.encoder)
        print(json.dumps(res, indent=1))
        return res
    command = f"{PROG} " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    with user_errors(code=2):  # bad input (a ScienceError, Hydra's override errors): one line, exit 2
        res = run_science_command(args.out, encoders=args.encoders, families=args.families,
                                  holdout_families=args.holdout_families, steps=args.steps,
                                  canvas_size=args.canvas_size, max_grid=args.max_grid, min_grid=args.min_grid,
                                  num_train=args.num_train, num_test=args.num_test, num_aug=args.num_aug,
                                  seed=args.seed, overrides=args.override, eval_overrides=args.eval_override,
                                  config=args.config, command=command)
    failed = [n for n, r in res["runs"].items() if r["status"] != "ok"]
    if failed:
        fail(f"runs failed: {', '.join(failed)} (see their train.log / eval.log under {args.out}/runs)", code=1)
    return res

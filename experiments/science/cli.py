"""ETRM science: does a demonstration encoder infer a rule it never saw, from the demos alone?

``python -m experiments.science --out DIR`` runs the whole experiment through the user-facing commands, each stage
a subprocess whose log lands in DIR:

1. data: ``python -m dataset.build_synthetic_dataset ... --canvas-size N --build-dir DIR/data/built --mode etrm``
   (benchmark v3: the 9 covered families of dataset/synthetic_rules.py and the 7 open ones of
   dataset/open_families.py; evaluation puzzles are rule instances of structures never seen in training, also not
   through an augmented copy, every evaluation copy itself a held-out instance, and with ``--holdout-families`` whole
   families never seen in training) -- or, with ``--input-file-prefix P``, your own puzzles (below);
2. training: ``python pretrain_encoder.py --config-name cfg_science encoder=<name> ...`` once per encoder
   (standard, variational, lpn, hybrid, recurrent) and for the zero-demo control (``control`` = standard with
   ``encoder.zero_demos=true``: the encoder sees only PAD demos, so it cannot know the rule). The recipe is
   config/cfg_science.yaml (it checkpoints every ``checkpoint_every`` steps); ``--override key=value`` passes
   Hydra overrides through;
3. evaluation: ``python evaluate.py checkpoint=... data_path=...`` on the held-out puzzles and on the train-fit
   set (``--train-fit-puzzles`` training puzzles), voting over the augmented copies, pass@K;
4. report: held-out pass@1 / pass@2 per rule family (per group for your own puzzles) next to the same on the
   training puzzles (train fit) for every run, one copy per held-out puzzle (the headline) and voted over the
   copies, beside the ``program`` row (trm_views' candidates with no learned weight), written to DIR/science.json
   and DIR/science.md and printed; the headline row is over the covered + open families (roll, the wrapped shift,
   is outside it).

Your own puzzles: ``--input-file-prefix P`` reads the kaggle layout P_training_challenges.json,
P_training_solutions.json, P_evaluation_challenges.json, P_evaluation_solutions.json (the layout of
``python -m dataset.build_arc_dataset``; a _solutions file may be left out when the challenges carry the test
outputs): the evaluation puzzles are the held-out ones. Rows of the table: ``--groups FILE`` (JSON: puzzle id ->
group, or -> {"family": ...} as the synthetic builder's _rules.json; every puzzle id must be named), else the id
prefix (the part of the id before its first '_' or '-'; the whole id when it has neither). No colour / dihedral
augmentation unless you pass --num-aug K: the copies can realise a held-out colour or orientation of a rule, i.e.
leak a held-out rule instance into training (docs/science_command.md, "Augmentation can leak a held-out rule instance
into training"). --families, --holdout-families, --num-train, --num-test, --min-grid and --max-grid do not apply;
--canvas-size defaults to the largest grid side.

Resumable: a run whose summary.json says ``finished`` is not trained again; a run cut short (killed, interrupted,
failed after a checkpoint) resumes from its last checkpoint, and until then its last checkpoint is evaluated and
marked "cut short at step N" in the table; an evaluation of the same checkpoint step is not repeated;
``--no-train`` trains nothing and evaluates what exists. A DIR built with other settings (or other files) is
refused (name a new --out). Ctrl-C stops the running stage cleanly (training writes a checkpoint first).

    python -m experiments.science --out runs/science                       # standard + control: 4000 steps, 40-60 min
    python -m experiments.science --out runs/science-all --encoders all     # the benchmark: 5 encoders + control
    python -m experiments.science --out runs/s --holdout-families gravity --steps 2000 --override lr=3e-4
    python -m experiments.science --out runs/mine --input-file-prefix data/mine/puzzles --groups data/mine/groups.json
    python -m experiments.science --out runs/science --no-train             # evaluate what exists (cut-short runs too)

The older single-family check (``recolour``: repaint colour a as b; train and test instances disjoint), trained
in-process with ``training.loop.train``, stays available for quick encoder experiments:

    python -m experiments.science --recolour --out /tmp/etrm_recolour     # the recipe: 3000 steps, ~8 min
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from typing import Optional, Sequence

import torch

from core.errors import fail, user_errors
from experiments.science.common import CONTROL, ENCODERS, ScienceError
from experiments.science.recolour import RECOLOUR_STEPS, run_science
from experiments.science.run import run_science_command
from experiments.science.settings import FILES_NUM_AUG, SYNTHETIC_DEFAULTS, ScienceSettings

PROG = "python -m experiments.science"
# options whose argparse name is not the settings field's; --recolour / --encoder belong to the recolour check
_DEST = {"overrides": "override", "eval_overrides": "eval_override", "groups_file": "groups"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = ScienceSettings.default
    ap.add_argument("--out", required=True, help="output directory (data, runs, science.json, science.md)")
    ap.add_argument(
        "--encoders",
        nargs="+",
        default=list(default("encoders")),
        help=f"runs: any of {', '.join(ENCODERS)}, {CONTROL} (zero-demo standard), or all; or "
        f"another registered encoder (e.g. dihedral_views)",
    )
    ap.add_argument(
        "--input-file-prefix",
        default=default("input_file_prefix"),
        metavar="P",
        help="your own puzzles: P_{training,evaluation}_{challenges,solutions}.json (kaggle layout); "
        "evaluation = held out",
    )
    ap.add_argument(
        "--groups",
        default=default("groups_file"),
        metavar="FILE",
        help="with --input-file-prefix: JSON puzzle id -> group (rows of the table; default: the id "
        "prefix before the first '_' or '-')",
    )
    _add_data_args(ap)
    _add_run_args(ap)
    return ap


def _add_data_args(ap: argparse.ArgumentParser) -> None:
    """The benchmark's data: families, sizes, copies."""
    d, default = SYNTHETIC_DEFAULTS, ScienceSettings.default
    ap.add_argument(
        "--families",
        nargs="+",
        default=default("families"),
        help="rule families (default: all 16, 9 covered and 7 open; the headline figure is over all but roll)",
    )
    ap.add_argument(
        "--holdout-families",
        nargs="+",
        default=list(default("holdout_families")),
        help="families never seen in training",
    )
    ap.add_argument(
        "--train-only-families",
        nargs="+",
        default=list(default("train_only_families")),
        help="families in training only, never evaluated (breadth of training rules)",
    )
    ap.add_argument(
        "--drop-training-families",
        nargs="+",
        default=list(default("drop_training_families")),
        help="the same data draw without these families' training puzzles (their held-out puzzles stay): the "
        "breadth ablation",
    )
    ap.add_argument(
        "--breadth-families",
        nargs="+",
        default=list(default("breadth_families")),
        help="training-only rule families (dataset/breadth_families.py, or all), 100 training puzzles each, never "
        "evaluated: more kinds of training rules on the same held-out puzzles",
    )
    ap.add_argument(
        "--steps", type=int, default=default("steps"), help="training steps (default: max_steps of the config)"
    )
    ap.add_argument(
        "--canvas-size",
        type=int,
        default=default("canvas_size"),
        help=f"canvas side (default {d['canvas_size']}; your own puzzles: the largest grid side)",
    )
    ap.add_argument(
        "--max-grid", type=int, default=default("max_grid"), help="largest input side (default: canvas - 2, at most 10)"
    )
    ap.add_argument(
        "--min-grid", type=int, default=default("min_grid"), help=f"smallest input side (default {d['min_grid']})"
    )
    ap.add_argument(
        "--num-train", type=int, default=default("num_train"), help=f"training puzzles (default {d['num_train']})"
    )
    ap.add_argument(
        "--num-test", type=int, default=default("num_test"), help=f"held-out puzzles (default {d['num_test']})"
    )
    ap.add_argument(
        "--num-aug",
        type=int,
        default=default("num_aug"),
        help=f"augmented (colour / dihedral) copies per puzzle, evaluation votes over them (default "
        f"{d['num_aug']}; your own puzzles: {FILES_NUM_AUG}, since a copy can show a held-out rule "
        "instance)",
    )


def _add_run_args(ap: argparse.ArgumentParser) -> None:
    """Training, evaluation and what else is measured."""
    default = ScienceSettings.default
    ap.add_argument(
        "--train-fit-puzzles",
        type=int,
        default=default("train_fit_puzzles"),
        help="training puzzles evaluated for the train-fit columns (0: none)",
    )
    ap.add_argument(
        "--no-train",
        action="store_true",
        help="train nothing: evaluate the runs that exist (a cut-short run: its last checkpoint)",
    )
    ap.add_argument(
        "--curve",
        action="store_true",
        help="also evaluate every kept checkpoint (held-out and train fit) -> curve.json / curve.md / "
        "curve.png; keep them with --override checkpoint_keep=null (experiments.science.curve)",
    )
    ap.add_argument(
        "--rule-readout",
        type=float,
        default=default("rule_readout"),
        metavar="W",
        help="weight of an auxiliary loss that asks a head on the encoder's context to name each training "
        "puzzle's rule (family and parameters; synthetic families only; docs/models.md)",
    )
    ap.add_argument(
        "--halting-step",
        action="store_true",
        help="also score every run at its Q head's halting step (evaluate.py halt_early=true): a second "
        "per-family table; done anyway for a run whose training samples halt early",
    )
    ap.add_argument("--seed", type=int, default=default("seed"))
    ap.add_argument(
        "--override",
        action="append",
        default=list(default("overrides")),
        metavar="KEY=VALUE",
        help="Hydra override for pretrain_encoder.py (repeatable), e.g. --override lr=3e-4",
    )
    ap.add_argument(
        "--eval-override",
        action="append",
        default=list(default("eval_overrides")),
        metavar="KEY=VALUE",
        help="override for evaluate.py (repeatable), e.g. --eval-override batch_size=256",
    )
    ap.add_argument("--config", default=default("config"), help="training config name under config/")
    ap.add_argument("--recolour", action="store_true", help="run the older in-process recolour check instead")
    ap.add_argument("--encoder", default="standard", help="--recolour only: the encoder")


def settings_from_args(args: argparse.Namespace, command: str = "") -> ScienceSettings:
    """The one place the command line becomes the command's settings (every field from its option)."""
    return ScienceSettings(
        command=command,
        **{
            f.name: getattr(args, _DEST.get(f.name, f.name))
            for f in dataclasses.fields(ScienceSettings)
            if f.name != "command"
        },
    )


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.recolour:
        with user_errors(code=2):
            other = [
                f
                for f, v in (
                    ("--input-file-prefix", args.input_file_prefix),
                    ("--groups", args.groups),
                    ("--no-train", args.no_train),
                )
                if v
            ]
            if other:
                raise ScienceError(
                    f"--recolour and {other[0]} are mutually exclusive (the recolour check writes "
                    "its own data and always trains)"
                )
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        res = run_science(args.out, steps=args.steps or RECOLOUR_STEPS, seed=args.seed, encoder=args.encoder)
        print(json.dumps(res, indent=1))
        return res
    command = f"{PROG} " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    try:
        with user_errors(code=2):  # bad input (a ScienceError, Hydra's override errors): one line, exit 2
            res = run_science_command(settings_from_args(args, command))
    except KeyboardInterrupt:
        fail(
            f"interrupted; run the same command again to resume (a cut-short run continues from its last "
            f"checkpoint; --no-train evaluates what exists in {args.out})",
            code=130,
        )
    runs = res["runs"]
    failed = [
        n
        for n, r in runs.items()
        if r["status"] in ("train_failed", "eval_failed") or (r["status"] == "cut_short" and not args.no_train)
    ]
    if failed:
        fail(
            f"runs failed or cut short: {', '.join(failed)} (see their train.log / eval.log under {args.out}/runs; "
            "run the command again to resume a cut-short run)",
            code=1,
        )
    if not any(r["status"] in ("ok", "cut_short") for r in runs.values()):
        fail(f"--no-train: no run of {', '.join(runs)} has a checkpoint in {args.out}/runs", code=1)
    return res

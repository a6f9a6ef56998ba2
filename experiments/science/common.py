"""Names and helpers shared by the science command's stages (:mod:`experiments.science.run`,
:mod:`experiments.science.data`) and its report (:mod:`experiments.science.report`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from core.errors import PlatformError

ENCODERS = ("standard", "variational", "lpn", "hybrid", "recurrent")
CONTROL = "control"  # the zero-demo control: encoder=standard encoder.zero_demos=true
UNFIT_TRAIN_EXACT = 0.5  # below this train exact a run's held-out table is flagged "not fitted"
TOTAL_ROW = "all"  # the table's row over every held-out puzzle (no family / group may have this name)
# the row over the held-out puzzles of the headline families (dataset.synthetic_rules.HEADLINE_FAMILIES) when the
# data also holds others (roll); without it the headline figure is the TOTAL_ROW
HEADLINE_ROW = "headline"
# benchmark v3's group rows: the families with a built-in candidate in trm_views and those without
# (dataset.families.GROUPS), each over its held-out puzzles, before the headline row (both groups together)
GROUP_ROWS = ("covered", "open")
PROGRAM = "program"  # the no-weights solver made of trm_views' candidates (experiments.science.program)
SEARCH = "search"  # the no-weights, no-candidate search: local rules, else a pointer (experiments.science.pointer)
NO_WEIGHTS = (PROGRAM, SEARCH)  # the report's rows that are not evaluate.py runs
ONE_COPY_TABLE = "families_one_copy"  # science.json: the per-family table of one copy per held-out puzzle
# a run's evaluations by the report: (subdirectory of the run dir, what it scores)
HELDOUT_EVAL, FIT_EVAL = "eval", "eval-train"
ONE_COPY_EVAL = "eval-one-copy"  # the held-out puzzles as drawn: one copy each (evaluate.py num_augmentations=1)
HALT_HELDOUT_EVAL, HALT_FIT_EVAL = "eval-halt", "eval-train-halt"  # the same at the Q head's halting step
EVAL_ARGS = "science_eval.json"  # beside an evaluation's metrics.json: the evaluate.py overrides it was made with

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


class ScienceError(PlatformError, ValueError):
    """Bad science-command input (the message names the option / file and the value)."""


def say(msg: str) -> None:
    print(f"[science] {msg}", flush=True)


def unreported_runs(out: str, names: Sequence[str]) -> list[str]:
    """Runs trained earlier in ``out`` (``runs/<name>/checkpoint`` holds a step) that ``names`` leaves out: a command
    that names only some runs rewrites science.md / science.json with those alone."""
    root = os.path.join(out, "runs")
    out_runs = []
    for n in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        ckpt = os.path.join(root, n, "checkpoint")
        if n not in names and os.path.isdir(ckpt) and any(f.startswith("step_") for f in os.listdir(ckpt)):
            out_runs.append(n)
    return out_runs


def say_unreported_runs(out: str, names: Sequence[str]) -> None:
    """Say, before any work, which trained runs of ``out`` a command naming only ``names`` leaves out of its report."""
    others = unreported_runs(out, names)
    if others:
        say(
            f"{out} also holds the trained run(s) {', '.join(others)}: science.md and science.json are rewritten "
            f"with {', '.join(names)} alone (their files stay; --encoders {' '.join([*names, *others])} reports them "
            "side by side, a finished run and its evaluations reused)"
        )


def read_json_or_none(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def first_diff(a: Any, b: Any, key: str = "") -> tuple[str, Any, Any]:
    """(dotted key, a's value, b's value) of the first difference between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_diff(a.get(k), b.get(k), f"{key}.{k}" if key else k)
    return key, a, b


def check_same(path: str, saved: Optional[dict], wanted: dict, what: str) -> None:
    """Refuse to mix results made with other settings in one --out directory."""
    if saved is None or saved == wanted:
        return
    k, old, new = first_diff(saved, wanted)
    raise ScienceError(
        f"{path}: {what} was made with {k}={old!r}, this command asks for {k}={new!r}; "
        "use a new --out (or the same options) to keep results comparable"
    )


# seconds a stage may take to stop after Ctrl-C (training finishes its step and writes a checkpoint)
STOP_GRACE_S = 60.0


def run_logged(cmd: list[str], log_path: str, *, append: bool = False) -> tuple[int, float, str]:
    """Run ``cmd`` in the repository root, stdout+stderr to ``log_path`` (``append``: after what it holds, e.g.
    the earlier segments of a resumed run); (exit status, seconds, last log line).

    Ctrl-C: the stage (in the same process group) gets the SIGINT too; training then stops after its current step
    and writes a checkpoint (``training.signals``), so it is given :data:`STOP_GRACE_S` seconds to exit (a SIGTERM,
    the same stop request, is sent if it is still running after 5 s, e.g. when only this process got the SIGINT);
    a second Ctrl-C kills it. The KeyboardInterrupt is then re-raised."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.time()
    with open(log_path, "a" if append else "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            say(f"interrupted: letting {os.path.basename(log_path)[:-4]} stop cleanly (Ctrl-C again kills it)")
            try:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=STOP_GRACE_S)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            raise
        except BaseException:  # anything else ends this process: the stage must not outlive it
            proc.kill()
            proc.wait()
            raise
    with open(log_path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    return rc, time.time() - t0, (lines[-1] if lines else "")


def hydra_quote(path: str) -> str:
    """A path as a quoted Hydra override value (spaces, commas, brackets and '=' survive)."""
    return "'" + path.replace("'", "\\'") + "'"


def evaluate_checkpoint(
    name: str,
    run_dir: str,
    data_path: str,
    sub: str,
    expect: Sequence[str],
    step: int,
    eval_overrides: list[str],
    what: str,
    checkpoint: Optional[str] = None,
) -> tuple[Optional[dict], Optional[dict]]:
    """Stage 3 for one run on one dataset: evaluate.py into ``run_dir/sub`` unless that holds the evaluation of
    checkpoint ``step`` on exactly the puzzles ``expect`` with exactly these ``eval_overrides`` (an evaluation made
    with other ones, e.g. before ``--eval-override use_ema=false``, or by a version that did not record them, is
    made again). ``checkpoint``: that file (default: the run's newest).
    Returns (metrics.json record, None) or (None, the failure's fields)."""
    ck, ev = checkpoint or os.path.join(run_dir, "checkpoint"), os.path.join(run_dir, sub)
    mpath, ppath = os.path.join(ev, "metrics.json"), os.path.join(ev, "predictions.json")
    rec, pred = read_json_or_none(mpath), read_json_or_none(ppath)
    made_with = {"eval_overrides": list(eval_overrides)}
    if (
        rec is not None
        and pred is not None
        and rec.get("checkpoint_step") == step
        and set(pred) == set(expect)
        and read_json_or_none(os.path.join(ev, EVAL_ARGS)) == made_with
    ):
        say(f"{name}: evaluation of {what} exists, reused")
        return rec, None
    shutil.rmtree(ev, ignore_errors=True)
    cmd = [
        sys.executable,
        "evaluate.py",
        f"checkpoint={hydra_quote(ck)}",
        f"data_path={hydra_quote(data_path)}",
        f"output_dir={hydra_quote(ev)}",
        "progress=false",
        "num_pictures=0",
        "pass_ks=[1,2]",
        *eval_overrides,
    ]
    say(f"{name}: evaluating {what} (checkpoint step {step})")
    log = os.path.join(run_dir, f"{sub}.log")
    rc, secs, last = run_logged(cmd, log)
    rec = read_json_or_none(mpath)
    if rc != 0 or rec is None or not os.path.exists(ppath):
        say(f"{name}: evaluation of {what} FAILED (exit {rc}): {last}")
        return None, dict(status="eval_failed", exit_status=rc, message=f"{what}: {last} (log: {log})")
    with open(os.path.join(ev, EVAL_ARGS), "w") as f:
        json.dump(made_with, f)
    say(f"{name}: evaluated {what} in {secs:.0f} s")
    return rec, None

"""A speed-up as a ratio taken side by side: the same benchmark command in an old commit and in this checkout,
alternated round by round on the same machine (shared machines are noisy; a ratio of two separate runs is not).

    python -m benchmarks.compare_commits --old HEAD~1                         # science step, 1 thread, 4 rounds
    python -m benchmarks.compare_commits --old v0.3 --config trm-tiny --threads 2 --rounds 6 --steps 20
    python -m benchmarks.compare_commits --old HEAD~3 --json ab.json

The old commit is checked out with ``git worktree add --detach`` into a temporary directory (removed afterwards);
the new side is this working tree as it is (uncommitted changes included). Each round runs
``python -m benchmarks.train_step --config C --steps N --json ...`` once in the old tree, then once in the new one,
with ``OMP_NUM_THREADS`` set; both use this interpreter and its installed packages. Reported: every round's s/step
(old, new), the per-round ratio old/new, and the median ratio (the figure to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Optional

from core.errors import PlatformError, user_errors
from core.io import write_json_atomic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CompareError(PlatformError, ValueError):
    """Bad --old revision or a failed benchmark run; the message names it."""


def _git(*args: str) -> str:
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise CompareError(f"git {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def _time_step(tree: str, config: str, steps: int, threads: int, out_json: str) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))  # `-m` in cwd=tree: that tree's modules come first
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.train_step",
        "--config",
        config,
        "--steps",
        str(steps),
        "--compile",
        "eager",
        "--device",
        "cpu",
        "--json",
        out_json,
    ]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise CompareError(f"benchmark in {tree} failed (exit {r.returncode}): {tail[0]}")
    with open(out_json) as f:
        return float(json.load(f)["eager"]["seconds_per_step"])


def summarise(old: list[float], new: list[float]) -> dict[str, Any]:
    """Per-round ratios old/new (> 1: the new tree is faster) and their median."""
    if len(old) != len(new) or not old:
        raise ValueError("need the same positive number of old and new rounds")
    ratios = [o / n for o, n in zip(old, new)]
    return {"old_s_per_step": old, "new_s_per_step": new, "ratios": ratios, "median_ratio": statistics.median(ratios)}


def compare(
    old_rev: str,
    *,
    config: str = "science",
    threads: int = 1,
    rounds: int = 4,
    steps: int = 10,
    progress=lambda msg: print(msg, flush=True),
) -> dict[str, Any]:
    sha = _git("rev-parse", "--verify", f"{old_rev}^{{commit}}")
    old_s, new_s = [], []
    with tempfile.TemporaryDirectory(prefix="compare-commits-") as tmp:
        tree = os.path.join(tmp, "old")
        _git("worktree", "add", "--detach", "--quiet", tree, sha)
        try:
            for r in range(1, rounds + 1):
                for side, path, acc in (("old", tree, old_s), ("new", REPO, new_s)):
                    acc.append(_time_step(path, config, steps, threads, os.path.join(tmp, f"{side}-{r}.json")))
                    progress(
                        f"[compare] round {r}/{rounds} {side} ({sha[:10] if side == 'old' else 'working tree'})"
                        f": {acc[-1]:.3f} s/step"
                    )
        finally:
            shutil.rmtree(tree, ignore_errors=True)
            _git("worktree", "prune")
    out = dict(summarise(old_s, new_s), old=sha, config=config, threads=threads, steps=steps, rounds=rounds)
    progress(
        f"[compare] {config}, {threads} thread(s): old/new per round "
        + " ".join(f"{x:.2f}" for x in out["ratios"])
        + f"; median {out['median_ratio']:.2f}x"
    )
    return out


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.compare_commits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--old", required=True, help="the commit to compare against (any git revision)")
    ap.add_argument("--config", choices=["science", "trm-tiny"], default="science")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    if min(a.threads, a.rounds, a.steps) <= 0:
        ap.error("--threads, --rounds and --steps must be positive")
    with user_errors():
        out = compare(a.old, config=a.config, threads=a.threads, rounds=a.rounds, steps=a.steps)
    if a.json:
        write_json_atomic(a.json, out)
    return out


if __name__ == "__main__":
    main()

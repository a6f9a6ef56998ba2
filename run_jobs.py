#!/usr/bin/env python
"""Run the experiment queue in a jobs file (default ``jobs.txt``); see docs/experiments.md.

python run_jobs.py                         # run pending lines one after another
python run_jobs.py jobs.txt --parallel 4 --gpus 0,1,2,3
python run_jobs.py --dry-run               # what would run, gate decisions; changes nothing
python run_jobs.py --check                 # compose + validate each queued Hydra command, run nothing
"""

from __future__ import annotations

import argparse
import os
import sys

from experiments.queue.check import check_jobs
from experiments.queue.jobfile import JobFileError, parse_duration
from experiments.queue.runner import Runner, RunnerConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run_jobs.py",
        description="Run the experiment queue of a jobs file (docs/experiments.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("jobs", nargs="?", default="jobs.txt", help="jobs file")
    p.add_argument(
        "--parallel", "-p", type=int, default=None, help="jobs at a time (default: number of --gpus, else 1)"
    )
    p.add_argument(
        "--gpus",
        default=None,
        help="GPU pool, e.g. 0,1,2,3: each job gets its own GPU(s) via CUDA_VISIBLE_DEVICES "
        "(a job tagged gpus=K gets K)",
    )
    p.add_argument(
        "--dry-run", "-n", action="store_true", help="print what would run and gate decisions; change nothing"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check that each pending Hydra command composes and validates (in-process Hydra "
        "compose + strict config validation; no training); change nothing",
    )
    p.add_argument("--check-all", action="store_true", help="with --check: also check done/failed/skipped lines")
    p.add_argument("--logs-dir", default="logs", help="one log file per job goes here")
    p.add_argument(
        "--max-retries",
        type=int,
        default=1,
        help="reruns of a crashed job, each with the resume argument (per job: retries=N tag)",
    )
    p.add_argument(
        "--resume-arg",
        default="resume=true",
        help="appended to a crashed/interrupted job's command on rerun (per job: resume=ARG or resume=none)",
    )
    p.add_argument("--once", action="store_true", help="take one job, run it, exit")
    p.add_argument(
        "--kill-grace",
        type=float,
        default=30.0,
        help="seconds between SIGINT and SIGKILL for running jobs on Ctrl-C (SIGTERM and SIGKILL past a timeout)",
    )
    p.add_argument(
        "--timeout",
        default="none",
        help="time limit of each job attempt, e.g. 90m, 12h, 1d (per job: timeout=DURATION or timeout=none); past "
        "it the job's process group gets SIGTERM, SIGKILL after --kill-grace, and the line is marked failed "
        "(timed out), not retried",
    )
    p.add_argument("--workdir", default=None, help="working directory of the commands (default: current)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus is not None else None
    parallel = args.parallel if args.parallel is not None else (len(gpus) if gpus else 1)
    try:
        cfg = RunnerConfig(
            jobs_path=args.jobs,
            parallel=parallel,
            gpus=gpus,
            logs_dir=args.logs_dir,
            max_retries=args.max_retries,
            once=args.once,
            resume_arg=args.resume_arg,
            kill_grace=args.kill_grace,
            timeout=parse_duration(args.timeout, "--timeout"),
            workdir=args.workdir,
        )
        if not os.path.isfile(args.jobs):
            raise JobFileError(f"jobs file not found: {args.jobs}")
        if args.check:
            return check_jobs(args.jobs, workdir=args.workdir, include_finished=args.check_all)
        runner = Runner(cfg)
        return runner.dry_run() if args.dry_run else runner.run()
    except (JobFileError, ValueError, TimeoutError) as e:
        print(f"run_jobs.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

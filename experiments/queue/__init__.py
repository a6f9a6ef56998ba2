"""Experiment queue: the ``jobs.txt`` format (:mod:`experiments.queue.jobfile`), gates on run summaries
(:mod:`experiments.queue.gates`), the runner (:mod:`experiments.queue.runner`, CLI ``run_jobs.py``), config checks of
queued commands (:mod:`experiments.queue.check`; each command read as Hydra reads it:
:mod:`experiments.queue.hydra_command`) and the SLURM / torch.distributed bridge for Hydra's submitit launcher
(:mod:`experiments.queue.slurm`). User documentation: docs/experiments.md.
"""

from .gates import GateDecision, Requirement, evaluate_gates, lookup_metric, parse_requirement, summary_path
from .jobfile import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SKIPPED,
    Job,
    JobFile,
    JobFileError,
    JobStore,
    atomic_write_text,
    parse_job_line,
)
from .runner import Runner, RunnerConfig, resume_command

__all__ = [
    "DONE",
    "FAILED",
    "PENDING",
    "RUNNING",
    "SKIPPED",
    "Job",
    "JobFile",
    "JobFileError",
    "JobStore",
    "atomic_write_text",
    "parse_job_line",
    "GateDecision",
    "Requirement",
    "evaluate_gates",
    "lookup_metric",
    "parse_requirement",
    "summary_path",
    "Runner",
    "RunnerConfig",
    "resume_command",
]

"""Gates: a job runs only if the jobs it requires are done and their summary.json metrics pass.

Requirement syntax (in a job's metadata comment)::

    requires=ID                                  ID must be done ([x])
    requires=ID:train/exact_accuracy>0.90        ... and its summary metric must pass the comparison
    requires=ID:best:train/exact_accuracy>=0.9   explicit section of summary.json (best: / final:)
    # requires: ID train/exact_accuracy>0.90     long form (one requirement per segment)

Operators: ``>``, ``>=``, ``<``, ``<=``, ``==``, ``!=``. Several ``requires`` are ANDed.

Where the summary of job ID is (first that applies), relative paths against the runner's workdir:

1. its ``summary=PATH`` tag (a file, or a directory holding summary.json);
2. ``<checkpoint_path>/summary.json`` from a ``checkpoint_path=`` / ``+checkpoint_path=`` /
   ``++checkpoint_path=`` override in its command;
3. ``checkpoints/<project_name>/<run_name>/summary.json`` from its ``project_name`` and ``run_name``
   overrides (pretrain.py's default checkpoint dir).

Metric lookup without a section: a top-level key of summary.json, else ``best[metric]``, else
``final[metric]`` (so ``train/exact_accuracy>0.9`` means "reached", i.e. the best value). A name without
``/`` also matches its ``eval/`` form (``all.exact_accuracy`` -> ``eval/all.exact_accuracy``).
Outcomes are read only from summary.json, never from logs.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass
from typing import Any, Optional

from .jobfile import DONE, FAILED, PENDING, RUNNING, SKIPPED, Job
from .requirements import OPS, SECTIONS, Requirement, parse_requirement

SUMMARY_FILE = "summary.json"


def command_overrides(command: str) -> dict[str, str]:
    """``key=value`` words of a shell command (``+``/``++`` prefixes stripped); the last one wins."""
    try:
        words = shlex.split(command, comments=False)
    except ValueError:
        words = command.split()
    out: dict[str, str] = {}
    for w in words:
        if "=" not in w or w.startswith("-"):
            continue
        k, _, v = w.partition("=")
        out[k.lstrip("+")] = v
    return out


def summary_path(job: Job, workdir: str = ".") -> Optional[str]:
    """Where ``job`` writes its summary.json (see module doc), or None if it cannot be known."""

    def absol(p: str) -> str:
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(workdir, p))

    if "summary" in job.meta:
        p = absol(job.meta["summary"])
        return os.path.join(p, SUMMARY_FILE) if not p.endswith(".json") else p
    ov = command_overrides(job.command)
    if ov.get("checkpoint_path") not in (None, "", "null", "None"):
        return absol(os.path.join(ov["checkpoint_path"], SUMMARY_FILE))
    if ov.get("project_name") and ov.get("run_name"):
        return absol(os.path.join("checkpoints", ov["project_name"], ov["run_name"], SUMMARY_FILE))
    return None


def read_summary(path: str) -> dict[str, Any]:
    with open(path, "r", encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: summary.json must hold a JSON object, got {type(data).__name__}")
    return data


def lookup_metric(summary: dict[str, Any], metric: str, section: Optional[str] = None) -> Optional[float]:
    """Value of ``metric`` in a summary (see module doc for the lookup order), or None."""
    places: list[Any] = [summary.get(section)] if section else [summary, summary.get("best"), summary.get("final")]
    names = [metric] if "/" in metric else [metric, f"eval/{metric}"]  # all.exact_accuracy is logged as eval/…
    for place, name in ((p, n) for n in names for p in places):
        if isinstance(place, dict) and name in place:
            metric = name
            v = place[metric]
            if isinstance(v, dict):  # e.g. {"value": x, "step": n}
                v = v.get("value")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return None if v is None else float("nan")
            return float(v)
    return None


def available_metrics(summary: dict[str, Any]) -> list[str]:
    names = {k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for sec in SECTIONS:
        if isinstance(summary.get(sec), dict):
            names.update(f"{sec}:{k}" for k in summary[sec])
    return sorted(names)


@dataclass
class GateDecision:
    """``run``: all requirements pass; ``wait``: some required job is not finished; ``skip``: never."""

    action: str  # "run" | "wait" | "skip"
    reason: str


def evaluate_requirement(req: Requirement, dep: Optional[Job], workdir: str = ".") -> GateDecision:
    if dep is None:
        return GateDecision("skip", f"requires unknown job id '{req.job_id}'")
    if dep.mark in (PENDING, RUNNING):
        return GateDecision("wait", f"waits for {req.job_id} ({dep.status})")
    if dep.mark in (FAILED, SKIPPED):
        return GateDecision("skip", f"requires {req.job_id}, which {'failed' if dep.mark == FAILED else 'was skipped'}")
    assert dep.mark == DONE
    if req.metric is None:
        return GateDecision("run", f"requirement {req.job_id} done")
    path = summary_path(dep, workdir)
    shown = os.path.relpath(path, workdir) if path and not os.path.relpath(path, workdir).startswith("..") else path
    if path is None:
        return GateDecision(
            "skip",
            f"cannot locate the summary.json of {req.job_id}: give it a summary=PATH tag or a checkpoint_path= "
            f"(or +project_name= and +run_name=) override",
        )
    try:
        summary = read_summary(path)
    except FileNotFoundError:
        return GateDecision("skip", f"{req.job_id} summary not found: {shown}")
    except (OSError, ValueError) as e:
        return GateDecision("skip", f"{req.job_id} summary unreadable: {shown}: {e}")
    value = lookup_metric(summary, req.metric, req.section)
    sec = f"{req.section}:" if req.section else ""
    if value is None:
        avail = ", ".join(available_metrics(summary)[:12]) or "none"
        return GateDecision("skip", f"{req.job_id} {sec}{req.metric} missing from {shown} (has: {avail})")
    ok = (not math.isnan(value)) and OPS[req.op](value, req.threshold)  # type: ignore[index]
    if ok:
        return GateDecision("run", f"gate {req.describe()} passed ({sec}{req.metric}={value:.4g})")
    return GateDecision(
        "skip",
        f"gate {req.describe()} failed: {sec}{req.metric}={value:.4g}, needs {req.op} {req.threshold:g} (from {shown})",
    )


def evaluate_gates(job: Job, jobs_by_id: dict[str, Job], workdir: str = ".") -> GateDecision:
    """AND of all requirements of ``job``: the first skip wins, then any wait, else run."""
    if not job.requires:
        return GateDecision("run", "")
    decisions = [
        evaluate_requirement(parse_requirement(spec), jobs_by_id.get(parse_requirement(spec).job_id), workdir)
        for spec in job.requires
    ]
    for d in decisions:
        if d.action == "skip":
            return d
    waits = [d.reason for d in decisions if d.action == "wait"]
    if waits:
        return GateDecision("wait", "; ".join(waits))
    return GateDecision("run", "; ".join(d.reason for d in decisions))

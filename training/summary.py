"""``<checkpoint_dir>/summary.json``: the run's outcome, read by the experiment queue's gates.

Written atomically (temp file + ``os.replace``) at every checkpoint and at the end. Keys::

    run_name, project_name, checkpoint_dir, config_path, status ("running" | "finished" | "failed"),
    stop_reason ("completed" | "max_steps" | "early_stop: <reason>" | "non-finite loss" | "interrupted" |
    "error" | null while running),
    exit_status (int or null while running), steps, total_steps, epochs_completed, examples_seen,
    wall_time_s, num_params, final {metric: value} (the last logged value of every train/ and eval/ metric),
    best {metric: value} (only metrics with a direction, ``training.metrics.metric_direction``: max for
    accuracies / pass@K, min for losses), best_step {metric: step},
    last_checkpoint, warnings (health warnings), message (error text when failed)
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Optional

from core.io import write_json_atomic
from training.metrics import metric_direction

SUMMARY_FILE = "summary.json"

STOP_COMPLETED = "completed"
STOP_MAX_STEPS = "max_steps"
STOP_NONFINITE = "non-finite loss"
STOP_INTERRUPTED = "interrupted"
STOP_ERROR = "error"  # an exception ended the run (message has it); the process exits non-zero

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NONFINITE = 2
EXIT_EARLY_STOP = 3
EXIT_INTERRUPTED = 130


class RunSummary:
    """Tracks final/best metrics and writes summary.json."""

    def __init__(
        self,
        checkpoint_dir: str,
        *,
        run_name: str,
        project_name: str,
        config_path: Optional[str],
        total_steps: int,
        num_params: int = 0,
        warnings: tuple[str, ...] = (),
    ):
        self.path = os.path.join(checkpoint_dir, SUMMARY_FILE)
        self.start = time.time()
        self.wall_offset = 0.0  # wall time of earlier segments (resume)
        self.data: dict[str, Any] = {
            "run_name": run_name,
            "project_name": project_name,
            "checkpoint_dir": os.path.abspath(checkpoint_dir),
            "config_path": config_path,
            "status": "running",
            "stop_reason": None,
            "exit_status": None,
            "steps": 0,
            "total_steps": int(total_steps),
            "epochs_completed": 0.0,
            "examples_seen": 0,
            "wall_time_s": 0.0,
            "num_params": int(num_params),
            "final": {},
            "best": {},
            "best_step": {},
            "last_checkpoint": None,
            "warnings": list(warnings),
            "message": None,
        }

    def update_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if not (k.startswith("train/") or k.startswith("eval/") or "/" in k):
                continue
            try:
                v = float(v)
            except (TypeError, ValueError):
                continue
            if not math.isfinite(v):
                continue
            self.data["final"][k] = v
            direction = metric_direction(k)
            if direction is None:
                continue
            best = self.data["best"].get(k)
            better = best is None or (v < best if direction == "min" else v > best)
            if better:
                self.data["best"][k] = v
                self.data["best_step"][k] = int(step)

    def set(self, **kw: Any) -> None:
        self.data.update(kw)

    def add_warning(self, msg: str) -> None:
        self.data["warnings"].append(msg)

    def write(self) -> None:
        self.data["wall_time_s"] = round(self.wall_offset + time.time() - self.start, 3)
        write_json_atomic(self.path, self.data)

    def finish(self, stop_reason: str, exit_status: int, message: Optional[str] = None) -> dict[str, Any]:
        self.data.update(
            stop_reason=stop_reason,
            exit_status=int(exit_status),
            message=message,
            status="finished" if exit_status in (EXIT_OK, EXIT_EARLY_STOP) else "failed",
        )
        self.write()
        return dict(self.data)

    def state_dict(self) -> dict[str, Any]:
        d = dict(self.data)
        d["wall_time_s"] = round(self.wall_offset + time.time() - self.start, 3)
        return json.loads(json.dumps(d))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        keep = {k: self.data[k] for k in ("total_steps", "config_path", "checkpoint_dir")}
        self.data.update(state)
        self.data.update(keep)
        self.data.update(status="running", stop_reason=None, exit_status=None, message=None)
        self.wall_offset = float(state.get("wall_time_s", 0.0))


def read_summary(checkpoint_dir: str) -> dict[str, Any]:
    with open(os.path.join(checkpoint_dir, SUMMARY_FILE)) as f:
        return json.load(f)

"""Where a run reports: W&B / the terminal (``training.logging.RunLogger``), ``summary.json``
(``training.summary.RunSummary``) and the health monitor (``training.health.HealthMonitor``), fed together.

Rank 0 writes; every rank takes the same early-stop decision (rank 0's: evaluator metrics exist only there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import OmegaConf

from core.io import atomic_write
from training import distributed as D
from training.config import PretrainConfig
from training.health import HealthMonitor
from training.logging import RunLogger
from training.summary import EXIT_FAILED, STOP_ERROR, RunSummary

METRICS_FILE = "metrics.jsonl"  # every logged value, one JSON object per log call (python -m training.plot_run)
CONFIG_FILE = "config.yaml"  # the run's resolved config (every key, defaults included), rewritten at each start


def write_config(cfg: PretrainConfig, checkpoint_dir: str) -> str:
    """``<checkpoint_dir>/config.yaml``: the validated config the run trains with (every key, defaults included;
    ``python pretrain.py --config-path DIR --config-name config`` composes it again). Returns its path."""
    path = os.path.join(checkpoint_dir, CONFIG_FILE)
    text = OmegaConf.to_yaml(OmegaConf.create(cfg.model_dump(mode="json")))
    atomic_write(path, lambda f: f.write(text))
    return path


@dataclass
class RunReport:
    cfg: PretrainConfig
    info: D.DistInfo
    summary: RunSummary
    health: Optional[HealthMonitor]
    logger: Optional[RunLogger] = None

    def open(self, *, step: int, resume_id: Optional[str], start_line: str) -> str:
        """Start W&B / the progress bar, write the first summary.json; returns the W&B run id. The run's names,
        directory, length and size are the summary's."""
        cfg, s = self.cfg, self.summary.data
        project, run_name, checkpoint_dir = s["project_name"], s["run_name"], s["checkpoint_dir"]
        total_steps, num_params = s["total_steps"], s["num_params"]
        self.logger = RunLogger(
            enabled=self.info.is_main,
            project=project,
            run_name=run_name,
            config=cfg.model_dump(mode="json"),
            mode=cfg.wandb.mode,
            wandb_dir=cfg.wandb.dir or checkpoint_dir,
            total_steps=total_steps,
            initial_step=step,
            entity=cfg.wandb.entity,
            save_code=cfg.wandb.save_code,
            progress=cfg.progress,
            resume_id=resume_id,
            metrics_path=os.path.join(checkpoint_dir, METRICS_FILE),
        )
        if self.info.is_main:
            os.makedirs(checkpoint_dir, exist_ok=True)
            config_file = write_config(cfg, checkpoint_dir)  # the summary's config_path
            self.summary.write()
            if step == 0:  # once per run, not again at a resume
                self.logger.log({"num_params": float(num_params)}, step=step)
            self.logger.print(start_line)
            self.logger.print(f"[train] config: {config_file}")
        return self.logger.run_id

    def publish(self, step: int, logs: dict[str, float], **progress: Any) -> Optional[str]:
        """Log ``logs``, update summary.json (live progress for watchers, status stays "running"; ``progress``:
        steps / examples_seen / epochs_completed), feed the health monitor. Returns its early-stop reason when
        ``early_stop`` is on."""
        self.logger.log(logs, step=step)
        if self.info.is_main:
            self.summary.update_metrics(step, logs)
            self.summary.set(**progress)
            self.summary.write()
        if self.health is None:
            return None
        for w in self.health.update(step, logs):
            self.logger.print(f"[health] step {step}: {w}")
            if self.info.is_main:
                self.summary.add_warning(f"step {step}: {w}")
        return D.broadcast_object(self.health.stop_reason if self.cfg.early_stop else None)

    def eval_result(self, step: int, logs: dict[str, float], *, log: bool) -> None:
        """Print an evaluation's line; with ``log`` also log it and record it in the summary (end of run)."""
        self.logger.print_eval(step, logs)
        if log:
            self.logger.log(logs, step=step)
            if self.info.is_main:
                self.summary.update_metrics(step, logs)

    def finish(
        self, stop_reason: str, exit_status: int, message: Optional[str], checkpoint_dir: str, **progress: Any
    ) -> Optional[dict[str, Any]]:
        """Final summary.json (rank 0: returns its dict) and the closing lines."""
        if not self.info.is_main:
            return None
        self.summary.set(**progress)
        result = self.summary.finish(stop_reason, exit_status, message)
        self.logger.summary({**result["final"], **{f"best/{k}": v for k, v in result["best"].items()}})
        self.logger.print(
            f"[train] {stop_reason} after {progress.get('steps')} steps. checkpoint dir: "
            f"{checkpoint_dir}\n[train] summary: {self.summary.path}\n[train] W&B run "
            f"({self.logger.mode}): {self.logger.run_dir or '(W&B disabled)'}"
        )
        return result

    def fail(self, e: BaseException, **progress: Any) -> None:
        """summary.json with status failed (stop_reason "error"); W&B closed with exit code 1."""
        if self.info.is_main:
            try:
                self.summary.set(**progress)
                self.summary.finish(STOP_ERROR, EXIT_FAILED, f"{type(e).__name__}: {e}")
            except Exception:
                pass
        self.close(EXIT_FAILED)

    def close(self, exit_code: int) -> None:
        if self.logger is not None:
            self.logger.close(exit_code=exit_code)

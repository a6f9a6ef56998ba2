"""Rank-0 logging: W&B (online / offline / disabled) and a tqdm progress bar.

``wandb.mode``: ``auto`` (default) -> online when ``WANDB_API_KEY`` is set or a wandb login exists in
``~/.netrc``, otherwise offline; the ``WANDB_MODE`` environment variable, when set, wins over ``auto``;
``disabled`` turns W&B off entirely. Non-zero ranks never touch W&B.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, Optional

from tqdm import tqdm


def _has_wandb_login() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        with open(netrc) as f:
            return "api.wandb.ai" in f.read()
    except OSError:
        return False


def resolve_wandb_mode(mode: str) -> str:
    """Map the configured mode to the one given to ``wandb.init``."""
    if mode != "auto":
        return mode
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled", "dryrun", "run"):
        return {"dryrun": "offline", "run": "online"}.get(env, env)
    return "online" if _has_wandb_login() else "offline"


class RunLogger:
    """Logs metrics to W&B and the console (rank 0 only) and drives the progress bar."""

    def __init__(self, *, enabled: bool, project: str, run_name: str, config: dict[str, Any], mode: str,
                 wandb_dir: str, total_steps: int, initial_step: int = 0, entity: Optional[str] = None,
                 save_code: bool = True, progress: bool = True, resume_id: Optional[str] = None):
        self.enabled = enabled
        self.run = None
        self.mode = resolve_wandb_mode(mode)
        self.bar = None
        self.run_dir: Optional[str] = None
        if not enabled:
            return
        if self.mode != "disabled":
            import wandb

            os.makedirs(wandb_dir, exist_ok=True)
            self.run = wandb.init(project=project, name=run_name, config=config, mode=self.mode, dir=wandb_dir,
                                  entity=entity, save_code=save_code, id=resume_id,
                                  resume="allow" if resume_id else None, reinit="finish_previous")
            if save_code and self.run is not None and self.mode != "disabled":
                try:
                    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                    skip = ("/.venv/", "/.git/", "/wandb/", "/checkpoints/", "/data/", "/outputs/", "/multirun/")
                    self.run.log_code(root, include_fn=lambda p: p.endswith((".py", ".yaml")),
                                      exclude_fn=lambda p, root=None: any(s in p + "/" for s in skip))
                except Exception as e:  # code saving is a convenience; the run must not die for it
                    print(f"[logging] W&B code saving failed: {e}", file=sys.stderr)
            self.run_dir = getattr(self.run, "dir", None)
            if self.run_dir and self.run_dir.endswith("/files"):
                self.run_dir = os.path.dirname(self.run_dir)
        if progress:
            self.bar = tqdm(total=total_steps, initial=initial_step, desc=run_name, dynamic_ncols=True,
                            file=sys.stderr, disable=None)

    @property
    def run_id(self) -> Optional[str]:
        return getattr(self.run, "id", None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        if self.run is not None:
            self.run.log(metrics, step=step)
        if self.bar is not None:
            short = {k.split("/")[-1]: v for k, v in metrics.items()
                     if k in ("train/lm_loss", "train/exact_accuracy", "train/accuracy", "train/lr")}
            self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else v)
                                  for k, v in short.items()}, refresh=False)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def print(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            for k, v in values.items():
                self.run.summary[k] = v

    def close(self, exit_code: int = 0) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None

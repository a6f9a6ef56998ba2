"""Rank-0 logging: W&B (online / offline / disabled), a tqdm progress bar and plain metric lines.

On a terminal the progress bar (stderr) shows the latest train metrics. When stdout is not a terminal (a queue,
SLURM, ``> log``) or the bar is off, every log window prints one line to stdout instead::

    [train] step 50/500 loss 1.234 exact 0.12 acc 0.87 q_halt_acc 0.9 steps 2.1 lr 0.001 grad 0.53 epoch 2.5 \
        | 0.21 s/step, elapsed 0:00:11, ETA 0:01:35

(s/step over the log window; ETA from the mean step time of this process so far.)

Every evaluation prints one line with its metrics (``[eval] step 50: ...``), terminal or not.

``wandb.mode``: ``auto`` (default) -> online when ``WANDB_API_KEY`` is set or a wandb login exists in
``~/.netrc``, otherwise offline; the ``WANDB_MODE`` environment variable, when set, wins over ``auto``;
``disabled`` turns W&B off entirely. Non-zero ranks never touch W&B.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable, Optional

from tqdm import tqdm

from core.io import atomic_write

# (metric, short name) shown in the plain train line, in this order (those present)
TRAIN_LINE_KEYS = (
    ("train/loss", "loss"),
    ("train/lm_loss", "lm_loss"),
    ("train/exact_accuracy", "exact"),
    ("train/accuracy", "acc"),
    ("train/q_halt_accuracy", "q_halt_acc"),
    ("train/steps", "steps"),
    ("train/rule_exact", "rule_exact"),
    ("train/lr", "lr"),
    ("grad/total_norm", "grad"),
    ("train/epoch", "epoch"),
)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def train_line(step: int, total_steps: int, metrics: dict[str, Any], pace: str = "") -> Optional[str]:
    """``[train] step N/T loss … exact … lr … | <pace>`` for a log window's metrics (None when it has no train
    loss); ``pace``: :meth:`Pace.tick`'s ``s/step, elapsed, ETA``."""
    if "train/loss" not in metrics:
        return None
    parts = [f"{short} {_fmt(metrics[k])}" for k, short in TRAIN_LINE_KEYS if k in metrics]
    return f"[train] step {step}/{total_steps} " + " ".join(parts) + (f" | {pace}" if pace else "")


def _hms(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Pace:
    """Seconds per step over the last window, time elapsed and the ETA of a run (this process's steps only: a
    resumed run counts from its restart)."""

    def __init__(self, total_steps: int, initial_step: int = 0, clock: Callable[[], float] = time.monotonic):
        self.total, self.clock = int(total_steps), clock
        self.t0, self.step0 = clock(), int(initial_step)
        self.last_t, self.last_step = self.t0, int(initial_step)

    def tick(self, step: int) -> str:
        """``"0.21 s/step, elapsed 0:00:11, ETA 0:01:35"`` at ``step`` (the window: since the previous tick)."""
        now = self.clock()
        window = (now - self.last_t) / (step - self.last_step) if step > self.last_step else None
        mean = (now - self.t0) / (step - self.step0) if step > self.step0 else None
        self.last_t, self.last_step = now, step
        per = f"{window:.3g} s/step" if window is not None else "- s/step"
        eta = _hms(mean * max(0, self.total - step)) if mean is not None else "-"
        return f"{per}, elapsed {_hms(now - self.t0)}, ETA {eta}"


def eval_line(step: int, metrics: dict[str, Any]) -> Optional[str]:
    """``[eval] step N: name value, …`` with every metric of one evaluation (None when there are none)."""
    if not metrics:
        return None
    items = ", ".join(f"{(k[5:] if k.startswith('eval/') else k)} {_fmt(v)}" for k, v in sorted(metrics.items()))
    return f"[eval] step {step}: {items}"


def _truncate_after(path: str, step: int) -> None:
    """Keep the lines of a metrics.jsonl logged at or before ``step`` (a resumed run logs the later ones again);
    a line cut short by a crash mid-write (or damaged: not UTF-8, not a JSON object) is dropped."""
    if not os.path.isfile(path):
        return
    keep = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                line = raw.decode("utf-8")
                row = json.loads(line)
            except ValueError:
                continue
            at = row.get("step", 0) if isinstance(row, dict) else None
            if isinstance(at, (int, float)) and at <= step:
                keep.append(line.rstrip("\n") + "\n")
    atomic_write(path, lambda f: f.writelines(keep), encoding="utf-8")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


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


def wandb_identity(config: dict[str, Any], run_name: str) -> dict[str, Any]:
    """``group``, ``tags`` and the config W&B shows for a run's (or its evaluation's) config dump: group =
    ``wandb.group`` (a training run stores its effective group there: ``training.config.with_wandb_group``), else
    ``run_name``; tags = ``arch:<name>``, ``encoder:<name>`` (``encoder:none`` for TRM), ``data:<dataset dir>``,
    + ``wandb.tags``. Runs without an encoder show ``encoder.name = "none"`` so that grouping by ``encoder.name``
    covers TRM runs too."""
    wb = config.get("wandb") or {}
    arch = (config.get("arch") or {}).get("name", "model")
    enc = (config.get("encoder") or {}).get("name")
    data = [os.path.basename(os.path.normpath(p)) for p in (config.get("data_paths") or [])]
    shown = dict(config, encoder=config.get("encoder") or {"name": "none"})
    return {
        "group": wb.get("group") or run_name,
        "tags": [f"arch:{arch}", f"encoder:{enc or 'none'}", *(f"data:{d}" for d in data), *wb.get("tags", [])],
        "config": shown,
    }


class RunLogger:
    """Logs metrics to W&B and the console (rank 0 only) and drives the progress bar."""

    def __init__(
        self,
        *,
        enabled: bool,
        project: str,
        run_name: str,
        config: dict[str, Any],
        mode: str,
        wandb_dir: str,
        total_steps: int,
        initial_step: int = 0,
        entity: Optional[str] = None,
        save_code: bool = True,
        progress: bool = True,
        resume_id: Optional[str] = None,
        metrics_path: Optional[str] = None,
        job_type: str = "train",
    ):
        self.enabled = enabled
        self.metrics_path = metrics_path if enabled else None
        if self.metrics_path:
            _truncate_after(self.metrics_path, initial_step if initial_step > 0 else -1)  # step 0: a fresh start
        self.run = None
        self.mode = resolve_wandb_mode(mode)
        self.bar = None
        self.run_dir: Optional[str] = None
        self.total_steps = int(total_steps)
        self.pace = Pace(total_steps, initial_step)
        self.postfix: dict[str, Any] = {}
        self.lines = False  # plain metric lines on stdout (set below: stdout not a TTY, or no visible bar)
        if not enabled:
            return
        if self.mode != "disabled":
            import wandb

            os.makedirs(wandb_dir, exist_ok=True)
            ident = wandb_identity(config, run_name)
            self.run = wandb.init(
                project=project,
                name=run_name,
                config=ident["config"],
                mode=self.mode,
                dir=wandb_dir,
                entity=entity,
                save_code=save_code,
                id=resume_id,
                resume="allow" if resume_id else None,
                reinit="finish_previous",
                group=ident["group"],
                tags=ident["tags"],
                job_type=job_type,
            )
            if save_code and self.run is not None and self.mode != "disabled":
                try:
                    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                    skip = ("/.venv/", "/.git/", "/wandb/", "/checkpoints/", "/data/", "/outputs/", "/multirun/")
                    self.run.log_code(
                        root,
                        include_fn=lambda p: p.endswith((".py", ".yaml")),
                        exclude_fn=lambda p, root=None: any(s in p + "/" for s in skip),
                    )
                except Exception as e:  # code saving is a convenience; the run must not die for it
                    print(f"[logging] W&B code saving failed: {e}", file=sys.stderr)
            self.run_dir = getattr(self.run, "dir", None)
            if self.run_dir and self.run_dir.endswith("/files"):
                self.run_dir = os.path.dirname(self.run_dir)
        if progress:
            self.bar = tqdm(
                total=total_steps,
                initial=initial_step,
                desc=run_name,
                dynamic_ncols=True,
                file=sys.stderr,
                disable=None,
            )
        bar_visible = self.bar is not None and not getattr(self.bar, "disable", False)
        self.lines = not bar_visible or not _isatty(sys.stdout)

    @property
    def run_id(self) -> Optional[str]:
        return getattr(self.run, "id", None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        if self.run is not None:
            self.run.log(metrics, step=step)
        if self.metrics_path:  # the run's own record of every logged value (python -m training.plot_run)
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps({"step": int(step), **{k: float(v) for k, v in metrics.items()}}) + "\n")
        if self.lines and "train/loss" in metrics:
            self._stdout(train_line(step, self.total_steps, metrics, self.pace.tick(step)))
        if self.bar is not None:  # the latest value of each (an lr-only log keeps the loss shown)
            self.postfix.update(
                {
                    k.split("/")[-1]: (f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else v)
                    for k, v in metrics.items()
                    if k in ("train/lm_loss", "train/exact_accuracy", "train/accuracy", "train/lr")
                }
            )
            self.bar.set_postfix(self.postfix, refresh=False)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def print_eval(self, step: int, metrics: dict[str, Any]) -> None:
        """One line with an evaluation's metrics (always printed, terminal or not)."""
        line = eval_line(step, metrics) if self.enabled else None
        if line:
            self._stdout(line)

    def _stdout(self, msg: str) -> None:
        if self.bar is not None and not getattr(self.bar, "disable", False):
            self.bar.write(msg, file=sys.stdout)
        else:
            print(msg, flush=True)

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

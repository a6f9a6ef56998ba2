"""Pre-train a TRM-family model: a thin Hydra entry point around ``training.loop.train``.

    python pretrain.py arch=trm data_paths="[data/arc1concept-aug-1000]" arch.L_layers=2 \
        arch.H_cycles=3 arch.L_cycles=4 +run_name=my_run ema=True
    torchrun --nproc-per-node 4 pretrain.py ...          # multi-GPU (NCCL) / multi-process CPU (gloo)
    python pretrain.py --multirun lr=1e-4,3e-4 ...        # Hydra sweep (one run per value)

Checkpoints, summary.json and the W&B run live in ``checkpoint_path`` (default
``checkpoints/<project_name>/<run_name>``), with the resolved config (``config.yaml``). A single run leaves no
Hydra output dir (``outputs/…``): a refused config leaves nothing behind.
Exit status: 0 completed / max_steps, 1 error, 2 non-finite loss, 3 early stop, 130 interrupted.
"""

from __future__ import annotations

import sys
import traceback
from typing import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from core.errors import fail, run_hydra_main, user_errors
from training.config import (  # (also registers the defaults with Hydra)
    CONFIG_DIR,
    ConfigError,
    PretrainConfig,
    config_from_hydra,
    known_keys,
)
from training.loop import train


def check_config(cfg: DictConfig, overrides: Sequence[str] = (), *, require_encoder: bool = False) -> PretrainConfig:
    """Everything this entry point checks in a composed config before training (``run_jobs.py --check`` calls it
    for a queued line, with its task overrides): the strict PretrainConfig, and an encoder when ``require_encoder``
    (pretrain_encoder.py). Bad input raises ConfigError."""
    if require_encoder and not cfg.get("encoder"):
        raise ConfigError("pretrain_encoder.py needs an encoder (encoder=<name>); use pretrain.py for TRM")
    return config_from_hydra(cfg)


def run(cfg: DictConfig, *, require_encoder: bool = False) -> dict:
    """Validate the composed config and train; returns the summary dict."""
    return train(check_config(cfg, require_encoder=require_encoder))


FAILED_POINTS: list[str] = []  # sweep points (--multirun) that failed; the process exits 1 after the sweep


def _is_multirun() -> bool:
    try:
        return HydraConfig.get().mode.name == "MULTIRUN"
    except Exception:  # noqa: BLE001 - no Hydra context (called directly)
        return False


def execute(cfg: DictConfig, *, require_encoder: bool = False) -> None:
    """Shared body of the entry points: train, turn bad input into a one-line error (exit 1, core.errors), and
    map the run's outcome to the exit status. Inside a --multirun sweep a failing point (bad input: its one line;
    a crash: its traceback) is recorded and the remaining points run; the process then exits 1."""
    multirun = _is_multirun()
    try:
        with user_errors(known_keys=known_keys):
            summary = run(cfg, require_encoder=require_encoder)
    except (SystemExit, Exception) as e:
        if not multirun or isinstance(e, SystemExit) and e.code in (0, None):
            raise
        if not isinstance(e, SystemExit):
            traceback.print_exc()
        FAILED_POINTS.append(" ".join(HydraConfig.get().overrides.task))
        print(f"[sweep] point failed, continuing: {FAILED_POINTS[-1]}", file=sys.stderr, flush=True)
        return
    status = int((summary or {}).get("exit_status") or 0)
    if status != 0 and not multirun:  # in a sweep, let the remaining points run
        sys.exit(status)


def main_with_sweep_status(main) -> None:
    """Run a Hydra main; after a --multirun sweep, exit 1 naming the failed points (if any)."""
    run_hydra_main(main, known_keys=known_keys)
    if FAILED_POINTS:
        fail(f"{len(FAILED_POINTS)} sweep point(s) failed (the others ran): " + " | ".join(FAILED_POINTS))


@hydra.main(config_path=CONFIG_DIR, config_name="cfg_pretrain", version_base=None)
def main(cfg: DictConfig) -> None:
    execute(cfg)


if __name__ == "__main__":
    main_with_sweep_status(main)  # Hydra's own composition errors (unknown override key) as one line too

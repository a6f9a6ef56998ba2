"""Pre-train ETRM (TRM + demonstration encoder): a thin Hydra entry around the SAME ``training.loop.train``
as pretrain.py (config ``config/cfg_pretrain_encoder_arc_agi_1.yaml``; ``encoder=<name>`` picks the encoder).

    python pretrain_encoder.py encoder=standard +run_name=std
    torchrun --nproc-per-node 4 pretrain_encoder.py encoder=lpn max_train_groups=32 max_eval_groups=32 \
        arch.halt_max_steps=8 arch.halt_exploration_prob=0.7 +project_name=etrm-dev +run_name=lpn_overfit

Exit status as pretrain.py: 0 completed, 1 error, 2 non-finite loss, 3 early stop (health monitor), 130 interrupted.
"""

from __future__ import annotations

from typing import Sequence

import hydra
from omegaconf import DictConfig

import pretrain
from pretrain import CONFIG_DIR, execute, main_with_sweep_status
from training.config import known_keys  # noqa: F401 - run_jobs.py --check: "did you mean …?" on a misspelt key


def check_config(cfg: DictConfig, overrides: Sequence[str] = ()) -> pretrain.PretrainConfig:
    """What :func:`main` checks before training (``run_jobs.py --check`` calls it): an encoder, the strict config."""
    return pretrain.check_config(cfg, overrides, require_encoder=True)


@hydra.main(config_path=CONFIG_DIR, config_name="cfg_pretrain_encoder_arc_agi_1", version_base=None)
def main(cfg: DictConfig) -> None:
    execute(cfg, require_encoder=True)


if __name__ == "__main__":
    main_with_sweep_status(main)

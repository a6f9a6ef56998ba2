"""Pre-train ETRM (TRM + demonstration encoder): a thin Hydra entry around the SAME ``training.loop.train``
as pretrain.py (config ``config/cfg_pretrain_encoder_arc_agi_1.yaml``; ``encoder=<name>`` picks the encoder).

    python pretrain_encoder.py encoder=standard +run_name=std
    torchrun --nproc-per-node 4 pretrain_encoder.py encoder=lpn max_train_groups=32 max_eval_groups=32 \
        arch.halt_max_steps=8 arch.halt_exploration_prob=0.7 +project_name=etrm-dev +run_name=lpn_overfit

Exit status as pretrain.py: 0 completed, 1 error, 2 non-finite loss, 3 early stop (health monitor), 130 interrupted.
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from pretrain import run


@hydra.main(config_path="config", config_name="cfg_pretrain_encoder_arc_agi_1", version_base=None)
def main(cfg: DictConfig) -> None:
    from training.config import ConfigError

    if not cfg.get("encoder"):
        print("error: pretrain_encoder.py needs an encoder (encoder=<name>); use pretrain.py for TRM", file=sys.stderr)
        sys.exit(1)
    try:
        summary = run(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    status = int((summary or {}).get("exit_status") or 0)
    if status != 0:
        from hydra.core.hydra_config import HydraConfig

        try:
            multirun = HydraConfig.get().mode.name == "MULTIRUN"
        except Exception:
            multirun = False
        if not multirun:
            sys.exit(status)


if __name__ == "__main__":
    main()

"""The training loop's eval hook: when an evaluation is due, and running it (``evaluators.inference.evaluate``, the
path evaluate.py uses too) on the run's test loader with its evaluators, EMA weights when ``ema=true``."""

from __future__ import annotations

import os
from typing import Any, Optional

from evaluators.inference import as_logged, evaluate
from training import checkpoint as ckpt
from training import distributed as D
from training.build import RunData, build_loss_head
from training.config import PretrainConfig
from training.schedule import eval_due


def eval_is_due(cfg: PretrainConfig, data: RunData, step: int) -> bool:
    """Whether the loop evaluates after ``step`` (``eval_interval`` epochs or ``eval_interval_steps``)."""
    return data.test_loader is not None and eval_due(
        step,
        eval_interval=cfg.eval_interval,
        eval_interval_steps=cfg.eval_interval_steps,
        min_eval_interval=cfg.min_eval_interval,
        batches_per_epoch=data.batches_per_epoch,
        passes_per_epoch=data.passes_per_epoch,
    )


def run_eval(
    cfg: PretrainConfig, data: RunData, model: Any, ema: Optional[Any], info: Any, step: int, checkpoint_dir: str
) -> dict[str, float]:
    """The run's evaluation at ``step`` under the logged names (``eval/<set>.<metric>``, ``ARC/pass@K``); the
    evaluators' outputs go to ``<checkpoint_dir>/eval/step_<step>``. An evaluator failure raises (pitfall 14)."""
    if data.test_loader is None:
        return {}
    model = ema.materialize(model) if ema is not None else ckpt.unwrap_model(model)
    was_training = model.training
    try:
        raw = evaluate(
            build_loss_head(model, cfg.loss_type),
            data.test_loader,
            data.evaluators,
            device=info.device,
            autocast_dtype=D.autocast_dtype(info.device),
            halt_early=cfg.eval_halt_early,
            progress=cfg.progress and info.is_main,
            return_keys=tuple(cfg.eval_save_outputs),
            save_path=os.path.join(checkpoint_dir, "eval", f"step_{step}"),
        )
    finally:
        model.train(was_training)
    return as_logged(raw or {})

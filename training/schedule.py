"""Learning-rate schedule: linear warmup, then cosine decay to ``lr_min_ratio * base_lr``.

``step`` is the 1-based index of the optimizer update being taken (TRM convention): the first update uses
``base_lr / warmup_steps``; update ``warmup_steps`` uses ``base_lr``; update ``total_steps`` (the last) uses
``base_lr * lr_min_ratio``. The same schedule scales the puzzle-embedding lr.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_at_step(step: int, *, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 1.0) -> float:
    if step < 1:
        raise ValueError(f"lr step is 1-based, got {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * step / warmup_steps
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    return base_lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def lr_of(cfg: Any, step: int, base_lr: float, total_steps: int) -> float:
    """:func:`lr_at_step` with a run config's schedule (``lr_warmup_steps``, ``lr_min_ratio``); step 0 reads as 1."""
    return lr_at_step(
        max(step, 1),
        base_lr=base_lr,
        warmup_steps=cfg.lr_warmup_steps,
        total_steps=total_steps,
        min_ratio=cfg.lr_min_ratio,
    )


def schedulers_of(cfg: Any, optimizers: dict[str, torch.optim.Optimizer], total_steps: Callable[[], int]) -> dict:
    """:func:`make_schedulers` with a run config's schedule."""
    return make_schedulers(
        optimizers, warmup_steps=cfg.lr_warmup_steps, total_steps=total_steps, min_ratio=cfg.lr_min_ratio
    )


def make_schedulers(
    optimizers: dict[str, torch.optim.Optimizer], *, warmup_steps: int, total_steps: Callable[[], int], min_ratio: float
) -> dict[str, LambdaLR]:
    """One ``LambdaLR`` per optimizer: every group's lr = its initial lr x ``lr_at_step(k, base_lr=1)`` for update
    ``k`` (1-based; the scheduler's ``last_epoch`` counts the updates done), so the puzzle-embedding optimizer
    follows the same schedule. ``total_steps`` is read at every step (a resume may change it). The schedulers'
    state goes into the checkpoint (training.state)."""

    def factor(done: int) -> float:
        return lr_at_step(
            done + 1, base_lr=1.0, warmup_steps=warmup_steps, total_steps=total_steps(), min_ratio=min_ratio
        )

    return {name: LambdaLR(opt, factor) for name, opt in optimizers.items()}


def eval_due(
    step: int,
    *,
    eval_interval: Optional[int],
    eval_interval_steps: Optional[int],
    min_eval_interval: int,
    batches_per_epoch: int,
    passes_per_epoch: int,
) -> bool:
    """Whether an evaluation is scheduled after update ``step``. ``eval_interval_steps`` counts optimizer steps;
    otherwise ``eval_interval`` / ``min_eval_interval`` count epochs = passes over the data (TRM semantics): a
    loader epoch of ``batches_per_epoch`` steps holds ``passes_per_epoch`` passes, and the evaluation comes at
    the first step that completes a multiple of ``eval_interval`` passes (integer arithmetic)."""
    if eval_interval_steps:
        return step % eval_interval_steps == 0
    if eval_interval is None:
        return False
    per = batches_per_epoch * eval_interval
    crossed = (step * passes_per_epoch) // per > ((step - 1) * passes_per_epoch) // per
    return crossed and step * passes_per_epoch >= min_eval_interval * batches_per_epoch

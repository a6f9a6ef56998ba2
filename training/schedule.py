"""Learning-rate schedule: linear warmup, then cosine decay to ``lr_min_ratio * base_lr``.

``step`` is the 1-based index of the optimizer update being taken (TRM convention): the first update uses
``base_lr / warmup_steps``; update ``warmup_steps`` uses ``base_lr``; update ``total_steps`` (the last) uses
``base_lr * lr_min_ratio``. The same schedule scales the puzzle-embedding lr.
"""
from __future__ import annotations

import math


def lr_at_step(step: int, *, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 1.0) -> float:
    if step < 1:
        raise ValueError(f"lr step is 1-based, got {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * step / warmup_steps
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    return base_lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

"""Process-group helpers for evaluators that also work with no process group at all (pitfall 15)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist


def dist_active() -> bool:
    """True when a torch.distributed process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist_active() else 0


def world_size() -> int:
    return dist.get_world_size() if dist_active() else 1


def gather_to_rank0(obj: Any) -> Optional[list]:
    """Gather one picklable object per rank. Rank 0 gets the list (rank order); other ranks get None.

    Without a process group (or world size 1) this returns ``[obj]``.
    """
    if not dist_active():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (no-op without a process group)."""
    if dist_active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t

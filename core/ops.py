"""Small tensor operations shared by the model core (models/) and the demo encoders (encoders/)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def split_projections(x: torch.Tensor) -> bool:
    """Whether a fused projection (qkv, gate/up) runs as one matmul per chunk (CPU) or as one matmul then a split
    (CUDA). Both give the same forward numbers (tests/test_models_layers.py compares them)."""
    return not x.is_cuda


def linear_chunks(x: torch.Tensor, weight: torch.Tensor, sizes: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """``F.linear(x, weight).split(sizes, -1)`` with the same numbers. On CPU each chunk is its own matmul on a
    slice of the weight: the backward then adds the chunks' input gradients instead of concatenating full-size
    activation gradients (a large copy on CPU); on CUDA one matmul, then the split."""
    if not split_projections(x):
        return F.linear(x, weight).split(list(sizes), dim=-1)
    return tuple(F.linear(x, w) for w in weight.split(list(sizes), dim=0))

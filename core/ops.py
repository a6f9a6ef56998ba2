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


def grid_coordinates(tokens: torch.Tensor, side: int, first_colour: int = 2) -> torch.Tensor:
    """Grid-relative coordinates of every canvas cell: [n, side*side, 4] long in ``[0, 2*side]``.

    ``tokens`` [n, L] holds flattened ``side x side`` canvases (L <= side*side: a cropped tail counts as empty).
    The grid of a canvas is the bounding box of its colour cells (tokens >= ``first_colour``; PAD and EOS are not
    colours), wherever it sits on the canvas (translation augmentation moves it). For cell (r, c) the four values
    are its offsets from that box's top, bottom, left and right edge: ``r - r0, r1 - r, c - c0, c1 - c`` (negative
    outside the box), clamped to ``[-side, side]`` and shifted by ``side`` to index an embedding table. A canvas
    without colour cells gives an empty box at the origin (r0 = c0 = 0, r1 = c1 = -1). No host sync."""
    n, L = tokens.shape
    if L > side * side:
        raise ValueError(f"grid_coordinates: {L} tokens do not fit a {side}x{side} canvas")
    if L < side * side:
        tokens = F.pad(tokens, (0, side * side - L))
    grid = (tokens >= first_colour).view(n, side, side)
    ar = torch.arange(side, device=tokens.device)

    def extent(occupied: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [n, side] -> first, last index
        first = torch.where(occupied, ar, side).amin(1)
        last = torch.where(occupied, ar, -1).amax(1)
        empty = last < 0
        return first.masked_fill(empty, 0)[:, None], last[:, None]

    r0, r1 = extent(grid.any(2))
    c0, c1 = extent(grid.any(1))
    rows, cols = (ar - r0, r1 - ar), (ar - c0, c1 - ar)  # each [n, side]
    coords = torch.stack([rows[0][:, :, None].expand(n, side, side), rows[1][:, :, None].expand(n, side, side),
                          cols[0][:, None, :].expand(n, side, side), cols[1][:, None, :].expand(n, side, side)], -1)
    return (coords.clamp(-side, side) + side).view(n, side * side, 4)

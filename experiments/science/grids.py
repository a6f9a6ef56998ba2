"""Grids in and out of the fitted programs (``experiments.science.pointer``, ``experiments.science.maps``): a grid
as canvas tokens, and a canvas of answer classes back as a grid."""

from __future__ import annotations

import numpy as np
import torch

from dataset.canvas import grid_to_canvas

COLOURS = 10
OUTSIDE = COLOURS  # the answer class "not a cell of the output grid"
NULLS = 2  # null keys a cell may read instead of an input cell: source classes COLOURS and COLOURS + 1


def canvas_tokens(grid, side: int) -> torch.Tensor:
    """[side * side] tokens of a grid at the canvas origin (dataset.canvas: colours from 2, PAD / EOS below)."""
    return torch.from_numpy(grid_to_canvas(np.asarray(grid), size=side).astype(np.int64))


def classes_to_grid(classes: np.ndarray) -> np.ndarray:
    """The output grid of a canvas of classes: the box of its non-outside cells from the origin (a hole reads 0)."""
    inside = classes != OUTSIDE
    if not inside.any():
        return np.zeros((0, 0), dtype=np.int64)
    h = int(np.nonzero(inside.any(1))[0].max()) + 1
    w = int(np.nonzero(inside.any(0))[0].max()) + 1
    g = classes[:h, :w].copy()
    g[g == OUTSIDE] = 0
    return g


def source_classes(tokens: torch.Tensor) -> torch.Tensor:
    """[n, S + NULLS]: each key's class, for canvas tokens [n, S]: the input cell's colour, the null keys COLOURS and
    COLOURS + 1."""
    nulls = torch.arange(COLOURS, COLOURS + NULLS, device=tokens.device).expand(tokens.shape[0], NULLS)
    return torch.cat(((tokens - 2).clamp_min(0), nulls), dim=-1)

"""Grids in and out of the fitted programs (``experiments.science.pointer``, ``experiments.science.maps``): a grid
as canvas tokens, and a canvas of answer classes back as a grid."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

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


def answer_classes(tokens: torch.Tensor) -> torch.Tensor:
    """Output canvas tokens -> answer classes: the colour, or OUTSIDE for a cell that is not of the output grid."""
    return torch.where(tokens >= 2, tokens - 2, OUTSIDE)


def stack_pairs(puzzles: list, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([P, D, S] input tokens, output tokens, [P, D] valid) of every puzzle's (x, y) pairs (a puzzle: a list of
    pairs; D: the most pairs of any, the rest padded and not valid)."""
    D = max(len(p) for p in puzzles)
    di = torch.zeros(len(puzzles), D, side * side, dtype=torch.long)
    do, valid = torch.zeros_like(di), torch.zeros(len(puzzles), D, dtype=torch.bool)
    for a, pairs in enumerate(puzzles):
        for d, (x, y) in enumerate(pairs):
            di[a, d], do[a, d], valid[a, d] = canvas_tokens(x, side), canvas_tokens(y, side), True
    return di, do, valid


def majority_table(cls: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The colour table of hard reads: ``cls`` [B, D, S] the class each cell of each valid (``valid`` [B, D]) grid
    reads, ``target`` [B, D, S] its answer class -> (per source class the commonest answer class [B, COLOURS + NULLS];
    a class no grid shows keeps its colour, a null is outside; the cells the table reproduces [B])."""
    B = cls.shape[0]
    hot = F.one_hot(target, COLOURS + 1).float() * valid[..., None, None]
    counts = torch.zeros(B, COLOURS + NULLS, COLOURS + 1)
    counts.scatter_add_(1, cls.reshape(B, -1, 1).expand(-1, -1, COLOURS + 1), hot.reshape(B, -1, COLOURS + 1))
    fallback = torch.tensor(list(range(COLOURS)) + [OUTSIDE] * NULLS)
    table = torch.where(counts.sum(-1) > 0, counts.argmax(-1), fallback)
    pred = table.gather(1, cls.reshape(B, -1)).view_as(cls)
    return table, ((pred == target) & valid[..., None]).sum((1, 2))

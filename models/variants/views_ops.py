"""Per-cell counts of the grid-views variant (``arch=trm_views``, models/variants/trm_views.py): object sizes and
ray counts of flattened square canvases. Only that variant and its tests use them (core/ops.py keeps what the encoders
share)."""

from __future__ import annotations

import torch

from core.nn import compile_boundary


def _canvas_cells(tokens: torch.Tensor, side: int, first_colour: int):
    """(grid [n, side, side], cell mask [n, side, side]) of flattened square canvases ``tokens`` [n, side * side]."""
    n, L = tokens.shape
    if L != side * side:
        raise ValueError(f"cell features need square canvases: rows of {L} tokens are not {side} x {side}")
    g = tokens.view(n, side, side)
    return g, g >= first_colour


@compile_boundary  # a data-dependent loop: one graph break where the cell features are on
def object_sizes(tokens: torch.Tensor, side: int, first_colour: int = 2) -> torch.Tensor:
    """[n, side * side] long: for every grid cell of the canvases ``tokens`` [n, side * side], the number of cells of
    its object, the 4-connected component of cells of its colour (the background's components included); 0 outside
    the grid. Labels each component by its smallest canvas index: a cell takes the least label of its same-colour
    neighbours, then of the cell its label names (pointer jumping), until nothing changes."""
    n, L = tokens.shape
    g, cell = _canvas_cells(tokens, side, first_colour)
    idx = torch.arange(L, device=tokens.device).view(1, side, side).expand(n, -1, -1)
    lab = torch.where(cell, idx, L)  # L: not a cell (never the least label of a cell)
    same_down = cell[:, 1:] & cell[:, :-1] & (g[:, 1:] == g[:, :-1])  # cell (r, c) joins (r + 1, c)
    same_right = cell[:, :, 1:] & cell[:, :, :-1] & (g[:, :, 1:] == g[:, :, :-1])
    for _ in range(L):
        new = lab.clone()
        new[:, :-1] = torch.minimum(new[:, :-1], torch.where(same_down, lab[:, 1:], L))
        new[:, 1:] = torch.minimum(new[:, 1:], torch.where(same_down, lab[:, :-1], L))
        new[:, :, :-1] = torch.minimum(new[:, :, :-1], torch.where(same_right, lab[:, :, 1:], L))
        new[:, :, 1:] = torch.minimum(new[:, :, 1:], torch.where(same_right, lab[:, :, :-1], L))
        flat = new.reshape(n, L)
        jumped = torch.where(flat < L, flat.gather(1, flat.clamp_max(L - 1)), L).view(n, side, side)
        new = torch.minimum(new, jumped)
        if not torch.compiler.is_compiling() and torch.equal(new, lab):
            break
        lab = new
    flat = lab.reshape(n, L)
    counts = torch.zeros(n, L + 1, dtype=torch.long, device=tokens.device)
    counts.scatter_add_(1, flat, torch.ones_like(flat))
    return torch.where(cell.reshape(n, L), counts.gather(1, flat), 0)


def ray_counts(tokens: torch.Tensor, side: int, first_colour: int = 2) -> torch.Tensor:
    """[n, 4, side * side] long: for every grid cell of the canvases ``tokens`` [n, side * side], how many cells of a
    colour other than the background (colour 0, token ``first_colour``) lie beyond it up to the grid's edge, upward,
    downward, leftward and rightward (the cell itself not counted); 0 outside the grid."""
    n, L = tokens.shape
    g, cell = _canvas_cells(tokens, side, first_colour)
    solid = (g > first_colour).long()  # PAD and end-of-grid tokens are below first_colour: never counted
    up = solid.cumsum(1) - solid
    down = solid.flip(1).cumsum(1).flip(1) - solid
    left = solid.cumsum(2) - solid
    right = solid.flip(2).cumsum(2).flip(2) - solid
    rays = torch.stack((up, down, left, right), 1).view(n, 4, L)
    return torch.where(cell.reshape(n, 1, L), rays, 0)

"""The shift families of the synthetic rules (:mod:`dataset.synthetic_rules`): translate (content moves by (dr, dc),
background fills in, nothing falls off) and roll (the same shift with wrap-around), the (|dr|, |dc|) cells their
shifts are drawn from, and :func:`shift_instance`, the instance of a given shift."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from dataset.rule_grids import Grid, GridSpec, RuleInstance, _colours, _random_grid

# translate / roll: a shift (dr, dc) with |dr|, |dc| <= MAX_SHIFT, not both 0. The 15 cells (|dr|, |dc|) are drawn
# uniformly, then the signs, so that every shift magnitude is as common as any other (docs/data.md, "Synthetic rule
# families": the shift table).
MAX_SHIFT = 3
SHIFT_CELLS: tuple[tuple[int, int], ...] = tuple(
    (a, b) for a in range(MAX_SHIFT + 1) for b in range(MAX_SHIFT + 1) if (a, b) != (0, 0)
)
SHIFT_FAMILIES = ("translate", "roll")


def shift_cells(spec: GridSpec) -> list[tuple[int, int]]:
    """The (|dr|, |dc|) cells a shift family draws from under ``spec``: a shift must leave at least one row and
    column of the largest grid on it (|dr|, |dc| < max_grid)."""
    m = min(MAX_SHIFT, spec.max_grid - 1)
    return [(a, b) for a, b in SHIFT_CELLS if a <= m and b <= m]


def draw_shift(rng: np.random.Generator, spec: GridSpec) -> tuple[int, int]:
    """A shift: a uniform cell of :func:`shift_cells`, then uniform signs."""
    cells = shift_cells(spec)
    if not cells:
        raise ValueError(f"no shift fits grids of side {spec.max_grid} (translate / roll need max_grid >= 2)")
    a, b = cells[int(rng.integers(len(cells)))]
    sr, sc = (int(s) * 2 - 1 for s in rng.integers(0, 2, size=2))
    return a * sr, b * sc


def _shift_size(rng: np.random.Generator, spec: GridSpec, dr: int, dc: int) -> tuple[int, int]:
    """A grid size within ``spec`` with h > |dr| and w > |dc|."""
    lo_h, lo_w = max(spec.min_grid, abs(dr) + 1), max(spec.min_grid, abs(dc) + 1)
    hi_h, hi_w = max(spec.max_grid, lo_h), max(spec.max_grid, lo_w)
    return int(rng.integers(lo_h, hi_h + 1)), int(rng.integers(lo_w, hi_w + 1))


def shift_instance(family: str, rng: np.random.Generator, spec: GridSpec, dr: int, dc: int) -> RuleInstance:
    """The translate or roll instance of shift (dr, dc), with its input colours drawn from ``rng``."""
    cols = _colours(rng, 2)
    params = {"dr": int(dr), "dc": int(dc)}
    if family == "translate":
        return RuleInstance("translate", params, _translate_apply(params), _translate_input(spec, dr, dc, cols))
    if family == "roll":
        return RuleInstance("roll", params, _roll_apply(params), _roll_input(spec, dr, dc, cols))
    raise ValueError(f"not a shift family: {family!r}")


def translate(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    """Shift all content by (dr, dc) (|dr|, |dc| <= 3), background 0 fills in; no wrap-around: the content lies in
    the part of the grid that stays on it."""
    return shift_instance("translate", rng, spec, *draw_shift(rng, spec))


def _translate_input(spec: GridSpec, dr: int, dc: int, cols: list[int]) -> Callable[[np.random.Generator], Grid]:
    def make(r):
        h, w = _shift_size(r, spec, dr, dc)
        g = np.zeros((h, w), np.uint8)
        rows, cols_ = slice(max(0, -dr), h - max(0, dr)), slice(max(0, -dc), w - max(0, dc))
        sub = _random_grid(r, (h - abs(dr), w - abs(dc)), cols, 0.25)
        if not sub.any():  # never all background
            sub[int(r.integers(sub.shape[0])), int(r.integers(sub.shape[1]))] = cols[int(r.integers(len(cols)))]
        g[rows, cols_] = sub
        return g

    return make


def _translate_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    dr, dc = p["dr"], p["dc"]

    def apply(g):
        h, w = g.shape
        if abs(dr) >= h or abs(dc) >= w:
            return None
        src = g[max(0, -dr) : h - max(0, dr), max(0, -dc) : w - max(0, dc)]
        if np.count_nonzero(g) != np.count_nonzero(src):
            return None  # content would fall off the grid
        out = np.zeros_like(g)
        out[max(0, dr) : max(0, dr) + src.shape[0], max(0, dc) : max(0, dc) + src.shape[1]] = src
        return out

    return apply


def roll(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    """Shift all cells by (dr, dc) (|dr|, |dc| <= 3) with wrap-around (np.roll): what leaves one side comes back on
    the other. Every input has content on a cell that wraps, so no pair is an unwrapped shift."""
    return shift_instance("roll", rng, spec, *draw_shift(rng, spec))


def _roll_input(spec: GridSpec, dr: int, dc: int, cols: list[int]) -> Callable[[np.random.Generator], Grid]:
    def make(r):
        h, w = _shift_size(r, spec, dr, dc)
        g = _random_grid(r, (h, w), cols, 0.25)
        wraps = np.zeros((h, w), bool)  # the cells the shift carries across an edge
        if dr > 0:
            wraps[h - dr :] = True
        elif dr < 0:
            wraps[:-dr] = True
        if dc > 0:
            wraps[:, w - dc :] = True
        elif dc < 0:
            wraps[:, :-dc] = True
        if not (g[wraps] != 0).any():
            ys, xs = np.nonzero(wraps)
            i = int(r.integers(len(ys)))
            g[ys[i], xs[i]] = cols[int(r.integers(len(cols)))]
        return g

    return make


def _roll_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    dr, dc = p["dr"], p["dc"]
    return lambda g: np.roll(g, (dr, dc), axis=(0, 1))

"""The building blocks of the synthetic rule families (:mod:`dataset.synthetic_rules`): a :class:`RuleInstance`
(family + parameters, its mapping and its input generator) and its identity :func:`rule_key`, the
:class:`GridSpec` of the inputs, and the random-grid and connected-component helpers the families share."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

Grid = np.ndarray


@dataclass
class RuleInstance:
    family: str
    params: dict
    apply: Callable[[Grid], Optional[Grid]]  # output grid, or None if this input is unsuitable
    make_input: Callable[[np.random.Generator], Grid]

    @property
    def key(self) -> str:
        """The rule's identity (:func:`rule_key`): equal keys = the same input -> output mapping."""
        return rule_key(self.family, self.params)


@dataclass
class GridSpec:
    min_grid: int = 3
    max_grid: int = 10

    def size(self, rng: np.random.Generator, max_side: Optional[int] = None) -> tuple[int, int]:
        hi = self.max_grid if max_side is None else max(1, min(self.max_grid, max_side))
        lo = min(self.min_grid, hi)
        return int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))


def _colours(rng: np.random.Generator, k: int, exclude: tuple = (0,)) -> list[int]:
    pool = [c for c in range(10) if c not in exclude]
    return [int(c) for c in rng.choice(pool, size=k, replace=False)]


def _random_grid(rng: np.random.Generator, shape: tuple[int, int], colours: list[int], density: float) -> Grid:
    g = np.zeros(shape, dtype=np.uint8)
    mask = rng.random(shape) < density
    g[mask] = rng.choice(colours, size=int(mask.sum()))
    return g


def _components(mask: np.ndarray) -> list[list[tuple[int, int]]]:
    """4-connected components of True cells."""
    h, w = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    comps = []
    for r in range(h):
        for c in range(w):
            if mask[r, c] and not seen[r, c]:
                stack, comp = [(r, c)], []
                seen[r, c] = True
                while stack:
                    y, x = stack.pop()
                    comp.append((y, x))
                    for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                        ny, nx = y + dy, x + dx
                        if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                            seen[ny, nx] = True
                            stack.append((ny, nx))
                comps.append(comp)
    return comps


def _maybe_recolour(rng: np.random.Generator) -> Optional[list[int]]:
    """Optional extra parameter of small families: afterwards colour a becomes colour b (None = off)."""
    return None if rng.random() < 0.5 else _colours(rng, 2)


def _recolour(g: Grid, rc: Optional[list[int]]) -> Grid:
    if rc:
        g = g.copy()
        g[g == rc[0]] = rc[1]
    return g


# Parameters that shape only the random *inputs* of an instance, not its input -> output mapping.
# (extend_lines' block colour: a ray stops at any non-background cell, the block colour only draws the inputs)
INPUT_ONLY_PARAMS: dict[str, tuple[str, ...]] = {"fill_enclosed": ("noise",), "extend_lines": ("block",)}


def rule_key(family: str, params: dict) -> str:
    """Canonical identity of a rule instance: family + the parameters that define its mapping. Two instances
    that differ only in how their inputs are drawn (fill_enclosed's noise colour) or in no-op entries (a
    colour_map entry c -> c) are the same rule."""
    drop = INPUT_ONLY_PARAMS.get(family, ())
    p = {k: v for k, v in params.items() if k not in drop}
    if family == "colour_map":
        p["map"] = {a: b for a, b in p["map"].items() if int(a) != int(b)}
    return f"{family}:{json.dumps(p, sort_keys=True)}"

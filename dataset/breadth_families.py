"""Training-only rule families ("breadth"): rules the synthetic builder can add to the *training* puzzles
(``--breadth-families``) and never evaluates, so that a reader sees more kinds of rules than the benchmark scores.

They are apart from the 16 evaluated families (:data:`dataset.families.ALL_FAMILIES`): the default benchmark, its
rule-label slots and every figure built on them stay as they are. None of them is a candidate of any model (no model
operator is written to them) and none shares a constant with the evaluated families' generators. Every one keeps the
grid's shape and has a small, finite set of instances (:func:`breadth_instances`): the builder refuses every instance
that produces some evaluation copy's pairs before it draws a training puzzle (:mod:`dataset.synthetic_breadth`), so a
breadth rule never shows a held-out rule by behaviour, in either direction.

- ``border_frame``: the grid's outermost ring of cells becomes a colour;
- ``invert_mask``: a one-colour picture is inverted (its cells become background, the background its colour);
- ``fill_lines``: every row (or column) holding a cell of a colour has its background cells painted that colour;
- ``erase_colour``: every cell of a colour becomes background;
- ``recolour_extreme``: the largest (or smallest) object becomes a colour;
- ``draw_cross``: the row and the column through each mark have their background cells painted a line colour;
- ``denoise``: cells with no same-colour neighbour (4- or 8-neighbourhood) are removed;
- ``surround_cells``: the background cells around each cell of a colour (its 8 neighbours) become a ring colour.
"""

from __future__ import annotations

import itertools
import json
from typing import Callable, Optional

import numpy as np

from dataset.dihedral import D4_MATRIX
from dataset.open_families import _objects, _rects, _scatter
from dataset.rule_grids import Grid, GridSpec, RuleInstance, _colours, _random_grid

BREADTH = "breadth"
_COLOURS = range(1, 10)


def _paint_background(g: Grid, where: np.ndarray, colour: int) -> Grid:
    out = g.copy()
    out[where & (g == 0)] = colour
    return out


# --- the rules (params -> mapping; None for an input the rule cannot decide) --------------------------------------
def _border_frame(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        out = g.copy()
        out[[0, -1], :] = p["colour"]
        out[:, [0, -1]] = p["colour"]
        return out

    return apply


def _invert_mask(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        if not np.isin(g, (0, p["colour"])).all():
            return None
        return np.where(g == 0, p["colour"], 0).astype(np.uint8)

    return apply


def _fill_lines(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        hit = g == p["colour"]
        if not hit.any():
            return None
        lines = hit.any(axis=1, keepdims=True) if p["orientation"] == "rows" else hit.any(axis=0, keepdims=True)
        return _paint_background(g, np.broadcast_to(lines, g.shape), p["colour"])

    return apply


def _erase_colour(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        return np.where(g == p["colour"], 0, g).astype(np.uint8)

    return apply


def _recolour_extreme(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        if (g == p["colour"]).any():
            return None
        objs = _objects(g)
        sizes = [len(cells) for _, cells in objs]
        if len(objs) < 2:
            return None
        best = max(sizes) if p["which"] == "largest" else min(sizes)
        if sizes.count(best) != 1:
            return None
        ys, xs = zip(*objs[sizes.index(best)][1])
        out = g.copy()
        out[list(ys), list(xs)] = p["colour"]
        return out

    return apply


def _draw_cross(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        marks = g == p["mark"]
        if not marks.any():
            return None
        cross = marks.any(axis=1, keepdims=True) | marks.any(axis=0, keepdims=True)
        return _paint_background(g, cross, p["line"])

    return apply


def _denoise(p: dict) -> Callable[[Grid], Optional[Grid]]:
    steps = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]
    if p["neighbours"] == 4:
        steps = [(dr, dc) for dr, dc in steps if dr == 0 or dc == 0]

    def apply(g):
        h, w = g.shape
        padded = np.pad(g, 1, constant_values=0)
        alone = g != 0
        for dr, dc in steps:
            alone &= padded[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w] != g
        out = g.copy()
        out[alone] = 0
        return out

    return apply


def _surround_cells(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        centre = g == p["centre"]
        if not centre.any():
            return None
        h, w = g.shape
        padded = np.pad(centre, 1)
        near = np.zeros_like(centre)
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                near |= padded[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w]
        return _paint_background(g, near, p["ring"])

    return apply


# --- the generators (rule instance + its inputs) -------------------------------------------------------------------
def border_frame(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    colour, other = _colours(rng, 2)
    p = {"colour": colour}
    return RuleInstance("border_frame", p, _border_frame(p), lambda r: _random_grid(r, spec.size(r), [other], 0.3))


def invert_mask(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    (colour,) = _colours(rng, 1)
    p = {"colour": colour}
    make = lambda r: _random_grid(r, spec.size(r), [colour], float(r.uniform(0.2, 0.6)))  # noqa: E731
    return RuleInstance("invert_mask", p, _invert_mask(p), make)


def fill_lines(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    colour, other = _colours(rng, 2)
    p = {"colour": colour, "orientation": str(rng.choice(["rows", "columns"]))}
    make = lambda r: _scatter(r, spec.size(r), colour, int(r.integers(1, 3)), [other])  # noqa: E731
    return RuleInstance("fill_lines", p, _fill_lines(p), make)


def erase_colour(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    colour, *others = _colours(rng, 3)
    p = {"colour": colour}
    make = lambda r: _random_grid(r, spec.size(r), [colour, *others], float(r.uniform(0.3, 0.7)))  # noqa: E731
    return RuleInstance("erase_colour", p, _erase_colour(p), make)


def recolour_extreme(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    colour, *others = _colours(rng, 3)
    p = {"which": str(rng.choice(["largest", "smallest"])), "colour": colour}
    make = lambda r: _rects(r, spec.size(r), others, int(r.integers(2, 5)))  # noqa: E731
    return RuleInstance("recolour_extreme", p, _recolour_extreme(p), make)


def draw_cross(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    mark, line, other = _colours(rng, 3)
    p = {"mark": mark, "line": line}
    make = lambda r: _scatter(r, spec.size(r), mark, int(r.integers(1, 3)), [other])  # noqa: E731
    return RuleInstance("draw_cross", p, _draw_cross(p), make)


def denoise(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    cols = _colours(rng, 2)
    p = {"neighbours": int(rng.choice([4, 8]))}

    def make(r):
        g = _rects(r, spec.size(r), cols, int(r.integers(1, 3)), min_side=2)
        free = np.flatnonzero(g.ravel() == 0)
        for i in r.choice(free, size=min(len(free), int(r.integers(1, 4))), replace=False):
            g.flat[i] = cols[int(r.integers(len(cols)))]
        return g

    return RuleInstance("denoise", p, _denoise(p), make)


def surround_cells(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    centre, ring, other = _colours(rng, 3)
    p = {"centre": centre, "ring": ring}
    make = lambda r: _scatter(r, spec.size(r), centre, int(r.integers(1, 3)), [other])  # noqa: E731
    return RuleInstance("surround_cells", p, _surround_cells(p), make)


BREADTH_FAMILIES: dict[str, Callable[[np.random.Generator, GridSpec], RuleInstance]] = {
    "border_frame": border_frame,
    "invert_mask": invert_mask,
    "fill_lines": fill_lines,
    "erase_colour": erase_colour,
    "recolour_extreme": recolour_extreme,
    "draw_cross": draw_cross,
    "denoise": denoise,
    "surround_cells": surround_cells,
}
_APPLY = {
    "border_frame": _border_frame,
    "invert_mask": _invert_mask,
    "fill_lines": _fill_lines,
    "erase_colour": _erase_colour,
    "recolour_extreme": _recolour_extreme,
    "draw_cross": _draw_cross,
    "denoise": _denoise,
    "surround_cells": _surround_cells,
}
# the structural parameters of each family (the rest are colours); every choice of them, with every colour
_STRUCTURE: dict[str, dict[str, tuple]] = {
    "border_frame": {},
    "invert_mask": {},
    "fill_lines": {"orientation": ("rows", "columns")},
    "erase_colour": {},
    "recolour_extreme": {"which": ("largest", "smallest")},
    "draw_cross": {},
    "denoise": {"neighbours": (4, 8)},
    "surround_cells": {},
}
_COLOUR_PARAMS = {
    "border_frame": ("colour",),
    "invert_mask": ("colour",),
    "fill_lines": ("colour",),
    "erase_colour": ("colour",),
    "recolour_extreme": ("colour",),
    "draw_cross": ("mark", "line"),
    "denoise": (),
    "surround_cells": ("centre", "ring"),
}


def breadth_apply(family: str, params: dict) -> Callable[[Grid], Optional[Grid]]:
    """The mapping (input grid -> output grid of the same shape, or None) of a breadth family's instance."""
    return _APPLY[family](params)


def breadth_structure(family: str, params: dict) -> str:
    """The instance's structure key (its structural parameters, colours left out), as the other families'."""
    return f"{family}:" + json.dumps({k: params[k] for k in _STRUCTURE[family]}, sort_keys=True)


def breadth_instances(family: str) -> list[dict]:
    """Every instance of the family (distinct colours where it names two)."""
    parts = dict(_STRUCTURE[family])
    out = []
    for colours in itertools.permutations(_COLOURS, len(_COLOUR_PARAMS[family])):
        for choice in itertools.product(*parts.values()):
            out.append(dict(zip(_COLOUR_PARAMS[family], colours)) | dict(zip(parts, choice)))
    return out


def breadth_conjugate_params(family: str, params: dict, dihedral: int, colour_map) -> dict:
    """The instance an augmented copy of a puzzle of ``params`` shows: colours through ``colour_map``, rows and
    columns exchanged by a transform that exchanges them (every other part is the same under any dihedral map)."""
    out = dict(params)
    for k in _COLOUR_PARAMS[family]:
        out[k] = int(colour_map[int(params[k])])
    if family == "fill_lines" and D4_MATRIX[dihedral][0, 0] == 0:
        out["orientation"] = "columns" if params["orientation"] == "rows" else "rows"
    return out


def breadth_rivals(family: str, params: dict) -> list[dict]:
    """Other instances that demos of ``params`` must rule out: its other structural choices (the other orientation,
    the other extreme, the other neighbourhood)."""
    return [dict(params, **{k: v}) for k, values in _STRUCTURE[family].items() for v in values if v != params[k]]

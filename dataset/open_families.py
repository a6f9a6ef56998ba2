"""Open rule families: ARC-like rules written without looking at any operator of the models.

The covered families (:mod:`dataset.synthetic_rules`) each have a built-in candidate in ``trm_views`` (shifts,
scales, settles, colour and size lookups written to the generator's ranges). These have none: a model that answers
their held-out instances has read the rule from the demonstrations. Each family samples a rule instance from a
generator, like the covered ones (:class:`dataset.synthetic_rules.RuleInstance`), and names its **structure**: the
part of an instance that is more than its colours (a direction, an axis, a selection criterion). A held-out split
that differs from training only in colours is weaker than one that differs in structure
(:func:`structure` gives the key a split holds out).

- ``extend_lines``: each marked cell shoots a ray to the grid's edge in a direction, in the line colour
  (structure: the direction of 8; whether a ray stops at another cell);
- ``mirror_complete``: a mirror-symmetric picture with a masked rectangle; the output restores it, whole or only the
  hidden patch (the axis: vertical or horizontal; the output: full or patch);
- ``crop_object``: the output is the bounding box of the one object a criterion singles out (colour, largest,
  smallest, unique colour);
- ``outline``: solid rectangles keep their border; the interior becomes a colour or background; a ring may be drawn
  around them (interior kind, ring or not);
- ``connect_pairs``: two cells of one colour on a row or column are joined by a segment (rows or columns;
  the segment in their own colour or a fixed one);
- ``keep_extreme``: only the largest (or smallest) object stays, or it alone is removed (which; keep or remove);
- ``count_to_bar``: the number of objects (or cells) of a colour becomes a bar of that length (row or column;
  objects or cells).
"""

from __future__ import annotations

import json
from typing import Callable, Optional

import numpy as np

from dataset.dihedral import D4_MATRIX
from dataset.synthetic_rules import Grid, GridSpec, RuleInstance, _colours, _components

DIRECTIONS = {  # name -> (dr, dc)
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
    "up_left": (-1, -1),
    "up_right": (-1, 1),
    "down_left": (1, -1),
    "down_right": (1, 1),
}


def _scatter(rng: np.random.Generator, shape: tuple[int, int], colour: int, count: int, other: Optional[list] = None):
    """A background grid with ``count`` cells of ``colour`` (and as many of each ``other`` colour) at distinct
    random places."""
    h, w = shape
    g = np.zeros(shape, dtype=np.uint8)
    cols = [colour] * count + [c for c in (other or []) for _ in range(count)]
    if len(cols) > h * w:
        return g
    for c, i in zip(cols, rng.choice(h * w, size=len(cols), replace=False)):
        g[i // w, i % w] = c
    return g


def _rects(rng: np.random.Generator, shape: tuple[int, int], colours: list[int], count: int, min_side: int = 1):
    """Up to ``count`` solid, non-touching rectangles (a one-cell gap around each), colours drawn from ``colours``."""
    h, w = shape
    g = np.zeros(shape, dtype=np.uint8)
    for _ in range(count * 10):
        if count == 0:
            break
        rh, rw = (
            int(rng.integers(min_side, max(min_side, h // 2) + 1)),
            int(rng.integers(min_side, max(min_side, w // 2) + 1)),
        )
        if rh > h or rw > w:
            continue
        r, c = int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1))
        if g[max(0, r - 1) : r + rh + 1, max(0, c - 1) : c + rw + 1].any():
            continue
        g[r : r + rh, c : c + rw] = colours[int(rng.integers(len(colours)))]
        count -= 1
    return g


# --- extend_lines ------------------------------------------------------------------------------------------------
def extend_lines(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    mark, line, block = _colours(rng, 3)
    params = {
        "direction": str(rng.choice(list(DIRECTIONS))),
        "mark": mark,
        "line": line,
        "stop": bool(rng.random() < 0.5),
    }
    if params["stop"]:
        params["block"] = block

    def make(r):
        g = _scatter(r, spec.size(r), mark, int(r.integers(1, 4)))
        if params["stop"]:
            g2 = _scatter(r, g.shape, block, int(r.integers(1, 4)))
            g = np.where(g == 0, g2, g)
        return g

    return RuleInstance("extend_lines", params, _extend_lines_apply(params), make)


def _extend_lines_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    dr, dc = DIRECTIONS[p["direction"]]

    def apply(g):
        out, (h, w) = g.copy(), g.shape
        for r, c in zip(*np.nonzero(g == p["mark"])):
            y, x = r + dr, c + dc
            while 0 <= y < h and 0 <= x < w:
                if g[y, x] != 0:
                    if p["stop"]:
                        break
                else:
                    out[y, x] = p["line"]
                y, x = y + dr, x + dc
        return out

    return apply


# --- mirror_complete ---------------------------------------------------------------------------------------------
def mirror_complete(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    cols = _colours(rng, 4)
    params = {
        "axis": str(rng.choice(["vertical", "horizontal"])),
        "mask": cols[0],
        "output": str(rng.choice(["full", "patch"])),
    }

    def make(r):
        h, w = spec.size(r)
        h, w = max(h, 4), max(w, 4)
        if params["axis"] == "horizontal":
            h -= h % 2
        else:
            w -= w % 2
        q = r.choice(np.array([0] + cols[1:], dtype=np.uint8), size=(h, w))
        full = _symmetric(q, params["axis"])
        # the mask: a rectangle inside one half, so its mirror image keeps the truth
        hh, hw = (h // 2, w) if params["axis"] == "horizontal" else (h, w // 2)
        mh, mw = int(r.integers(1, max(2, hh // 2 + 1))), int(r.integers(1, max(2, hw // 2 + 1)))
        y, x = int(r.integers(0, hh - mh + 1)), int(r.integers(0, hw - mw + 1))
        g = full.copy()
        g[y : y + mh, x : x + mw] = params["mask"]
        return g

    return RuleInstance("mirror_complete", params, _mirror_complete_apply(params), make)


def _symmetric(q: Grid, axis: str) -> Grid:
    g = q.copy()
    h, w = g.shape
    if axis == "vertical":
        g[:, w // 2 :] = g[:, : w // 2][:, ::-1]
    else:
        g[h // 2 :, :] = g[: h // 2, :][::-1, :]
    return g


def _mirror_complete_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        out, masked = g.copy(), g == p["mask"]
        img = g[:, ::-1] if p["axis"] == "vertical" else g[::-1, :]  # the mirror image
        hidden = masked.copy()
        take = masked & (img != p["mask"])
        out[take] = img[take]
        masked &= ~take
        if masked.any():
            return None  # every masked cell must be recoverable from a mirror image
        if p.get("output", "full") == "patch":  # only what was hidden: the masked cells' bounding box
            ys, xs = np.nonzero(hidden)
            if not len(ys):
                return None
            patch = out[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
            return patch.copy() if hidden[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1].all() else None
        return out

    return apply


# --- crop_object -------------------------------------------------------------------------------------------------
CROP_CRITERIA = ("colour", "largest", "smallest", "unique_colour")


def crop_object(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    cols = _colours(rng, 3)
    params = {"criterion": str(rng.choice(CROP_CRITERIA))}
    if params["criterion"] == "colour":
        params["colour"] = cols[0]

    def make(r):
        g = _rects(r, spec.size(r), cols, int(r.integers(2, 5)))
        # ragged objects: knock a few cells out of the rectangles so crops are not solid blocks
        holes = (r.random(g.shape) < 0.2) & (g != 0)
        return np.where(holes, 0, g).astype(np.uint8)

    return RuleInstance("crop_object", params, _crop_object_apply(params), make)


def _objects(g: Grid) -> list[tuple[int, list]]:
    """(colour, cells) of every 4-connected one-colour object."""
    return [(int(c), comp) for c in np.unique(g[g != 0]) for comp in _components(g == c)]


def _crop_object_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        objs = _objects(g)
        if p["criterion"] == "colour":
            chosen = [o for o in objs if o[0] == p["colour"]]
        elif p["criterion"] in ("largest", "smallest"):
            sizes = [len(o[1]) for o in objs]
            best = max(sizes, default=0) if p["criterion"] == "largest" else min(sizes, default=0)
            chosen = [o for o in objs if len(o[1]) == best]
        else:
            counts = {c: sum(o[0] == c for o in objs) for c, _ in objs}
            chosen = [o for o in objs if counts[o[0]] == 1]
        if len(chosen) != 1 or len(objs) < 2:
            return None  # the criterion must single out one object among several
        ys, xs = zip(*chosen[0][1])
        return g[min(ys) : max(ys) + 1, min(xs) : max(xs) + 1].copy()

    return apply


# --- outline -----------------------------------------------------------------------------------------------------
def outline(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    cols = _colours(rng, 4)
    params = {"interior": int(rng.choice([0, cols[0]])), "ring": None if rng.random() < 0.5 else cols[1]}
    body = cols[2:]

    def make(r):
        return _rects(r, spec.size(r), body, int(r.integers(1, 4)), min_side=3)

    return RuleInstance("outline", params, _outline_apply(params), make)


def _outline_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        out, (h, w) = g.copy(), g.shape
        pad = np.pad(g, 1)
        filled = g != 0
        # interior: a filled cell whose 8 neighbours are all filled with its colour
        same = np.ones_like(filled)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                same &= pad[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] == g
        interior = filled & same
        if not interior.any():
            return None
        out[interior] = p["interior"]
        if p["ring"] is not None:
            near = np.zeros_like(filled)
            fpad = np.pad(filled, 1)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    near |= fpad[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
            out[near & ~filled] = p["ring"]
        return out

    return apply


# --- connect_pairs -----------------------------------------------------------------------------------------------
def connect_pairs(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    cols = _colours(rng, 4)
    params = {
        "orientation": str(rng.choice(["rows", "columns"])),
        "segment": None if rng.random() < 0.5 else cols[0],
    }
    ends = cols[1:]

    def make(r):
        h, w = spec.size(r)
        g = np.zeros((max(h, 3), max(w, 3)), dtype=np.uint8)
        for c in ends[: int(r.integers(1, 4))]:
            along_rows = params["orientation"] == "rows"
            n, m = (g.shape[0], g.shape[1]) if along_rows else (g.shape[1], g.shape[0])
            line, (a, b) = int(r.integers(n)), sorted(r.choice(m, size=2, replace=False))
            cells = [(line, a), (line, b)] if along_rows else [(a, line), (b, line)]
            if any(g[y, x] for y, x in cells):
                continue
            for y, x in cells:
                g[y, x] = c
        return g

    return RuleInstance("connect_pairs", params, _connect_pairs_apply(params), make)


def _connect_pairs_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        out, claimed = g.copy(), np.zeros(g.shape, bool)
        for c in np.unique(g[g != 0]):
            ys, xs = np.nonzero(g == c)
            if len(ys) != 2:
                return None  # every colour marks exactly one pair
            fill = c if p["segment"] is None else p["segment"]
            if ys[0] == ys[1] and p["orientation"] == "rows":
                span = (ys[0], slice(min(xs) + 1, max(xs)))
            elif xs[0] == xs[1] and p["orientation"] == "columns":
                span = (slice(min(ys) + 1, max(ys)), xs[0])
            else:
                return None
            if claimed[span].any():
                return None  # two segments cross or overlap: which colour wins would be arbitrary
            claimed[span] = True
            seg = out[span]
            seg[seg == 0] = fill
        return out

    return apply


# --- keep_extreme ------------------------------------------------------------------------------------------------
def keep_extreme(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    cols = _colours(rng, 3)
    params = {"which": str(rng.choice(["largest", "smallest"])), "keep": bool(rng.random() < 0.5)}

    def make(r):
        g = _rects(r, spec.size(r), cols, int(r.integers(2, 5)))
        return g

    return RuleInstance("keep_extreme", params, _keep_extreme_apply(params), make)


def _keep_extreme_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        objs = _objects(g)
        if len(objs) < 2:
            return None
        sizes = [len(o[1]) for o in objs]
        best = max(sizes) if p["which"] == "largest" else min(sizes)
        if sizes.count(best) != 1:
            return None
        _, cells = objs[sizes.index(best)]
        ys, xs = list(zip(*cells))
        if not p["keep"]:  # the extreme object alone is removed
            out = g.copy()
            out[list(ys), list(xs)] = 0
            return out
        out = np.zeros_like(g)
        out[list(ys), list(xs)] = g[list(ys), list(xs)]
        return out

    return apply


# --- count_to_bar ------------------------------------------------------------------------------------------------
def count_to_bar(rng: np.random.Generator, spec: GridSpec) -> RuleInstance:
    target, other = _colours(rng, 2)
    params = {
        "colour": target,
        "orientation": str(rng.choice(["row", "column"])),
        "unit": str(rng.choice(["objects", "cells"])),
    }

    def make(r):
        g = _rects(r, spec.size(r), [target, other], int(r.integers(2, 6)))
        return g

    return RuleInstance("count_to_bar", params, _count_to_bar_apply(params), make)


def _count_to_bar_apply(p: dict) -> Callable[[Grid], Optional[Grid]]:
    def apply(g):
        mask = g == p["colour"]
        n = len(_components(mask)) if p["unit"] == "objects" else int(mask.sum())
        if n == 0 or n > 30:
            return None
        bar = np.full((1, n), p["colour"], dtype=np.uint8)
        return bar if p["orientation"] == "row" else bar.T.copy()

    return apply


OPEN_FAMILIES: dict[str, Callable[[np.random.Generator, GridSpec], RuleInstance]] = {
    "extend_lines": extend_lines,
    "mirror_complete": mirror_complete,
    "crop_object": crop_object,
    "outline": outline,
    "connect_pairs": connect_pairs,
    "keep_extreme": keep_extreme,
    "count_to_bar": count_to_bar,
}
_APPLY = {
    "extend_lines": _extend_lines_apply,
    "mirror_complete": _mirror_complete_apply,
    "crop_object": _crop_object_apply,
    "outline": _outline_apply,
    "connect_pairs": _connect_pairs_apply,
    "keep_extreme": _keep_extreme_apply,
    "count_to_bar": _count_to_bar_apply,
}
# The structural parameters of each family (the rest are colours): what a structure-held-out split varies.
STRUCTURE: dict[str, tuple[str, ...]] = {
    "extend_lines": ("direction", "stop"),
    "mirror_complete": ("axis", "output"),
    "crop_object": ("criterion",),
    "outline": ("interior_kind", "ring_kind"),
    "connect_pairs": ("orientation", "segment_kind"),
    "keep_extreme": ("which", "keep"),
    "count_to_bar": ("orientation", "unit"),
}


def structure(family: str, params: dict) -> str:
    """The structure of an instance: its family and structural parameters, colours left out (an ``outline`` whose
    interior is a colour and one whose interior is another colour have the same structure)."""
    derived = {
        "interior_kind": "empty" if params.get("interior") == 0 else "colour",
        "ring_kind": "none" if params.get("ring") is None else "ring",
        "segment_kind": "own" if params.get("segment", 0) is None else "fixed",
    }
    return f"{family}:" + json.dumps({k: params.get(k, derived.get(k)) for k in STRUCTURE[family]}, sort_keys=True)


def open_rule_apply(family: str, params: dict) -> Callable[[Grid], Optional[Grid]]:
    """The mapping (input grid -> output grid, or None for an unsuitable input) of an open family's instance."""
    return _APPLY[family](params)


_COLOUR_PARAMS = ("mark", "line", "block", "mask", "colour", "ring", "segment")
_SWAP = {"vertical": "horizontal", "horizontal": "vertical", "rows": "columns", "columns": "rows"}
_SWAP.update(row="column", column="row")


def open_conjugate_params(family: str, params: dict, dihedral: int, colour_map) -> dict:
    """The instance an augmented copy of a puzzle of ``params`` shows (as
    :func:`dataset.rule_identity.conjugate_params` for the covered families): colours through ``colour_map`` (0
    fixed), directions through the dihedral transform, a row / column (horizontal / vertical) choice exchanged by a
    transform that exchanges rows and columns. ``tests/test_open_families.py`` checks it against the mappings."""
    pi = [int(c) for c in colour_map]
    m = D4_MATRIX[dihedral]
    out = dict(params)
    for k in _COLOUR_PARAMS:
        if out.get(k) is not None:
            out[k] = pi[int(out[k])]
    if family == "outline":
        out["interior"] = pi[int(params["interior"])]
    if family == "extend_lines":
        v = tuple(int(x) for x in m @ np.array(DIRECTIONS[params["direction"]]))
        out["direction"] = next(d for d, u in DIRECTIONS.items() if u == v)
    if m[0, 0] == 0:  # rows and columns exchange
        for k in ("axis", "orientation"):
            if k in out:
                out[k] = _SWAP.get(out[k], out[k])
    return out


def open_rivals(family: str, params: dict) -> list[dict]:
    """Other instances of the family that the demos of ``params`` must rule out (a puzzle whose demos one of them
    also explains does not determine its rule): the optional part dropped (a ray that stops at cells vs one that
    does not, a ring, a fixed segment colour) and every other choice of the structural parameters that can give the
    same pairs (another crop criterion or crop colour, another mirror axis, pairs joined along rows vs both, objects
    vs cells counted)."""
    p, out = params, []
    if family == "extend_lines" and p["stop"]:
        out.append({k: v for k, v in p.items() if k != "block"} | {"stop": False})
    if family == "extend_lines" and not p["stop"]:
        out.append(dict(p, stop=True, block=0))
    if family == "outline" and p["ring"] is not None:
        out.append(dict(p, ring=None))
    if family == "connect_pairs":
        if p["segment"] is not None:
            out.append(dict(p, segment=None))
        out += [dict(p, orientation=o) for o in ("rows", "columns") if o != p["orientation"]]
    if family == "mirror_complete":
        out += [dict(p, axis=a) for a in ("vertical", "horizontal") if a != p["axis"]]
    if family == "crop_object":
        out += [{"criterion": c} for c in CROP_CRITERIA if c != "colour" and c != p["criterion"]]
        out += [{"criterion": "colour", "colour": c} for c in range(1, 10) if p.get("colour") != c]
    if family == "keep_extreme":  # with two objects, keeping the largest is removing the smallest
        other = "smallest" if p["which"] == "largest" else "largest"
        out += [dict(p, which=other), dict(p, which=other, keep=not p["keep"])]
    if family == "count_to_bar":  # a count of 1 is a 1 x 1 bar, a row and a column
        out.append(dict(p, unit="cells" if p["unit"] == "objects" else "objects"))
        out.append(dict(p, orientation="column" if p["orientation"] == "row" else "row"))
    return out

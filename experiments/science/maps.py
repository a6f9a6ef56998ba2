"""The ``maps`` program: position maps *learned* across training puzzles, factored into a row part and a column part.

    python -m experiments.science.pointer DIR --method maps --out MAPS.json [--maps-forms 24 --maps-steps 1000]

A dictionary of ``rows`` row forms and ``cols`` column forms is learned on a science command's training puzzles; a
held-out puzzle is answered by the (row form, column form) pair whose hard pointer, with the majority colour table,
reproduces the most of its demo cells (the pointer's answer rule: ``experiments.science.pointer``). A row form gives
output cell i the logit ``s * r_j^T R o_i`` for each source j: o_i is the cell's one-hot offsets from the input
grid's four edges (``core.ops.grid_coordinates``, the keys of the pointer and of the model's gather), r_j the
source's offsets from the top and bottom edges only (so every cell of a row gets one logit), or one of two null keys
that read no cell; a column form the same with the left and right edges. The row form says which source *row* a cell
reads (from its row, or for a transpose its column), the column form which source column, and the pair reads the
cell there, or a null key where either form picks one: a map seen in training only in other combinations (a shift
by (-2, -1) after (-2, 3) and (1, -1)) is a pair of forms the training shaped.

Learning (:func:`learn_maps`): the teacher is the pointer fitted to every pair of a training puzzle (demos and
tests), where it reproduces them all: the key each output cell reads. Each row form is scored per puzzle by the
log-probability it gives the teacher's source row on the cells the teacher pins down (a null key, or a source that
is not the input's commonest colour: which background cell a cell reads is arbitrary), each column form its
column; each form is pulled toward the puzzles it fits best (weights ``softmax(-tau * loss)`` over the forms, no
gradient through them). Forms start random (seeded); nothing lists a map, no constant is shared with the
benchmark's generator. Unlike the pointer and the cells this program learns across puzzles: its forms are weights
(record 2026-11-29-learned-maps). One answer per test input: pass@1 = pass@2.
"""

from __future__ import annotations

import sys
import time
from typing import Sequence

import torch
import torch.nn.functional as F

from core.ops import grid_coordinates
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

CLASSES = COLOURS + NULLS  # a source's class: its colour or a null key


class MapDictionary(torch.nn.Module):
    """``rows`` row forms R [rows, 2 W + NULLS, 4 W] and ``cols`` column forms C (W = 2 side + 1 offsets per edge)."""

    def __init__(self, side: int, rows: int = 8, cols: int = 8, seed: int = 0, init_std: float = 0.1) -> None:
        super().__init__()
        self.side, self.W = side, 2 * side + 1
        g = torch.Generator().manual_seed(seed)
        shape = (2 * self.W + NULLS, 4 * self.W)
        self.R = torch.nn.Parameter(init_std * torch.randn(rows, *shape, generator=g))
        self.C = torch.nn.Parameter(init_std * torch.randn(cols, *shape, generator=g))

    def axis_logits(self, tokens: torch.Tensor, scale: float):
        """([n, rows, S, S + NULLS], [n, cols, S, S + NULLS]): every row form's and column form's logits of each
        canvas cell over the input's cells and the null keys (cells off the input grid at -inf)."""
        n, S = tokens.shape
        W = self.W
        at = grid_coordinates(tokens, self.side) + W * torch.arange(4)
        o = torch.zeros(n, S, 4 * W).scatter_(-1, at, 1.0)  # target keys: all four edges
        nulls = torch.eye(NULLS).expand(n, NULLS, NULLS)
        off = F.pad(tokens < 2, (0, NULLS))[:, None, None, :]

        def axis(a: int, forms: torch.Tensor) -> torch.Tensor:  # the source's two edges of one axis, and the nulls
            src = torch.cat((F.pad(o[..., 2 * a * W : 2 * (a + 1) * W], (0, NULLS)), F.pad(nulls, (2 * W, 0))), dim=1)
            return (scale * torch.einsum("njf,mfg,nig->nmij", src, forms, o)).masked_fill(off, float("-inf"))

        return axis(0, self.R), axis(1, self.C)


def _axis_targets(keys: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``keys`` [n, S] the key each cell reads (cell or S + null) -> per axis [n, S, S + NULLS] the keys that agree with
    it on that axis: the cells of the same canvas row (column), or the null keys."""
    S = side * side
    j = torch.arange(S + NULLS)
    pos = torch.stack((torch.div(j, side, rounding_mode="floor"), j % side))  # [2, S + NULLS]
    pos[:, S:] = -1  # the null keys agree with each other only (which one is the colour table's business)
    tpos = torch.where(keys[None] < S, pos[:, keys.clamp_max(S - 1)], -1)  # [2, n, S]
    same = tpos[..., None] == pos[:, None, None, :]
    return same[0], same[1]


def _informative(tokens: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[n, S]: the cells whose teacher key says where they read from: a null key (off the output grid), or an input
    cell of a colour other than the input's commonest (a cell that reads background could read any background
    cell: the pointer's choice there is arbitrary)."""
    S = tokens.shape[1]
    counts = F.one_hot(tokens, COLOURS + 2)[..., 2:].sum(1)  # [n, COLOURS]
    bg = counts.argmax(-1) + 2
    src = tokens.gather(1, keys.clamp_max(S - 1))
    return (keys >= S) | ((src >= 2) & (src != bg[:, None]))


def learn_maps(
    teachers: list,
    side: int,
    rows: int = 24,
    cols: int = 24,
    steps: int = 1000,
    batch: int = 16,
    lr: float = 0.02,
    tau: float = 10.0,
    seed: int = 0,
    progress=None,
) -> MapDictionary:
    """The dictionary learned from ``teachers``: per training puzzle, its pairs' inputs [D, S] (canvas tokens) and the
    key each output cell reads [D, S] (``pointer.PointerFit.sources``: the pointer fitted to that puzzle's pairs).
    Each row form is scored per puzzle by the log-probability it gives the teacher's source row, each column form
    its column; the forms are pulled toward the puzzles they fit best (weights ``softmax(-tau * loss)`` over forms,
    no gradient through the weights), ``steps`` Adam steps of ``batch`` puzzles drawn with ``seed``."""
    maps = MapDictionary(side, rows, cols, seed)
    D = max(t.shape[0] for t, _ in teachers)
    S = side * side
    inp = torch.zeros(len(teachers), D, S, dtype=torch.long)
    key, valid = torch.zeros_like(inp), torch.zeros(len(teachers), D, dtype=torch.bool)
    for a, (t, k) in enumerate(teachers):
        inp[a, : len(t)], key[a, : len(t)], valid[a, : len(t)] = t, k, True
    opt = torch.optim.Adam(maps.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        idx = torch.randint(len(teachers), (batch,), generator=g)
        x, k, v = inp[idx].flatten(0, 1), key[idx].flatten(0, 1), valid[idx].flatten().float()
        scale = 1.0 + 9.0 * step / max(steps - 1, 1)
        loss, fit = 0.0, []
        told = _informative(x, k) & (v[:, None] > 0)  # [n, S]: the cells whose source the teacher pins down
        for L, same in zip(maps.axis_logits(x, scale), _axis_targets(k, side)):
            logp = torch.logsumexp(L.masked_fill(~same[:, None], float("-inf")), -1) - torch.logsumexp(L, -1)
            logp = torch.where(told[:, None], logp, 0.0)
            per = -logp.sum(-1).view(batch, D, -1).sum(1) / told.view(batch, -1).sum(1, keepdim=True).clamp_min(1)
            w = torch.softmax(-tau * per.detach(), dim=-1)  # [batch, forms]
            loss = loss + (w * per).sum(-1).mean()
            fit.append(per.detach().amin(-1).mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress:
            progress(step + 1, steps, float(sum(fit)))
    return maps


class MapFit:
    """Answers puzzles with a learned :class:`MapDictionary` (the ``fit`` of ``pointer.pointer_predictions``)."""

    def __init__(self, maps: MapDictionary) -> None:
        self.maps, self.side = maps, maps.side

    @torch.no_grad()
    def hard_classes(self, tokens: torch.Tensor) -> torch.Tensor:
        """[n, pairs, S]: under every pair (row form r, column form c at r * cols + c), the class each canvas cell
        reads. Each form picks its source row (column) or a null key, as it was taught; a null on either axis is
        read (the row's first), else the cell in the picked row and column. (Summing the two forms' logits over the
        cells instead let a column form taught on same-size grids call the rows a scaling adds "outside": seed 0's
        held-out scale_up 0.00 against 0.60; record 2026-11-29-learned-maps.)"""
        Lr, Lc = self.maps.axis_logits(tokens, 10.0)
        S, side = tokens.shape[1], self.side
        jr, jc = Lr.argmax(-1)[:, :, None], Lc.argmax(-1)[:, None]  # [n, rows, 1, S], [n, 1, cols, S]
        cell = torch.div(jr, side, rounding_mode="floor") * side + jc % side
        j = torch.where(jr >= S, jr, torch.where(jc >= S, jc, cell)).flatten(1, 2)
        n, m, _ = j.shape
        return source_classes(tokens)[:, None].expand(n, m, -1).gather(2, j)

    @torch.no_grad()
    def solve(self, puzzles: list) -> list:
        """``puzzles``: [(demos [(x, y)], test inputs [x])] -> per puzzle (test outputs, demos reproduced)."""
        di, do, valid = stack_pairs([d for d, _ in puzzles], self.side)
        P, D, S = di.shape
        cls = self.hard_classes(di.view(P * D, S)).view(P, D, -1, S).transpose(1, 2)  # [P, pairs, D, S]
        target = answer_classes(do)[:, None].expand_as(cls)
        m = cls.shape[1]
        table, right = majority_table(cls.flatten(0, 1), target.flatten(0, 1), valid.repeat_interleave(m, 0))
        table, right = table.view(P, m, -1), right.view(P, m)  # [P, pairs, CLASSES], [P, pairs]
        best = right.argmax(1)  # ties: the first pair
        out = []
        for a, (_, tests) in enumerate(puzzles):
            answers = []
            for x in tests:
                c = self.hard_classes(canvas_tokens(x, self.side)[None])[0, best[a]]
                answers.append(classes_to_grid(table[a, best[a]].gather(0, c).view(self.side, self.side).numpy()))
            out.append((answers, int(right[a, best[a]]) == int(valid[a].sum()) * S))
        return out


def fitted_maps(
    train_puzzles: Sequence,
    side: int,
    teacher,
    forms: int = 24,
    steps: int = 1000,
    tau: float = 10.0,
    seed: int = 0,
):
    """:func:`learn_maps` on :class:`dataset.augment.ArcPuzzle` objects: the pointer fitted to every pair of each
    (demos and tests; ``teacher``: a ``pointer.PointerFit``, whose ``sources`` give the keys) is the teacher where it
    reproduces them all. Progress on stderr. -> (MapFit, the number of puzzles that taught)."""
    t0 = time.time()
    pairs = [[*p.train, *p.test] for p in train_puzzles]
    teachers = []
    for s in range(0, len(pairs), 64):
        chunk = pairs[s : s + 64]
        for ps, (keys, ok) in zip(chunk, teacher.sources(chunk)):
            if ok:
                teachers.append((torch.stack([canvas_tokens(x, side) for x, _ in ps]), keys))
        print(
            f"\rmaps: teacher {min(s + 64, len(pairs))}/{len(pairs)}, {time.time() - t0:.0f} s", end="", file=sys.stderr
        )

    def bar(k: int, n: int, loss: float) -> None:
        print(f"\rmaps: step {k}/{n}, loss {loss:.3f}, {time.time() - t0:.0f} s", end="", file=sys.stderr)

    print(file=sys.stderr)
    maps = learn_maps(teachers, side, forms, forms, steps, tau=tau, seed=seed, progress=bar)
    print(file=sys.stderr)
    return MapFit(maps), len(teachers)

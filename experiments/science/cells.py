"""The ``cells`` program: a local-rule search with no learned weight and no candidate, fitted to each puzzle's demos.

    python -m experiments.science.pointer DIR --method cells --out CELLS.json [--max-features 3]

For puzzles whose every demo keeps the grid's shape. Every input cell is described by fixed columns, the same for
every puzzle (:func:`features`): its colour and whether it is background (the commonest colour of the demo inputs),
its 8 neighbours (colour; background / not / off the grid), the first non-background colour along each of its 8 rays
and whether there is one, counts of non-background and same-colour neighbours and of rays that hit, whether opposite
rays hit the same colour, whether a background cell's region is closed off from the border, the size of its
same-colour object and that size's rank from either end among the grid's objects, and its row and column from each
edge and their parity. These are generic priors of grid puzzles (objects, neighbours, lines of sight, counting,
order, position), the same columns for every rule: nothing is written to a family's parameter range.

A *rule* is a set of at most ``max_features`` columns: demo cells with the same values there form a group, and the
group's output must have one explanation shared by all its cells, taken in this order: the cell's own colour, the
colour along one of its rays, one of its neighbours' colours, a fixed colour. A rule is consistent when every group
has one; it answers a test input when every test cell falls in a group the demos formed and its explanation names a
colour there. The smallest consistent rules that answer vote cell by cell (ties: the first, in column order).
Consistent on the demos by construction: ``demos_reproduced`` is whether any rule was found; ``--loo`` checks that
a rule found on the other demos answers the demo left out. One answer per test input: pass@1 = pass@2.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

COLOURS = 10
OUT, NONE = 10, 11  # a neighbour off the grid; a ray that meets no non-background cell
DIRS = ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))  # up down left right, diagonals
REFS = 1 + 8 + 8  # explanations by reference: own colour, the 8 rays' colours, the 8 neighbours' colours
CHUNK = 1 << 22  # rules x cells per numpy pass
CAP = 31  # every column's values lie in [0, CAP]: keys pack 5 bits per column


def _components(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(label per cell: its 4-connected same-colour region, background regions included; size per label)."""
    h, w = g.shape
    lab = -np.ones((h, w), dtype=np.int64)
    sizes = []
    for r0 in range(h):
        for c0 in range(w):
            if lab[r0, c0] >= 0:
                continue
            k, stack, lab[r0, c0] = len(sizes), [(r0, c0)], len(sizes)
            n = 0
            while stack:
                r, c = stack.pop()
                n += 1
                for dr, dc in DIRS[:4]:
                    rr, cc = r + dr, c + dc
                    if 0 <= rr < h and 0 <= cc < w and lab[rr, cc] < 0 and g[rr, cc] == g[r0, c0]:
                        lab[rr, cc] = k
                        stack.append((rr, cc))
            sizes.append(n)
    return lab, np.asarray(sizes, dtype=np.int64)


def features(grid, bg: int) -> tuple[np.ndarray, np.ndarray]:
    """(columns [cells, F] with values in [0, CAP], references [cells, REFS]: the colours an explanation by reference
    would give, or NONE / OUT) of one grid, cells in row-major order."""
    g = np.asarray(grid, dtype=np.int64)
    h, w = g.shape
    pad = np.full((h + 2, w + 2), OUT, dtype=np.int64)
    pad[1:-1, 1:-1] = g
    nb = np.stack([pad[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w] for dr, dc in DIRS], -1)  # [h, w, 8]
    ray = np.full((h, w, 8), NONE, dtype=np.int64)
    for k, (dr, dc) in enumerate(DIRS):
        for r in range(h):
            for c in range(w):
                rr, cc = r + dr, c + dc
                while 0 <= rr < h and 0 <= cc < w:
                    if g[rr, cc] != bg:
                        ray[r, c, k] = g[rr, cc]
                        break
                    rr, cc = rr + dr, cc + dc
    lab, sizes = _components(g)
    colour = np.zeros(sizes.size, dtype=np.int64)
    colour[lab.ravel()] = g.ravel()
    objs = sizes[colour != bg]  # the sizes of the grid's objects (non-background regions)
    size = sizes[lab]
    fg = g != bg
    rank_big = np.where(fg, np.searchsorted(np.unique(-objs), -size), 3)  # 0: the largest size
    rank_small = np.where(fg, np.searchsorted(np.unique(objs), size), 3)  # 0: the smallest size
    border = set(lab[0].tolist() + lab[-1].tolist() + lab[:, 0].tolist() + lab[:, -1].tolist())
    closed = ~fg & ~np.isin(lab, list(border))
    rows, cols = np.indices((h, w))
    nb_cls = np.where(nb == OUT, 2, (nb != bg).astype(np.int64))
    hit = ray != NONE
    cols_ = [
        g,
        fg,
        *np.moveaxis(nb, -1, 0),
        *np.moveaxis(nb_cls, -1, 0),
        *np.moveaxis(ray, -1, 0),
        *np.moveaxis(hit, -1, 0),
        (nb_cls[..., :4] == 1).sum(-1),
        (nb_cls == 1).sum(-1),
        (nb[..., :4] == g[..., None]).sum(-1),
        hit[..., :4].sum(-1),
        hit.sum(-1),
        *[hit[..., a] & (ray[..., a] == ray[..., b]) for a, b in ((0, 1), (2, 3), (4, 7), (5, 6))],
        closed,
        size,
        np.minimum(rank_big, 3),
        np.minimum(rank_small, 3),
        rows,
        cols,
        h - 1 - rows,
        w - 1 - cols,
        rows % 2,
        cols % 2,
    ]
    F = np.stack([np.minimum(np.asarray(c, dtype=np.int64), CAP) for c in cols_], -1).reshape(h * w, -1)
    refs = np.concatenate([g[..., None], ray, nb], -1).reshape(h * w, REFS)
    return F, refs


N_FEATURES = features(np.zeros((1, 1), dtype=np.int64), 0)[0].shape[1]


def _explanations(refs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bit mask per cell of the explanations that give its output colour ``y``: bit k < REFS for reference k, bit
    REFS + c for the fixed colour c."""
    bits = (refs == y[:, None]).astype(np.int64) << np.arange(REFS)
    return bits.sum(-1) | (np.int64(1) << (REFS + y))


def _background(demos) -> int:
    counts = np.bincount(np.concatenate([np.asarray(x).ravel() for x, _ in demos]), minlength=COLOURS)
    return int(np.argmax(counts))  # ties: the smallest colour


def solve_one(demos, tests, max_features: int = 3) -> tuple[list[np.ndarray], bool]:
    """(one answer per test input, whether a rule was found) for one puzzle; no rule: empty answers."""
    empty = [np.zeros((0, 0), dtype=np.int64) for _ in tests]
    if not demos or any(np.shape(x) != np.shape(y) for x, y in demos):
        return empty, False
    bg = _background(demos)
    Fd, masks = [], []
    for x, y in demos:
        F, refs = features(x, bg)
        Fd.append(F)
        masks.append(_explanations(refs, np.asarray(y, dtype=np.int64).ravel()))
    Fd, masks = np.concatenate(Fd), np.concatenate(masks)
    test = [features(x, bg) for x in tests]
    Ft = np.concatenate([F for F, _ in test])
    refs_t = np.concatenate([r for _, r in test])
    chunk = max(1, CHUNK // max(len(Fd) + len(Ft), 1))
    for k in range(max_features + 1):
        subsets = list(combinations(range(N_FEATURES), k))
        good = [
            p for s in range(0, len(subsets), chunk) for p in _answers(subsets[s : s + chunk], Fd, masks, Ft, refs_t)
        ]
        if good:
            answer = _vote(np.concatenate(good))
            outs, at = [], 0
            for x in tests:
                n = int(np.size(x))
                outs.append(answer[at : at + n].reshape(np.shape(x)))
                at += n
            return outs, True
    return empty, False


def _answers(subsets: list, Fd, masks, Ft, refs_t) -> list[np.ndarray]:
    """The test cells' colours [rules, test cells] under the consistent rules among ``subsets`` that answer them."""
    S = len(subsets)
    cols = np.asarray(subsets, dtype=np.int64).reshape(S, -1)
    shift = 5 * np.arange(cols.shape[1], dtype=np.int64)
    row = np.arange(S, dtype=np.int64)[:, None] << 40
    kd = row + (Fd[:, cols] << shift).sum(-1).T  # [S, demo cells]
    kt = row + (Ft[:, cols] << shift).sum(-1).T  # [S, test cells]
    groups, inv = np.unique(kd.ravel(), return_inverse=True)
    acc = np.full(groups.size, -1, dtype=np.int64)
    np.bitwise_and.at(acc, inv, np.tile(masks, S))
    ok = (acc.reshape(-1) != 0)[inv].reshape(S, -1).all(1)
    at = np.searchsorted(groups, kt).clip(max=groups.size - 1)
    seen = groups[at] == kt
    mask = np.where(seen, acc[at], 0)
    first = mask & -mask  # the lowest explanation bit: the first in order
    bit = np.where(first > 0, np.log2(np.maximum(first, 1)).round().astype(np.int64), -1)
    ref = np.take_along_axis(np.broadcast_to(refs_t, (S, *refs_t.shape)), bit.clip(0, REFS - 1)[..., None], -1)[..., 0]
    pred = np.where(bit >= REFS, bit - REFS, ref)
    good = ok & seen.all(1) & (bit >= 0).all(1) & (pred < COLOURS).all(1)
    return [pred[good]] if good.any() else []


def _vote(votes: np.ndarray) -> np.ndarray:
    """The commonest answer among the rules' [rules, test cells] (ties: the first rule's)."""
    uniq, idx, count = np.unique(votes, axis=0, return_index=True, return_counts=True)
    best = np.flatnonzero(count == count.max())
    return uniq[best[np.argmin(idx[best])]]


class CellRuleFit:
    """The ``cells`` program behind the pointer command's interface: :meth:`solve` like ``PointerFit.solve``."""

    def __init__(self, max_features: int = 3):
        self.max_features = max_features

    def solve(self, puzzles: list) -> list:
        """``puzzles``: [(demos [(x, y)], test inputs [x])] -> per puzzle (test outputs, a rule was found)."""
        return [solve_one(d, t, self.max_features) for d, t in puzzles]

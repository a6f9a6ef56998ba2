"""A gather form written by the demos (``arch.gather_demo_form``): no map is listed or learned, it is counted.

The learned gather (:class:`~models.variants.gather.GridGather`) reads the test input through a bank of forms
learned across training puzzles, ``T[i, j] = o_j^T A o_i`` over the cells' one-hot offsets from the input grid's four
edges. A bank can only hold the maps training shows; a held-out shift or flip is, by construction, none of them. This
form is written per puzzle from its demos instead, in the same offset space: every demo output cell i votes for the
demo input cells j of its colour, ``w_ij = [out_i = in_j] / n_i^2`` (``n_i`` the input cells of that colour: a
colour seen once points at its source with weight 1, the background's many cells say little), and the votes are
counted per (source slot, target slot) pair, ``C = sum_pairs O^T W O``. Per pair of blocks (top, bottom, left,
right of the source; of the target) the form is the counts' pointwise mutual information (``alpha`` pseudo-counts),
0 where the demos say nothing. A cell's logit for a source is the sum over the 16 (its slot, the source's slot)
pairs: a naive-Bayes read of "where did cells placed like me get their colour".

Any map that sends a cell's edge offsets to its source's block by block (a flip, a transpose, a shift with or
without wrap, a scaling, a tiling) is counted from demos that show it, whether or not a training puzzle did; a rule
that recolours or draws new cells leaves the form near 0 (the gate's match then scores it low). Nothing here names a
rule family or a parameter range. The zero-demo control's form is 0 everywhere: a uniform read. A rule that recolours
in place sends the votes of its recoloured cells to cells of other colours; ``arch.gather_demo_form_roles`` also counts
over colour roles, which a recolouring keeps (:func:`demo_tables`).

The target cells are placed by the input grid's edges, which an axis swap (a quarter turn, a transpose) of a
non-square grid breaks: the output's bottom and right edges are then the swapped grid's.
``arch.gather_demo_form_frame`` counts in both frames (:func:`frame_slots`) and keeps, per sample, the one its demos'
shapes name (:func:`frame_allowed`: outputs shaped as their inputs' transposes, or not).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from core.ops import grid_coordinates


def pair_counts(onehot, inputs, outputs, first: int, table: Optional[torch.Tensor] = None, target=None) -> torch.Tensor:
    """[n, F, F] the votes of each demo pair, indexed [source slot, target slot]: ``onehot`` [n, S, F] the canvas
    cells' one-hot offsets from the pair's *input* grid (the target cells are placed by the input's edges, as the
    test's are; ``target``: the target cells' slots instead, :func:`frame_slots`), ``inputs`` / ``outputs`` [n, S]
    tokens (colours from ``first``). Each output cell's vote for the input cells of its colour: ``1 / n_i^2`` each,
    or, given a form ``table`` [n, F, F] (a refinement round), ``1 / n_i`` shared among them by the form's soft read
    (the sources the form already prefers get more)."""
    target = onehot if target is None else target
    same = (outputs[:, :, None] == inputs[:, None, :]) & (outputs[:, :, None] >= first)  # [n, S_i, S_j]
    w = same.float()
    n = w.sum(-1, keepdim=True).clamp_min(1)
    if table is None:
        w = w / n**2
    else:
        read = torch.softmax(form_logits(onehot, table, target).masked_fill(~same, float("-inf")), dim=-1)
        w = torch.nan_to_num(read) * w / n
    return torch.einsum("njg,nij,nif->ngf", onehot, w, target)


def form_table(counts: torch.Tensor, blocks: int = 4, alpha: float = 0.1, allowed=None) -> torch.Tensor:
    """[..., F, Ft] counts -> the form [..., F, Ft]: per pair of blocks (the source's, the target's), the smoothed
    pointwise mutual information of a source slot and a target slot under the block pair's votes,
    ``log p(source, target) / (p(source) p(target))``: a slot pair the demos link scores above 0, one they keep
    apart below, a slot that is merely common (the middle of every grid) 0. Each source block keeps only the target
    block that tells most about it (the largest mutual information): a map says where a source's offset is measured
    from, and the other 3 block pairs are noise. 0 without votes. A target side of more blocks (:func:`frame_slots`:
    6) with ``allowed`` [..., target blocks] (bool: the sample's frame, :data:`FRAMES`) keeps one among those."""
    *lead, F_, Ft = counts.shape
    k = F_ // blocks
    c = counts.reshape(*lead, blocks, k, Ft // k, k) + alpha
    total = c.sum((-3, -1), keepdim=True)
    pmi = torch.log(c * total / (c.sum(-3, keepdim=True) * c.sum(-1, keepdim=True)))
    mi = (c / total * pmi).sum((-3, -1))  # [..., source block, target block]
    if allowed is not None:
        mi = mi.masked_fill(~allowed[..., None, :], float("-inf"))
    keep = F.one_hot(mi.argmax(-1), Ft // k).to(pmi.dtype)  # [..., source block, target block]
    return (pmi * keep[..., :, None, :, None]).reshape(*lead, F_, Ft)


def form_logits(onehot: torch.Tensor, table: torch.Tensor, target: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[n, S_i, S_j]: ``T[i, j] = t_i^T table^T o_j`` per row (``onehot`` [n, S, F] the source slots, ``table`` [n, F,
    F], ``target`` the target cells' slots, default ``onehot``)."""
    return torch.einsum("njg,ngf,nif->nij", onehot, table, onehot if target is None else target)


def box_shapes(coords: torch.Tensor) -> torch.Tensor:
    """[n, 2] (height, width) of each canvas's grid from its cells' edge offsets ``coords`` [n, S, 4]
    (``core.ops.grid_coordinates``: top, bottom, left, right, shifted alike): 0 x 0 without a colour cell."""
    c = coords[:, 0]
    return torch.stack((c[:, 1] - c[:, 0] + 1, c[:, 3] - c[:, 2] + 1), dim=-1)


def transposed_outputs(in_coords, out_coords, rows, b: int) -> torch.Tensor:
    """[b] bool: the samples whose demos say the output grid is the input grid's transpose (height and width
    swapped): more non-square demo pairs (``rows`` [n] their sample) with the output's shape the input's transposed
    than with it the input's own (a square demo says nothing)."""
    si, so = box_shapes(in_coords), box_shapes(out_coords)
    telling = si[:, 0] != si[:, 1]
    swapped = (telling & (so == si.flip(-1)).all(-1)).float()
    kept = (telling & (so == si).all(-1)).float()
    votes = swapped.new_zeros(b).index_add(0, rows, swapped - kept)
    return votes > 0


def frame_slots(coords: torch.Tensor, side: int) -> torch.Tensor:
    """[n, S, 6] the target cells' edge offsets in both frames: the input grid's four (``coords``, shifted by
    ``side``), then the bottom and right offsets from the grid with the input's height and width swapped, anchored at
    its top-left corner (an axis swap's output grid: a quarter turn, a transpose; its top and left edges are the
    input's). Under an axis swap of a non-square grid an output cell's offsets from the input's own bottom and right
    edges are no source offset, and a form counted in them reads another row or column on a grid of another size."""
    top, bottom, left, right = (coords[..., k] - side for k in range(4))
    height, width = top + bottom + 1, left + right + 1
    moved = torch.stack((width - 1 - top, height - 1 - left), dim=-1).clamp(-side, side) + side
    return torch.cat((coords, moved), dim=-1)


#: the target blocks each frame keeps, of :func:`frame_slots`' six: the input's grid, the swapped grid
FRAMES = ((0, 1, 2, 3), (0, 4, 2, 5))


def slot_onehot(slots: torch.Tensor, side: int) -> torch.Tensor:
    """[n, S, K] edge offsets in ``[0, 2 side]`` -> [n, S, K (2 side + 1)]: one one-hot block per offset."""
    at = slots + (2 * side + 1) * torch.arange(slots.shape[-1], device=slots.device)
    return torch.zeros(*slots.shape[:2], slots.shape[-1] * (2 * side + 1), device=slots.device).scatter_(-1, at, 1.0)


def frame_onehot(tokens: torch.Tensor, side: int) -> torch.Tensor:
    """[n, S, 6 (2 side + 1)]: the one-hot of :func:`frame_slots` of every canvas cell (``tokens`` [n, S])."""
    return slot_onehot(frame_slots(grid_coordinates(tokens, side), side), side)


def frame_allowed(inputs, outputs, rows, b: int, side: int) -> torch.Tensor:
    """[b, 6] bool: the target blocks of each sample's frame (:data:`FRAMES`): the swapped grid's where its demos
    (``inputs`` / ``outputs`` [n, S], ``rows`` [n] their sample) say the output is the input's transpose in shape."""
    coords = (grid_coordinates(t, side) for t in (inputs, outputs))
    swap = transposed_outputs(*coords, rows, b).long()
    frames = torch.zeros(2, 6, dtype=torch.bool, device=inputs.device)
    frames[0, list(FRAMES[0])], frames[1, list(FRAMES[1])] = True, True
    return frames[swap]


def demo_tables(onehot, inputs, outputs, rows, b: int, first: int, rounds: int = 0, target=None, allowed=None,
                roles: bool = False, vocab: int = 12):  # fmt: skip
    """The form of each sample from all its valid demos, [b, F, F], and of each demo pair from its sample's *other*
    demos (leave-one-out: how well the form the other demos write explains this one is the gate's match), [n, F, F].
    ``onehot`` / ``inputs`` / ``outputs``: the n valid demo pairs; ``rows`` [n] the sample each belongs to.
    ``rounds``: refinement rounds, each recounting the votes shared by the last round's form (the leave-one-out
    form is the last round's counts less the pair's own). ``target`` [n, S, Ft]: the target cells' slots in both
    frames (:func:`frame_slots`, one-hot) and ``allowed`` [b, 6]: each sample's frame (:data:`FRAMES`).
    ``roles`` (``arch.gather_demo_form_roles``): the votes are also counted over the cells' colour roles
    (:func:`role_tokens`) and each sample keeps the count whose read, recoloured as its demos show, reproduces more
    of its demo output cells (:func:`reproduced`; a tie keeps the colours'): a rule that permutes colours in place
    sends every vote of a recoloured cell to cells of another colour, its roles to its source. ``vocab``: the token
    count (the colour table's size)."""
    form, loo = _counted(onehot, inputs, outputs, rows, b, first, rounds, target, allowed)
    if not roles:
        return form, loo
    by_role = _counted(onehot, role_tokens(inputs, first, vocab), role_tokens(outputs, first, vocab), rows, b, first,
                       rounds, target, allowed, ROLE_ALPHA)  # fmt: skip
    target = onehot if target is None else target
    score = lambda t: reproduced(onehot, t, target, inputs, outputs, rows, b, vocab, first)  # noqa: E731
    better = score(by_role[0]) > score(form)  # [b]
    return torch.where(better[:, None, None], by_role[0], form), torch.where(
        better.index_select(0, rows)[:, None, None], by_role[1], loo
    )


#: the role count's pseudo-count (:func:`form_table`'s ``alpha``): a role's votes are spread over about half a grid
#: (two roles), so the colours' pseudo-count would drown them; chosen on training puzzles (the count alone, data
#: seeds 0 and 2: docs/record/2026-12-07-colour-roles-count.md)
ROLE_ALPHA = 1e-3


def role_tokens(tokens: torch.Tensor, first: int, vocab: int) -> torch.Tensor:
    """[n, S]: each colour cell's role in its grid, ``first`` where it has the grid's commonest colour (ties: the
    lowest) and ``first + 1`` where not; the tokens below ``first`` (no colour) kept. A recolouring keeps roles."""
    cell = tokens >= first
    counts = tokens.new_zeros(tokens.shape[0], vocab, dtype=torch.float)
    counts = counts.scatter_add_(1, tokens.long(), cell.float())
    commonest = counts[:, first:].argmax(-1, keepdim=True) + first
    return torch.where(cell, first + (tokens != commonest).long(), tokens.long())


def reproduced(onehot, form, target, inputs, outputs, rows, b: int, vocab: int, first: int) -> torch.Tensor:
    """[b]: per sample, the demo output cells (of the n valid pairs) its counted ``form`` [b, F, Ft] reproduces: each
    cell's best-scored input cell, its colour mapped to the output colour the cells reading that colour show most
    on the sample's demos (``onehot`` / ``target`` the source / target slots, ``inputs`` / ``outputs`` [n, S],
    ``rows`` [n])."""
    off = inputs < first
    logits = form_logits(onehot, form.index_select(0, rows), target)  # [n, S_i, S_j]
    table = link_counts(logits, off, inputs, outputs, rows, b, vocab, first, linked=False)
    return table.amax(-1).sum(-1)  # each source colour's commonest output colour: the cells it reproduces


def _counted(onehot, inputs, outputs, rows, b: int, first: int, rounds: int, target, allowed, alpha: float = 0.1):
    """:func:`demo_tables`' count of the votes of ``inputs`` / ``outputs`` (colours or roles)."""
    table = lambda t: form_table(t, alpha=alpha, allowed=allowed)  # noqa: E731
    counts = pair_counts(onehot, inputs, outputs, first, target=target)
    total = counts.new_zeros(b, *counts.shape[1:]).index_add(0, rows, counts)
    for _ in range(rounds):
        counts = pair_counts(onehot, inputs, outputs, first, table(total).index_select(0, rows), target)
        total = counts.new_zeros(b, *counts.shape[1:]).index_add(0, rows, counts)
    loo = (total.index_select(0, rows) - counts).clamp_min(0)
    return table(total), form_table(
        loo, alpha=alpha, allowed=None if allowed is None else allowed.index_select(0, rows)
    )


def colour_read(logits: torch.Tensor, off: torch.Tensor, inputs: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, ..., S, vocab + 1]: per cell, the colour a form brings to it: its soft read of ``inputs``' cells [n, S]
    under ``logits`` [n, ..., S, S + 1] (the null key last, its share in the last column), ``off`` [n, ..., S + 1] the
    keys never read (``GridGather.match`` scores the forms with it)."""
    p = logits.masked_fill(off.unsqueeze(-2), float("-inf")).softmax(-1)
    src = F.one_hot(F.pad(inputs.long(), (0, 1), value=vocab), vocab + 1).to(p.dtype)
    return torch.einsum("n...ij,njk->n...ik", p, src)


def colour_table(logits, off, inputs, outputs, rows, b: int, vocab: int, first: int) -> torch.Tensor:
    """[b, vocab, vocab] row-stochastic: the colour each source colour becomes where the counted form reads it, counted
    on each sample's demos (``arch.gather_demo_form_colour``). ``logits`` [n, S, S] the counted form's on the n valid
    demo pairs (its target cells first), ``off`` [n, S] the keys never read, ``inputs`` / ``outputs`` [n, S] tokens,
    ``rows`` [n] their sample. Each demo output cell of a colour whose best key the form links to it (logit > 0) adds
    1 to (that key's colour, the cell's colour); each colour also keeps itself once (a colour no demo shows, or a
    sample without demos, maps to itself). A flip that recolours, a scaling that recolours: the source the count
    finds holds the colour before the recolouring, its demos say after."""
    total = link_counts(logits, off, inputs, outputs, rows, b, vocab, first, linked=True)
    total = total + torch.eye(vocab, dtype=total.dtype, device=total.device)
    return total / total.sum(-1, keepdim=True)


def link_counts(logits, off, inputs, outputs, rows, b: int, vocab: int, first: int, linked: bool) -> torch.Tensor:
    """[b, vocab, vocab]: per sample, how many demo output cells of each colour read a key of each colour, each cell
    its best key under ``logits`` [n, S, S] (``off`` [n, S] the keys never read; ``inputs`` / ``outputs`` [n, S],
    ``rows`` [n] their sample). ``linked``: only the cells whose best key the form links to them (logit > 0) and
    that key a colour cell (:func:`colour_table`); else every output colour cell (:func:`reproduced`)."""
    best, at = logits.masked_fill(off[:, None, :], float("-inf")).max(-1)  # [n, S] over the grid's cells
    src = inputs.long().gather(1, at)
    ok = outputs >= first
    if linked:
        ok = ok & (best > 0) & (src >= first)
    per = logits.new_zeros(inputs.shape[0], vocab * vocab).scatter_add_(
        1, src * vocab + outputs.long(), ok.to(logits.dtype)
    )
    return per.new_zeros(b, vocab * vocab).index_add(0, rows, per).view(b, vocab, vocab)

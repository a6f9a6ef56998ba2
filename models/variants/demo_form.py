"""A gather form written by the demos (``arch.gather_demo_form``): no map is listed or learned, it is counted.

The learned gather (:class:`~models.variants.views_parts.GridGather`) reads the test input through a bank of forms
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
rule family or a parameter range. The zero-demo control's form is 0 everywhere: a uniform read.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def pair_counts(onehot, inputs, outputs, first: int, table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[n, F, F] the votes of each demo pair, indexed [source slot, target slot]: ``onehot`` [n, S, F] the canvas
    cells' one-hot offsets from the pair's *input* grid (the target cells are placed by the input's edges, as the
    test's are), ``inputs`` / ``outputs`` [n, S] tokens (colours from ``first``). Each output cell's vote for the
    input cells of its colour: ``1 / n_i^2`` each, or, given a form ``table`` [n, F, F] (a refinement round),
    ``1 / n_i`` shared among them by the form's soft read (the sources the form already prefers get more)."""
    same = (outputs[:, :, None] == inputs[:, None, :]) & (outputs[:, :, None] >= first)  # [n, S_i, S_j]
    w = same.float()
    n = w.sum(-1, keepdim=True).clamp_min(1)
    if table is None:
        w = w / n**2
    else:
        read = torch.softmax(form_logits(onehot, table).masked_fill(~same, float("-inf")), dim=-1)
        w = torch.nan_to_num(read) * w / n
    return torch.einsum("njg,nij,nif->ngf", onehot, w, onehot)


def form_table(counts: torch.Tensor, blocks: int = 4, alpha: float = 0.1) -> torch.Tensor:
    """[..., F, F] counts -> the form [..., F, F]: per pair of blocks (the source's, the target's), the smoothed
    pointwise mutual information of a source slot and a target slot under the block pair's votes,
    ``log p(source, target) / (p(source) p(target))``: a slot pair the demos link scores above 0, one they keep
    apart below, a slot that is merely common (the middle of every grid) 0. Each source block keeps only the target
    block that tells most about it (the largest mutual information): a map says where a source's offset is measured
    from, and the other 3 block pairs are noise. 0 without votes."""
    *lead, F_, _ = counts.shape
    k = F_ // blocks
    c = counts.reshape(*lead, blocks, k, blocks, k) + alpha
    total = c.sum((-3, -1), keepdim=True)
    pmi = torch.log(c * total / (c.sum(-3, keepdim=True) * c.sum(-1, keepdim=True)))
    mi = (c / total * pmi).sum((-3, -1))  # [..., source block, target block]
    keep = F.one_hot(mi.argmax(-1), blocks).to(pmi.dtype)  # [..., source block, target block]
    return (pmi * keep[..., :, None, :, None]).reshape(*lead, F_, F_)


def form_logits(onehot: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """[n, S_i, S_j]: ``T[i, j] = o_j^T table o_i`` per row (``onehot`` [n, S, F], ``table`` [n, F, F])."""
    return torch.einsum("njg,ngf,nif->nij", onehot, table, onehot)


def demo_tables(onehot, inputs, outputs, rows, b: int, first: int, rounds: int = 0):
    """The form of each sample from all its valid demos, [b, F, F], and of each demo pair from its sample's *other*
    demos (leave-one-out: how well the form the other demos write explains this one is the gate's match), [n, F, F].
    ``onehot`` / ``inputs`` / ``outputs``: the n valid demo pairs; ``rows`` [n] the sample each belongs to.
    ``rounds``: refinement rounds, each recounting the votes shared by the last round's form (the leave-one-out
    form is the last round's counts less the pair's own)."""
    counts = pair_counts(onehot, inputs, outputs, first)
    total = counts.new_zeros(b, *counts.shape[1:]).index_add(0, rows, counts)
    for _ in range(rounds):
        counts = pair_counts(onehot, inputs, outputs, first, form_table(total).index_select(0, rows))
        total = counts.new_zeros(b, *counts.shape[1:]).index_add(0, rows, counts)
    return form_table(total), form_table((total.index_select(0, rows) - counts).clamp_min(0))


def colour_read(logits: torch.Tensor, off: torch.Tensor, inputs: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, ..., S, vocab + 1]: per cell, the colour a form brings to it (``arch.gather_demo_input`` feeds the counted
    form's to the core as an input): its soft read of ``inputs``' cells [n, S] under ``logits`` [n, ..., S, S + 1]
    (the null key last, its share in the last column), ``off`` [n, ..., S + 1] the keys never read."""
    p = logits.float().masked_fill(off.unsqueeze(-2), float("-inf")).softmax(-1)
    src = F.one_hot(F.pad(inputs.long(), (0, 1), value=vocab), vocab + 1).to(p.dtype)
    return torch.einsum("n...ij,njk->n...ik", p, src)

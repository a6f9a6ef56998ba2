"""A copy head on the learned gather (``arch.gather_copy``): an output cell may answer with the colour it reads.

The gather (:class:`~models.variants.views_parts.GridGather`) gives each output cell i, per head h, a read ``p_hij``
over the test input's cells j and a null key. Without this head the read only enters the latent state (a colour
embedding through a projection started at zero) and the core must learn to turn it back into the answer, which it
may fail to do where the read is right (docs/record/2026-12-06-counted-gather-form.md). With the head the answer's
distribution per cell is a mixture (a pointer-generator)::

    P_i(k) = (w_i0 + sum_h w_ih p_hi,null) softmax(lm_i)_k + sum_h w_ih sum_j p_hij [colour_j = k]

``w_i = softmax(W z_H,i + b)`` over the LM head and the gather's heads (``W`` started at 0, ``b = (0, -3, ...)``: the
LM head keeps 0.9 of the weight at the start); a head's null mass falls back to the LM. The logits returned are
``log P``, so softmax cross-entropy is the mixture's log-likelihood and the argmax its answer, and the answer's loss
reaches the gather's gate and forms directly (a pointer trained by the answer, not only through the core). A copy
writes an input colour where the read points; it names no rule and no parameter range.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.layers import CastedLinear
from models.variants.demo_form import demo_tables, recolour_table
from models.variants.views_parts import FIRST_COLOUR, GridGather

COPY_BIAS = -3.0  # each head's starting mixing logit (the LM head's: 0)


class GatherCopy(nn.Module):
    """``forward(logits [b, S, vocab], z_H [b, P + S, hidden], p [b, heads, S, S + 1], inputs [b, S]) -> [b, S,
    vocab]`` fp32 log-probabilities of the mixture above (``p``: :meth:`GridGather.pointer`, the null key last)."""

    def __init__(self, hidden: int, heads: int, vocab: int, prefix: int) -> None:
        super().__init__()
        self.vocab, self.prefix = vocab, prefix
        self.mix = CastedLinear(hidden, 1 + heads, bias=True)
        with torch.no_grad():
            self.mix.weight.zero_()
            self.mix.bias.copy_(torch.tensor([0.0] + [COPY_BIAS] * heads))

    def weights(self, z_H: torch.Tensor) -> torch.Tensor:
        """[b, S, 1 + heads]: each grid cell's mixing weights (the LM head first)."""
        return torch.softmax(self.mix(z_H[:, self.prefix :]).float(), dim=-1)

    def forward(self, logits, z_H: torch.Tensor, p: torch.Tensor, inputs: torch.Tensor, recolour=None) -> torch.Tensor:
        w = self.weights(z_H)
        wh = w[..., 1:].transpose(1, 2)  # [b, heads, S]
        colours = F.one_hot(inputs.long(), self.vocab).to(p.dtype)  # unread cells (PAD, EOS) have p = 0
        if recolour is not None:  # [b, vocab, vocab]: what each read colour becomes (demo_recolour)
            colours = torch.bmm(colours, recolour.to(p.dtype))
        copy = torch.einsum("bhi,bhij,bjk->bik", wh, p[..., :-1], colours)  # [b, S, vocab]
        keep = w[..., 0] + (wh * p[..., -1]).sum(1)  # [b, S]: the LM head's share (> 0)
        lm = torch.log_softmax(logits.float(), dim=-1) + keep.log()[..., None]
        return torch.logaddexp(lm, copy.clamp_min(1e-30).log())


def demo_recolour(gather: GridGather, demo_inputs, demo_labels, valid: torch.Tensor) -> torch.Tensor:
    """[b, vocab, vocab] (``arch.gather_copy_recolour``): per sample, the answer colour each colour the counted form
    reads becomes on its demos (:func:`models.variants.demo_form.recolour_table`, each demo read by the form of the
    others): a flip that also recolours is copied recoloured. Identity where the demos show nothing; held fixed (no
    gradient: counts)."""
    b, D, S = demo_inputs.shape
    idx = valid.reshape(b * D).nonzero().squeeze(-1)
    inp = demo_inputs.reshape(b * D, S).index_select(0, idx).long()
    out = demo_labels.reshape(b * D, S).index_select(0, idx).long()
    o, rows = gather.onehot(inp), torch.div(idx, D, rounding_mode="floor")
    with torch.no_grad():
        loo = demo_tables(o, inp, out, rows, b, FIRST_COLOUR, gather.demo_rounds)[1]
        return recolour_table(o, inp, out, rows, b, loo, gather.vocab, FIRST_COLOUR)

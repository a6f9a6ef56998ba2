"""The learned gather of the grid core (``arch.grid_gather``, :class:`GridGather`): per cell, a position-keyed read
over the test input's cells through learned forms and, with ``arch.gather_demo_form``, one form counted from the
sample's demos (:mod:`models.variants.demo_form`)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from core.ops import grid_coordinates
from models.layers import CastedEmbedding, CastedLinear, trunc_normal_init_
from models.variants.demo_form import (
    colour_read,
    colour_table,
    demo_tables,
    form_logits,
    frame_allowed,
    frame_onehot,
    slot_onehot,
)
from models.variants.views_parts import FIRST_COLOUR


class GridGather(nn.Module):
    """A learned gather over the test input's cells, keyed by position only (``arch=trm_local``, ``grid_gather``):
    no map is listed, each is learned. Cell i reads ``sum_j p_ij E[colour_j]`` over the input grid's cells j (and a
    null key that reads nothing), ``p_i = softmax_j(sum_m g_im T_m[i, j])``, per head. ``T_m[i, j] = o_j^T A_m o_i``
    is a learned bilinear form of the two cells' one-hot offsets from the input grid's four edges
    (``core.ops.grid_coordinates``: 4 ones over ``4 (2 side + 1)`` slots): any map that sends a cell's offsets to its
    source's block by block (a flip, a transpose, a shift, a scaling, a tiling) is one ``A``; ``g_i = softmax(W h_i
    + s * match)`` (per head) lets the cell's state and the demos choose: ``match`` [b, forms] (:meth:`match`; else
    0) is how well each form explains the sample's demos up to a recolouring, ``s`` learned. With ``demo_form``
    (``rounds``, None: off) one more form is counted from each sample's demos (:mod:`models.variants.demo_form`);
    its read is mixed with the learned forms' by its gate weight (reads, not logits: a sharp count is not blurred).
    With ``demo_colour`` the counted share of the read brings each key's colour as the demos map it where the count
    reads it (:meth:`demo_colours`, ``tables(..., colours)``); the learned forms' share the key's own colour. With
    ``demo_roles`` the count is also taken over colour roles, per sample the one reproducing more demo cells kept.

    ``tables(inputs [b, S], match or None, form or None) -> (T [b, forms, S, S + 1], off [b, S + 1], colour
    [b, S + 1, width], gate bias)`` once per supervision step; ``pointer(h, tables)``: the reads p [b, heads, S, S +
    1]; ``forward(h [b, P + S, hidden], tables) -> [b, P + S, hidden]``, 0 on the P prefix positions, its projection
    started at 0. The logits are ``scale`` times the forms (the counted one's too): a sharp pointer needs logit gaps
    of several units, which Adam's steps of about ``lr`` per entry would take thousands of steps to reach."""

    def __init__(
        self,
        side: int,
        hidden: int,
        vocab: int,
        maps: int,
        heads: int,
        width: int,
        prefix: int,
        scale: float = 10.0,
        match: bool = False,
        demo_form: Optional[int] = None,
        demo_frame: bool = False,
        demo_colour: bool = False,
        demo_roles: bool = False,
    ) -> None:
        super().__init__()
        self.side, self.vocab, self.maps, self.heads, self.width, self.prefix = side, vocab, maps, heads, width, prefix
        # + a counted form, last; its target cells in the input's frame or the swapped one (demo_form.FRAMES)
        self.demo_form, self.demo_rounds, self.demo_frame = demo_form is not None, demo_form or 0, demo_frame
        self.demo_colour = demo_colour  # the counted read brings the colour the demos show there (demo_colours)
        self.demo_roles = demo_roles  # the count over colour roles too, the one reproducing more demo cells kept
        self.forms_total, self.scale = maps + int(self.demo_form), scale  # logits = scale x the forms
        slots = 4 * (2 * side + 1)
        self.forms = nn.Parameter(trunc_normal_init_(torch.empty(maps, slots, slots), std=0.1 / scale))
        self.null = nn.Parameter(torch.zeros(maps))  # the null key's logit under each form (also scaled)
        self.colour = CastedEmbedding(vocab, width, init_std=1.0, cast_to=torch.float32)
        self.gate = CastedLinear(hidden, heads * self.forms_total, bias=True)
        self.out_proj = CastedLinear(heads * width, hidden)
        self.match_scale = nn.Parameter(torch.tensor(10.0)) if match else None  # as InputViews' match scale
        if self.demo_form:  # the counted form's logit scale and null logit
            self.demo_scale, self.demo_null = nn.Parameter(torch.tensor(1.0 / scale)), nn.Parameter(torch.tensor(0.0))
        nn.init.zeros_(self.out_proj.weight)

    def onehot(self, inputs: torch.Tensor) -> torch.Tensor:
        """[b, S] -> [b, S, 4 (2 side + 1)]: the one-hot offsets of every cell from the grid's four edges."""
        return slot_onehot(grid_coordinates(inputs, self.side), self.side)  # offsets [b, S, 4] in [0, 2 side]

    def logits(self, inputs: torch.Tensor):
        """[b, maps, S, S + 1] every form's logits (the null key last) and [b, S + 1] the keys never read."""
        o = self.onehot(inputs)  # [b, S, F]
        T = torch.einsum("bjf,mfg,big->bmij", o, self.forms, o)  # [b, maps, S_i, S_j]
        T = self.scale * torch.cat((T, self.null[None, :, None, None].expand(*T.shape[:3], 1)), dim=-1)
        return T, F.pad(inputs < FIRST_COLOUR, (0, 1))  # only the grid's cells and the null key are read

    def match(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[b, forms] in [0, 1]: per form, the share of each valid demo's output cells it explains up to a
        recolouring (a (source colour, output colour) count table of its soft gather, the best output per source),
        the mean over the valid demos (``valid`` [b, D]); 0 without one. Differentiable in the forms."""
        return self.demo_scores(demo_inputs, demo_labels, valid, ("match",))[0][0]

    def copy_nll(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[b, forms]: per form, the mean of ``-log sum_j p_ij [colour_j = colour of output cell i]`` over the valid
        demos' output cells not of the input's commonest colour that some input cell has (0 without demos)."""
        return self.demo_scores(demo_inputs, demo_labels, valid, ("copy_nll",))[0][0]

    def demo_scores(self, demo_inputs, demo_labels, valid, kinds: tuple[str, ...], colours: bool = False):
        """``(scores, form)``: each of ``kinds`` (``match``, ``copy_nll``) [b, forms] in one pass over the valid demos;
        with ``demo_form`` each sample's counted form [b, F, F] (else None), scored on a demo as its others write it;
        ``colours`` (with ``demo_form``): ``(scores, form, colour table)``, the table (:meth:`demo_colours`) from the
        same pass."""
        if not kinds and not self.demo_form:
            return (), None
        b, D = demo_inputs.shape[:2]
        idx, inp, out, rows = self._pairs(demo_inputs, demo_labels, valid)
        T, off = self.logits(inp)
        form = None
        if self.demo_form:
            o, ot = self._slots(inp)
            allowed = frame_allowed(inp, out, rows, b, self.side) if self.demo_frame else None
            form, loo = demo_tables(
                o, inp, out, rows, b, FIRST_COLOUR, self.demo_rounds, ot, allowed, self.demo_roles, self.vocab
            )
            T = torch.cat((T, self._counted(o, loo, ot)), dim=1)
        table = self._colours(o, ot, inp, out, rows, form) if colours else None
        scores = []
        for kind in kinds:
            per_pair = {"match": self._explained, "copy_nll": self._copy_nll}[kind](inp, out, T, off)  # [n, forms]
            n = self.forms_total
            per = per_pair.new_zeros(b * D, n).index_copy(0, idx, per_pair).view(b, D, n)
            scores.append(per.sum(1) / valid.sum(1, keepdim=True).clamp_min(1))
        return (tuple(scores), form, table) if colours else (tuple(scores), form)

    @staticmethod
    def _pairs(demo_inputs, demo_labels, valid):
        """The valid demo pairs: their flat index [n], inputs and outputs [n, S] (long), sample [n]."""
        b, D, S = demo_inputs.shape
        idx = valid.reshape(b * D).nonzero().squeeze(-1)
        inp = demo_inputs.reshape(b * D, S).index_select(0, idx).long()
        out = demo_labels.reshape(b * D, S).index_select(0, idx).long()
        return idx, inp, out, torch.div(idx, D, rounding_mode="floor")

    def _slots(self, inputs: torch.Tensor):
        """The counted form's source slots and target slots (both frames with ``demo_frame``) of [n, S] grids."""
        o = self.onehot(inputs)
        return o, (frame_onehot(inputs, self.side) if self.demo_frame else o)

    def demo_colours(self, demo_inputs, demo_labels, valid, form: torch.Tensor) -> torch.Tensor:
        """[b, vocab, vocab]: per sample, the colour each source colour becomes where its counted ``form`` [b, F, Ft]
        (:meth:`demo_scores`) reads it on its valid demos (:func:`~models.variants.demo_form.colour_table`; identity
        without demos). No gradient: a count."""
        _, inp, out, rows = self._pairs(demo_inputs, demo_labels, valid)
        return self._colours(*self._slots(inp), inp, out, rows, form)

    @torch.no_grad()
    def _colours(self, o, ot, inp, out, rows, form: torch.Tensor) -> torch.Tensor:
        """:meth:`demo_colours` of the valid pairs (``o`` / ``ot`` their source / target slots, :meth:`_slots`)."""
        logits = form_logits(o, form.detach().index_select(0, rows).to(o.dtype), ot)
        return colour_table(logits, inp < FIRST_COLOUR, inp, out, rows, form.shape[0], self.vocab, FIRST_COLOUR)

    def _counted(self, onehot: torch.Tensor, table: torch.Tensor, target=None) -> torch.Tensor:
        """[n, 1, S, S + 1]: the counted form's logits (``table`` [n, F, Ft]; x ``scale`` too), its null key last."""
        T = self.scale * self.demo_scale * form_logits(onehot, table.to(onehot.dtype), target)
        return torch.cat((T, self.demo_null.expand(*T.shape[:2], 1)), dim=-1)[:, None]

    def _explained(self, inp, out, T, off) -> torch.Tensor:
        """[n, maps]: :meth:`match`'s share of each pair's output cells."""
        q = colour_read(T, off[:, None], inp, self.vocab)  # [n, maps, S, vocab + 1]; the null key: its own colour
        cell = out >= FIRST_COLOUR
        counts = torch.einsum("nmik,nil->nmkl", q, F.one_hot(out, self.vocab).to(q.dtype) * cell[..., None])
        return counts.amax(-1).sum(-1) / cell.sum(-1, keepdim=True).clamp_min(1)

    def _copy_nll(self, inp, out, T, off) -> torch.Tensor:
        """[n, maps]: :meth:`copy_nll` of each pair."""
        logp = torch.log_softmax(T.float().masked_fill(off[:, None, None, :], -1e4), dim=-1)  # [n, maps, S, S + 1]
        keys = F.pad(torch.where(inp >= FIRST_COLOUR, inp, -1), (0, 1), value=-1)  # colour per key; null: none
        same = keys[:, None, :] == out[:, :, None]  # [n, S_i, S_j + 1]
        counts = F.one_hot(inp, self.vocab)[..., FIRST_COLOUR:].sum(1)  # [n, colours]: the input's colour counts
        background = counts.argmax(-1, keepdim=True) + FIRST_COLOUR  # the input's commonest colour
        ok = (out >= FIRST_COLOUR) & (out != background) & same.any(-1)
        nll = -torch.logsumexp(logp.masked_fill(~same[:, None], -1e4), dim=-1)  # [n, maps, S]
        return (nll * ok[:, None]).sum(-1) / ok.sum(-1, keepdim=True).clamp_min(1)

    @staticmethod
    def fit_loss(nll: torch.Tensor, tau: float) -> torch.Tensor:
        """[b]: ``sum_m r_m nll_m`` with the responsibilities ``r = softmax(-tau * nll)`` held fixed (``nll``:
        :meth:`copy_nll`): the forms that best read a sample's demos are pulled to read them entirely."""
        r = torch.softmax(-tau * nll.detach().float(), dim=-1)
        return (r * nll.float()).sum(-1)

    def tables(self, inputs: torch.Tensor, match: Optional[torch.Tensor] = None, form: Optional[torch.Tensor] = None,
               colours: Optional[torch.Tensor] = None):  # fmt: skip
        """See the class docstring; with ``colours`` [b, vocab, vocab] (:meth:`demo_colours`) a fifth table, [b, S + 1,
        width]: the colour embedding each key brings through the counted read (its colour mapped by the table)."""
        T, off = self.logits(inputs)
        if self.demo_form:  # the sample's counted form (``demo_scores``); none given: 0, a uniform read
            o, ot = self._slots(inputs)
            form = o.new_zeros(o.shape[0], o.shape[-1], ot.shape[-1]) if form is None else form
            T = torch.cat((T, self._counted(o, form, ot)), dim=1)
        colour = F.pad(self.colour(inputs.long()), (0, 0, 0, 1))  # the null key reads nothing
        bias = 0.0 if match is None else self.match_scale * match[:, None, None, :]  # [b, 1, 1, maps]
        if colours is None:
            return T, off, colour, bias
        rows = colours.gather(1, inputs.long()[..., None].expand(-1, -1, self.vocab)).to(colour.dtype)  # [b, S, vocab]
        mapped = F.pad(rows @ self.colour.embedding_weight.to(colour.dtype), (0, 0, 0, 1))
        return T, off, colour, bias, mapped

    def pointer(self, h: torch.Tensor, tables, parts: bool = False):
        """[b, heads, S, S + 1]: each grid cell's read over the input's cells and the null key, per head; ``parts``
        (with ``demo_form``): the learned forms' share and the counted form's share of it, apart."""
        T, off, colour, bias = tables[:4]
        b, mask = h.shape[0], off[:, None, None, :]
        g = torch.softmax(self.gate(h[:, self.prefix :]).float().view(b, -1, self.heads, self.forms_total) + bias, -1)
        if not self.demo_form:
            return torch.einsum("bihm,bmij->bhij", g, T).masked_fill(mask, float("-inf")).softmax(-1)
        # the learned forms' read (their logits mixed) and the counted form's, mixed as reads by its weight
        c = g[..., -1:].transpose(1, 2)  # [b, heads, S, 1]
        bank = torch.einsum("bihm,bmij->bhij", g[..., :-1], T[:, :-1]) / (1 - c).clamp_min(1e-6)
        counted = c * T[:, -1:].masked_fill(mask, float("-inf")).softmax(-1)
        bank = (1 - c) * bank.masked_fill(mask, float("-inf")).softmax(-1)
        return (bank, counted) if parts else bank + counted

    def forward(self, h: torch.Tensor, tables) -> torch.Tensor:
        if len(tables) > 4:  # demo_colour: the counted read brings the key's colour as the demos map it
            bank, counted = self.pointer(h, tables, parts=True)
            read = torch.einsum("bhij,bjw->bihw", bank, tables[2]) + torch.einsum("bhij,bjw->bihw", counted, tables[4])
        else:
            read = torch.einsum("bhij,bjw->bihw", self.pointer(h, tables), tables[2])
        return F.pad(self.out_proj(read.reshape(*read.shape[:2], -1).to(h.dtype)), (0, 0, self.prefix, 0))

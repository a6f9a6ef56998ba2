"""Demo memory plus the test input's grid views (``arch=trm_views``): a core that can *apply* a map it reads.

The probes split the spatial families into reading and applying: the ``dihedral_views`` encoder names a held-out
dihedral map from the demos (1.00, docs/record/2026-11-25-rule-readout-dihedral-views.md), but no core applied it in
the 8-family mix (flip_rotate, translate and roll at 0.00 train fit with the grid, memory and pointer cores).
Applying a map to a grid of any size is a gather from a cell whose position depends on the grid's size and on the
rule, which two cycles of attention do not learn. Here every cell of the test input holds, for every view v of
``views`` (``core.ops.view_sources``: the 8 dihedral maps, 48 shifts, 48 rolls, 8 scalings and 16 tilings, 128 in
all, each relative to the input grid wherever it sits), an embedding of the input colour v sends to it (PAD where
none, which also draws v's output shape), mixed by per-sample weights:

    x_cell += sum_v softmax_v(gate(mean context slot) + s * match_v) * E_v[colour that v sends to the cell]

``match_v`` (``views_gate: match``, the default) is how well v explains the demos the encoder saw: per demo,
(output cells equal to v - cells that differ, a colour drawn outside the output grid included) / both, the worst over
those demos; ``s`` is learned from ``views_match_scale``. The gate on the context starts at zero; with
``views_gate: context`` it is the only chooser. Which view is thus read from the demos (by a fixed comparison and a
learned weighting) and applying it is a choice among candidate colours the cell already holds; what the view does
not say (a recolouring, which cells of a gravity rule move) is left to the demo memory and the recursion. The
zero-demo control's memory is empty, so its match is 0 (uniform): it never sees a demo. Everything else is
``trm_memory``. Square canvas only. Parameters: ``trm_memory``'s plus ``inner.views.embed`` [views * vocab,
hidden], ``inner.views.gate`` and ``inner.views.match_scale``. Measured: docs/record/2026-11-27-grid-views.md.
"""

from __future__ import annotations

from typing import List, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from core.ops import VIEW_KINDS, view_sources
from models.layers import CastedEmbedding, CastedLinear
from models.variants.trm_memory import TRMMemory, TRMMemoryConfig, TRMMemoryInner

FIRST_COLOUR = 2  # tokens 0 and 1 are PAD and the end-of-grid marker (core.ops.grid_coordinates)


class TRMViewsConfig(TRMMemoryConfig):
    """``trm_memory``'s fields plus which views every cell gets (``core.ops.view_sources``)."""

    name: Literal["trm_views"] = "trm_views"  # type: ignore[assignment]
    # dihedral: the 8 maps; shift: the 48 shifts by up to 3 cells (content moved, background in); roll: wrapped;
    # scale: each cell a ky x kx block; tile: the grid repeated ry x rx times, plain or mirrored (factors 1-3)
    views: List[Literal["dihedral", "shift", "roll", "scale", "tile"]] = Field(
        ["dihedral", "shift", "roll", "scale", "tile"], min_length=1
    )
    # the gate's logits are this times the gate projection's output (a larger scale sharpens the choice sooner)
    views_gate_scale: float = Field(1.0, gt=0)
    # what chooses the view: context (a linear gate on the mean context slot) or match (also each view's match with
    # the demos the encoder saw: the worst over them of (equal - different) / both, times a learned scale that
    # starts at views_match_scale; core.ops.view_agreement)
    views_gate: Literal["context", "match"] = "match"
    views_match_scale: float = Field(10.0, gt=0)
    # how a view's match with a demo is scored (InputViews.match): agree (the cells it draws that the output has) or
    # explain (the output's cells it explains up to a recolouring; reads the true view better, scored lower: the
    # record's grid views file)
    views_match: Literal["agree", "explain"] = "agree"


class InputViews(nn.Module):
    """``forward(inputs [b, S], context [b, P, hidden] or None) -> [b, S, hidden]``: per cell, the gated sum over the
    views of ``kinds`` of an embedding (one table per view) of the input colour the view sends to the cell (PAD
    where none). Without a context the gate is uniform."""

    def __init__(
        self,
        side: int,
        vocab: int,
        hidden: int,
        kinds,
        init_std: float,
        cast_to: torch.dtype,
        gate_scale: float = 1.0,
        match_scale: Optional[float] = None,
        match_kind: str = "agree",
    ) -> None:
        super().__init__()
        self.side, self.vocab, self.kinds, self.gate_scale = side, vocab, tuple(kinds), gate_scale
        self.match_kind = match_kind
        self.num_views = sum(VIEW_KINDS[k] for k in self.kinds)
        self.embed = CastedEmbedding(self.num_views * vocab, hidden, init_std=init_std, cast_to=cast_to)
        self.gate = CastedLinear(hidden, self.num_views, bias=True)
        self.match_scale = nn.Parameter(torch.tensor(float(match_scale))) if match_scale else None
        with torch.no_grad():
            self.gate.weight.zero_()
            self.gate.bias.zero_()  # type: ignore[union-attr]

    def gates(self, context: Optional[torch.Tensor], b: int, device, match: Optional[torch.Tensor] = None):
        """[b, V] the weight of each view: softmax of the gate over the mean context slot (zero without one) plus,
        given ``match`` [b, V] (:meth:`match`), ``match_scale * match``."""
        logits = torch.zeros(b, self.num_views, device=device)
        if context is not None:
            logits = logits + self.gate_scale * self.gate(context.mean(1)).float()
        if match is not None:
            logits = logits + self.match_scale.float() * match
        return torch.softmax(logits, dim=-1)

    def match(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[b, V] how well each view explains the valid demos (``valid`` [b, D]), in [-1, 1]: per demo 2 x share - 1,
        the worst over the valid demos (a view must explain every one); 0 for a sample without a valid demo.
        ``views_match`` says what the share is. ``agree`` (default): of the cells the view draws a colour on, those
        where the output has that colour (a colour drawn outside the output grid is a miss). ``explain``: of the
        cells the output colours or the view draws on, those where the output is a *function of the view's colour*
        (for each view colour, and for "no source", the output colour most cells with it have: a view followed by a
        recolouring explains the output, and the cells a view leaves uncovered must share one colour), a colour
        drawn outside the output grid never explained."""
        b, D, S = demo_inputs.shape
        inp, out = demo_inputs.reshape(b * D, S), demo_labels.reshape(b * D, S)
        flat = valid.reshape(b * D)
        if torch.compiler.is_compiling():  # one shape: every slot
            score = self.demo_scores(inp, out)
        else:  # only the valid demos (the zero-demo control: none); the same numbers
            idx = flat.nonzero().squeeze(-1)
            score = inp.new_zeros(b * D, self.num_views, dtype=torch.float32)
            score = score.index_copy(0, idx, self.demo_scores(inp.index_select(0, idx), out.index_select(0, idx)))
        worst = score.view(b, D, -1).masked_fill(~valid[..., None], 2.0).amin(1)
        return torch.where(valid.any(1, keepdim=True), worst, 0.0)

    def demo_scores(self, inp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """[n, V] 2 x share - 1 of each demo (inputs / outputs [n, S]) and view (see :meth:`match`)."""
        src = view_sources(inp, self.side, self.kinds)  # [n, V, S]
        n, V, S = src.shape
        has = src >= 0
        colour = inp.long().gather(1, src.clamp_min(0).flatten(1)).view_as(src).masked_fill(~has, 0)
        out = out.long()
        oc = (out >= FIRST_COLOUR)[:, None, :].expand_as(has)
        if self.match_kind == "agree":  # the cells the view draws on: equal to the output's colour or not
            n_eq, n_has = (has & oc & (colour == out[:, None, :])).sum(-1).float(), has.sum(-1).float()
            return (2 * n_eq - n_has) / n_has.clamp_min(1.0)  # 0 for a view that draws nothing
        # explain: (view colour, output colour) pairs of the output's cells, per demo and view; other cells -> bin 0
        bins = self.vocab * self.vocab + 1
        pair = torch.where(oc, colour * self.vocab + out[:, None, :] + 1, 0)
        counts = torch.zeros(n, V, bins, dtype=torch.int32, device=src.device)
        counts.scatter_add_(2, pair, torch.ones(1, 1, 1, dtype=torch.int32, device=src.device).expand(n, V, S))
        explained = counts[..., 1:].view(n, V, self.vocab, self.vocab).amax(-1).sum(-1).float()
        total = oc.sum(-1) + (has & ~oc).sum(-1)  # the output's cells and the view's colours outside it
        return 2 * explained / total.clamp_min(1) - 1

    def forward(
        self, inputs: torch.Tensor, context: Optional[torch.Tensor], match: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        b, S = inputs.shape
        V = self.num_views
        src = view_sources(inputs, self.side, self.kinds)  # [b, V, S], -1 where the view sends no cell
        colour = inputs.long().gather(1, src.clamp_min(0).flatten(1)).view(b, V, S).masked_fill(src < 0, 0)
        ids = colour + self.vocab * torch.arange(V, device=inputs.device)[None, :, None]
        g = self.gates(context, b, inputs.device, match)  # [b, V]
        # one weighted bag of V rows per cell (never a [b, V, S, hidden] tensor)
        out = F.embedding_bag(
            ids.permute(0, 2, 1).reshape(b * S, V),
            self.embed.embedding_weight,
            mode="sum",
            per_sample_weights=g[:, None, :].expand(b, S, V).reshape(b * S, V),
        )
        return out.view(b, S, -1).to(self.embed.cast_to)


class TRMViewsInner(TRMMemoryInner):
    def __init__(self, config: TRMViewsConfig, **kw) -> None:
        super().__init__(config, **kw)
        self.views = InputViews(
            self.canvas_side("arch=trm_views"),
            self.vocab_size,
            config.hidden_size,
            config.views,
            init_std=self.embed_init_std,
            cast_to=self.forward_dtype,
            gate_scale=config.views_gate_scale,
            match_scale=config.views_match_scale if config.views_gate == "match" else None,
            match_kind=config.views_match,
        )

    def embed_inputs(self, batch, prefix_context, memory):
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        match = None
        if self.views.match_scale is not None:  # the demos the encoder saw (none for the zero-demo control)
            b, D = batch["demo_inputs"].shape[:2]
            valid = torch.zeros(b, D, device=x.device).scatter_reduce(
                1, memory.demo.expand(b, -1), memory.mask.float(), "amax"
            )
            match = self.views.match(batch["demo_inputs"], batch["demo_labels"], valid > 0)
        P = self.puzzle_emb_len
        views = self.embed_scale * self.views(batch["inputs"], prefix_context, match)
        return torch.cat((x[:, :P], x[:, P:] + views.to(x.dtype)), dim=1)


class TRMViews(TRMMemory):
    inner_cls = TRMViewsInner

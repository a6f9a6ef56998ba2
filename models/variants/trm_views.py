"""Demo memory plus the test input's dihedral views (``arch=trm_views``): a core that can *apply* a map it read.

The probes split flip_rotate into reading and applying: the ``dihedral_views`` encoder names a held-out map from
the demos (1.00, docs/record/2026-11-25-rule-readout-dihedral-views.md), but the core does not apply it (train fit
0.00 with the grid and the memory cores; the pointer core applies *told* maps, 0.90 / 0.98, but not in the 8-family
mix). Applying a dihedral map d to a grid of any size is a gather from a cell whose position depends on the grid's
size, which attention over 2 x 2 cycles does not learn. Here every cell of the test input gets, for every map d of
``core.ops.DIHEDRAL_POINTERS``, an embedding of the input colour that d sends to it (``core.ops.dihedral_sources``:
relative to the input grid wherever it sits; PAD where d sends none, which also draws the transformed grid's
shape), mixed by a per-sample gate over the 8 maps read from the context slots:

    x_cell += sum_d softmax(gate(mean of the context slots))_d * E_d[colour that d sends to the cell]

The gate starts uniform (zero weights and bias). Which map is still read from the demos (by the encoder, into the
context); the core only gets the 8 candidate answers side by side, as ``encoder=dihedral_views`` gives the
encoder the 8 comparisons. Everything else is ``trm_memory`` (the demo memory on the grid core). Square canvas only.
Parameters: ``trm_memory``'s plus ``inner.views.embedding_weight`` [8 * vocab, hidden] and ``inner.views.gate``.
"""

from __future__ import annotations

from typing import List, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from core.ops import VIEW_KINDS, view_agreement, view_sources
from models.layers import CastedEmbedding, CastedLinear
from models.variants.trm_memory import TRMMemory, TRMMemoryConfig, TRMMemoryInner

FIRST_COLOUR = 2  # tokens 0 and 1 are PAD and the end-of-grid marker (core.ops.grid_coordinates)


class TRMViewsConfig(TRMMemoryConfig):
    """``trm_memory``'s fields plus which views every cell gets (``core.ops.view_sources``)."""

    name: Literal["trm_views"] = "trm_views"  # type: ignore[assignment]
    # dihedral: the 8 maps; shift: the 48 shifts by up to 3 cells (content moved, background in); roll: wrapped
    views: List[Literal["dihedral", "shift", "roll", "scale", "tile"]] = Field(
        ["dihedral", "shift", "roll", "scale", "tile"], min_length=1
    )
    # the gate's logits are this times the gate projection's output (a larger scale sharpens the choice sooner)
    views_gate_scale: float = Field(1.0, gt=0)
    # what chooses the view: context (a linear gate on the mean context slot) or match (also each view's match with
    # the demos the encoder saw: the worst over them of (equal - different) / cells with a source, times a learned
    # scale that starts at views_match_scale; core.ops.view_agreement)
    views_gate: Literal["context", "match"] = "match"
    views_match_scale: float = Field(10.0, gt=0)


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
    ) -> None:
        super().__init__()
        self.side, self.vocab, self.kinds, self.gate_scale = side, vocab, tuple(kinds), gate_scale
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
        """[b, V] how well each view explains the valid demos (``valid`` [b, D]): per demo, (cells where the output
        equals the view - cells where it differs) / (the two together), in [-1, 1], where a view that gives a colour
        to a cell outside the output grid also differs there (it draws the wrong shape); the worst over the valid
        demos (a view must explain every one); 0 for a sample without a valid demo."""
        b, D, S = demo_inputs.shape
        out = demo_labels.reshape(b * D, S).long()
        colour, agree = view_agreement(demo_inputs.reshape(b * D, S).long(), out, self.side, self.kinds)
        eq = (agree == 2).sum(-1).float()
        ne = ((agree == 1) | ((colour > 0) & (out < FIRST_COLOUR)[:, None])).sum(-1).float()
        score = ((eq - ne) / (eq + ne).clamp_min(1.0)).view(b, D, -1)
        worst = score.masked_fill(~valid[..., None], 2.0).amin(1)
        return torch.where(valid.any(1, keepdim=True), worst, 0.0)

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

"""Demo memory plus the test input's grid views (``arch=trm_views``): a core that can *apply* a map it reads.

The probes split the spatial families into reading and applying: the ``dihedral_views`` encoder names a held-out
dihedral map from the demos (1.00, docs/record/2026-11-25-rule-readout-dihedral-views.md), but no core applied it in
the 8-family mix (flip_rotate, translate and roll at 0.00 train fit with the grid, memory and pointer cores).
Applying a map to a grid of any size is a gather from a cell whose position depends on the grid's size and on the
rule, which two cycles of attention do not learn. Here every cell of the test input holds, for every view v of
``views`` (``core.ops.view_sources``: the 8 dihedral maps, 48 shifts, 48 rolls, 8 scalings and 16 tilings, 128 in
all, each relative to the input grid wherever it sits), an embedding of the input colour v sends to it (PAD where
none, which also draws v's output shape), mixed by per-sample weights:

    x_cell += sum_v softmax_v(gate(mean context slot) + s * match_v) * E_t(v)[colour that v sends to the cell]

``E_t(v)`` is the table of v (``views_embed``: v's own, the one of its kind, or one for every view; a table of
its own is trained only where v is chosen, so a held-out rule instance's view is applied with its initial rows).
``match_v`` (``views_gate: match``, the default) is how well v explains the demos the encoder saw: per demo,
(output cells equal to v - cells that differ, a colour drawn outside the output grid included) / both, the worst over
those demos; ``s`` is learned from ``views_match_scale``. The gate on the context starts at zero; with
``views_gate: context`` it is the only chooser. Which view is thus read from the demos (by a fixed comparison and a
learned weighting) and applying it is a choice among candidate colours the cell already holds; what the view does
not say (a recolouring, what a settle view leaves unfilled) is left to the demo memory and the recursion. The
zero-demo control's memory is empty, so its match is 0 (uniform): it never sees a demo. Optional: ``settle`` views
(40, the colours fall in a direction until a wall colour: they depend on the content, ``core.ops.settle_sources``),
per-cell counts in the colour embedding (``cell_features``: object size, non-background cells up to each edge) and a
fixed lookup of what the demo cells of a cell's colour and object size became (``demo_lookup``). Everything else is
``trm_memory``. Square canvas only. Parameters: ``trm_memory``'s plus ``inner.views.embed`` [tables * vocab,
hidden], ``inner.views.gate`` and ``inner.views.match_scale``. Measured: docs/record/2026-11-27-grid-views.md.
"""

from __future__ import annotations

from typing import List, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from core.ops import VIEW_KINDS, object_sizes, ray_counts, view_sources, view_table
from models.layers import CastedEmbedding, CastedLinear
from models.variants.trm_memory import TRMMemory, TRMMemoryConfig, TRMMemoryInner

FIRST_COLOUR = 2  # tokens 0 and 1 are PAD and the end-of-grid marker (core.ops.grid_coordinates)


class TRMViewsConfig(TRMMemoryConfig):
    """``trm_memory``'s fields plus which views every cell gets (``core.ops.view_sources``)."""

    name: Literal["trm_views"] = "trm_views"  # type: ignore[assignment]
    # dihedral: the 8 maps; shift: the 48 shifts by up to 3 cells (content moved, background in); roll: wrapped;
    # scale: each cell a ky x kx block; tile: the grid repeated ry x rx times, plain or mirrored (factors 1-3);
    # settle: the non-background cells fall in one of 4 directions, stopped by the grid's edge or a wall colour (none
    # or 1-9): 40 views that depend on the colours (core.ops.settle_sources)
    views: List[Literal["dihedral", "shift", "roll", "scale", "tile", "settle"]] = Field(
        ["dihedral", "shift", "roll", "scale", "tile"], min_length=1
    )
    # the gate's logits are this times the gate projection's output (a larger scale sharpens the choice sooner)
    views_gate_scale: float = Field(1.0, gt=0)
    # what chooses the view: context (a linear gate on the mean context slot) or match (also each view's match with
    # the demos the encoder saw: the worst over them of (equal - different) / both, times a learned scale that
    # starts at views_match_scale; core.ops.view_agreement)
    # tiebreak: the match alone says which views can be the rule (those within 1e-4 of the best match); the context
    # gate chooses among them only (ties: a view and its wrapped twin, tilings of a symmetric grid; the zero-demo
    # control, where every view ties). With match, a context that names a trained instance can outvote the match of
    # a held-out one
    views_gate: Literal["context", "match", "tiebreak"] = "match"
    views_match_scale: float = Field(10.0, gt=0)
    # how a view's match with a demo is scored (InputViews.match): agree (the cells it draws that the output has) or
    # explain (the output's cells it explains up to a recolouring; reads the true view better, scored lower: the
    # record's grid views file)
    views_match: Literal["agree", "explain"] = "agree"
    # which embedding table the colour a view sends is looked up in: view (one table per view: a view never chosen in
    # training keeps its initial rows, so a held-out rule instance whose view the match names is applied with
    # untrained rows), kind (one per kind of view: dihedral, shift, ...) or shared (one table for every view: what
    # the cell gets depends on the colour and the gate, not on which view sent it)
    views_embed: Literal["view", "kind", "shared"] = "view"
    # per-cell counts added to every grid cell's colour embedding, of the test input and of the demo inputs the memory
    # keys (CellFeatures): object_size (cells in its same-colour 4-connected object, 1-9+) and rays (non-background
    # cells beyond it up to each edge, 0-7+); the counts recolour_by_size and gravity depend on. [] = none
    cell_features: List[Literal["object_size", "rays"]] = []
    # per test cell, an embedding of what the demo cells with its key became (DemoLookup; one table per key): the share
    # of each output colour at the same place of the demos the encoder saw, or "none seen"; colour: the cell's colour;
    # object: its colour and object size. [] = none
    demo_lookup: List[Literal["colour", "object"]] = []


class CellFeatures(nn.Module):
    """``forward(tokens [n, S]) -> [n, S, hidden]``: per grid cell, the sum of one learned embedding per count of
    ``kinds`` (``object_size``: :func:`core.ops.object_sizes` clipped to 1..SIZE_MAX; ``rays``: the four
    :func:`core.ops.ray_counts` clipped to 0..RAY_MAX, a table per direction); 0 outside the grid."""

    SIZE_MAX, RAY_MAX = 9, 7

    def __init__(self, side: int, hidden: int, kinds, init_std: float, cast_to: torch.dtype) -> None:
        super().__init__()
        self.side, self.kinds = side, tuple(kinds)
        rows = {"object_size": self.SIZE_MAX + 1, "rays": 4 * (self.RAY_MAX + 1)}
        self.embed = nn.ModuleDict(
            {k: CastedEmbedding(rows[k], hidden, init_std=init_std, cast_to=cast_to) for k in self.kinds}
        )
        self.num_tables = sum(4 if k == "rays" else 1 for k in self.kinds)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, cell = 0, (tokens >= FIRST_COLOUR)[..., None]
        if "object_size" in self.kinds:
            size = object_sizes(tokens, self.side, FIRST_COLOUR).clamp_max(self.SIZE_MAX)
            out = out + self.embed["object_size"](size)
        if "rays" in self.kinds:
            rays = ray_counts(tokens, self.side, FIRST_COLOUR).clamp_max(self.RAY_MAX)  # [n, 4, S]
            ids = rays + (self.RAY_MAX + 1) * torch.arange(4, device=tokens.device)[None, :, None]
            out = out + self.embed["rays"](ids).sum(1)
        return out * cell


class InputViews(nn.Module):
    """``forward(inputs [b, S], context [b, P, hidden] or None) -> [b, S, hidden]``: per cell, the gated sum over the
    views of ``kinds`` of an embedding (``embed``: one table per view, per kind of view, or one for all) of the input
    colour the view sends to the cell (PAD where none). Without a context the gate is uniform."""

    TIE = 1e-4  # tiebreak: matches this close to the best one count as tied

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
        embed: str = "view",
        tiebreak: bool = False,
    ) -> None:
        super().__init__()
        self.side, self.vocab, self.kinds, self.gate_scale = side, vocab, tuple(kinds), gate_scale
        self.match_kind, self.tiebreak = match_kind, tiebreak
        self.reads_match = match_scale is not None or tiebreak  # the gate needs each view's match with the demos
        self.num_views = sum(VIEW_KINDS[k] for k in self.kinds)
        # the embedding table of each view: its own (view), its kind's (kind) or the one of every view (shared)
        per_kind = [i for i, k in enumerate(self.kinds) for _ in range(VIEW_KINDS[k])]
        rows = {"view": list(range(self.num_views)), "kind": per_kind, "shared": [0] * self.num_views}
        if embed not in rows:
            raise ValueError(f"InputViews: embed must be one of {sorted(rows)}, got {embed!r}")
        self.register_buffer("table_of_view", torch.tensor(rows[embed]), persistent=False)
        # the shape views' sources of every grid size: a buffer, so it moves with the module and a compiled forward
        # reads it instead of tracing its build (core.ops.view_table). It is the process cache's tensor itself (only
        # ever read: a copy per module would cost (side + 1)^2 x V x side^2 longs, 0.9 GB at side 30)
        shape = any(k != "settle" for k in self.kinds)
        self.register_buffer("table", view_table(side, self.kinds) if shape else None, persistent=False)
        self.num_tables = max(rows[embed]) + 1
        self.embed = CastedEmbedding(self.num_tables * vocab, hidden, init_std=init_std, cast_to=cast_to)
        self.gate = CastedLinear(hidden, self.num_views, bias=True)
        self.match_scale = nn.Parameter(torch.tensor(float(match_scale))) if match_scale else None
        with torch.no_grad():
            self.gate.weight.zero_()
            self.gate.bias.zero_()  # type: ignore[union-attr]

    def gates(self, context: Optional[torch.Tensor], b: int, device, match: Optional[torch.Tensor] = None):
        """[b, V] the weight of each view: softmax of the gate over the mean context slot (zero without one) plus,
        given ``match`` [b, V] (:meth:`match`), ``match_scale * match``; with ``tiebreak``, the views below the best
        match (by more than ``TIE``) get no weight, and the context term chooses among the rest."""
        logits = torch.zeros(b, self.num_views, device=device)
        if context is not None:
            logits = logits + self.gate_scale * self.gate(context.mean(1)).float()
        if match is not None:
            if self.tiebreak:
                best = match >= match.amax(-1, keepdim=True) - self.TIE
                return torch.softmax(logits.masked_fill(~best, float("-inf")), dim=-1)
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
        src = view_sources(inp, self.side, self.kinds, self.table)  # [n, V, S]
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
        src = view_sources(inputs, self.side, self.kinds, self.table)  # [b, V, S], -1 where the view sends no cell
        colour = inputs.long().gather(1, src.clamp_min(0).flatten(1)).view(b, V, S).masked_fill(src < 0, 0)
        ids = colour + self.vocab * self.table_of_view[None, :, None]
        g = self.gates(context, b, inputs.device, match)  # [b, V]
        # one weighted bag of V rows per cell (never a [b, V, S, hidden] tensor)
        out = F.embedding_bag(
            ids.permute(0, 2, 1).reshape(b * S, V),
            self.embed.embedding_weight,
            mode="sum",
            per_sample_weights=g[:, None, :].expand(b, S, V).reshape(b * S, V),
        )
        return out.view(b, S, -1).to(self.embed.cast_to)


class DemoLookup(nn.Module):
    """``forward(inputs [b, S], demo_inputs / demo_labels [b, D, S], valid [b, D]) -> [b, S, hidden]``: for every grid
    cell of the test input, keyed by its colour and its object's size (:func:`core.ops.object_sizes`, clipped to
    ``size_max``; the colour alone for ``size_max`` 0), the output colours of the valid demos' input cells with the
    same key (the output's colour at the same canvas cell, where both grids have one) as shares, embedded as
    ``sum_k share_k * E[k]``; ``E[none]`` where no demo cell has the key (always for a sample without valid demos);
    0 outside the grid. A fixed lookup, as attention over the memory with the key (colour, size) would do it."""

    def __init__(self, side: int, vocab: int, hidden: int, size_max: int, init_std: float, cast_to) -> None:
        super().__init__()
        self.side, self.vocab, self.size_max = side, vocab, size_max
        self.embed = CastedEmbedding(vocab + 1, hidden, init_std=init_std, cast_to=cast_to)  # row vocab: none seen

    def keys(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.size_max == 0:  # the colour alone
            return tokens.long()
        size = object_sizes(tokens, self.side, FIRST_COLOUR).clamp_max(self.size_max)
        return tokens.long() * (self.size_max + 1) + size  # a non-grid cell has size 0: its own keys, never asked

    def forward(self, inputs, demo_inputs, demo_labels, valid) -> torch.Tensor:
        b, D, S = demo_inputs.shape
        K = self.vocab * (self.size_max + 1)
        key = self.keys(demo_inputs.reshape(b * D, S)).view(b, D, S)
        out = demo_labels.long()
        seen = valid[:, :, None] & (demo_inputs >= FIRST_COLOUR) & (out >= FIRST_COLOUR)
        table = torch.zeros(b, K * self.vocab + 1, device=inputs.device)  # the last bin: cells not counted
        pair = torch.where(seen, key * self.vocab + out, K * self.vocab).view(b, D * S)
        table.scatter_add_(1, pair, torch.ones_like(pair, dtype=table.dtype))
        table = table[:, :-1].view(b, K, self.vocab)
        counts = table.gather(1, self.keys(inputs)[..., None].expand(-1, -1, self.vocab))  # [b, S, vocab]
        total = counts.sum(-1, keepdim=True)
        share = torch.cat((counts / total.clamp_min(1.0), (total == 0).float()), -1)  # [b, S, vocab + 1]
        w = self.embed.embedding_weight.to(self.embed.cast_to)
        return (share.to(w.dtype) @ w) * (inputs >= FIRST_COLOUR)[..., None]


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
            embed=config.views_embed,
            tiebreak=config.views_gate == "tiebreak",
        )
        self.demo_lookup = None
        if config.demo_lookup:
            size_max = {"colour": 0, "object": CellFeatures.SIZE_MAX}
            self.demo_lookup = nn.ModuleList(
                DemoLookup(
                    self.views.side,
                    self.vocab_size,
                    config.hidden_size,
                    size_max[k],
                    self.embed_init_std,
                    self.forward_dtype,
                )
                for k in config.demo_lookup
            )
        self.cell_features = None
        if config.cell_features:
            self.cell_features = CellFeatures(
                self.views.side, config.hidden_size, config.cell_features, self.embed_init_std, self.forward_dtype
            )

    def token_embeddings(self, inputs: torch.Tensor) -> torch.Tensor:
        """The colour (and grid offset) embedding plus, with ``cell_features``, the cell's counts: of the test input
        here and, through the memory's keys, of every demo input cell (the variance kept)."""
        x = super().token_embeddings(inputs)
        if self.cell_features is None:
            return x
        return (x + self.cell_features(inputs).to(x.dtype)) * (1 + self.cell_features.num_tables) ** -0.5

    def embed_inputs(self, batch, prefix_context, memory):
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        match, valid = None, None
        if self.views.reads_match or self.demo_lookup is not None:
            b, D = batch["demo_inputs"].shape[:2]  # the demos the encoder saw (none for the zero-demo control)
            valid = torch.zeros(b, D, device=x.device).scatter_reduce(
                1, memory.demo.expand(b, -1), memory.mask.float(), "amax"
            )
            valid = valid > 0
        if self.views.reads_match:
            match = self.views.match(batch["demo_inputs"], batch["demo_labels"], valid)
        P = self.puzzle_emb_len
        views = self.views(batch["inputs"], prefix_context, match)
        if self.demo_lookup is not None:
            for lookup in self.demo_lookup:
                views = views + lookup(batch["inputs"], batch["demo_inputs"], batch["demo_labels"], valid)
        return torch.cat((x[:, :P], x[:, P:] + (self.embed_scale * views).to(x.dtype)), dim=1)


class TRMViews(TRMMemory):
    inner_cls = TRMViewsInner

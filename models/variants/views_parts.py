"""The components of the grid core (models/variants/trm_views.py), each an ``nn.Module`` with its own forward:

========================  ==================================================================================
:class:`GridCoordEmbedding`  learned embeddings of a cell's offsets from its grid's four edges (every variant)
:class:`MemoryRead`       cross-attention of the core's cells over the encoder's per-cell demo states (memory)
:class:`InputViews`       per cell, the gated sum of the colour each grid view sends to it (views)
:class:`CellFeatures`     per cell, embeddings of its object size and ray counts (``cell_features``)
:class:`DemoLookup`       per cell, what the demo cells with its key (colour, object size) became (``demo_lookup``)
:class:`GridOps`          per cell, its 3 x 3 neighbourhood and the running max along its row and column (``trm_local``)
========================  ==================================================================================

The grid views' sources come from ``core.ops`` (shared with ``encoder=dihedral_views``), the counts from
:mod:`models.variants.views_ops`. The learned gather (``GridGather``) is its own module, :mod:`models.variants.gather`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from core.nn import rms_norm
from core.ops import VIEW_KINDS, grid_coordinates, view_sources, view_table
from encoders.interface import DemoMemory
from models.layers import CastedEmbedding, CastedLinear, trunc_normal_init_
from models.variants.views_ops import object_sizes, ray_counts

FIRST_COLOUR = 2  # tokens 0 and 1 are PAD and the end-of-grid marker (core.ops.grid_coordinates)


class GridCoordEmbedding(nn.Module):
    """Learned embeddings of a cell's offsets from the edges of its input grid (``core.ops.grid_coordinates``):
    top, bottom, left and right, one table each, summed. With them a cell knows where it sits *relative to the
    grid*. ``forward(inputs [b, side*side]) -> [b, side*side, dim]``. Each table's std is ``init_std / 2``, so the
    sum of four has the variance of one token embedding of std ``init_std``."""

    def __init__(self, side: int, dim: int, init_std: float, cast_to: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.side = side
        self.cast_to = cast_to
        self.embedding_weight = nn.Parameter(trunc_normal_init_(torch.empty(4, 2 * side + 1, dim), std=init_std / 2))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        coords = grid_coordinates(inputs, self.side)  # [b, S, 4]
        w = self.embedding_weight.to(self.cast_to)
        return sum(F.embedding(coords[..., k], w[k]) for k in range(4))


class MemoryRead(nn.Module):
    """Cross-attention of the core's cells over a :class:`DemoMemory` plus a learned null key (its value is zero: a
    sample without demos reads nothing, never NaN). Each memory token is keyed by its state, its offsets from the edges
    of its demo's input and output grids, its output colour and its demo slot.

    ``keys(memory, demo_inputs, demo_labels)`` -> (k, v, mask) once per supervision step; ``forward(h, kv)`` ->
    [b, s, hidden], the read of every position of ``h`` [b, s, hidden]."""

    def __init__(
        self, hidden: int, num_heads: int, width: int, side: int, max_demos: int, vocab: int, init_std: float, cast_to
    ) -> None:
        super().__init__()
        self.hidden, self.num_heads, self.max_demos = hidden, num_heads, max_demos
        self.embed_scale = hidden**0.5
        self.in_proj = CastedLinear(width, hidden)
        self.coords_in = GridCoordEmbedding(side, hidden, init_std, cast_to)  # where the cell sits in the demo input
        self.coords_out = GridCoordEmbedding(side, hidden, init_std, cast_to)  # ... and in the demo output
        self.demo = CastedEmbedding(max_demos, hidden, init_std=init_std, cast_to=cast_to)
        self.colour_out = CastedEmbedding(vocab, hidden, init_std=init_std, cast_to=cast_to)  # the cell's output colour
        self.q_proj = CastedLinear(hidden, hidden)
        self.kv_proj = CastedLinear(hidden, 2 * hidden)
        self.o_proj = CastedLinear(hidden, hidden)
        self.null_key = nn.Parameter(trunc_normal_init_(torch.empty(hidden), std=1.0))

    def keys(self, memory: DemoMemory, demo_inputs, demo_labels, colour_in: nn.Module, dtype: torch.dtype):
        b, D, S = demo_inputs.shape
        if D > self.max_demos:
            raise ValueError(
                f"the demo memory: {D} demo slots but arch.memory_max_demos={self.max_demos} (raise it, or set "
                f"max_demos)"
            )
        cin = self.coords_in(demo_inputs.reshape(b * D, S)).view(b, D, S, -1)
        cout = self.coords_out(demo_labels.reshape(b * D, S)).view(b, D, S, -1)
        cells = (
            cin
            + cout
            + colour_in(demo_inputs.reshape(b * D, S)).view(b, D, S, -1)
            + self.colour_out(demo_labels.reshape(b * D, S).to(torch.int32)).view(b, D, S, -1)
        )
        rows = torch.arange(b, device=cells.device)[:, None]
        where = cells[rows, memory.demo[None, :], memory.cell] + self.demo(memory.demo)  # [b, M, hidden]
        m = rms_norm(self.in_proj(memory.states.to(dtype)) + self.embed_scale * where.to(dtype), 1e-5)
        k, v = self.kv_proj(m).chunk(2, dim=-1)
        null_k = self.null_key.to(dtype).expand(b, 1, -1)
        k = torch.cat([null_k, k], dim=1)
        v = torch.cat([torch.zeros_like(null_k), v], dim=1)
        mask = torch.cat([memory.mask.new_ones(b, 1), memory.mask.bool()], dim=1)
        heads = lambda t: t.view(b, t.shape[1], self.num_heads, -1).transpose(1, 2)  # noqa: E731
        return heads(k), heads(v), mask[:, None, None, :]

    def forward(self, h: torch.Tensor, kv) -> torch.Tensor:
        k, v, mask = kv
        b, s, _ = h.shape
        q = self.q_proj(h).view(b, s, self.num_heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.hidden))


class CellFeatures(nn.Module):
    """``forward(tokens [n, S]) -> [n, S, hidden]``: per grid cell, the sum of one learned embedding per count of
    ``kinds`` (``object_size``: :func:`.object_sizes` clipped to 1..SIZE_MAX; ``rays``: the four
    :func:`.ray_counts` clipped to 0..RAY_MAX, a table per direction); 0 outside the grid."""

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
    views of ``kinds`` of an embedding (``embed``: one table per kind of view, or one for all) of the input colour the
    view sends to the cell (PAD where none). The gate: the context term plus the match term (:meth:`gates`)."""

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
        match_scale: Optional[float] = 10.0,
        match_kind: str = "agree",
        embed: str = "kind",
        tiebreak: bool = False,
    ) -> None:
        super().__init__()
        self.side, self.vocab, self.kinds, self.gate_scale = side, vocab, tuple(kinds), gate_scale
        self.match_kind, self.tiebreak = match_kind, tiebreak
        self.num_views = sum(VIEW_KINDS[k] for k in self.kinds)
        # the embedding table of each view: its kind's (kind) or the one of every view (shared)
        per_kind = [i for i, k in enumerate(self.kinds) for _ in range(VIEW_KINDS[k])]
        rows = {"kind": per_kind, "shared": [0] * self.num_views}
        if embed not in rows:
            raise ValueError(f"InputViews: embed must be one of {sorted(rows)}, got {embed!r}")
        self.register_buffer("table_of_view", torch.tensor(rows[embed]), persistent=False)
        # the shape views' sources of every grid size: a buffer, so it moves with the module and a compiled forward
        # reads it instead of tracing its build (core.ops.view_table). It is the process cache's tensor itself (only
        # ever read: a copy per module would cost (side + 1)^2 x V x side^2 longs, V the shape views)
        shape = any(k != "settle" for k in self.kinds)
        self.register_buffer("table", view_table(side, self.kinds) if shape else None, persistent=False)
        self.num_tables = max(rows[embed]) + 1
        self.embed = CastedEmbedding(self.num_tables * vocab, hidden, init_std=init_std, cast_to=cast_to)
        self.gate = CastedLinear(hidden, self.num_views, bias=True)
        if not tiebreak and match_scale is None:
            raise ValueError("InputViews: the match gate needs a match_scale (or tiebreak=True)")
        self.match_scale = None if tiebreak else nn.Parameter(torch.tensor(float(match_scale)))
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
        where the output has that colour (drawn outside the output grid: a miss). ``explain``: of the cells the output
        colours or the view draws on, those where the output is a *function of the view's colour* (per view colour and
        "no source", the commonest output colour: a view then a recolouring explains the output)."""
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
    cell of the test input, keyed by its colour and its object's size (:func:`.object_sizes`, clipped to
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


class GridOps(nn.Module):
    """Generic grid layers over the canvas cells, written to no rule family (``arch=trm_local``): per cell, a
    projection of its 3 x 3 neighbourhood (``neighbours``: the 9 cells around and at it, zero beyond the canvas)
    and the running maximum of a projection along each of the four directions of its row and column (``rays``:
    the max over the cells from the canvas edge up to and including it, left, right, top and bottom), mixed back to
    the hidden width. ``forward(h [b, P + side*side, hidden]) -> [b, P + side*side, hidden]``, zero on the P prefix
    positions."""

    def __init__(self, side: int, hidden: int, ops, width: int, prefix: int) -> None:
        super().__init__()
        self.side, self.ops, self.width, self.prefix = side, tuple(ops), width, prefix
        n_in = {"neighbours": 1, "rays": 4}
        n_out = {"neighbours": 9, "rays": 4}
        self.in_proj = CastedLinear(hidden, width * sum(n_in[o] for o in self.ops))
        self.out_proj = CastedLinear(width * sum(n_out[o] for o in self.ops), hidden)

    @staticmethod
    def neighbourhood(a: torch.Tensor) -> torch.Tensor:
        """[b, side, side, w] -> [b, side, side, 9 w]: the 3 x 3 neighbourhood of every cell (zero-padded)."""
        s = a.shape[1]
        p = F.pad(a, (0, 0, 1, 1, 1, 1))
        return torch.cat([p[:, dy : dy + s, dx : dx + s] for dy in range(3) for dx in range(3)], dim=-1)

    @staticmethod
    def rays(a: torch.Tensor) -> torch.Tensor:
        """[b, side, side, 4 w] -> [b, side, side, 4 w]: chunk k's running max along direction k (from the left, the
        right, the top, the bottom edge up to the cell)."""
        left, right, top, bottom = a.chunk(4, dim=-1)
        return torch.cat(
            (
                left.cummax(dim=2).values,
                right.flip(2).cummax(dim=2).values.flip(2),
                top.cummax(dim=1).values,
                bottom.flip(1).cummax(dim=1).values.flip(1),
            ),
            dim=-1,
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, P, s, w = h.shape[0], self.prefix, self.side, self.width
        a = self.in_proj(h[:, P:]).view(b, s, s, -1)
        parts, at = [], 0
        for op in self.ops:
            if op == "neighbours":
                parts.append(self.neighbourhood(a[..., at : at + w]))
                at += w
            else:
                parts.append(self.rays(a[..., at : at + 4 * w]))
                at += 4 * w
        out = self.out_proj(torch.cat(parts, dim=-1)).view(b, s * s, -1)
        return F.pad(out, (0, 0, P, 0))

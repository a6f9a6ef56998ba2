"""TRM with pointer RoPE (``arch=trm_pointer``): grid-relative 2D RoPE in which every attention query is rotated
to the position it *points at* instead of its own; built on ``trm_grid`` (grid offsets too, as in every
measured pointer run).

A key sits at its cell's (row, column) offset from the top-left corner of the input grid (the bounding box of
the colour cells, ``core.ops.grid_coordinates``, so translation does not move it). A query of head ``h`` at a
cell with features ``f = (top, bottom, left, right, 1)`` (its offsets from the four edges) points at
``(G_row . f, G_col . f)``, where ``G`` [heads, 2, 5] is a linear function of a hidden state
(:class:`PointerAttention`'s ``pointer`` projection: zero weights, a bias set by ``pointer_init``). Every
dihedral map of any grid size is one exact pointer (``core.ops.DIHEDRAL_POINTERS``: a horizontal flip is
``(top, right)``, a transpose ``(left, top)``), and so is a shift by (dr, dc): ``(top - dr, left - dc)``.

Measured (5695a84, docs/record/2026-11-25-pointer-rope.md): on seven dihedral maps told by an oracle the core fits
0.90 / 0.98 train exact (seeds 0 / 1) with ``dihedral`` / ``context`` against 0.27 / 0.43 for the recipe's core;
0.40 with ``dihedral`` / ``token``; ``identity`` / ``token`` stayed below the control. In the 8-family ETRM check
it did not help (held-out 0.08 / 0.06 against 0.10 at 2000 steps): the recipe does not use it. It is the core of
the map probe that first solved held-out spatial puzzles read from demos (0.98 / 1.00 of fresh puzzles at the
halting step, training seeds 0 / 1; e88a31a, 8e3842c, docs/record/2026-11-25-context-size-steps-halting.md).

Parameters: ``trm_grid``'s plus ``self_attn.pointer.weight`` / ``.bias`` in every attention layer (the names
``arch=trm`` with ``pos_encodings=pointer`` had before this variant had its own module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import model_validator
from torch import nn

from core.ops import (
    apply_pointer_rope,
    pointer_bias,
    pointer_coefficients,
    pointer_features,
    pointer_freqs,
    pointer_tables,
)
from models.act import head_dim_of
from models.layers import Attention, CastedLinear
from models.variants.trm_grid import TRMGrid, TRMGridConfig, TRMGridInner

# what sets a query's pointer: its own hidden state (token), or the hidden state of the first context slot, shared by
# every query of the sample (context: the rule read from the demos / puzzle embedding chooses the map directly)
POINTER_SOURCES = ("token", "context")


class TRMPointerConfig(TRMGridConfig):
    """``trm_grid`` with pointer RoPE as its positions; defaults: the measured best (dihedral / context)."""

    name: Literal["trm_pointer"] = "trm_pointer"  # type: ignore[assignment]
    pos_encodings: Literal["pointer"] = "pointer"  # type: ignore[assignment]
    # where the heads' pointers start (identity: every head at its own cell, i.e. grid-relative 2D RoPE;
    # dihedral: head h at dihedral map h % 8, core.ops.DIHEDRAL_POINTERS); learned from there
    pointer_init: Literal["identity", "dihedral"] = "dihedral"
    # what sets a query's pointer (token: its own hidden state; context: the first context slot's, shared by
    # every query of the sample; needs puzzle_emb_len >= 1)
    pointer_source: Literal["token", "context"] = "context"

    @model_validator(mode="after")
    def _check_pointer(self):
        head_dim = head_dim_of(self)
        if head_dim % 4 or head_dim < 8:
            raise ValueError(
                f"pointer RoPE (arch=trm_pointer) needs a head dimension divisible by 4 (half of its "
                f"frequency pairs turn with the row, half with the column) and at least 8, got "
                f"hidden_size/num_heads = {head_dim}"
            )
        if self.pointer_source == "context" and self.puzzle_emb_len == 0 and self.puzzle_emb_ndim == 0:
            raise ValueError(
                "pointer_source=context reads the pointers from the first context slot, but the model "
                "has none (puzzle_emb_len = 0 and puzzle_emb_ndim = 0)"
            )
        if self.mlp_t:
            raise ValueError("arch=trm_pointer rotates attention queries, but mlp_t=true has no attention")
        return self


@dataclass
class PointerPositions:
    """What :class:`PointerRoPE` gives every attention layer of one forward pass (per sample, fixed over cycles).

    ``feats`` [b, P + L, 5] float32: the grid-relative features each query's pointer is a combination of -- the
    cell's offsets from the top, bottom, left and right edge of its input grid, and 1 (context slots: 0, 0, 0, 0, 1);
    ``k_cos`` / ``k_sin`` [b, P + L, 1, head_dim]: every key's rotation at its own (row, column) offset from the
    grid's top-left corner (context slots far off the grid); ``freqs`` [head_dim / 4]: angular frequencies per axis."""

    feats: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor
    freqs: torch.Tensor
    source: str = "token"  # token: each query's own hidden state sets its pointer; context: the first context slot's


class PointerRoPE(nn.Module):
    """The positions of pointer RoPE for ``inputs [b, side*side]``: the query features and the keys' rotations
    (:class:`PointerPositions`). Frequencies per axis: ``pi * k / side`` for ``k = 1 .. head_dim/4 - 1`` (no aliasing
    between offsets of one canvas) and one pair at frequency 0 (content, not position)."""

    def __init__(self, head_dim: int, side: int, prefix: int = 0, source: str = "token") -> None:
        super().__init__()
        if source not in POINTER_SOURCES:
            raise ValueError(f"pointer source must be one of {POINTER_SOURCES}, got {source!r}")
        if source == "context" and prefix < 1:
            raise ValueError("pointer source 'context' needs at least one context slot (puzzle_emb_len >= 1)")
        self.side, self.prefix, self.source = side, prefix, source
        self.register_buffer("freqs", pointer_freqs(head_dim, side), persistent=False)

    def forward(self, inputs: torch.Tensor) -> PointerPositions:
        feats, key_pos = pointer_features(inputs, self.side, self.prefix)
        cos, sin = pointer_tables(key_pos, self.freqs)
        return PointerPositions(
            feats=feats, k_cos=cos.unsqueeze(-2), k_sin=sin.unsqueeze(-2), freqs=self.freqs, source=self.source
        )


class PointerAttention(Attention):
    """:class:`models.layers.Attention` whose queries point: ``pointer`` gives per head the (row, column)
    coefficients over the 5 grid features of each query (zero weights; the bias starts every head at ``init``)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_key_value_heads: int,
        causal: bool = False,
        *,
        init: str = "identity",
    ) -> None:
        super().__init__(hidden_size, head_dim, num_heads, num_key_value_heads, causal=causal)
        bias = pointer_bias(num_heads, init)
        self.pointer = CastedLinear(hidden_size, num_heads * 2 * 5, bias=True)
        with torch.no_grad():
            self.pointer.weight.zero_()
            self.pointer.bias.copy_(bias)  # type: ignore[union-attr]

    def pointer_coefficients(self, hidden_states: torch.Tensor, pos: PointerPositions) -> torch.Tensor:
        """[b, s or 1, heads, 2, 5] pointer coefficients of each query (``pos.source`` token) or of the sample
        (context: the first context slot's), fp32."""
        src = hidden_states[:, :1] if pos.source == "context" else hidden_states
        return pointer_coefficients(src, self.pointer.weight, self.pointer.bias, self.num_heads)

    def pointed_positions(self, hidden_states: torch.Tensor, pos: PointerPositions) -> torch.Tensor:
        """[b, s, heads, 2] (row, column) each query of each head points at, fp32."""
        s = hidden_states.shape[1]
        return (self.pointer_coefficients(hidden_states, pos) * pos.feats[:, :s, None, None, :]).sum(-1)

    def rotate(
        self, cos_sin, hidden_states: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(cos_sin, PointerPositions):
            return super().rotate(cos_sin, hidden_states, q, k)
        s = q.shape[1]
        return apply_pointer_rope(
            q,
            k,
            self.pointer_coefficients(hidden_states, cos_sin),
            cos_sin.feats[:, :s],
            cos_sin.k_cos[:, :s],
            cos_sin.k_sin[:, :s],
            cos_sin.freqs,
        )


class TRMPointerInner(TRMGridInner):
    def build_positions(self, config) -> None:
        self.rotary_emb = PointerRoPE(
            config.hidden_size // config.num_heads,
            self.canvas_side("arch=trm_pointer"),
            self.puzzle_emb_len,
            source=config.pointer_source,
        )
        self.add_grid_offsets()

    def cos_sin(self, inputs: torch.Tensor) -> PointerPositions:
        return self.rotary_emb(inputs)

    def attention(
        self, hidden_size: int, head_dim: int, num_heads: int, num_key_value_heads: int, causal: bool = False
    ) -> nn.Module:
        return PointerAttention(
            hidden_size, head_dim, num_heads, num_key_value_heads, causal=causal, init=self.config.pointer_init
        )


class TRMPointer(TRMGrid):
    inner_cls = TRMPointerInner

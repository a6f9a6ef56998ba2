"""The per-demo trunk of the demo encoders: each valid demo pair (input canvas, output canvas) -> token states, and
a pooled embedding per demo.

Padding rules (pitfall 16): PAD tokens (id 0) inside a demo are never attended to and never pooled; demo slots
with ``demo_mask == False`` (or containing only PAD) are skipped entirely (never encoded).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Literal, Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from core.nn import compile_boundary, trunc_normal_init_
from core.ops import grid_coordinates, pointer_features, pointer_freqs, pointer_tables
from dataset.tokens import PAD_ID

from .config import BaseEncoderConfig, EncoderConfigError
from .layers import Block, TokenPacking, TokenPointers

_init = partial(trunc_normal_init_, std_of="normal")  # the encoders' convention (core.nn.trunc_normal_init_)


class DemoTrunk(nn.Module):
    """Encodes each valid demo pair independently.

    Tokens (``pair_layout``): "sequence" = input canvas then output canvas (2*S tokens), embedded as token +
    canvas position + segment (input/output) embeddings; "aligned" = one token per canvas cell, embedded as
    input-colour + output-colour (a second table) + position embeddings. An optional CLS token is prepended.
    PAD tokens (aligned: cells PAD in both canvases) are masked as attention keys and excluded from mean pooling.
    """

    def __init__(self, cfg: BaseEncoderConfig, vocab_size: int, seq_len: int, pooling: Literal["mean", "cls"]):
        super().__init__()
        d = cfg.hidden_size
        self.cfg = cfg
        self.seq_len = seq_len
        self.aligned = cfg.pair_layout == "aligned"
        self.embed_scale = math.sqrt(d)
        std = 1.0 / self.embed_scale
        self.tok = nn.Parameter(_init(torch.empty(vocab_size, d), std))
        self.pos = nn.Parameter(_init(torch.empty(seq_len, d), std))
        if self.aligned:  # output-colour table; the two tables already tell input from output
            self.tok_out = nn.Parameter(_init(torch.empty(vocab_size, d), std))
        else:
            self.seg = nn.Parameter(_init(torch.empty(2, d), std))
        self.cls = nn.Parameter(_init(torch.empty(d), std)) if pooling == "cls" else None
        if cfg.grid_coords or cfg.pointer is not None:
            self.side = self.square_side("grid_coords=true" if cfg.grid_coords else f"pointer={cfg.pointer}")
        if cfg.grid_coords:  # four offset tables each for the input grid and the output grid
            self.coord_in = nn.Parameter(_init(torch.empty(4, 2 * self.side + 1, d), std / 2))
            self.coord_out = nn.Parameter(_init(torch.empty(4, 2 * self.side + 1, d), std / 2))
        self.init_cell_features(vocab_size, d, std)
        if cfg.pointer is not None:
            self.register_buffer("pointer_freqs", pointer_freqs(d // cfg.num_heads, self.side), persistent=False)
        self.blocks = nn.ModuleList(
            Block(d, cfg.num_heads, cfg.expansion, cfg.norm_eps, pointer=cfg.pointer) for _ in range(cfg.num_layers)
        )

    def square_side(self, what: str) -> int:
        """The side of the square canvas (seq_len = side * side) that ``what`` (an option) needs."""
        side = math.isqrt(self.seq_len)
        if side * side != self.seq_len:
            raise EncoderConfigError(
                f"encoder {self.cfg.name}: {what} needs a square canvas, but the data's seq_len "
                f"{self.seq_len} is not a square"
            )
        return side

    # -- extension points of a variant's trunk (encoders/dihedral_views.py) -------------------------------------
    def init_cell_features(self, vocab_size: int, d: int, std: float) -> None:
        """Create the tables of extra per-cell features (none here), after the embeddings, before the blocks."""

    def cell_features(self, inp: torch.Tensor, out: torch.Tensor) -> Optional[torch.Tensor]:
        """Extra features [n, S, d] added to the aligned tokens of full canvases inp / out [n, S] (None: none)."""
        return None

    # Runs eagerly under torch.compile: skipping empty slots and cropping PAD give data-dependent shapes, which
    # would otherwise force a recompilation for every new shape.
    @compile_boundary
    def encode_tokens(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """Token states of the valid demos. Returns (x [n, T, d] or None when no demo is valid, key mask [n, T],
        idx [n] (flat b*D index of each encoded demo), valid [b, D] bool, cells [n, T] long: the canvas cell of each
        token, -1 for the CLS token and the padding; with ``pack_tokens`` a demo's tokens come left-aligned)."""
        b, D, S = demo_inputs.shape
        if S > self.seq_len:
            raise ValueError(f"demo sequence length {S} exceeds the encoder's seq_len {self.seq_len}")
        if self.cfg.zero_demos:
            demo_inputs = torch.zeros_like(demo_inputs)
            demo_labels = torch.zeros_like(demo_labels)
        valid = demo_mask.bool() & ((demo_inputs != PAD_ID).any(-1) | (demo_labels != PAD_ID).any(-1))
        idx = valid.flatten().nonzero().squeeze(-1)
        if idx.numel() == 0:
            return None, None, idx, valid, None
        inp = demo_inputs.reshape(b * D, S).index_select(0, idx).long()
        out = demo_labels.reshape(b * D, S).index_select(0, idx).long()
        extra = self.cell_features(inp, out) if self.aligned else None  # on the full canvases
        pos = torch.arange(S, device=inp.device)
        if self.cfg.crop_padding:  # exact: trailing PAD is masked anyway
            # kept length of each canvas = last column holding a non-PAD token + 1 (at least 1); one host sync
            col = torch.arange(1, S + 1, device=inp.device)
            li, lo = (
                torch.stack([((inp != PAD_ID).any(0) * col).max(), ((out != PAD_ID).any(0) * col).max()])
                .clamp_min(1)
                .tolist()
            )
            if self.aligned:
                li = lo = max(li, lo)
            inp, out = inp[:, :li], out[:, :lo]
            pi, po = pos[:li], pos[:lo]
        else:
            pi = po = pos
            li = lo = S
        cin = cout = 0.0
        if self.cfg.grid_coords:
            cin, cout = self._coords(self.coord_in, inp), self._coords(self.coord_out, out)
        if self.aligned:
            x = self.tok[inp] + self.tok_out[out] + self.pos[pi]
            if self.cfg.grid_coords:
                x = x + cin + cout
            if extra is not None:
                x = x + extra[:, :li]
            mask = (inp != PAD_ID) | (out != PAD_ID)
        else:
            x = torch.cat(
                [self.tok[inp] + self.pos[pi] + self.seg[0] + cin, self.tok[out] + self.pos[po] + self.seg[1] + cout],
                dim=1,
            )
            mask = torch.cat([inp != PAD_ID, out != PAD_ID], dim=1)
        # the canvas cell of every token (-1: the CLS token); the sequence layout holds the input, then the output cells
        cells = torch.cat([pi, po]) if not self.aligned else pi
        if self.cls is not None:
            n = x.shape[0]
            x = torch.cat([self.cls.expand(n, 1, -1), x], dim=1)
            mask = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=mask.device), mask], dim=1)
            cells = torch.cat([cells.new_full((1,), -1), cells])
        cells = cells.expand(x.shape[0], -1)
        x = self.embed_scale * x
        pointers = self._pointers(inp, li, lo) if self.cfg.pointer is not None else None
        packing = None
        if self.cfg.pack_tokens and self.blocks:  # exact: PAD tokens are never keys and never read out
            packing, order, sel = TokenPacking.build(mask)
            idx = idx.index_select(0, order)
            cells = cells.index_select(0, order).flatten().index_select(0, sel)
            x = x.index_select(0, order).flatten(0, 1).index_select(0, sel)
            if pointers is not None:
                pointers = pointers.select(order, sel)
        for blk in self.blocks:
            if self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, None, mask, packing, pointers, use_reentrant=False)
            else:
                x = blk(x, key_mask=mask, packing=packing, pointers=pointers)
        if packing is not None:
            x, mask = packing.unpack(x)
            cells = cells.new_full((mask.numel(),), -1).index_copy(0, packing.dest, cells).view(mask.shape)
        return x, mask, idx, valid, cells

    def _pointers(self, inp: torch.Tensor, li: int, lo: int) -> TokenPointers:
        """Pointer RoPE inputs of every token (in the token layout: [CLS,] cells, or [CLS,] input then output
        cells), all relative to each demo's *input* grid, so an output cell can point at the input cell a map
        sends to it."""
        side, P = self.side, int(self.cls is not None)
        feats, key_pos = pointer_features(F.pad(inp, (0, side * side - inp.shape[1])), side, prefix=P)
        keep = list(range(P + li)) + ([] if self.aligned else list(range(P, P + lo)))
        feats, key_pos = feats[:, keep], key_pos[:, keep]
        cos, sin = pointer_tables(key_pos, self.pointer_freqs)
        return TokenPointers(feats, cos.unsqueeze(-2), sin.unsqueeze(-2), self.pointer_freqs)

    def _coords(self, tables: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Sum of the four edge-offset embeddings of each of ``tokens`` [n, L] (a cropped canvas prefix)."""
        coords = grid_coordinates(tokens, self.side)[:, : tokens.shape[1]]
        return sum(F.embedding(coords[..., k], tables[k]) for k in range(4))

    @compile_boundary
    def forward(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """Returns (pooled [b, D, d] (zeros for skipped slots), valid [b, D] bool)."""
        b, D, _ = demo_inputs.shape
        x, mask, idx, valid, _ = self.encode_tokens(demo_inputs, demo_labels, demo_mask)
        pooled = torch.zeros(b, D, self.cfg.hidden_size, device=demo_inputs.device, dtype=self.tok.dtype)
        if x is None:
            return pooled, valid
        if self.cls is not None:
            z = x[:, 0]
        else:
            m = mask.to(x.dtype).unsqueeze(-1)
            z = (x * m).sum(1) / m.sum(1).clamp_min(1.0)
        pooled = pooled.flatten(0, 1).index_copy(0, idx, z.to(pooled.dtype)).view(b, D, -1)
        return pooled, valid

    def sample_tokens(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """Every token of every valid demo of a sample, unpooled: (tokens [b, D*T, d], key mask [b, D*T] bool;
        False for PAD tokens and for the tokens of skipped slots). T >= 1 even when no demo is valid."""
        return self.cell_tokens(demo_inputs, demo_labels, demo_mask)[:2]

    @compile_boundary
    def cell_tokens(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """:meth:`sample_tokens` plus the canvas cell of each token: (tokens [b, D*T, d], key mask [b, D*T], cells
        [b, D*T] long, -1 for the CLS token and padding). Slot j's tokens are positions ``j*T .. j*T + T - 1``."""
        b, D, _ = demo_inputs.shape
        x, mask, idx, valid, cells = self.encode_tokens(demo_inputs, demo_labels, demo_mask)
        if x is None:
            dev = demo_inputs.device
            return (
                torch.zeros(b, D, self.cfg.hidden_size, device=dev, dtype=self.tok.dtype),
                torch.zeros(b, D, dtype=torch.bool, device=dev),
                torch.full((b, D), -1, dtype=torch.long, device=dev),
            )
        T = x.shape[1]
        full = x.new_zeros(b * D, T, x.shape[-1]).index_copy(0, idx, x)
        fmask = mask.new_zeros(b * D, T).index_copy(0, idx, mask)
        fcells = cells.new_full((b * D, T), -1).index_copy(0, idx, cells)
        return full.view(b, D * T, -1), fmask.view(b, D * T), fcells.view(b, D * T)

    def keys(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """What the aggregation attends over: every demo token (``aggregation: tokens``, :meth:`sample_tokens`)
        or one pooled embedding per demo slot (:meth:`forward`). Returns (keys [b, K, d], key mask [b, K])."""
        if self.cfg.aggregation == "tokens":
            return self.sample_tokens(demo_inputs, demo_labels, demo_mask)
        return self(demo_inputs, demo_labels, demo_mask)

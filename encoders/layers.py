"""Layers of the demo encoders: multi-head attention (with optional pointer RoPE), the post-norm block, and token
packing (the per-demo blocks run on the non-PAD tokens only, attention per bucket of demos of similar length).

Own implementation; post-norm RMSNorm + SwiGLU like the TRM core (the primitives are ``core.nn``'s). Padding rules
(pitfall 16): a key mask [n, Tk] (True = attend) hides PAD tokens; callers guarantee every row has at least one
attendable key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from core.nn import SwiGLU, rms_norm, trunc_normal_init_
from core.ops import apply_pointer_rope, linear_chunks, pointer_bias, pointer_coefficients


def swiglu(dim: int, expansion: float) -> SwiGLU:
    """The encoders' SwiGLU (``core.nn.SwiGLU``): hidden width ``expansion * dim * 2/3`` rounded to the nearest
    multiple of 64 (at least 64), torch's ``nn.Linear`` initialisation, parameters ``gate_up`` / ``down`` (the
    state_dict keys of every encoder checkpoint)."""
    return SwiGLU(dim, expansion, multiple=64, rounding="nearest", init="torch", names=("gate_up", "down"))


@dataclass
class TokenPointers:
    """Pointer RoPE inputs of a demo's tokens (``BaseEncoderConfig.pointer``), padded [n, T, ...] or packed [N, ...]
    like the tokens: ``feats`` (..., 5) grid features of each query, ``k_cos`` / ``k_sin`` (..., 1, head_dim) each
    key's rotation, ``freqs`` [head_dim / 4] (core.ops.pointer_features / pointer_tables)."""

    feats: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor
    freqs: torch.Tensor

    def select(self, order: torch.Tensor, sel: torch.Tensor) -> "TokenPointers":
        """Packed like the tokens (``TokenPacking.build``'s order and sel)."""
        pack = lambda t: t.index_select(0, order).flatten(0, 1).index_select(0, sel)  # noqa: E731
        return TokenPointers(pack(self.feats), pack(self.k_cos), pack(self.k_sin), self.freqs)


class Attention(nn.Module):
    """Multi-head attention; ``key_mask`` [n, Tk] bool, True = attend. Callers guarantee every row
    has at least one attendable key. ``pointer`` (None, or a start of core.ops.POINTER_INITS): a pointer projection
    for pointer RoPE in self-attention (zero weights, the bias at the starting pointers)."""

    def __init__(self, dim: int, num_heads: int, pointer: Optional[str] = None):
        super().__init__()
        self.h = num_heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.pointer = None
        if pointer is not None:
            self.pointer = nn.Linear(dim, num_heads * 2 * 5, bias=True)
            with torch.no_grad():
                self.pointer.weight.zero_()
                self.pointer.bias.copy_(pointer_bias(num_heads, pointer))
            # a learned query and key offset per head: the projections have no bias, so without it a purely
            # positional match (attend to the cell the pointer names, whatever its colour) is not expressible
            self.pointer_qk = nn.Parameter(
                trunc_normal_init_(torch.empty(2, num_heads, dim // num_heads), 0.5, std_of="normal")
            )

    def _rotate(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, pointers: TokenPointers):
        """q, k [..., T, h, head_dim] of tokens x [..., T, d] with pointer RoPE applied."""
        if self.pointer is None:
            raise ValueError("pointer positions were given to an encoder attention layer built without a pointer")
        coef = pointer_coefficients(x, self.pointer.weight, self.pointer.bias, self.h)
        q, k = q + self.pointer_qk[0].to(q.dtype), k + self.pointer_qk[1].to(k.dtype)
        return apply_pointer_rope(q, k, coef, pointers.feats, pointers.k_cos, pointers.k_sin, pointers.freqs)

    def forward(
        self,
        x: torch.Tensor,
        ctx: Optional[torch.Tensor] = None,
        key_mask: Optional[torch.Tensor] = None,
        pointers: Optional[TokenPointers] = None,
    ) -> torch.Tensor:
        if pointers is not None and ctx is not None:
            raise ValueError("pointer RoPE is for self-attention (ctx=None)")
        ctx = x if ctx is None else ctx
        n, tq, d = x.shape
        tk = ctx.shape[1]
        q = self.q(x).view(n, tq, self.h, d // self.h)
        if key_mask is not None and ctx is not x:  # cross-attention: project only the keys that are attended
            sel = key_mask.flatten().nonzero().squeeze(-1)
            kv = self.kv(ctx.reshape(n * tk, d).index_select(0, sel))
            kv = kv.new_zeros(n * tk, 2 * d).index_copy(0, sel, kv)
        else:
            kv = self.kv(ctx)
        k, v = (t.reshape(n, tk, self.h, d // self.h) for t in kv.chunk(2, dim=-1))
        if pointers is not None:
            q, k = self._rotate(x, q, k, pointers)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(n, tq, d))

    def forward_packed(
        self, x: torch.Tensor, packing: "TokenPacking", pointers: Optional[TokenPointers] = None
    ) -> torch.Tensor:
        """Self-attention within each demo of packed tokens x [N, d] (``TokenPacking``): the same numbers as
        :meth:`forward` on the padded demos with their key mask, for the real tokens."""
        d = x.shape[-1]
        q = self.q(x)
        k, v = linear_chunks(x, self.kv.weight, (d, d))
        if pointers is not None:
            q, k = (
                t.reshape(t.shape[0], d)
                for t in self._rotate(x, q.view(-1, self.h, d // self.h), k.reshape(-1, self.h, d // self.h), pointers)
            )
        outs = []
        for bk in packing.buckets:
            o = F.scaled_dot_product_attention(*(self._bucket_heads(t, bk) for t in (q, k, v)), attn_mask=bk.attn_mask)
            o = o.transpose(1, 2).reshape(bk.num * bk.length, d)
            outs.append(o if bk.index is None else o.index_select(0, bk.index))
        return self.o(torch.cat(outs) if len(outs) > 1 else outs[0])

    def _bucket_heads(self, t: torch.Tensor, bk: "PackedBucket") -> torch.Tensor:
        """The bucket's packed tokens of t [N, d] as padded heads [num, h, length, d / h]."""
        t = t[bk.start : bk.end]
        if bk.index is not None:  # demos shorter than the bucket: scatter into the padded layout
            t = t.new_zeros(bk.num * bk.length, t.shape[-1]).index_copy(0, bk.index, t)
        return t.reshape(bk.num, bk.length, self.h, -1).transpose(1, 2)


@dataclass
class PackedBucket:
    start: int  # packed tokens [start, end) belong to this bucket's demos
    end: int
    num: int  # demos in the bucket
    length: int  # padded length of the bucket
    index: Optional[torch.Tensor]  # [end - start] slot of each token in the [num * length] padded layout (None: full)
    attn_mask: Optional[torch.Tensor]  # [num, 1, 1, length] key mask (None: every slot is a real token)


@dataclass
class TokenPacking:
    """The non-PAD tokens of n demos, flattened demo by demo (demos sorted by length, tokens in canvas order),
    and the buckets attention runs in: demos whose length rounds up to the same multiple of ``quantum``."""

    buckets: list[PackedBucket]
    dest: torch.Tensor  # [N] slot of each packed token in the left-aligned [n * max_len] layout
    lengths: torch.Tensor  # [n] real tokens per demo
    max_len: int

    QUANTUM = 8

    @classmethod
    def build(cls, mask: torch.Tensor) -> tuple["TokenPacking", torch.Tensor, torch.Tensor]:
        """From a key mask [n, T] (every row with a real token): (packing, order [n] of the demos, sel [N] flat
        index of each packed token into [n * T] in the sorted order)."""
        n, T = mask.shape
        counts = mask.sum(1)
        padded = ((counts + cls.QUANTUM - 1) // cls.QUANTUM * cls.QUANTUM).clamp_max(T)
        order = torch.argsort(padded, stable=True)
        mask, counts, padded = mask[order], counts[order], padded[order]
        sel = mask.flatten().nonzero().squeeze(-1)
        rank = (mask.cumsum(1) - 1).flatten().index_select(0, sel)
        demo = torch.div(sel, T, rounding_mode="floor")
        lens, nums = torch.unique_consecutive(padded, return_counts=True)
        ends = torch.cumsum(nums, 0)
        tok_ends = torch.cumsum(counts, 0).index_select(0, ends - 1)
        lens, nums, ends, tok_ends, max_len = (
            *(t.tolist() for t in (lens, nums, ends, tok_ends)),
            int(counts.max()),
        )  # one host sync
        buckets, d0, t0 = [], 0, 0
        for length, num, d1, t1 in zip(lens, nums, ends, tok_ends):
            if t1 - t0 == num * length:  # every demo fills the bucket: no scatter, no mask
                buckets.append(PackedBucket(t0, t1, num, length, None, None))
            else:
                index = (demo[t0:t1] - d0) * length + rank[t0:t1]
                key = torch.arange(length, device=mask.device) < counts[d0:d1, None]
                buckets.append(PackedBucket(t0, t1, num, length, index, key[:, None, None, :]))
            d0, t0 = d1, t1
        return cls(buckets, demo * max_len + rank, counts, max_len), order, sel

    def unpack(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed token states [N, d] -> (left-aligned [n, max_len, d] (zeros after each demo's tokens), key mask
        [n, max_len])."""
        n = self.lengths.shape[0]
        full = x.new_zeros(n * self.max_len, x.shape[-1]).index_copy(0, self.dest, x)
        mask = torch.arange(self.max_len, device=x.device) < self.lengths[:, None]
        return full.view(n, self.max_len, -1), mask


class Block(nn.Module):
    """Post-norm block: x = norm(x + attn(x, ctx)); x = norm(x + mlp(x))."""

    def __init__(self, dim: int, num_heads: int, expansion: float, eps: float, pointer: Optional[str] = None):
        super().__init__()
        self.attn = Attention(dim, num_heads, pointer=pointer)
        self.mlp = swiglu(dim, expansion)
        self.eps = eps

    def forward(
        self,
        x,
        ctx=None,
        key_mask=None,
        packing: Optional[TokenPacking] = None,
        pointers: Optional[TokenPointers] = None,
    ):
        """``packing``: x is packed tokens [N, d] (self-attention within each demo, TokenPacking); ``pointers``:
        pointer RoPE inputs laid out like x."""
        a = self.attn(x, ctx, key_mask, pointers) if packing is None else self.attn.forward_packed(x, packing, pointers)
        x = rms_norm(x + a, self.eps)
        return rms_norm(x + self.mlp(x), self.eps)

"""Shared pieces of every demonstration encoder.

Interface (docs/architecture.md §3)::

    encoder(demo_inputs [b, D, S] int, demo_labels [b, D, S] int, demo_mask [b, D] bool, state=None)
        -> EncoderOutput(context [b, puzzle_emb_len, hidden], kl [b] | None, state | None)

Padding rules (pitfall 16): PAD tokens (id 0) inside a demo are never attended to and never pooled;
demo slots with ``demo_mask == False`` (or containing only PAD) are skipped entirely (never encoded);
a sample with no demo at all gets a well-defined context (attention always has a learned "null" key,
so no attention row is ever fully masked and no NaN can appear).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import pydantic
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from omegaconf import DictConfig, OmegaConf
from torch import nn

from core.errors import PlatformError
from core.registry import Registry
from core.ops import (apply_pointer_rope, dihedral_agreement, grid_coordinates, linear_chunks, pointer_bias,
                      pointer_coefficients, pointer_features, pointer_freqs, pointer_tables)
from dataset.tokens import PAD_ID
from dataset.rule_labels import RULE_SLOTS


class EncoderConfigError(PlatformError, ValueError):
    """Bad encoder configuration; the message names the encoder and the field."""


@dataclass
class EncoderOutput:
    context: torch.Tensor  # [b, puzzle_emb_len, hidden]
    kl: Optional[torch.Tensor] = None  # [b] per-sample KL (unweighted), variational encoders only
    state: Optional[torch.Tensor] = None  # recurrent encoders: new z_E (NOT detached)


class BaseEncoderConfig(pydantic.BaseModel):
    """Fields shared by every encoder. Unknown keys raise (pitfall 8)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str
    hidden_size: int = 512  # encoder width (independent of the decoder hidden size)
    num_layers: int = 2  # per-demo transformer layers
    num_heads: int = 8
    expansion: float = 4.0  # SwiGLU expansion
    norm_eps: float = 1e-5
    # cross-demo aggregation: learned queries attend over the per-demo embeddings ("cross_attention"), a masked
    # mean of them ("mean"), or learned queries attend over every non-PAD token of every valid demo ("tokens":
    # no per-demo pooling, so which cell changed to what stays visible to the queries). The encoders whose recipe
    # is "tokens" (standard, variational, recurrent; docs/science.md) set that as their own default.
    aggregation: Literal["cross_attention", "mean", "tokens"] = "cross_attention"
    # how a demo pair becomes tokens: "sequence" = input canvas then output canvas (2*S tokens, segment embedding);
    # "aligned" = one token per canvas cell, input-colour embedding + output-colour embedding (S tokens, a cell's
    # change is visible locally)
    pair_layout: Literal["sequence", "aligned"] = "aligned"
    num_queries: Optional[int] = None  # None = puzzle_emb_len (one query per context token)
    # optional learned scale / gate on the context (pitfall 10): "none" | "scalar" (one learned scale)
    # | "gate" (per context token sigmoid gate) | "norm" (each context token RMS-normalised to the scale of a token
    # embedding, times context_scale_init: the context cannot outgrow the decoder's own inputs)
    context_scale: Literal["none", "scalar", "gate", "norm"] = "none"
    context_scale_init: float = 1.0
    # K > 0: the context is a softmax mixture of K learned whole contexts ("codes", [P, hidden] each, token scale)
    # chosen by a linear head on the encoder state: a confident encoder hands the core exactly one code, the same
    # for every sample that gets it, like the rule oracle's table (docs/science.md, "What the core needs from the
    # encoder's context")
    context_codes: int = pydantic.Field(default=0, ge=0)
    # crop the all-PAD tail of the demo canvases before encoding (exact: masked tokens have no effect)
    crop_padding: bool = True
    # run the per-demo blocks on the non-PAD tokens only (exact, like crop_padding, but per demo): projections,
    # norms and SwiGLU see each real token once, attention runs per bucket of demos of similar length
    # (TokenPacking). False = every demo padded to the batch's (cropped) canvas length, the reference path.
    pack_tokens: bool = True
    # add learned embeddings of each cell's offsets from the edges of the input grid and of the output grid
    # (core.ops.grid_coordinates; square canvases): where a cell sits in each grid, so a token can tell where
    # cells moved and not only which colour became which (docs/science.md, "Grid-relative positions")
    grid_coords: bool = False
    # pointer RoPE in the per-demo self-attention (core.ops.apply_pointer_rope; square canvases): each query of each
    # head is rotated to the cell it points at -- a learned linear map of its offsets from the *input* grid's edges,
    # starting at the identity ("identity") or at dihedral map h % 8 for head h ("dihedral") -- and each key sits at
    # its offset from the input grid's top-left corner, so a head can compare an output cell with the input cell a
    # flip / rotation / shift sends to it (docs/science.md, "Pointer RoPE"). null = off.
    pointer: Optional[Literal["identity", "dihedral"]] = None
    # dihedral views (aligned layout; square canvases): each output cell also sees, for every dihedral map d, the
    # input colour that d would send there (core.ops.dihedral_sources) and whether the output agrees with it, so
    # "the output is the input flipped / rotated by d" is a per-cell comparison the pooling can count
    dihedral_views: bool = False
    # science control: replace every demo by zeros (all PAD) -> the encoder sees no demonstration
    zero_demos: bool = False
    # science control, the other bound: the context is a learned embedding of the sample's true rule labels
    # (RULE_SLOTS, from rule_labels; training batches only, zeros where there are none, e.g. evaluation). Measures
    # whether the core can apply a rule it is told through the ETRM path (docs/science.md, "Rule readout")
    oracle_context: bool = False
    # recompute each per-demo block in the backward pass (saves activation memory on full 30x30 ARC demos)
    activation_checkpointing: bool = False
    # auxiliary rule readout (docs/science.md, "Rule readout"): weight of a loss that asks a linear head on the
    # context to name the rule (dataset.synthetic_rules.RULE_SLOTS) of each training sample; needs the training
    # config's rule_labels (the synthetic builder's rules.json). 0 = off (no head).
    rule_readout: float = pydantic.Field(default=0.0, ge=0.0)

    @pydantic.model_validator(mode="after")
    def _check(self):
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"encoder {self.name}: hidden_size={self.hidden_size} is not divisible by "
                             f"num_heads={self.num_heads}")
        if self.pointer is not None and ((self.hidden_size // self.num_heads) % 4
                                         or self.hidden_size // self.num_heads < 8):
            raise ValueError(f"encoder {self.name}: pointer={self.pointer} needs a head dimension (hidden_size / "
                             f"num_heads) divisible by 4 and at least 8, got {self.hidden_size // self.num_heads}")
        if self.num_layers < 0:
            raise ValueError(f"encoder {self.name}: num_layers must be >= 0, got {self.num_layers}")
        if self.dihedral_views and self.pair_layout != "aligned":
            raise ValueError(f"encoder {self.name}: dihedral_views=true needs pair_layout=aligned (one token per "
                             f"output cell), got pair_layout={self.pair_layout}")
        return self


# name -> Entry(config class, module class); filled by @ENCODER_REGISTRY.register(name, config=...) in the variant
# modules (each encoder is one module and one registry line)
ENCODER_REGISTRY = Registry("encoder", EncoderConfigError)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def parse_encoder_config(cfg: "dict | BaseEncoderConfig") -> "BaseEncoderConfig":
    """The validated config of ``cfg["name"]``'s encoder (strict: an unknown or unused key raises
    :class:`EncoderConfigError` naming it and listing the valid keys): the discriminated union over the registry,
    keyed by ``name``. An already validated config of a registered class is returned as it is."""
    if isinstance(cfg, BaseEncoderConfig) and type(cfg) in ENCODER_REGISTRY.configs():
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    return ENCODER_REGISTRY.parse(dict(cfg), prefix="encoder")


def build_encoder(cfg: "dict | BaseEncoderConfig", *, hidden_size: int, vocab_size: int, seq_len: int,
                  puzzle_emb_len: int, verbose: bool = True) -> "DemoEncoder":
    """Build an encoder from its config (``cfg["name"]`` = registry key; a dict is validated). Unknown keys raise."""
    config = parse_encoder_config(cfg)
    name = config.name
    module_cls = ENCODER_REGISTRY.entry(name).cls
    if puzzle_emb_len <= 0:
        raise EncoderConfigError(f"encoder {name!r}: puzzle_emb_len must be > 0 (the context replaces the "
                                 f"puzzle-embedding prefix), got {puzzle_emb_len}")
    enc = module_cls(config, hidden_size=hidden_size, vocab_size=vocab_size, seq_len=seq_len,
                     puzzle_emb_len=puzzle_emb_len)
    if verbose:
        print(f"[encoder] {name}: {count_parameters(enc):,} trainable parameters "
              f"(width {config.hidden_size}, {config.num_layers} layers, context {puzzle_emb_len}x{hidden_size})")
    return enc


# ----------------------------------------------------------------------------------------------
# Small building blocks (own implementation; post-norm RMSNorm + SwiGLU, like the TRM core)
# ----------------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)).to(dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, expansion: float):
        super().__init__()
        inner = int(round(expansion * dim * 2 / 3 / 64)) * 64 or 64
        self.gate_up = nn.Linear(dim, 2 * inner, bias=False)
        self.down = nn.Linear(inner, dim, bias=False)

    def forward(self, x):
        g, u = linear_chunks(x, self.gate_up.weight, (self.down.in_features,) * 2)
        return self.down(F.silu(g) * u)


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
    has at least one attendable key. ``pointer`` (None | "identity" | "dihedral"): a pointer projection for
    pointer RoPE in self-attention (zero weights, the bias at the starting pointers)."""

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
            self.pointer_qk = nn.Parameter(_trunc_normal_(torch.empty(2, num_heads, dim // num_heads), 0.5))

    def _rotate(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, pointers: TokenPointers):
        """q, k [..., T, h, head_dim] of tokens x [..., T, d] with pointer RoPE applied."""
        if self.pointer is None:
            raise ValueError("pointer positions were given to an encoder attention layer built without a pointer")
        coef = pointer_coefficients(x, self.pointer.weight, self.pointer.bias, self.h)
        q, k = q + self.pointer_qk[0].to(q.dtype), k + self.pointer_qk[1].to(k.dtype)
        return apply_pointer_rope(q, k, coef, pointers.feats, pointers.k_cos, pointers.k_sin, pointers.freqs)

    def forward(self, x: torch.Tensor, ctx: Optional[torch.Tensor] = None,
                key_mask: Optional[torch.Tensor] = None, pointers: Optional[TokenPointers] = None) -> torch.Tensor:
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

    def forward_packed(self, x: torch.Tensor, packing: "TokenPacking",
                       pointers: Optional[TokenPointers] = None) -> torch.Tensor:
        """Self-attention within each demo of packed tokens x [N, d] (``TokenPacking``): the same numbers as
        :meth:`forward` on the padded demos with their key mask, for the real tokens."""
        d = x.shape[-1]
        q = self.q(x)
        k, v = linear_chunks(x, self.kv.weight, (d, d))
        if pointers is not None:
            q, k = (t.reshape(t.shape[0], d) for t in self._rotate(x, q.view(-1, self.h, d // self.h),
                                                                     k.reshape(-1, self.h, d // self.h), pointers))
        outs = []
        for bk in packing.buckets:
            o = F.scaled_dot_product_attention(*(self._bucket_heads(t, bk) for t in (q, k, v)),
                                               attn_mask=bk.attn_mask)
            o = o.transpose(1, 2).reshape(bk.num * bk.length, d)
            outs.append(o if bk.index is None else o.index_select(0, bk.index))
        return self.o(torch.cat(outs) if len(outs) > 1 else outs[0])

    def _bucket_heads(self, t: torch.Tensor, bk: "PackedBucket") -> torch.Tensor:
        """The bucket's packed tokens of t [N, d] as padded heads [num, h, length, d / h]."""
        t = t[bk.start:bk.end]
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
        lens, nums, ends, tok_ends, max_len = (*(t.tolist() for t in (lens, nums, ends, tok_ends)),
                                               int(counts.max()))  # one host sync
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
        self.mlp = SwiGLU(dim, expansion)
        self.eps = eps

    def forward(self, x, ctx=None, key_mask=None, packing: Optional[TokenPacking] = None,
                pointers: Optional[TokenPointers] = None):
        """``packing``: x is packed tokens [N, d] (self-attention within each demo, TokenPacking); ``pointers``:
        pointer RoPE inputs laid out like x."""
        a = (self.attn(x, ctx, key_mask, pointers) if packing is None
             else self.attn.forward_packed(x, packing, pointers))
        x = rms_norm(x + a, self.eps)
        return rms_norm(x + self.mlp(x), self.eps)


def _trunc_normal_(w: torch.Tensor, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)


# ----------------------------------------------------------------------------------------------
# Per-demo trunk: (input canvas, output canvas) -> token states + pooled demo embedding
# ----------------------------------------------------------------------------------------------
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
        self.pooling = pooling
        self.seq_len = seq_len
        self.aligned = cfg.pair_layout == "aligned"
        self.embed_scale = math.sqrt(d)
        std = 1.0 / self.embed_scale
        self.tok = nn.Parameter(_trunc_normal_(torch.empty(vocab_size, d), std))
        self.pos = nn.Parameter(_trunc_normal_(torch.empty(seq_len, d), std))
        if self.aligned:  # output-colour table; the two tables already tell input from output
            self.tok_out = nn.Parameter(_trunc_normal_(torch.empty(vocab_size, d), std))
        else:
            self.seg = nn.Parameter(_trunc_normal_(torch.empty(2, d), std))
        self.cls = nn.Parameter(_trunc_normal_(torch.empty(d), std)) if pooling == "cls" else None
        if cfg.grid_coords or cfg.pointer is not None or cfg.dihedral_views:
            side = math.isqrt(seq_len)
            if side * side != seq_len:
                what = ("grid_coords=true" if cfg.grid_coords else f"pointer={cfg.pointer}" if cfg.pointer
                        else "dihedral_views=true")
                raise EncoderConfigError(f"encoder {cfg.name}: {what} needs a square canvas, but the "
                                         f"data's seq_len {seq_len} is not a square")
            self.side = side
        if cfg.grid_coords:  # four offset tables each for the input grid and the output grid
            self.coord_in = nn.Parameter(_trunc_normal_(torch.empty(4, 2 * side + 1, d), std / 2))
            self.coord_out = nn.Parameter(_trunc_normal_(torch.empty(4, 2 * side + 1, d), std / 2))
        if cfg.dihedral_views:  # per map: the source cell's colour (PAD = no source) and agreement (none/no/yes)
            self.view_tok = nn.Parameter(_trunc_normal_(torch.empty(8, vocab_size, d), std / 2))
            self.view_eq = nn.Parameter(_trunc_normal_(torch.empty(8, 3, d), std / 2))
        if cfg.pointer is not None:
            self.register_buffer("pointer_freqs", pointer_freqs(d // cfg.num_heads, side), persistent=False)
        self.blocks = nn.ModuleList(Block(d, cfg.num_heads, cfg.expansion, cfg.norm_eps, pointer=cfg.pointer)
                                    for _ in range(cfg.num_layers))

    # Runs eagerly under torch.compile: skipping empty slots and cropping PAD give data-dependent shapes, which
    # would otherwise force a recompilation for every new shape.
    @torch.compiler.disable
    def encode_tokens(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """Token states of the valid demos. Returns (x [n, T, d] or None when no demo is valid, key mask [n, T],
        idx [n] (flat b*D index of each encoded demo), valid [b, D] bool)."""
        b, D, S = demo_inputs.shape
        if S > self.seq_len:
            raise ValueError(f"demo sequence length {S} exceeds the encoder's seq_len {self.seq_len}")
        if self.cfg.zero_demos:
            demo_inputs = torch.zeros_like(demo_inputs)
            demo_labels = torch.zeros_like(demo_labels)
        valid = demo_mask.bool() & ((demo_inputs != PAD_ID).any(-1) | (demo_labels != PAD_ID).any(-1))
        idx = valid.flatten().nonzero().squeeze(-1)
        if idx.numel() == 0:
            return None, None, idx, valid
        inp = demo_inputs.reshape(b * D, S).index_select(0, idx).long()
        out = demo_labels.reshape(b * D, S).index_select(0, idx).long()
        views = self._dihedral_views(inp, out) if self.cfg.dihedral_views else None
        pos = torch.arange(S, device=inp.device)
        if self.cfg.crop_padding:  # exact: trailing PAD is masked anyway
            # kept length of each canvas = last column holding a non-PAD token + 1 (at least 1); one host sync
            col = torch.arange(1, S + 1, device=inp.device)
            li, lo = torch.stack([((inp != PAD_ID).any(0) * col).max(), ((out != PAD_ID).any(0) * col).max()]
                                 ).clamp_min(1).tolist()
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
            if views is not None:
                x = x + views[:, :li]
            mask = (inp != PAD_ID) | (out != PAD_ID)
        else:
            x = torch.cat([self.tok[inp] + self.pos[pi] + self.seg[0] + cin,
                           self.tok[out] + self.pos[po] + self.seg[1] + cout], dim=1)
            mask = torch.cat([inp != PAD_ID, out != PAD_ID], dim=1)
        if self.cls is not None:
            n = x.shape[0]
            x = torch.cat([self.cls.expand(n, 1, -1), x], dim=1)
            mask = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=mask.device), mask], dim=1)
        x = self.embed_scale * x
        pointers = self._pointers(inp, li, lo) if self.cfg.pointer is not None else None
        packing = None
        if self.cfg.pack_tokens and self.blocks:  # exact: PAD tokens are never keys and never read out
            packing, order, sel = TokenPacking.build(mask)
            idx = idx.index_select(0, order)
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
        return x, mask, idx, valid

    def _dihedral_views(self, inp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """[n, S, d] per-cell features of the dihedral views (``dihedral_views``) of full canvases inp / out [n, S]:
        for each map d, the embedding of the input colour d sends to the cell (PAD where none) plus that of the
        agreement (core.ops.dihedral_agreement: none / differs / equal)."""
        colour, agreement = dihedral_agreement(inp, out, self.side)  # [n, 8, S] each
        n, _, S = colour.shape
        V = self.view_tok.shape[1]
        maps = torch.arange(8, device=inp.device)[None, :, None]
        # one bag of 16 rows per cell of one table (never an [n, 8, S, d] tensor)
        rows = torch.cat((maps * V + colour, 8 * V + maps * 3 + agreement), 1).permute(0, 2, 1).reshape(n * S, 16)
        table = torch.cat((self.view_tok.flatten(0, 1), self.view_eq.flatten(0, 1)))
        return F.embedding_bag(rows, table, mode="sum").view(n, S, -1)

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
        coords = grid_coordinates(tokens, self.side)[:, :tokens.shape[1]]
        return sum(F.embedding(coords[..., k], tables[k]) for k in range(4))

    @torch.compiler.disable
    def forward(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """Returns (pooled [b, D, d] (zeros for skipped slots), valid [b, D] bool)."""
        b, D, _ = demo_inputs.shape
        x, mask, idx, valid = self.encode_tokens(demo_inputs, demo_labels, demo_mask)
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

    @torch.compiler.disable
    def sample_tokens(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """Every token of every valid demo of a sample, unpooled: (tokens [b, D*T, d], key mask [b, D*T] bool;
        False for PAD tokens and for the tokens of skipped slots). T >= 1 even when no demo is valid."""
        b, D, _ = demo_inputs.shape
        x, mask, idx, valid = self.encode_tokens(demo_inputs, demo_labels, demo_mask)
        if x is None:
            dev = demo_inputs.device
            return (torch.zeros(b, D, self.cfg.hidden_size, device=dev, dtype=self.tok.dtype),
                    torch.zeros(b, D, dtype=torch.bool, device=dev))
        T = x.shape[1]
        full = x.new_zeros(b * D, T, x.shape[-1]).index_copy(0, idx, x)
        fmask = mask.new_zeros(b * D, T).index_copy(0, idx, mask)
        return full.view(b, D * T, -1), fmask.view(b, D * T)

    def keys(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """What the aggregation attends over: every demo token (``aggregation: tokens``, :meth:`sample_tokens`)
        or one pooled embedding per demo slot (:meth:`forward`). Returns (keys [b, K, d], key mask [b, K])."""
        if self.cfg.aggregation == "tokens":
            return self.sample_tokens(demo_inputs, demo_labels, demo_mask)
        return self(demo_inputs, demo_labels, demo_mask)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x [b, D, ...] over D where mask [b, D]; zeros where no entry is valid."""
    m = mask.to(x.dtype).view(*mask.shape, *([1] * (x.dim() - 2)))
    return (x * m).sum(1) / m.sum(1).clamp_min(1.0)


class DemoAggregator(nn.Module):
    """Order-invariant aggregation of per-demo embeddings [b, D, d] (or, ``aggregation: tokens``, of every demo
    token [b, D*T, d] with its key mask) -> [b, Q, d].

    cross_attention: Q learned queries attend over the valid demos plus one learned null key (so a sample
    without demos is well defined; no attention row is ever fully masked); the attention output (not added to
    the queries, so the result is dominated by the demos, not by the query vectors) is normalised and refined by
    a residual SwiGLU. mean: masked mean of the demos, projected to Q tokens by one linear map.
    """

    def __init__(self, cfg: BaseEncoderConfig, num_queries: int):
        super().__init__()
        d = cfg.hidden_size
        self.mode = cfg.aggregation
        self.eps = cfg.norm_eps
        self.Q = num_queries
        if self.mode in ("cross_attention", "tokens"):
            self.queries = nn.Parameter(_trunc_normal_(torch.empty(num_queries, d), 1.0))
            self.null_key = nn.Parameter(_trunc_normal_(torch.empty(1, d), 1.0))
            self.attn = Attention(d, cfg.num_heads)
            self.mlp = SwiGLU(d, cfg.expansion)
        else:
            self.proj = nn.Linear(d, num_queries * d)

    def forward(self, demos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        b, d = demos.shape[0], demos.shape[-1]
        if self.mode == "mean":
            return rms_norm(self.proj(masked_mean(demos, valid)).view(b, self.Q, d), self.eps)
        q = self.queries.unsqueeze(0).expand(b, -1, -1).to(demos.dtype)
        keys = torch.cat([self.null_key.unsqueeze(0).expand(b, -1, -1).to(demos.dtype), demos], dim=1)
        mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=valid.device), valid], dim=1)
        x = rms_norm(self.attn(q, keys, mask), self.eps)
        return rms_norm(x + self.mlp(x), self.eps)


class ContextHead(nn.Module):
    """Projects encoder tokens [b, Q, d_in] to the decoder context [b, L, hidden], with optional
    learned scale / gate (pitfall 10)."""

    def __init__(self, cfg: BaseEncoderConfig, d_in: int, num_tokens: int, hidden_size: int, puzzle_emb_len: int):
        super().__init__()
        self.L, self.hidden = puzzle_emb_len, hidden_size
        self.num_tokens = num_tokens
        if num_tokens not in (1, puzzle_emb_len):
            raise EncoderConfigError(f"encoder {cfg.name}: num_queries={num_tokens} must be 1 or equal to "
                                     f"puzzle_emb_len={puzzle_emb_len}")
        self.codes: Optional[nn.Parameter] = None
        if cfg.context_codes:
            # logits over the codes from the flattened encoder state; small init: a near-uniform mixture at the
            # start. Each code is a whole context at the decoder's token-embedding scale (like the oracle's rows).
            self.code_logits = nn.Linear(num_tokens * d_in, cfg.context_codes)
            _trunc_normal_(self.code_logits.weight, 0.1 / math.sqrt(num_tokens * d_in))
            nn.init.zeros_(self.code_logits.bias)
            self.codes = nn.Parameter(_trunc_normal_(torch.empty(cfg.context_codes, puzzle_emb_len * hidden_size),
                                                     1.0 / math.sqrt(hidden_size)))
        else:
            self.proj = nn.Linear(d_in, hidden_size * (puzzle_emb_len if num_tokens == 1 and puzzle_emb_len > 1
                                                       else 1))
            # The decoder multiplies its input embeddings (prefix included) by sqrt(hidden); initialise so that a
            # unit-RMS encoder state gives context entries of std 1/sqrt(hidden), i.e. the scale of the decoder's
            # own token embeddings (std 1 after that multiplication).
            _trunc_normal_(self.proj.weight, 1.0 / math.sqrt(d_in * hidden_size))
            nn.init.zeros_(self.proj.bias)
        self.mode = cfg.context_scale
        if self.mode == "scalar":
            self.scale = nn.Parameter(torch.tensor(float(cfg.context_scale_init)))
        elif self.mode == "gate":
            # sigmoid gate per context token, initialised so that sigmoid(g) = context_scale_init
            p = min(max(cfg.context_scale_init, 1e-4), 1 - 1e-4)
            self.gate = nn.Parameter(torch.full((puzzle_emb_len,), math.log(p / (1 - p))))
        elif self.mode == "norm":  # RMS context_scale_init / sqrt(hidden): RMS context_scale_init in the decoder
            self.norm_gain, self.eps = float(cfg.context_scale_init) / math.sqrt(hidden_size), cfg.norm_eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        b = z.shape[0]
        if self.codes is not None:
            probs = torch.softmax(self.code_logits(z.flatten(1)).float(), -1)
            ctx = (probs @ self.codes.float()).to(z.dtype).reshape(b, self.L, self.hidden)
        else:
            ctx = self.proj(z).reshape(b, self.L, self.hidden)
        if self.mode == "scalar":
            ctx = ctx * self.scale
        elif self.mode == "gate":
            ctx = ctx * torch.sigmoid(self.gate).view(1, -1, 1).to(ctx.dtype)
        elif self.mode == "norm":
            ctx = rms_norm(ctx, self.eps) * self.norm_gain
        return ctx


class Gaussian(nn.Module):
    """Variational bottleneck: mean / log-variance heads, reparameterised sample in training, mean in eval.
    KL(q || N(0, I)) per sample = sum over every latent coordinate of the sample (pitfall 6)."""

    def __init__(self, d_in: int, latent: int, logvar_min: float = -10.0, logvar_max: float = 5.0):
        super().__init__()
        self.mu = nn.Linear(d_in, latent)
        self.logvar = nn.Linear(d_in, latent)
        nn.init.zeros_(self.logvar.weight)
        nn.init.constant_(self.logvar.bias, -2.0)
        self.lo, self.hi = logvar_min, logvar_max

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu = self.mu(x)
        logvar = self.logvar(x).clamp(self.lo, self.hi)
        if self.training:
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        else:
            z = mu
        return z, gaussian_kl(mu, logvar)


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Per-sample KL(N(mu, exp(logvar)) || N(0, I)) summed over all non-batch dims -> [b] (float32)."""
    mu, logvar = mu.float(), logvar.float()
    kl = 0.5 * (mu.square() + logvar.exp() - 1.0 - logvar)
    return kl.flatten(1).sum(-1)


class RuleReadout(nn.Module):
    """Auxiliary rule readout: a linear head on the flattened context that names the rule of the sample in every
    slot of :data:`dataset.synthetic_rules.RULE_SLOTS` (family, dihedral map, shift, colours, ...). Its loss is
    the mean cross-entropy over the sample's labelled slots (targets -100 elsewhere), computed in fp32; it
    reaches the encoder only, through the context the core also reads."""

    def __init__(self, d_in: int):
        super().__init__()
        self.sizes = list(RULE_SLOTS.values())
        self.proj = nn.Linear(d_in, sum(self.sizes))

    def forward(self, context: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context [b, P, D], targets int [b, len(RULE_SLOTS)] -> (per-sample loss [b], per-sample exact [b]:
        every labelled slot named right; False for a sample without labels)."""
        if targets.shape != (context.shape[0], len(self.sizes)):
            raise ValueError(f"rule targets {tuple(targets.shape)} must be [batch, {len(self.sizes)}]")
        valid = targets >= 0
        losses, right = [], []
        for j, lg in enumerate(self.slot_logits(context)):
            t = targets[:, j]
            losses.append(F.cross_entropy(lg, t.clamp_min(0), reduction="none") * valid[:, j])
            right.append((lg.argmax(-1) == t) | ~valid[:, j])
        labelled = valid.sum(-1)
        loss = torch.stack(losses, -1).sum(-1) / labelled.clamp_min(1)
        exact = torch.stack(right, -1).all(-1) & (labelled > 0)
        return loss, exact.detach().float()

    def slot_logits(self, context: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per slot, the fp32 logits [b, classes] of contexts [b, P, D] (fp32 under bf16 autocast too)."""
        with torch.autocast(context.device.type, enabled=False):
            logits = F.linear(context.flatten(1).float(), self.proj.weight.float(), self.proj.bias.float())
        return torch.split(logits, self.sizes, dim=-1)

    def predict(self, context: torch.Tensor) -> torch.Tensor:
        """The class the head names in every slot: long [b, len(RULE_SLOTS)]."""
        return torch.stack([lg.argmax(-1) for lg in self.slot_logits(context)], -1)


class RuleOracle(nn.Module):
    """``encoder.oracle_context``: the context of a sample is the sum of learned embeddings of its rule labels
    (one table row per class of every :data:`dataset.synthetic_rules.RULE_SLOTS` slot; unlabelled slots add
    nothing), [b, P, hidden], at the scale of a token embedding (the core multiplies by sqrt(hidden))."""

    def __init__(self, puzzle_emb_len: int, hidden_size: int):
        super().__init__()
        sizes = list(RULE_SLOTS.values())
        self.register_buffer("offsets", torch.tensor([0] + sizes[:-1]).cumsum(0), persistent=False)
        self.shape = (puzzle_emb_len, hidden_size)
        self.table = nn.Parameter(_trunc_normal_(torch.empty(sum(sizes), puzzle_emb_len * hidden_size),
                                                 1.0 / math.sqrt(hidden_size)))

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        valid = (targets >= 0).unsqueeze(-1)
        rows = self.table[(targets.clamp_min(0) + self.offsets).long()]  # [b, slots, P * hidden]
        return (rows * valid).sum(1).view(targets.shape[0], *self.shape)


class DemoEncoder(nn.Module):
    """Base class of every encoder module."""

    registry_name: str = "?"
    is_recurrent: bool = False
    kl_weight: float = 0.0

    def __init__(self, cfg: BaseEncoderConfig, *, hidden_size: int, vocab_size: int, seq_len: int,
                 puzzle_emb_len: int):
        super().__init__()
        self.cfg = cfg
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.puzzle_emb_len = puzzle_emb_len
        self.rule_head = self.rule_oracle = None
        with torch.random.fork_rng(devices=[]):  # the rest of the model initialises as it would without them
            if cfg.rule_readout > 0:
                self.rule_head = RuleReadout(puzzle_emb_len * hidden_size)
            if cfg.oracle_context:
                self.rule_oracle = RuleOracle(puzzle_emb_len, hidden_size)

    @staticmethod
    def _check_inputs(demo_inputs, demo_labels, demo_mask):
        if demo_inputs.shape != demo_labels.shape or demo_inputs.dim() != 3:
            raise ValueError(f"demo_inputs {tuple(demo_inputs.shape)} and demo_labels {tuple(demo_labels.shape)} "
                             f"must both be [batch, max_demos, seq]")
        if tuple(demo_mask.shape) != tuple(demo_inputs.shape[:2]):
            raise ValueError(f"demo_mask {tuple(demo_mask.shape)} must be [batch, max_demos] = "
                             f"{tuple(demo_inputs.shape[:2])}")

    def initial_state(self, batch_size: int, device) -> Optional[torch.Tensor]:
        return None

    def forward(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor,
                state: Optional[torch.Tensor] = None) -> EncoderOutput:  # pragma: no cover - abstract
        raise NotImplementedError

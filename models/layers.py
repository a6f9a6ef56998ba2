"""Building blocks shared by every architecture (TRM, HRM, transformer baseline).

Numerics follow the published TRM/HRM code:

* weights are stored in float32 and cast to the compute dtype of the input at use
  (:class:`CastedLinear`, :class:`CastedEmbedding`);
* initialisation is a truncated normal (cut at +-2 std) whose *actual* standard deviation equals the
  requested one (LeCun-style ``1/sqrt(fan_in)`` for linear layers), see :func:`trunc_normal_init_`;
* post-norm blocks: ``h = rms_norm(h + attn(h)); h = rms_norm(h + mlp(h))``, RMSNorm without a weight;
* SwiGLU with intermediate size ``round(expansion * hidden * 2/3)`` rounded up to a multiple of 256;
* non-causal multi-head attention through ``torch.nn.functional.scaled_dot_product_attention``;
* RoPE with the "rotate half" layout (1D or 2D), learned positions, or none;
* ``mlp_t``: an MLP over the sequence axis replaces attention (for small fixed grids such as Sudoku).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# the shared primitives, defined once in core.nn (also imported from here: trunc_normal_init_, rms_norm, SwiGLU; the
# TRM core's SwiGLU width rule, core.nn.swiglu_width's defaults, as swiglu_intermediate_size)
from core.nn import SwiGLU, rms_norm, trunc_normal_init_
from core.nn import swiglu_width as swiglu_intermediate_size  # noqa: F401
from core.ops import linear_chunks, rotate_half  # noqa: F401 (rotate_half: re-exported)

# what every attention layer of one forward gets: RoPE tables (cos, sin), None, or a variant's own positions (read by
# its own attention layer, IOStem.attention)
CosSin = Optional[Any]

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(name: str, device: Optional[torch.device | str] = None) -> torch.dtype:
    """Map a config dtype name to a torch dtype. ``"auto"`` = bfloat16 on a CUDA ``device``, else float32
    (docs/pitfalls.md, item 24): the device the model runs on, not whether the machine has a GPU (a CPU run on a
    GPU machine is fp32, as on any CPU)."""
    if name == "auto":
        return torch.bfloat16 if device is not None and torch.device(device).type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"forward_dtype must be one of {['auto', *DTYPES]}, got {name!r}")
    return DTYPES[name]


# ----------------------------------------------------------------------------------------------
# Casted layers (fp32 master weights, compute in the input's dtype)
# ----------------------------------------------------------------------------------------------
class CastedLinear(nn.Module):
    """Linear layer with fp32 weights cast to the input dtype; truncated LeCun-normal init, zero bias."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            trunc_normal_init_(torch.empty(out_features, in_features), std=1.0 / math.sqrt(in_features))
        )
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(x.dtype), bias)

    def forward_chunks(self, x: torch.Tensor, sizes: Sequence[int]) -> Tuple[torch.Tensor, ...]:
        """``forward(x).split(sizes, -1)``, as one matmul per chunk on CPU (``core.ops.linear_chunks``)."""
        if self.bias is not None:
            return self.forward(x).split(list(sizes), dim=-1)
        return linear_chunks(x, self.weight.to(x.dtype), sizes)


class CastedEmbedding(nn.Module):
    """Embedding table in fp32, looked up and cast to ``cast_to``. The weight is named ``embedding_weight``
    (as in the published code, so original checkpoints map 1:1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, init_std: float, cast_to: torch.dtype) -> None:
        super().__init__()
        self.cast_to = cast_to
        self.embedding_weight = nn.Parameter(
            trunc_normal_init_(torch.empty(num_embeddings, embedding_dim), std=init_std)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding_weight.to(self.cast_to))


# ----------------------------------------------------------------------------------------------
# Positions
# ----------------------------------------------------------------------------------------------
class RotaryEmbedding(nn.Module):
    """RoPE tables ``(cos, sin)`` of shape [max_positions, dim] in the "rotate half" layout."""

    def __init__(self, dim: int, max_position_embeddings: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {dim}")
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        _set_rope_tables(self, torch.outer(torch.arange(max_position_embeddings, dtype=torch.float32), inv_freq))

    def forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.cos_cached, self.sin_cached


def _set_rope_tables(module: nn.Module, angles: torch.Tensor) -> None:
    """``cos_cached`` / ``sin_cached`` buffers of the angles [positions, dim / 2] in the "rotate half" layout."""
    angles = torch.cat((angles, angles), dim=-1)
    module.register_buffer("cos_cached", angles.cos(), persistent=False)
    module.register_buffer("sin_cached", angles.sin(), persistent=False)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k: [b, seq, heads, head_dim]; cos, sin: [seq, head_dim]. Computed in the tables' dtype (fp32)."""
    dtype = q.dtype
    q, k = q.to(cos.dtype), k.to(cos.dtype)
    # rotate_half(x) * sin == swap_halves(x) * (sin with its first half negated), bit for bit (the sign moves from
    # x to sin); one flip instead of two slices, a negation and a concatenation (and their backward)
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(-2)
    cos = cos.unsqueeze(-2)
    q_out = q * cos + _swap_halves(q) * sin
    k_out = k * cos + _swap_halves(k) * sin
    return q_out.to(dtype), k_out.to(dtype)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)


# ----------------------------------------------------------------------------------------------
# Attention / MLP / norm
# ----------------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Multi-head (optionally grouped-query) attention through SDPA; non-causal by default; no padding mask
    (parity with the published TRM, pitfall 22)."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_key_value_heads: int, causal: bool = False
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_key_value_heads = num_key_value_heads
        self.causal = causal
        self.qkv_proj = CastedLinear(hidden_size, (num_heads + 2 * num_key_value_heads) * head_dim, bias=False)
        self.o_proj = CastedLinear(num_heads * head_dim, hidden_size, bias=False)

    def rotate(
        self, cos_sin: CosSin, hidden_states: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """q, k [b, s, heads, head_dim] with their positions applied (RoPE tables, or none). ``hidden_states``:
        for a subclass whose rotation depends on them."""
        if cos_sin is not None:
            cos, sin = cos_sin
            s = q.shape[1]
            return apply_rotary_pos_emb(q, k, cos[:s], sin[:s])
        return q, k

    def forward(self, cos_sin: CosSin, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        hq, hkv = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        q, k, v = (t.view(b, s, -1, self.head_dim) for t in self.qkv_proj.forward_chunks(hidden_states, (hq, hkv, hkv)))
        q, k = self.rotate(cos_sin, hidden_states, q, k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, heads, s, d]
        if self.num_key_value_heads != self.num_heads:  # grouped-query attention: share each k/v head
            rep = self.num_heads // self.num_key_value_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))


class TransformerBlock(nn.Module):
    """Post-norm block: (attention | MLP over the sequence axis) then SwiGLU, each followed by RMSNorm.
    ``attention(hidden, head_dim, heads, kv_heads, causal=...)`` builds the attention layer (default
    :class:`Attention`; a variant passes its own, e.g. ``IOStem.attention``)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        expansion: float,
        rms_norm_eps: float,
        mlp_t: bool = False,
        total_seq_len: Optional[int] = None,
        attention: Optional[Callable[..., nn.Module]] = None,
    ) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
        self.use_mlp_t = mlp_t
        if mlp_t:
            if not total_seq_len:
                raise ValueError("mlp_t needs the total sequence length (seq_len + puzzle_emb_len)")
            self.mlp_t = SwiGLU(total_seq_len, expansion)
        else:
            self.self_attn = (attention or Attention)(
                hidden_size, hidden_size // num_heads, num_heads, num_heads, causal=False
            )
        self.mlp = SwiGLU(hidden_size, expansion)
        self.norm_eps = rms_norm_eps

    def forward(self, cos_sin: CosSin, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.use_mlp_t:
            h = hidden_states.transpose(1, 2)  # [b, hidden, seq]: mix along the sequence
            h = rms_norm(h + self.mlp_t(h), self.norm_eps)
            hidden_states = h.transpose(1, 2)
        else:
            hidden_states = rms_norm(hidden_states + self.self_attn(cos_sin, hidden_states), self.norm_eps)
        return rms_norm(hidden_states + self.mlp(hidden_states), self.norm_eps)


class ReasoningModule(nn.Module):
    """A stack of blocks applied to ``hidden + injection`` (input injection by addition)."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(
        self, hidden_states: torch.Tensor, input_injection: torch.Tensor, cos_sin: CosSin = None
    ) -> torch.Tensor:
        hidden_states = hidden_states + input_injection
        for layer in self.layers:
            hidden_states = layer(cos_sin, hidden_states)
        return hidden_states

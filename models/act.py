"""ACT (adaptive computation time) wrapper and the input/output stem shared by every architecture.

One ACT ``forward(carry, batch)`` is one supervision step:

1. :meth:`ACTModel.refill`: slots whose ``carry.halted`` is True get a fresh inner state (the initial states),
   ``steps = 0`` and their ``current_data`` replaced by the rows of ``batch``; other slots keep theirs.
2. :meth:`ACTModel.step`: the inner model runs once on ``current_data`` (optionally with an external
   ``prefix_context``), then the halting decision:
   * ``steps += 1``; a slot halts when ``steps >= halt_max_steps`` (forced);
   * in training (and ``halt_max_steps > 1``) it also halts when ``q_halt > 0`` (``no_ACT_continue=True``)
     or ``q_halt > q_continue``; exploration: with probability ``halt_exploration_prob`` a slot gets a random
     minimum step count in ``[2, halt_max_steps]`` before which it cannot halt;
   * in eval every slot runs ``halt_max_steps`` unless ``halt_early_in_eval`` (then Q-halting, no exploration).
   With ``no_ACT_continue=False`` the training step also returns ``target_q_continue`` (bootstrapped from a
   second, gradient-free inner pass on the new state, as in the published code).

Everything runs on tensors (no ``.item()``, no data-dependent Python branches), so ``torch.compile`` can
trace it; only ``self.training`` / config flags select code paths.

The config fields every architecture shares (:class:`ArchConfig`: the stem's sizes, positions, dtype, loss;
:class:`ACTArchConfig`: + halting) live here beside :class:`IOStem`, which reads them. A research variant
(``models/variants/``) changes the stem through its four hooks: :meth:`IOStem.build_positions`,
:meth:`IOStem.cos_sin`, :meth:`IOStem.token_embeddings` and :meth:`IOStem.attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional, Tuple

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from models.layers import (
    Attention,
    CastedEmbedding,
    CastedLinear,
    ReasoningModule,
    RotaryEmbedding,
    TransformerBlock,
    resolve_dtype,
)
from models.sparse_embedding import SparsePuzzleEmbedding

Batch = Dict[str, torch.Tensor]


@dataclass
class ACTCarry:
    """State carried between supervision steps (architecture.md §2)."""

    inner_carry: Any
    steps: torch.Tensor  # int32 [b]
    halted: torch.Tensor  # bool [b]
    current_data: Dict[str, torch.Tensor] = field(default_factory=dict)


class LossConfig(BaseModel):
    """The ``loss:`` section of an arch YAML (consumed by :func:`models.build_loss_head`)."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["ACTLossHead", "losses@ACTLossHead"] = "ACTLossHead"
    loss_type: Literal["softmax_cross_entropy", "stable_max_cross_entropy", "stablemax_cross_entropy"] = (
        "softmax_cross_entropy"
    )
    q_loss_weight: float = 0.5
    extra_loss_weights: Dict[str, float] = Field(default_factory=dict)


def head_dim_of(cfg) -> int:
    """``hidden_size / num_heads`` (raises when it does not divide): the width RoPE rotates."""
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"hidden_size ({cfg.hidden_size}) must be divisible by num_heads ({cfg.num_heads})")
    return cfg.hidden_size // cfg.num_heads


class ArchConfig(BaseModel):
    """Fields every architecture shares: the IOStem (embeddings, positions, heads), dtype and loss. Each registered
    architecture subclasses it with ``name: Literal[...]`` (models.registry)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    # optional statements about the data (checked against the dataset when the model is built, never stored)
    vocab_size: Optional[int] = Field(None, exclude=True)
    seq_len: Optional[int] = Field(None, exclude=True)

    hidden_size: int = Field(512, gt=0)
    num_heads: int = Field(8, gt=0)
    expansion: float = Field(4.0, gt=0)
    puzzle_emb_ndim: int = Field(512, ge=0)
    puzzle_emb_len: int = Field(16, ge=0)
    # rope: 1D RoPE over the flattened canvas (published TRM); learned: absolute embeddings; none (rope2d: removed,
    # models.legacy.REMOVED)
    pos_encodings: Literal["rope", "learned", "none"] = "rope"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    forward_dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    loss: LossConfig = Field(default_factory=LossConfig)

    def for_encoder(self, encoder_hidden_size: int) -> "ArchConfig":
        """This config as the core of an ETRM whose encoder has width ``encoder_hidden_size`` (a variant that
        reads the encoder's states fills its sizes here, ``models/variants/trm_views.py``; others: unchanged)."""
        return self

    @model_validator(mode="after")
    def _check_heads(self):
        """A clear ArchConfigError instead of a failure deep in model construction."""
        head_dim = head_dim_of(self)
        if self.pos_encodings == "rope" and head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got hidden_size/num_heads = {head_dim}")
        return self


class ACTArchConfig(ArchConfig):
    """A recurrent architecture with ACT halting."""

    halt_max_steps: int = Field(16, ge=1)
    halt_exploration_prob: float = Field(0.1, ge=0.0, le=1.0)
    halt_early_in_eval: bool = False
    no_ACT_continue: bool = True


def prefix_length(puzzle_emb_ndim: int, puzzle_emb_len: int, hidden_size: int) -> int:
    """Number of prefix positions: ``puzzle_emb_len`` if > 0, else ceil(puzzle_emb_ndim / hidden_size)."""
    return puzzle_emb_len if puzzle_emb_len > 0 else -(-puzzle_emb_ndim // hidden_size)


class IOStem(nn.Module):
    """Token/puzzle/position embeddings, LM head and Q head (submodule names as in the published code, so
    original checkpoints map 1:1). Subclasses add their reasoning modules and the carry methods
    (:class:`models.base.RecurrentInner` for the recurrent cores)."""

    # declared for models.etrm.ETRM: True for an inner whose forward reads the encoder's per-cell demo states
    # (``forward(..., memory=DemoMemory)``, models/variants/trm_memory.py)
    reads_memory: bool = False
    puzzle_emb: Optional[SparsePuzzleEmbedding]  # None with puzzle_emb_ndim = 0

    @property
    def aux_loss_weights(self) -> Dict[str, float]:
        """The per-sample terms the inner's forward returns as a fourth value (``{output key: weight}``; none here;
        trm_views' ``gather_fit``), for the loss head."""
        return {}

    def __init__(self, config, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int) -> None:
        """``config``: the arch config (an :class:`ArchConfig`); its stem fields set the embeddings/heads."""
        super().__init__()
        self.config = config
        hidden_size = config.hidden_size
        puzzle_emb_ndim, puzzle_emb_len = config.puzzle_emb_ndim, config.puzzle_emb_len
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.hidden_size = hidden_size
        self.forward_dtype_name = config.forward_dtype
        self.forward_dtype = resolve_dtype(config.forward_dtype, torch.get_default_device())  # "auto": see _apply
        self.puzzle_emb_ndim = puzzle_emb_ndim
        self.puzzle_emb_len = prefix_length(puzzle_emb_ndim, puzzle_emb_len, hidden_size)
        if puzzle_emb_ndim > self.puzzle_emb_len * hidden_size:
            raise ValueError(
                f"puzzle_emb_ndim={puzzle_emb_ndim} does not fit in puzzle_emb_len={self.puzzle_emb_len} "
                f"tokens of hidden_size={hidden_size}"
            )
        self.total_seq_len = seq_len + self.puzzle_emb_len
        self.pos_encodings = config.pos_encodings

        self.embed_scale = math.sqrt(hidden_size)
        self.embed_init_std = 1.0 / self.embed_scale
        self.embed_tokens = CastedEmbedding(
            vocab_size, hidden_size, init_std=self.embed_init_std, cast_to=self.forward_dtype
        )
        self.lm_head = CastedLinear(hidden_size, vocab_size, bias=False)
        self.q_head = CastedLinear(hidden_size, 2, bias=True)
        self.puzzle_emb = None
        if puzzle_emb_ndim > 0:
            self.puzzle_emb = SparsePuzzleEmbedding(
                num_puzzle_identifiers, puzzle_emb_ndim, batch_size=batch_size, init_std=0.0, cast_to=self.forward_dtype
            )
        self.build_positions(config)
        # Q head: zero weights, bias -5 (almost never halts early at the start of training).
        with torch.no_grad():
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5.0)  # type: ignore[union-attr]

    # -- the hooks a variant (models/variants/) overrides ---------------------------------------------
    def build_positions(self, config) -> None:
        """``rotary_emb`` (rope) or ``embed_pos`` (learned) of ``config.pos_encodings``."""
        head_dim = config.hidden_size // config.num_heads
        if self.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(head_dim, self.total_seq_len, base=config.rope_theta)
        elif self.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(
                self.total_seq_len, config.hidden_size, init_std=self.embed_init_std, cast_to=self.forward_dtype
            )
        elif self.pos_encodings != "none":
            raise ValueError(f"pos_encodings must be rope, learned or none, got {self.pos_encodings!r}")

    def cos_sin(self, inputs: torch.Tensor):
        """What every attention layer of this forward gets: the RoPE tables (rope) or None."""
        return self.rotary_emb() if self.pos_encodings == "rope" else None

    def token_embeddings(self, inputs: torch.Tensor) -> torch.Tensor:
        """[b, seq, hidden] embeddings of the tokens (before the prefix and the sqrt(hidden) scale)."""
        return self.embed_tokens(inputs.to(torch.int32))

    def blocks(self, n: int) -> ReasoningModule:
        """``n`` post-norm blocks of this model's width (the reasoning module of TRM, HRM's levels, the transformer
        baseline), each with :meth:`attention` (or, ``mlp_t``, an MLP over the sequence)."""
        cfg = self.config
        return ReasoningModule(
            [
                TransformerBlock(
                    cfg.hidden_size,
                    cfg.num_heads,
                    cfg.expansion,
                    cfg.rms_norm_eps,
                    mlp_t=getattr(cfg, "mlp_t", False),
                    total_seq_len=self.total_seq_len,
                    attention=self.attention,
                )
                for _ in range(n)
            ]
        )

    def attention(
        self, hidden_size: int, head_dim: int, num_heads: int, num_key_value_heads: int, causal: bool = False
    ) -> nn.Module:
        """The attention layer of every block (``models.layers.TransformerBlock(attention=...)``)."""
        return Attention(hidden_size, head_dim, num_heads, num_key_value_heads, causal=causal)

    # -------------------------------------------------------------------------------------------------
    def canvas_side(self, what: str) -> int:
        """The side of the square canvas (``seq_len`` = side * side); ``what`` needs one (named if not square)."""
        side = math.isqrt(self.seq_len)
        if side * side != self.seq_len:
            raise ValueError(f"{what} needs a square canvas, but the data's seq_len {self.seq_len} is not a square")
        return side

    def _apply(self, fn, *args, **kwargs):
        """``.to(device)`` / ``.cuda()`` / ``.cpu()``: ``forward_dtype: auto`` follows the device the weights
        move to (bf16 on CUDA, fp32 on CPU), here and in the embeddings that cast to it."""
        out = super()._apply(fn, *args, **kwargs)
        if self.forward_dtype_name == "auto":
            weight = next(self.parameters(), None)
            self.forward_dtype = resolve_dtype("auto", None if weight is None else weight.device)
            for m in self.modules():
                if hasattr(m, "cast_to"):
                    m.cast_to = self.forward_dtype
        return out

    def input_embeddings(
        self, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor, prefix_context: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """[b, P + seq, hidden] in ``forward_dtype``, scaled by sqrt(hidden).

        Prefix (P = ``puzzle_emb_len`` positions): ``prefix_context`` [b, P, hidden] when given (ETRM), else the
        puzzle embedding in the first ``ceil(puzzle_emb_ndim/hidden)`` positions and zeros after it (TRM: one
        learned token + 15 zero tokens), else zeros. The prefix goes through the same sqrt(hidden) scaling.
        """
        emb = self.token_embeddings(inputs)
        b = emb.shape[0]
        P = self.puzzle_emb_len
        if P > 0:
            if prefix_context is not None:
                if tuple(prefix_context.shape) != (b, P, self.hidden_size):
                    raise ValueError(
                        f"prefix_context must have shape {(b, P, self.hidden_size)} "
                        f"[batch, puzzle_emb_len, hidden_size], got {tuple(prefix_context.shape)}"
                    )
                prefix = prefix_context.to(emb.dtype)
            elif self.puzzle_emb_ndim > 0:
                pe = self.puzzle_emb(puzzle_identifiers)
                pad = P * self.hidden_size - pe.shape[-1]
                if pad > 0:
                    pe = F.pad(pe, (0, pad))
                prefix = pe.view(b, P, self.hidden_size).to(emb.dtype)
            else:
                prefix = emb.new_zeros(b, P, self.hidden_size)
            emb = torch.cat((prefix, emb), dim=-2)
        elif prefix_context is not None:
            raise ValueError("prefix_context was given but the model has puzzle_emb_len = 0")
        if self.pos_encodings == "learned":
            emb = 0.707106781 * (emb + self.embed_pos.embedding_weight.to(emb.dtype))  # keep the variance
        return self.embed_scale * emb

    def heads(self, z_H: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits [b, seq, vocab] without the prefix, q_halt [b] fp32, q_continue [b] fp32)."""
        logits = self.lm_head(z_H)[:, self.puzzle_emb_len :]
        q = self.q_head(z_H[:, 0]).to(torch.float32)
        return logits, q[..., 0], q[..., 1]


class ACTModel(nn.Module):
    """The ACT wrapper of an architecture's ``config`` and ``inner`` (an :class:`IOStem` with
    ``empty_carry(b, device)``, ``reset_carry(flag, carry)`` and
    ``forward(carry, data, prefix_context=None) -> (carry, logits, (q_halt, q_continue))``). An architecture's
    behaviour lives in its inner (and config); the ACT methods here are every model's, so models.etrm.ETRM, built
    from a core's config and inner, runs the core's step."""

    config: Any
    inner: IOStem

    def __init__(self, config: Any, inner: IOStem) -> None:
        super().__init__()
        self.config = config
        self.inner = inner
        self.halt_early_in_eval = bool(config.halt_early_in_eval)  # evaluators may flip this at run time

    # -- properties used by the loop / evaluators -------------------------------------------
    @property
    def halt_max_steps(self) -> int:
        return int(getattr(self.config, "halt_max_steps", 1))

    @property
    def puzzle_emb(self) -> Optional[SparsePuzzleEmbedding]:
        return self.inner.puzzle_emb

    @property
    def reads_memory(self) -> bool:
        """Whether the inner reads the demos' per-cell states (:attr:`IOStem.reads_memory`; ETRM passes them)."""
        return self.inner.reads_memory

    @property
    def aux_loss_weights(self) -> Dict[str, float]:
        """The inner's per-sample auxiliary loss terms and weights (:attr:`IOStem.aux_loss_weights`)."""
        return self.inner.aux_loss_weights

    @property
    def puzzle_emb_len(self) -> int:
        return self.inner.puzzle_emb_len

    @property
    def hidden_size(self) -> int:
        return self.inner.hidden_size

    # -- ACT interface -----------------------------------------------------------------------
    def initial_carry(self, batch: Batch) -> ACTCarry:
        b = batch["inputs"].shape[0]
        device = batch["inputs"].device
        return ACTCarry(
            inner_carry=self.inner.empty_carry(b, device),
            steps=torch.zeros(b, dtype=torch.int32, device=device),
            halted=torch.ones(b, dtype=torch.bool, device=device),
            current_data={k: torch.zeros_like(v) for k, v in batch.items() if isinstance(v, torch.Tensor)},
        )

    def refill(self, carry: ACTCarry, batch: Batch) -> ACTCarry:
        """Reset halted slots' state and steps, and take their data from ``batch``."""
        halted = carry.halted
        data = {}
        for k, v in carry.current_data.items():
            new = batch[k]
            data[k] = torch.where(halted.view((-1,) + (1,) * (new.ndim - 1)), new, v)
        return ACTCarry(
            inner_carry=self.inner.reset_carry(halted, carry.inner_carry),
            steps=torch.where(halted, torch.zeros_like(carry.steps), carry.steps),
            halted=halted,
            current_data=data,
        )

    def step(
        self, carry: ACTCarry, prefix_context: Optional[torch.Tensor] = None, memory: Any = None
    ) -> Tuple[ACTCarry, Dict[str, torch.Tensor]]:
        """Run one supervision step on an already refilled carry (see module docstring). ``memory``: the demos'
        per-cell states (``encoders.DemoMemory``) for an inner that reads them (``reads_memory``, ETRM only)."""
        extra = {} if memory is None else {"memory": memory}
        res = self.inner(carry.inner_carry, carry.current_data, prefix_context=prefix_context, **extra)
        inner_carry, logits, (q_halt, q_continue) = res[:3]
        outputs: Dict[str, torch.Tensor] = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}
        if len(res) > 3:  # an inner's per-sample auxiliary terms (e.g. trm_views' gather_fit), for the loss head
            outputs.update(res[3])
        cfg = self.config
        max_steps = self.halt_max_steps
        with torch.no_grad():
            steps = carry.steps + 1
            is_last = steps >= max_steps
            halted = is_last
            act = max_steps > 1 and (self.training or self.halt_early_in_eval)
            if act:
                if getattr(cfg, "no_ACT_continue", True):
                    halted = halted | (q_halt > 0)
                else:
                    halted = halted | (q_halt > q_continue)
                if self.training:
                    explore = torch.rand_like(q_halt) < cfg.halt_exploration_prob
                    min_steps = explore.to(steps.dtype) * torch.randint_like(steps, low=2, high=max_steps + 1)
                    halted = halted & (steps >= min_steps)
                    if not getattr(cfg, "no_ACT_continue", True):
                        _, _, (next_halt, next_cont) = self.inner(
                            inner_carry, carry.current_data, prefix_context=prefix_context, **extra
                        )[:3]
                        outputs["target_q_continue"] = torch.sigmoid(
                            torch.where(is_last, next_halt, torch.maximum(next_halt, next_cont))
                        )
        return ACTCarry(inner_carry, steps.to(torch.int32), halted, carry.current_data), outputs

    def forward(
        self, carry: ACTCarry, batch: Batch, prefix_context: Optional[torch.Tensor] = None
    ) -> Tuple[ACTCarry, Dict[str, torch.Tensor]]:
        """One supervision step: refill halted slots from ``batch``, then :meth:`step`.

        ``prefix_context`` must correspond to the *refilled* data (ETRM: call :meth:`refill`, encode
        ``carry.current_data``, then :meth:`step`)."""
        return self.step(self.refill(carry, batch), prefix_context=prefix_context)

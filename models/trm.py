"""Tiny Recursive Model (Jolicoeur-Martineau, 2025) with ACT halting and deep supervision.

One supervision step (``TRMInner.forward``), with ``x`` the input embedding (prefix + tokens), ``z_H`` the
answer state (y) and ``z_L`` the latent (z), a single 2-layer network ``L_level``::

    repeat H_cycles times (all but the last without gradient):
        repeat L_cycles times:  z_L = net(z_L + z_H + x)
        z_H = net(z_H + z_L)
    logits = lm_head(z_H)[prefix:],  (q_halt, q_continue) = q_head(z_H[:, 0])

The new carry is detached (no gradient between supervision steps). The initial states ``H_init`` / ``L_init``
are fixed random vectors (truncated normal, std 1) stored as persistent buffers, exactly as in the published
code (they receive no gradient there either, because the first H-1 cycles run without grad).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Literal, Optional, Tuple

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.act import ACTModel, IOStem, pointer_init
from models.layers import ReasoningModule, TransformerBlock, trunc_normal_init_


class LossConfig(BaseModel):
    """The ``loss:`` section of an arch YAML (consumed by :func:`models.build_loss_head`)."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["ACTLossHead", "losses@ACTLossHead"] = "ACTLossHead"
    loss_type: Literal["softmax_cross_entropy", "stable_max_cross_entropy", "stablemax_cross_entropy"] = "softmax_cross_entropy"
    q_loss_weight: float = 0.5
    extra_loss_weights: Dict[str, float] = Field(default_factory=dict)


def check_heads(cfg):
    """Config-level check (a clear ArchConfigError instead of a failure deep in model construction)."""
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"hidden_size ({cfg.hidden_size}) must be divisible by num_heads ({cfg.num_heads})")
    head_dim = cfg.hidden_size // cfg.num_heads
    if cfg.pos_encodings == "rope" and head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got hidden_size/num_heads = {head_dim}")
    if cfg.pos_encodings in ("rope2d", "pointer") and head_dim % 4:
        raise ValueError(f"2D RoPE (pos_encodings={cfg.pos_encodings}) needs a head dimension divisible by 4 (half of "
                         f"its frequency pairs turn with the row, half with the column), got hidden_size/num_heads = "
                         f"{head_dim}")
    if cfg.pos_encodings == "pointer" and head_dim < 8:
        raise ValueError(f"pointer RoPE (pos_encodings=pointer) needs a head dimension of at least 8, got "
                         f"hidden_size/num_heads = {head_dim}")
    if (cfg.pos_encodings == "pointer" and getattr(cfg, "pointer_source", "token") == "context"
            and cfg.puzzle_emb_len == 0 and cfg.puzzle_emb_ndim == 0):
        raise ValueError("pointer_source=context reads the pointers from the first context slot, but the model has "
                         "none (puzzle_emb_len = 0 and puzzle_emb_ndim = 0)")
    if cfg.pos_encodings != "pointer" and (getattr(cfg, "pointer_init", "identity") != "identity"
                                           or getattr(cfg, "pointer_source", "token") != "token"):
        raise ValueError(f"pointer_init / pointer_source apply to pos_encodings=pointer only, but pos_encodings is "
                         f"{cfg.pos_encodings!r}")
    if getattr(cfg, "context_broadcast", False) and cfg.puzzle_emb_len == 0 and cfg.puzzle_emb_ndim == 0:
        raise ValueError("context_broadcast=true adds the context slots to every token, but the model has none "
                         "(puzzle_emb_len = 0 and puzzle_emb_ndim = 0)")
    if cfg.pos_encodings == "pointer" and getattr(cfg, "mlp_t", False):
        raise ValueError("pos_encodings=pointer rotates attention queries, but mlp_t=true has no attention")
    return cfg


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
    # rope: 1D RoPE over the flattened canvas (published TRM); rope2d: RoPE over (row, column) of the square
    # canvas (docs/science.md: the spatial-rule ablation); pointer: 2D RoPE over grid-relative coordinates in which
    # each query points at the cell a learned, context-chosen linear map of its grid offsets names (models.layers.
    # PointerRoPE; docs/science.md, "Pointer RoPE"); learned: absolute embeddings; none.
    pos_encodings: Literal["rope", "rope2d", "pointer", "learned", "none"] = "rope"
    # add learned embeddings of each cell's offsets from its input grid's edges (models.layers.GridCoordEmbedding;
    # square canvas only; on top of pos_encodings; docs/science.md, "Grid-relative positions")
    grid_coords: bool = False
    # pos_encodings=pointer: where the heads' pointers start (identity: every head at its own cell, i.e. grid-relative
    # 2D RoPE; dihedral: head h at dihedral map h % 8, core.ops.DIHEDRAL_POINTERS); learned from there
    pointer_init: Literal["identity", "dihedral"] = "identity"
    # pos_encodings=pointer: what sets a query's pointer (token: its own hidden state; context: the first context
    # slot's, shared by every query of the sample; needs puzzle_emb_len >= 1)
    pointer_source: Literal["token", "context"] = "token"
    # add a learned projection of the context slots (the puzzle embedding / the encoder's context) to every grid
    # token's input embedding, so that each cell reads the rule directly at every recursion instead of only through
    # attention to the prefix; zero-initialised (a fresh model computes what it does without it); needs a prefix
    # (docs/science.md, "Broadcasting the context to every cell")
    context_broadcast: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    forward_dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    loss: LossConfig = Field(default_factory=LossConfig)

    @model_validator(mode="after")
    def _check_heads(self):
        return check_heads(self)


class _ArchBase(ArchConfig):
    """A recurrent architecture with ACT halting."""

    halt_max_steps: int = Field(16, ge=1)
    halt_exploration_prob: float = Field(0.1, ge=0.0, le=1.0)
    halt_early_in_eval: bool = False
    no_ACT_continue: bool = True


class TRMConfig(_ArchBase):
    """Validated ``arch`` config of TRM (unknown keys are errors)."""

    name: Literal["trm"] = "trm"
    H_cycles: int = Field(3, ge=1)
    L_cycles: int = Field(4, ge=1)
    L_layers: int = Field(2, ge=1)
    H_layers: int = Field(0, ge=0)  # accepted for command-line parity with the published code; unused by TRM
    mlp_t: bool = False


@dataclass
class TRMInnerCarry:
    z_H: torch.Tensor
    z_L: torch.Tensor


class TRMInner(IOStem):
    def __init__(self, config: TRMConfig, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int) -> None:
        super().__init__(config, vocab_size=vocab_size, seq_len=seq_len, num_puzzle_identifiers=num_puzzle_identifiers,
                         batch_size=batch_size)
        self.L_level = ReasoningModule([
            TransformerBlock(config.hidden_size, config.num_heads, config.expansion, config.rms_norm_eps,
                             mlp_t=config.mlp_t, total_seq_len=self.total_seq_len,
                             pointer=pointer_init(config))
            for _ in range(config.L_layers)])
        self.register_buffer("H_init", trunc_normal_init_(torch.empty(config.hidden_size), std=1.0), persistent=True)
        self.register_buffer("L_init", trunc_normal_init_(torch.empty(config.hidden_size), std=1.0), persistent=True)

    def empty_carry(self, batch_size: int, device: torch.device) -> TRMInnerCarry:
        shape = (batch_size, self.total_seq_len, self.hidden_size)
        return TRMInnerCarry(z_H=torch.zeros(shape, dtype=self.forward_dtype, device=device),
                             z_L=torch.zeros(shape, dtype=self.forward_dtype, device=device))

    def reset_carry(self, reset: torch.Tensor, carry: TRMInnerCarry) -> TRMInnerCarry:
        flag = reset.view(-1, 1, 1)
        return TRMInnerCarry(z_H=torch.where(flag, self.H_init.to(carry.z_H.dtype), carry.z_H),
                             z_L=torch.where(flag, self.L_init.to(carry.z_L.dtype), carry.z_L))

    def latent_recursion(self, z_H: torch.Tensor, z_L: torch.Tensor, x: torch.Tensor, cos_sin) -> Tuple[torch.Tensor, torch.Tensor]:
        """One outer cycle: L_cycles latent updates from (z_L, z_H + x), then the answer update from (z_H, z_L)."""
        for _ in range(self.config.L_cycles):
            z_L = self.L_level(z_L, z_H + x, cos_sin)
        z_H = self.L_level(z_H, z_L, cos_sin)
        return z_H, z_L

    def forward(self, carry: TRMInnerCarry, batch: Dict[str, torch.Tensor], prefix_context: Optional[torch.Tensor] = None):
        cos_sin = self.cos_sin(batch["inputs"])
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self.latent_recursion(z_H, z_L, x, cos_sin)
        z_H, z_L = self.latent_recursion(z_H, z_L, x, cos_sin)  # the only cycle with gradient
        logits, q_halt, q_continue = self.heads(z_H)
        return TRMInnerCarry(z_H=z_H.detach(), z_L=z_L.detach()), logits, (q_halt, q_continue)


class TRM(ACTModel):
    """TRM with the ACT wrapper (see :mod:`models.act`)."""

    def __init__(self, config: TRMConfig, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int) -> None:
        super().__init__()
        self.config = config
        self.inner = TRMInner(config, vocab_size=vocab_size, seq_len=seq_len,
                              num_puzzle_identifiers=num_puzzle_identifiers, batch_size=batch_size)
        self.halt_early_in_eval = config.halt_early_in_eval

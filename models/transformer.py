"""Plain (non-recurrent) transformer baseline on the same blocks and the same ACT interface.

The input embedding goes once through ``num_layers`` post-norm blocks; every sample halts after one step
(``halt_max_steps = 1``), so one ACT step = one ordinary forward pass. The Q head is kept (and trained by the
loss head's q_halt BCE) so that metrics and evaluators see the same outputs as for TRM/HRM.
"""
from __future__ import annotations

from typing import Dict, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.act import ACTModel, IOStem
from models.layers import ReasoningModule, TransformerBlock
from models.trm import LossConfig, check_heads


class TransformerConfig(BaseModel):
    """Validated ``arch`` config of the transformer baseline."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["transformer"] = "transformer"
    hidden_size: int = Field(512, gt=0)
    num_heads: int = Field(8, gt=0)
    expansion: float = Field(4.0, gt=0)
    num_layers: int = Field(8, ge=1)
    puzzle_emb_ndim: int = Field(512, ge=0)
    puzzle_emb_len: int = Field(16, ge=0)
    pos_encodings: Literal["rope", "learned", "none"] = "rope"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    mlp_t: bool = False
    forward_dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    loss: LossConfig = Field(default_factory=LossConfig)

    @property
    def halt_max_steps(self) -> int:
        return 1

    @model_validator(mode="after")
    def _check_heads(self):
        return check_heads(self)


class TransformerInner(IOStem):
    def __init__(self, config: TransformerConfig, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int) -> None:
        super().__init__(vocab_size=vocab_size, seq_len=seq_len, hidden_size=config.hidden_size, num_heads=config.num_heads,
                         num_puzzle_identifiers=num_puzzle_identifiers, batch_size=batch_size,
                         puzzle_emb_ndim=config.puzzle_emb_ndim, puzzle_emb_len=config.puzzle_emb_len,
                         pos_encodings=config.pos_encodings, rope_theta=config.rope_theta, forward_dtype=config.forward_dtype)
        self.config = config
        self.layers = ReasoningModule([TransformerBlock(config.hidden_size, config.num_heads, config.expansion,
                                                        config.rms_norm_eps, mlp_t=config.mlp_t,
                                                        total_seq_len=self.total_seq_len)
                                       for _ in range(config.num_layers)])

    def empty_carry(self, batch_size: int, device: torch.device) -> None:
        return None

    def reset_carry(self, reset: torch.Tensor, carry: None) -> None:
        return None

    def forward(self, carry: None, batch: Dict[str, torch.Tensor], prefix_context: Optional[torch.Tensor] = None):
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        z = self.layers(x, torch.zeros_like(x), self.cos_sin())
        logits, q_halt, q_continue = self.heads(z)
        return None, logits, (q_halt, q_continue)


class TransformerBaseline(ACTModel):
    def __init__(self, config: TransformerConfig, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int) -> None:
        super().__init__()
        self.config = config
        self.inner = TransformerInner(config, vocab_size=vocab_size, seq_len=seq_len,
                                      num_puzzle_identifiers=num_puzzle_identifiers, batch_size=batch_size)

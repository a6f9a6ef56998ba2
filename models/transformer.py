"""Plain (non-recurrent) transformer baseline on the same blocks and the same ACT interface.

The input embedding goes once through ``num_layers`` post-norm blocks; every sample halts after one step
(``halt_max_steps = 1``), so one ACT step = one ordinary forward pass. The Q head is kept (and trained by the
loss head's q_halt BCE) so that metrics and evaluators see the same outputs as for TRM/HRM.
"""

from __future__ import annotations

from typing import Dict, Literal, Optional

import torch
from pydantic import Field

from models.act import ArchConfig, IOStem
from models.base import ACTCore


class TransformerConfig(ArchConfig):
    """Validated ``arch`` config of the transformer baseline."""

    name: Literal["transformer"] = "transformer"
    num_layers: int = Field(8, ge=1)
    mlp_t: bool = False

    @property
    def halt_max_steps(self) -> int:
        return 1

    @property
    def halt_early_in_eval(self) -> bool:
        return False  # one step: nothing to halt early


class TransformerInner(IOStem):
    def __init__(self, config: TransformerConfig, **sizes) -> None:
        """``sizes``: ``vocab_size``, ``seq_len``, ``num_puzzle_identifiers``, ``batch_size`` (see IOStem)."""
        super().__init__(config, **sizes)
        self.layers = self.blocks(config.num_layers)

    def empty_carry(self, batch_size: int, device: torch.device) -> None:
        return None

    def reset_carry(self, reset: torch.Tensor, carry: None) -> None:
        return None

    def forward(self, carry: None, batch: Dict[str, torch.Tensor], prefix_context: Optional[torch.Tensor] = None):
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        z = self.layers(x, torch.zeros_like(x), self.cos_sin(batch["inputs"]))
        logits, q_halt, q_continue = self.heads(z)
        return None, logits, (q_halt, q_continue)


class TransformerBaseline(ACTCore):
    inner_cls = TransformerInner

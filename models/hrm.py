"""Hierarchical Reasoning Model (Wang et al., 2025) on the shared blocks and ACT wrapper.

Two recurrent modules: a low-level ``L_level`` (``L_layers`` blocks) updated ``L_cycles`` times per high-level
step from ``(z_L, z_H + x)``, and a high-level ``H_level`` (``H_layers`` blocks) updated once per cycle from
``(z_H, z_L)``. One-step gradient approximation: every update runs without gradient except the very last
L update and the very last H update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Literal, Optional

import torch
from pydantic import Field

from models.act import ACTArchConfig, ACTModel, IOStem
from models.layers import trunc_normal_init_


class HRMConfig(ACTArchConfig):
    """Validated ``arch`` config of HRM (published ARC settings as defaults)."""

    name: Literal["hrm"] = "hrm"
    H_cycles: int = Field(2, ge=1)
    L_cycles: int = Field(2, ge=1)
    H_layers: int = Field(4, ge=1)
    L_layers: int = Field(4, ge=1)
    puzzle_emb_len: int = Field(0, ge=0)  # 0 = ceil(puzzle_emb_ndim / hidden_size) tokens, as in HRM
    no_ACT_continue: bool = False  # HRM trains the Q-continue head with the bootstrapped target


@dataclass
class HRMInnerCarry:
    z_H: torch.Tensor
    z_L: torch.Tensor


class HRMInner(IOStem):
    def __init__(
        self, config: HRMConfig, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int
    ) -> None:
        super().__init__(
            config,
            vocab_size=vocab_size,
            seq_len=seq_len,
            num_puzzle_identifiers=num_puzzle_identifiers,
            batch_size=batch_size,
        )
        self.H_level = self.blocks(config.H_layers)
        self.L_level = self.blocks(config.L_layers)
        self.register_buffer("H_init", trunc_normal_init_(torch.empty(config.hidden_size), std=1.0), persistent=True)
        self.register_buffer("L_init", trunc_normal_init_(torch.empty(config.hidden_size), std=1.0), persistent=True)

    def empty_carry(self, batch_size: int, device: torch.device) -> HRMInnerCarry:
        shape = (batch_size, self.total_seq_len, self.hidden_size)
        return HRMInnerCarry(
            z_H=torch.zeros(shape, dtype=self.forward_dtype, device=device),
            z_L=torch.zeros(shape, dtype=self.forward_dtype, device=device),
        )

    def reset_carry(self, reset: torch.Tensor, carry: HRMInnerCarry) -> HRMInnerCarry:
        flag = reset.view(-1, 1, 1)
        return HRMInnerCarry(
            z_H=torch.where(flag, self.H_init.to(carry.z_H.dtype), carry.z_H),
            z_L=torch.where(flag, self.L_init.to(carry.z_L.dtype), carry.z_L),
        )

    def forward(
        self, carry: HRMInnerCarry, batch: Dict[str, torch.Tensor], prefix_context: Optional[torch.Tensor] = None
    ):
        cos_sin = self.cos_sin(batch["inputs"])
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        z_H, z_L = carry.z_H, carry.z_L
        H, L = self.config.H_cycles, self.config.L_cycles
        with torch.no_grad():
            for h in range(H):
                for l in range(L):
                    if not (h == H - 1 and l == L - 1):
                        z_L = self.L_level(z_L, z_H + x, cos_sin)
                if h != H - 1:
                    z_H = self.H_level(z_H, z_L, cos_sin)
        z_L = self.L_level(z_L, z_H + x, cos_sin)  # one-step gradient
        z_H = self.H_level(z_H, z_L, cos_sin)
        logits, q_halt, q_continue = self.heads(z_H)
        return HRMInnerCarry(z_H=z_H.detach(), z_L=z_L.detach()), logits, (q_halt, q_continue)


class HRM(ACTModel):
    def __init__(
        self, config: HRMConfig, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int
    ) -> None:
        super().__init__()
        self.config = config
        self.inner = HRMInner(
            config,
            vocab_size=vocab_size,
            seq_len=seq_len,
            num_puzzle_identifiers=num_puzzle_identifiers,
            batch_size=batch_size,
        )
        self.halt_early_in_eval = config.halt_early_in_eval

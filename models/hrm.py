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

from models.act import ACTArchConfig
from models.base import ACTCore, LatentCarry, RecurrentInner


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
class HRMInnerCarry(LatentCarry):
    """(z_H, z_L) of HRM (the class name its checkpoints' carry stores)."""


class HRMInner(RecurrentInner):
    carry_cls = HRMInnerCarry

    def build_levels(self, config: HRMConfig) -> None:
        self.H_level = self.blocks(config.H_layers)
        self.L_level = self.blocks(config.L_layers)

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


class HRM(ACTCore):
    inner_cls = HRMInner

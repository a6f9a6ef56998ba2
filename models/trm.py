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

The network is the paper's (models/layers.py): post-norm blocks with weight-free RMSNorm, a SwiGLU MLP,
attention with RoPE (or learned positions; ``mlp_t``: an MLP over the sequence axis instead, for Sudoku), the
input stem of :class:`models.act.IOStem` (token embedding, learned puzzle-embedding prefix, LM head, Q head on
the first position). Research variants subclass ``TRMConfig`` / ``TRMInner`` / ``TRM`` in ``models/variants/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Literal, Optional, Tuple

import torch
from pydantic import Field

from models.act import ACTArchConfig
from models.base import ACTCore, LatentCarry, RecurrentInner


class TRMConfig(ACTArchConfig):
    """Validated ``arch`` config of TRM (unknown keys are errors); the stem's fields are ``models.act.ArchConfig``'s
    (sizes, puzzle embedding, positions, dtype, loss) and ``ACTArchConfig``'s (halting)."""

    name: Literal["trm"] = "trm"
    H_cycles: int = Field(3, ge=1)
    L_cycles: int = Field(4, ge=1)
    L_layers: int = Field(2, ge=1)
    H_layers: int = Field(0, ge=0)  # accepted for command-line parity with the published code; unused by TRM
    mlp_t: bool = False


@dataclass
class TRMInnerCarry(LatentCarry):
    """(z_H, z_L) of TRM (the class name its checkpoints' carry stores)."""


class TRMInner(RecurrentInner):
    carry_cls = TRMInnerCarry

    def build_levels(self, config: TRMConfig) -> None:
        self.L_level = self.blocks(config.L_layers)  # the one network of both updates

    def latent_recursion(
        self, z_H: torch.Tensor, z_L: torch.Tensor, x: torch.Tensor, cos_sin
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """One outer cycle: L_cycles latent updates from (z_L, z_H + x), then the answer update from (z_H, z_L)."""
        for _ in range(self.config.L_cycles):
            z_L = self.L_level(z_L, z_H + x, cos_sin)
        z_H = self.L_level(z_H, z_L, cos_sin)
        return z_H, z_L

    def forward(
        self, carry: TRMInnerCarry, batch: Dict[str, torch.Tensor], prefix_context: Optional[torch.Tensor] = None
    ):
        cos_sin = self.cos_sin(batch["inputs"])
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self.latent_recursion(z_H, z_L, x, cos_sin)
        z_H, z_L = self.latent_recursion(z_H, z_L, x, cos_sin)  # the only cycle with gradient
        logits, q_halt, q_continue = self.heads(z_H)
        return TRMInnerCarry(z_H=z_H.detach(), z_L=z_L.detach()), logits, (q_halt, q_continue)


class TRM(ACTCore):
    """TRM with the ACT wrapper (see :mod:`models.act`). A variant sets ``inner_cls`` (models/variants/)."""

    inner_cls = TRMInner

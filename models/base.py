"""The base every architecture shares (TRM, HRM, the transformer baseline; TRM's variants through TRM):
:class:`ACTCore`, the ACT model built from its config and ``inner_cls``, and :class:`RecurrentInner`, the inner
model of a recurrent core (the stem of :class:`models.act.IOStem`, its reasoning modules, the states z_H / z_L and
their reset)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.act import ACTModel, IOStem
from models.layers import trunc_normal_init_


class ACTCore(ACTModel):
    """An architecture built from its config: ``inner_cls(config, **sizes)`` in the ACT wrapper (TRM, HRM, the
    transformer baseline; a variant sets its own ``inner_cls``). The core an ETRM wraps."""

    inner_cls: type  # an IOStem subclass

    def __init__(self, config, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int) -> None:
        inner = self.inner_cls(
            config,
            vocab_size=vocab_size,
            seq_len=seq_len,
            num_puzzle_identifiers=num_puzzle_identifiers,
            batch_size=batch_size,
        )
        super().__init__(config, inner)


@dataclass
class LatentCarry:
    """The recurrent state of :class:`RecurrentInner`: the answer state ``z_H`` and the latent ``z_L``, each
    [b, P + seq, hidden] (each model keeps its own subclass: the class name a checkpoint's carry stores)."""

    z_H: torch.Tensor
    z_L: torch.Tensor


class RecurrentInner(IOStem):
    """The inner model of a recurrent core (TRM, HRM): the stem, the reasoning modules :meth:`build_levels` creates,
    and the two states (z_H, z_L) of ``carry_cls``, which a slot taking new data resets to the fixed random
    vectors ``H_init`` / ``L_init`` (truncated normal, std 1, persistent buffers, no gradient; as published)."""

    carry_cls = LatentCarry

    def __init__(self, config, **sizes) -> None:
        """``sizes``: ``vocab_size``, ``seq_len``, ``num_puzzle_identifiers``, ``batch_size`` (see :class:`IOStem`)."""
        super().__init__(config, **sizes)
        self.build_levels(config)  # before the initial states: the initialisation order of the published models
        self.register_buffer("H_init", trunc_normal_init_(torch.empty(config.hidden_size), std=1.0), persistent=True)
        self.register_buffer("L_init", trunc_normal_init_(torch.empty(config.hidden_size), std=1.0), persistent=True)

    def build_levels(self, config) -> None:
        """Create the reasoning modules (``self.blocks(n)``)."""
        raise NotImplementedError

    def empty_carry(self, batch_size: int, device: torch.device) -> LatentCarry:
        shape = (batch_size, self.total_seq_len, self.hidden_size)
        return self.carry_cls(
            z_H=torch.zeros(shape, dtype=self.forward_dtype, device=device),
            z_L=torch.zeros(shape, dtype=self.forward_dtype, device=device),
        )

    def reset_carry(self, reset: torch.Tensor, carry: LatentCarry) -> LatentCarry:
        flag = reset.view(-1, 1, 1)
        return self.carry_cls(
            z_H=torch.where(flag, self.H_init.to(carry.z_H.dtype), carry.z_H),
            z_L=torch.where(flag, self.L_init.to(carry.z_L.dtype), carry.z_L),
        )

"""The module interface every demonstration encoder implements (docs/architecture.md §3)::

    encoder(demo_inputs [b, D, S] int, demo_labels [b, D, S] int, demo_mask [b, D] bool, state=None)
        -> EncoderOutput(context [b, puzzle_emb_len, hidden], kl [b] | None, state | None, memory | None)

``memory`` (:class:`DemoMemory`): the per-cell states of the demonstrations before any pooling, for a core that
reads them cell by cell (``arch=trm_memory``, models/variants/trm_views.py); given by the encoders whose
``capabilities.gives_memory`` is True.

What an encoder does beyond that call is declared, not probed: :class:`EncoderCapabilities` (``encoder.capabilities``,
fixed at construction from the config by the encoder class's :meth:`DemoEncoder.declare`), which models.etrm.ETRM
and the evaluators read.

Padding rules (pitfall 16): PAD tokens (id 0) inside a demo are never attended to and never pooled;
demo slots with ``demo_mask == False`` (or containing only PAD) are skipped entirely (never encoded);
a sample with no demo at all gets a well-defined context (no NaN).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .config import BaseEncoderConfig
from .probes import attach_probes


@dataclass
class DemoMemory:
    """Every token of every demo slot of a sample, unpooled: ``states`` [b, D*T, d] (the encoder's width), ``mask``
    [b, D*T] (False for PAD cells, the tokens of empty demo slots and a CLS token), ``demo`` [D*T] (the demo slot of
    each position: slot j's tokens are positions ``j*T .. j*T + T - 1``) and ``cell`` [b, D*T] (the canvas cell of
    each token: with the aligned pair layout a token holds the input and the output colour of that cell; 0 where
    masked)."""

    states: torch.Tensor
    mask: torch.Tensor
    demo: torch.Tensor
    cell: torch.Tensor

    @classmethod
    def from_cell_tokens(cls, states: torch.Tensor, mask: torch.Tensor, cells: torch.Tensor, num_demos: int):
        """The memory of :meth:`encoders.trunk.DemoTrunk.cell_tokens`' output (aligned layout)."""
        T = states.shape[1] // num_demos
        demo = torch.arange(num_demos * T, device=states.device) // T
        return cls(states, mask & (cells >= 0), demo, cells.clamp_min(0))

    @classmethod
    def empty(cls, batch: int, width: int, device, dtype=torch.float32) -> "DemoMemory":
        """No demo cell at all (every key masked): what a core reads when it is told the rule instead."""
        return cls(
            torch.zeros(batch, 1, width, device=device, dtype=dtype),
            torch.zeros(batch, 1, dtype=torch.bool, device=device),
            torch.zeros(1, dtype=torch.long, device=device),
            torch.zeros(batch, 1, dtype=torch.long, device=device),
        )


@dataclass(frozen=True)
class EncoderCapabilities:
    """What an encoder does beyond ``forward -> context``: declared by each encoder class for its config
    (:meth:`DemoEncoder.declare`), read by models.etrm.ETRM instead of probing attributes."""

    recurrent: bool = False  # keeps a state z_E across ACT steps: initial_state() and EncoderOutput.state
    gives_kl: bool = False  # forward returns a per-sample KL (EncoderOutput.kl)
    kl_weight: float = 0.0  # the KL's weight in the loss (0 = not added)
    gives_memory: bool = False  # demo_memory() gives the per-cell demo states (one token per cell: pair_layout aligned)
    latent_search: bool = False  # encode_latent / context_from_latent: test-time latent search (models.latent_search)
    search_steps: int = 0  # the latent search the config asks for at evaluation (0 = off)
    search_lr: float = 0.1
    # the science probes of every encoder (encoders.probes; from the ProbeConfig fields, set by DemoEncoder)
    rule_readout: float = 0.0  # weight of the rule-readout loss (``rule_head``; 0 = no head)
    rule_oracle: bool = False  # the context is told by ``rule_oracle`` (the encoder does not run)

    def __post_init__(self):
        if self.kl_weight > 0 and not self.gives_kl:
            raise ValueError(f"kl_weight={self.kl_weight} declared by an encoder that gives no KL")
        if self.search_steps > 0 and not self.latent_search:
            raise ValueError(f"search_steps={self.search_steps} declared by an encoder without latent search")


@dataclass
class EncoderOutput:
    context: torch.Tensor  # [b, puzzle_emb_len, hidden]
    kl: Optional[torch.Tensor] = None  # [b] per-sample KL (unweighted), variational encoders only
    state: Optional[torch.Tensor] = None  # recurrent encoders: new z_E (NOT detached)
    memory: Optional[DemoMemory] = None  # per-cell demo states (encoders with capabilities.gives_memory)


class DemoEncoder(nn.Module):
    """Base class of every encoder module. Holds the config and the sizes it was built for, its declared
    :class:`EncoderCapabilities` (``capabilities``), the science probes of its config (``rule_head`` /
    ``rule_oracle``, encoders.probes; None when off) and ``head``, the :class:`encoders.heads.ContextHead` that
    every encoder's context comes out of."""

    registry_name: str = "?"
    head: nn.Module  # encoders.heads.ContextHead, set by each encoder
    capabilities: EncoderCapabilities

    def __init__(self, cfg: BaseEncoderConfig, *, hidden_size: int, vocab_size: int, seq_len: int, puzzle_emb_len: int):
        super().__init__()
        self.cfg = cfg
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.puzzle_emb_len = puzzle_emb_len
        self.capabilities = dataclasses.replace(
            type(self).declare(cfg), rule_readout=float(cfg.rule_readout), rule_oracle=bool(cfg.oracle_context)
        )
        attach_probes(self, cfg, puzzle_emb_len, hidden_size)

    @classmethod
    def declare(cls, cfg: BaseEncoderConfig) -> EncoderCapabilities:
        """The capabilities of this encoder class built from ``cfg`` (each encoder declares its own; the probe
        fields are filled from the config by :meth:`__init__`)."""
        raise NotImplementedError(f"encoder {cls.__name__} declares no capabilities (DemoEncoder.declare)")

    def context_gain(self) -> Optional[float]:
        """The learned scale of the context (``context_scale``: scalar -> the scale, gate -> the mean gate; None
        for the others), logged as ``train/encoder_context_scale``."""
        return self.head.learned_gain()

    @staticmethod
    def _check_inputs(demo_inputs, demo_labels, demo_mask):
        if demo_inputs.shape != demo_labels.shape or demo_inputs.dim() != 3:
            raise ValueError(
                f"demo_inputs {tuple(demo_inputs.shape)} and demo_labels {tuple(demo_labels.shape)} "
                f"must both be [batch, max_demos, seq]"
            )
        if tuple(demo_mask.shape) != tuple(demo_inputs.shape[:2]):
            raise ValueError(
                f"demo_mask {tuple(demo_mask.shape)} must be [batch, max_demos] = {tuple(demo_inputs.shape[:2])}"
            )

    def keys_and_memory(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor):
        """What the trunk's aggregation attends over (:meth:`encoders.trunk.DemoTrunk.keys`) and, when those keys are
        every demo cell (``aggregation: tokens``, aligned), the memory made of them (else None): (keys, mask,
        memory)."""
        if (
            self.cfg.aggregation == "tokens" and self.capabilities.gives_memory
        ):  # the keys are the memory: no extra pass
            keys, mask, cells = self.trunk.cell_tokens(demo_inputs, demo_labels, demo_mask)
            return keys, mask, DemoMemory.from_cell_tokens(keys, mask, cells, demo_inputs.shape[1])
        return (*self.trunk.keys(demo_inputs, demo_labels, demo_mask), None)

    def demo_memory(self, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor) -> DemoMemory:
        """The trunk's per-cell states of every demo (:meth:`encoders.trunk.DemoTrunk.cell_tokens`). An extra trunk
        pass: the encoders whose forward already attends over every token (``aggregation: tokens``: standard,
        variational) put it in :attr:`EncoderOutput.memory` themselves."""
        return DemoMemory.from_cell_tokens(
            *self.trunk.cell_tokens(demo_inputs, demo_labels, demo_mask), demo_inputs.shape[1]
        )

    def initial_state(self, batch_size: int, device) -> Optional[torch.Tensor]:
        return None

    def forward(
        self,
        demo_inputs: torch.Tensor,
        demo_labels: torch.Tensor,
        demo_mask: torch.Tensor,
        state: Optional[torch.Tensor] = None,
    ) -> EncoderOutput:  # pragma: no cover - abstract
        raise NotImplementedError

"""`recurrent` encoder (ETRM^2): keeps a latent z_E [b, Q, d] across ACT steps. Every call refines z_E
``encoder_refinement_steps`` times by cross-attending to the (re-encoded) demos, then projects it to the
context. The returned state is NOT detached (pitfall 1): the ETRM wrapper detaches it only when storing it in
the carry, and resets it to ``initial_state`` when the sample halts."""

from __future__ import annotations

from typing import Literal, Optional

import pydantic
import torch
from torch import nn

from core.nn import trunc_normal_init_

from .config import ENCODER_REGISTRY, BaseEncoderConfig
from .heads import ContextHead
from .interface import DemoEncoder, EncoderCapabilities, EncoderOutput
from .layers import Block
from .trunk import DemoTrunk


class RecurrentEncoderConfig(BaseEncoderConfig):
    name: Literal["recurrent"] = "recurrent"
    aggregation: Literal["cross_attention", "mean", "tokens"] = "tokens"
    encoder_refinement_steps: int = pydantic.Field(2, ge=1)

    @pydantic.model_validator(mode="after")
    def _refuse_unused(self):
        # pitfall 8: the demos are aggregated by z_E's own cross-attention (over the pooled demos, or over every
        # demo token with aggregation: tokens); a masked mean is not available
        if self.aggregation not in ("cross_attention", "tokens"):
            raise ValueError(
                f"encoder recurrent: aggregation={self.aggregation!r} is not used (z_E cross-attends to "
                f"the pooled demos, or to every demo token with aggregation: tokens); remove it"
            )
        return self


@ENCODER_REGISTRY.register("recurrent", config=RecurrentEncoderConfig)
class RecurrentEncoder(DemoEncoder):
    @classmethod
    def declare(cls, cfg: RecurrentEncoderConfig) -> EncoderCapabilities:
        return EncoderCapabilities(recurrent=True, gives_memory=cfg.pair_layout == "aligned")

    def __init__(self, cfg: RecurrentEncoderConfig, **kw):
        super().__init__(cfg, **kw)
        d = cfg.hidden_size
        q = cfg.num_queries or self.puzzle_emb_len
        self.trunk = DemoTrunk(cfg, self.vocab_size, self.seq_len, pooling="mean")
        self.z_init = nn.Parameter(trunc_normal_init_(torch.empty(q, d), 1.0, std_of="normal"))
        self.null_key = nn.Parameter(trunc_normal_init_(torch.empty(1, d), 1.0, std_of="normal"))
        self.refine = Block(d, cfg.num_heads, cfg.expansion, cfg.norm_eps)
        self.head = ContextHead(cfg, d, q, self.hidden_size, self.puzzle_emb_len)

    def initial_state(self, batch_size: int, device=None) -> torch.Tensor:
        """Learned initial z_E, [b, Q, d] (carries gradient to ``z_init``)."""
        z = self.z_init.unsqueeze(0).expand(batch_size, -1, -1)
        return z if device is None else z.to(device)

    def forward(self, demo_inputs, demo_labels, demo_mask, state: Optional[torch.Tensor] = None) -> EncoderOutput:
        self._check_inputs(demo_inputs, demo_labels, demo_mask)
        b = demo_inputs.shape[0]
        demos, valid = self.trunk.keys(demo_inputs, demo_labels, demo_mask)
        z = self.initial_state(b) if state is None else state
        keys = torch.cat([self.null_key.unsqueeze(0).expand(b, -1, -1).to(demos.dtype), demos], dim=1)
        mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=valid.device), valid], dim=1)
        for _ in range(self.cfg.encoder_refinement_steps):
            z = self.refine(z, keys, mask)
        return EncoderOutput(context=self.head(z), state=z)

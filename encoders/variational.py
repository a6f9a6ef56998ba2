"""`variational` encoder: the standard trunk and aggregation, then a Gaussian bottleneck per context token
(reparameterised sample in training, mean in evaluation) and a per-sample KL to N(0, I)."""

from __future__ import annotations

from typing import Literal, Optional

import pydantic
import torch

from .config import ENCODER_REGISTRY, BaseEncoderConfig
from .heads import ContextHead, DemoAggregator, Gaussian
from .interface import DemoEncoder, EncoderCapabilities, EncoderOutput
from .trunk import DemoTrunk


class VariationalEncoderConfig(BaseEncoderConfig):
    name: Literal["variational"] = "variational"
    aggregation: Literal["cross_attention", "mean", "tokens"] = "tokens"
    latent_dim: int = pydantic.Field(64, gt=0)  # per context token
    kl_weight: float = pydantic.Field(1e-3, ge=0)


@ENCODER_REGISTRY.register("variational", config=VariationalEncoderConfig)
class VariationalEncoder(DemoEncoder):
    @classmethod
    def declare(cls, cfg: VariationalEncoderConfig) -> EncoderCapabilities:
        return EncoderCapabilities(gives_kl=True, kl_weight=cfg.kl_weight, gives_memory=cfg.pair_layout == "aligned")

    def __init__(self, cfg: VariationalEncoderConfig, **kw):
        super().__init__(cfg, **kw)
        q = cfg.num_queries or self.puzzle_emb_len
        self.trunk = DemoTrunk(cfg, self.vocab_size, self.seq_len, pooling="mean")
        self.aggregate = DemoAggregator(cfg, q)
        self.bottleneck = Gaussian(cfg.hidden_size, cfg.latent_dim)
        self.head = ContextHead(cfg, cfg.latent_dim, q, self.hidden_size, self.puzzle_emb_len)

    def forward(self, demo_inputs, demo_labels, demo_mask, state: Optional[torch.Tensor] = None) -> EncoderOutput:
        self._check_inputs(demo_inputs, demo_labels, demo_mask)
        demos, valid, memory = self.keys_and_memory(demo_inputs, demo_labels, demo_mask)
        z, kl = self.bottleneck(self.aggregate(demos, valid))
        return EncoderOutput(context=self.head(z), kl=kl, memory=memory)

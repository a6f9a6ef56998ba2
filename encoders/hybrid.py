"""`hybrid` encoder: per-demo encodings, self-attention across the demos of a sample (no demo position:
order-equivariant, masked), cross-attention aggregation, Gaussian bottleneck, projection to the context."""

from __future__ import annotations

from typing import Literal, Optional

import pydantic
import torch
from torch import nn

from .config import ENCODER_REGISTRY, BaseEncoderConfig
from .heads import ContextHead, DemoAggregator, Gaussian
from .interface import DemoEncoder, EncoderCapabilities, EncoderOutput
from .layers import Block
from .trunk import DemoTrunk


class HybridEncoderConfig(BaseEncoderConfig):
    name: Literal["hybrid"] = "hybrid"
    cross_demo_layers: int = pydantic.Field(1, ge=1)
    latent_dim: int = pydantic.Field(64, gt=0)
    kl_weight: float = pydantic.Field(1e-3, ge=0)


@ENCODER_REGISTRY.register("hybrid", config=HybridEncoderConfig)
class HybridEncoder(DemoEncoder):
    @classmethod
    def declare(cls, cfg: HybridEncoderConfig) -> EncoderCapabilities:
        return EncoderCapabilities(gives_kl=True, kl_weight=cfg.kl_weight, gives_memory=cfg.pair_layout == "aligned")

    def __init__(self, cfg: HybridEncoderConfig, **kw):
        super().__init__(cfg, **kw)
        q = cfg.num_queries or self.puzzle_emb_len
        d = cfg.hidden_size
        self.trunk = DemoTrunk(cfg, self.vocab_size, self.seq_len, pooling="mean")
        self.cross_demo = nn.ModuleList(
            Block(d, cfg.num_heads, cfg.expansion, cfg.norm_eps) for _ in range(cfg.cross_demo_layers)
        )
        self.aggregate = DemoAggregator(cfg, q)
        self.bottleneck = Gaussian(d, cfg.latent_dim)
        self.head = ContextHead(cfg, cfg.latent_dim, q, self.hidden_size, self.puzzle_emb_len)

    def forward(self, demo_inputs, demo_labels, demo_mask, state: Optional[torch.Tensor] = None) -> EncoderOutput:
        self._check_inputs(demo_inputs, demo_labels, demo_mask)
        demos, valid = self.trunk.keys(demo_inputs, demo_labels, demo_mask)
        # rows without any valid demo would have a fully masked attention row: let them attend to themselves
        # (their result is discarded by the masked aggregation below)
        key_mask = valid | ~valid.any(-1, keepdim=True)
        x = demos
        for blk in self.cross_demo:
            x = blk(x, key_mask=key_mask)
        x = torch.where(valid.unsqueeze(-1), x, torch.zeros_like(x))
        z, kl = self.bottleneck(self.aggregate(x, valid))
        return EncoderOutput(context=self.head(z), kl=kl)

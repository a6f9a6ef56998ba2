"""`standard` encoder: per-demo transformer (mean pooling over non-PAD tokens), order-invariant aggregation
across demos (learned queries cross-attending over every demo token by default, or over the pooled demos, or a
masked mean), linear projection to the context."""

from __future__ import annotations

from typing import Literal, Optional

import torch

from .config import ENCODER_REGISTRY, BaseEncoderConfig
from .heads import ContextHead, DemoAggregator
from .interface import DemoEncoder, EncoderCapabilities, EncoderOutput
from .trunk import DemoTrunk


class StandardEncoderConfig(BaseEncoderConfig):
    name: Literal["standard"] = "standard"
    aggregation: Literal["cross_attention", "mean", "tokens"] = "tokens"


@ENCODER_REGISTRY.register("standard", config=StandardEncoderConfig)
class StandardEncoder(DemoEncoder):
    trunk_cls = DemoTrunk  # a variant's trunk (encoders/dihedral_views.py)

    @classmethod
    def declare(cls, cfg: StandardEncoderConfig) -> EncoderCapabilities:
        return EncoderCapabilities(gives_memory=cfg.pair_layout == "aligned")

    def __init__(self, cfg: StandardEncoderConfig, **kw):
        super().__init__(cfg, **kw)
        q = cfg.num_queries or self.puzzle_emb_len
        self.trunk = self.trunk_cls(cfg, self.vocab_size, self.seq_len, pooling="mean")
        self.aggregate = DemoAggregator(cfg, q)
        self.head = ContextHead(cfg, cfg.hidden_size, q, self.hidden_size, self.puzzle_emb_len)

    def forward(self, demo_inputs, demo_labels, demo_mask, state: Optional[torch.Tensor] = None) -> EncoderOutput:
        self._check_inputs(demo_inputs, demo_labels, demo_mask)
        demos, valid, memory = self.keys_and_memory(demo_inputs, demo_labels, demo_mask)
        return EncoderOutput(context=self.head(self.aggregate(demos, valid)), memory=memory)

"""`lpn` encoder (Latent-Program-Network style): each demo pair -> one latent (CLS pooling), optionally
Gaussian per pair; latents averaged over the valid pairs; the mean latent is projected to the whole context.

Test-time latent search (evaluation option) lives in :mod:`models.latent_search`.
"""

from __future__ import annotations

from typing import Literal, Optional

import pydantic
import torch
from torch import nn

from .config import ENCODER_REGISTRY, BaseEncoderConfig
from .heads import ContextHead, Gaussian, masked_mean
from .interface import DemoEncoder, EncoderCapabilities, EncoderOutput
from .trunk import DemoTrunk


class LPNEncoderConfig(BaseEncoderConfig):
    name: Literal["lpn"] = "lpn"
    latent_dim: int = pydantic.Field(256, gt=0)
    variational: bool = False
    kl_weight: float = pydantic.Field(1e-4, ge=0)
    # test-time latent search defaults (used by encoders.latent_search when enabled at evaluation)
    search_steps: int = pydantic.Field(0, ge=0)
    search_lr: float = pydantic.Field(0.1, gt=0)

    @pydantic.model_validator(mode="after")
    def _refuse_unused(self):
        # pitfall 8: base-config keys this encoder never reads must not be silently ignored
        if self.aggregation != "cross_attention":
            raise ValueError(
                f"encoder lpn: aggregation={self.aggregation!r} is not used (lpn always takes the masked "
                f"mean of its pair latents); remove it"
            )
        if self.num_queries is not None:
            raise ValueError(
                f"encoder lpn: num_queries={self.num_queries} is not used (one latent is projected to "
                f"the whole context); remove it"
            )
        if not self.variational and self.kl_weight != type(self).model_fields["kl_weight"].default:
            raise ValueError(f"encoder lpn: kl_weight={self.kl_weight} has no effect without variational: true")
        return self


@ENCODER_REGISTRY.register("lpn", config=LPNEncoderConfig)
class LPNEncoder(DemoEncoder):
    @classmethod
    def declare(cls, cfg: LPNEncoderConfig) -> EncoderCapabilities:
        return EncoderCapabilities(
            gives_kl=cfg.variational,
            kl_weight=cfg.kl_weight if cfg.variational else 0.0,
            gives_memory=cfg.pair_layout == "aligned",
            latent_search=True,
            search_steps=cfg.search_steps,
            search_lr=cfg.search_lr,
        )

    def __init__(self, cfg: LPNEncoderConfig, **kw):
        super().__init__(cfg, **kw)
        self.trunk = DemoTrunk(cfg, self.vocab_size, self.seq_len, pooling="cls")
        if cfg.variational:
            self.bottleneck = Gaussian(cfg.hidden_size, cfg.latent_dim)
        else:
            self.to_latent = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.head = ContextHead(cfg, cfg.latent_dim, 1, self.hidden_size, self.puzzle_emb_len)

    def encode_latent(self, demo_inputs, demo_labels, demo_mask) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Mean latent over the valid pairs [b, latent] and the per-sample KL (mean over pairs) or None."""
        self._check_inputs(demo_inputs, demo_labels, demo_mask)
        pairs, valid = self.trunk(demo_inputs, demo_labels, demo_mask)
        if self.cfg.variational:
            z, kl_pair = self.bottleneck(pairs.flatten(0, 1))  # [b*D, latent], [b*D]
            z, kl_pair = z.view(*valid.shape, -1), kl_pair.view(valid.shape)
            kl = (kl_pair * valid).sum(-1) / valid.sum(-1).clamp_min(1)
        else:
            z, kl = self.to_latent(pairs), None
        return masked_mean(z, valid), kl

    def context_from_latent(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(z.unsqueeze(1))

    def forward(self, demo_inputs, demo_labels, demo_mask, state: Optional[torch.Tensor] = None) -> EncoderOutput:
        z, kl = self.encode_latent(demo_inputs, demo_labels, demo_mask)
        return EncoderOutput(context=self.context_from_latent(z), kl=kl)

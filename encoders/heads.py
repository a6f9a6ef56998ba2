"""From per-demo states to the decoder's context: the order-invariant aggregation across demos
(:class:`DemoAggregator`), the variational bottleneck (:class:`Gaussian`) and the projection to the context
(:class:`ContextHead`, with its optional learned scale, pitfall 10).

A sample with no demo at all gets a well-defined context: attention always has a learned "null" key, so no
attention row is ever fully masked and no NaN can appear (pitfall 16).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.nn import rms_norm, trunc_normal_init_

from .config import BaseEncoderConfig, EncoderConfigError
from .layers import Attention, swiglu


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x [b, D, ...] over D where mask [b, D]; zeros where no entry is valid."""
    m = mask.to(x.dtype).view(*mask.shape, *([1] * (x.dim() - 2)))
    return (x * m).sum(1) / m.sum(1).clamp_min(1.0)


class DemoAggregator(nn.Module):
    """Order-invariant aggregation of per-demo embeddings [b, D, d] (or, ``aggregation: tokens``, of every demo
    token [b, D*T, d] with its key mask) -> [b, Q, d].

    cross_attention: Q learned queries attend over the valid demos plus one learned null key (so a sample
    without demos is well defined; no attention row is ever fully masked); the attention output (not added to
    the queries, so the result is dominated by the demos, not by the query vectors) is normalised and refined by
    a residual SwiGLU. mean: masked mean of the demos, projected to Q tokens by one linear map.
    """

    def __init__(self, cfg: BaseEncoderConfig, num_queries: int):
        super().__init__()
        d = cfg.hidden_size
        self.mode = cfg.aggregation
        self.eps = cfg.norm_eps
        self.Q = num_queries
        if self.mode in ("cross_attention", "tokens"):
            self.queries = nn.Parameter(trunc_normal_init_(torch.empty(num_queries, d), 1.0, std_of="normal"))
            self.null_key = nn.Parameter(trunc_normal_init_(torch.empty(1, d), 1.0, std_of="normal"))
            self.attn = Attention(d, cfg.num_heads)
            self.mlp = swiglu(d, cfg.expansion)
        else:
            self.proj = nn.Linear(d, num_queries * d)

    def forward(self, demos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        b, d = demos.shape[0], demos.shape[-1]
        if self.mode == "mean":
            return rms_norm(self.proj(masked_mean(demos, valid)).view(b, self.Q, d), self.eps)
        q = self.queries.unsqueeze(0).expand(b, -1, -1).to(demos.dtype)
        keys = torch.cat([self.null_key.unsqueeze(0).expand(b, -1, -1).to(demos.dtype), demos], dim=1)
        mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=valid.device), valid], dim=1)
        x = rms_norm(self.attn(q, keys, mask), self.eps)
        return rms_norm(x + self.mlp(x), self.eps)


class ContextHead(nn.Module):
    """Projects encoder tokens [b, Q, d_in] to the decoder context [b, L, hidden], with optional
    learned scale / gate (pitfall 10)."""

    def __init__(self, cfg: BaseEncoderConfig, d_in: int, num_tokens: int, hidden_size: int, puzzle_emb_len: int):
        super().__init__()
        self.L, self.hidden = puzzle_emb_len, hidden_size
        if num_tokens not in (1, puzzle_emb_len):
            raise EncoderConfigError(
                f"encoder {cfg.name}: num_queries={num_tokens} must be 1 or equal to puzzle_emb_len={puzzle_emb_len}"
            )
        self.proj = nn.Linear(d_in, hidden_size * (puzzle_emb_len if num_tokens == 1 and puzzle_emb_len > 1 else 1))
        # The decoder multiplies its input embeddings (prefix included) by sqrt(hidden); initialise so that a
        # unit-RMS encoder state gives context entries of std 1/sqrt(hidden), i.e. the scale of the decoder's
        # own token embeddings (std 1 after that multiplication).
        trunc_normal_init_(self.proj.weight, 1.0 / math.sqrt(d_in * hidden_size), std_of="normal")
        nn.init.zeros_(self.proj.bias)
        self.mode = cfg.context_scale
        if self.mode == "scalar":
            self.scale = nn.Parameter(torch.tensor(float(cfg.context_scale_init)))
        elif self.mode == "gate":
            # sigmoid gate per context token, initialised so that sigmoid(g) = context_scale_init
            p = min(max(cfg.context_scale_init, 1e-4), 1 - 1e-4)
            self.gate = nn.Parameter(torch.full((puzzle_emb_len,), math.log(p / (1 - p))))
        elif self.mode == "norm":  # RMS context_scale_init / sqrt(hidden): RMS context_scale_init in the decoder
            self.norm_gain, self.eps = float(cfg.context_scale_init) / math.sqrt(hidden_size), cfg.norm_eps

    def learned_gain(self) -> "float | None":
        """The learned scale of the context: ``scalar`` -> the scale, ``gate`` -> the mean sigmoid gate; None for
        the modes without a learned one (none, norm)."""
        if self.mode == "scalar":
            return float(self.scale.detach())
        if self.mode == "gate":
            return float(torch.sigmoid(self.gate.detach()).mean())
        return None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        ctx = self.proj(z).reshape(z.shape[0], self.L, self.hidden)
        if self.mode == "scalar":
            ctx = ctx * self.scale
        elif self.mode == "gate":
            ctx = ctx * torch.sigmoid(self.gate).view(1, -1, 1).to(ctx.dtype)
        elif self.mode == "norm":
            ctx = rms_norm(ctx, self.eps) * self.norm_gain
        return ctx


class Gaussian(nn.Module):
    """Variational bottleneck: mean / log-variance heads, reparameterised sample in training, mean in eval.
    KL(q || N(0, I)) per sample = sum over every latent coordinate of the sample (pitfall 6)."""

    def __init__(self, d_in: int, latent: int, logvar_min: float = -10.0, logvar_max: float = 5.0):
        super().__init__()
        self.mu = nn.Linear(d_in, latent)
        self.logvar = nn.Linear(d_in, latent)
        nn.init.zeros_(self.logvar.weight)
        nn.init.constant_(self.logvar.bias, -2.0)
        self.lo, self.hi = logvar_min, logvar_max

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu = self.mu(x)
        logvar = self.logvar(x).clamp(self.lo, self.hi)
        if self.training:
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        else:
            z = mu
        return z, gaussian_kl(mu, logvar)


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Per-sample KL(N(mu, exp(logvar)) || N(0, I)) summed over all non-batch dims -> [b] (float32)."""
    mu, logvar = mu.float(), logvar.float()
    kl = 0.5 * (mu.square() + logvar.exp() - 1.0 - logvar)
    return kl.flatten(1).sum(-1)

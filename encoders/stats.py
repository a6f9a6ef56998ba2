"""Statistics of an encoder's context batch ``[b, L, H]`` (docs/metrics.md defines every number).

Computed OUTSIDE the compiled forward (pitfall 18), every ``diag_interval`` steps, by ``ETRM.diagnostics(outputs)``;
``training.health.HealthMonitor`` turns them into warnings / an early stop.
"""

from __future__ import annotations

from typing import Optional

import torch


def _select(context: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    if context.dim() != 3:
        raise ValueError(f"context must be [batch, tokens, hidden], got shape {tuple(context.shape)}")
    x = context.detach().float()
    if mask is not None:
        x = x[mask.bool().to(x.device)]
    return x


def cross_sample_var(context: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Variance across the samples of the batch (population variance, dim 0) of every context coordinate
    (token, feature), averaged over coordinates. 0 when every sample gets the same context."""
    x = _select(context, mask)
    if x.shape[0] < 2:
        return torch.zeros((), device=x.device)
    return x.var(dim=0, unbiased=False).mean()


def output_mean(context: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean of all context entries."""
    return _select(context, mask).mean()


def output_norm(context: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """L2 norm over the hidden dimension of each context token, averaged over samples and tokens."""
    return _select(context, mask).norm(dim=-1).mean()


def output_std(context: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Standard deviation (population) of all context entries of the batch pooled together."""
    return _select(context, mask).std(unbiased=False)


def token_std(context: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Std (population) across the L context tokens of one sample, per feature, averaged over samples and
    features. 0 when all context tokens of a sample are equal (e.g. one vector broadcast to every slot)."""
    x = _select(context, mask)
    if x.shape[1] < 2:
        return torch.zeros((), device=x.device)
    return x.std(dim=1, unbiased=False).mean()


def context_statistics(
    context: torch.Tensor, mask: Optional[torch.Tensor] = None, prefix: str = "train/"
) -> dict[str, float]:
    """All five context statistics as python floats, keyed by their metric names."""
    stats = {
        "encoder_cross_sample_var": cross_sample_var(context, mask),
        "encoder_output_mean": output_mean(context, mask),
        "encoder_output_norm": output_norm(context, mask),
        "encoder_output_std": output_std(context, mask),
        "encoder_token_std": token_std(context, mask),
    }
    return {prefix + k: float(v) for k, v in stats.items()}

"""Exponential moving average of the trainable weights.

``shadow = rate * shadow + (1 - rate) * param`` after every optimizer step. Only ``requires_grad``
parameters are averaged: buffers -- in particular the sparse puzzle-embedding table (pitfall 23) -- are
taken from the live model when the EMA copy is materialised.

Why not ``torch.optim.swa_utils.AveragedModel`` + ``get_ema_multi_avg_fn``: it keeps a deep copy of the whole
module, buffers included, although it averages only the parameters. Measured on the ARC TRM (6.83M trainable
parameters, 100k puzzle ids, CPU, one thread): AveragedModel's copy holds 233 MB (the puzzle-embedding table and
rotary caches) against 27 MB of fp32 shadows here, and its update takes 33.3 ms against 6.8 ms (one fused
``_foreach`` pair here); the averages agree to 1e-6. With ARC-AGI-1 + ConceptARC at 1000 augmentations (~900k
puzzle ids x 512) its copy would add ~1.8 GB.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)


class EMA:
    def __init__(self, model: nn.Module, rate: float = 0.999):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"ema_rate must be in [0, 1], got {rate}")
        self.rate = rate
        self.shadow: dict[str, torch.Tensor] = {
            n: p.detach().clone().float() for n, p in _unwrap(model).named_parameters() if p.requires_grad
        }

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        params = dict(_unwrap(model).named_parameters())
        names = list(self.shadow)
        shadows = [self.shadow[n] for n in names]
        live = [params[n].detach().float() for n in names]
        if not shadows:
            return
        torch._foreach_mul_(shadows, self.rate)
        torch._foreach_add_(shadows, live, alpha=1.0 - self.rate)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        params = dict(_unwrap(model).named_parameters())
        for n, s in self.shadow.items():
            params[n].copy_(s.to(params[n].dtype))

    def materialize(self, model: nn.Module) -> nn.Module:
        """A deep copy of ``model`` (uncompiled) with the EMA weights and the live buffers."""
        m = copy.deepcopy(_unwrap(model))
        self.copy_to(m)
        return m

    def state_dict(self) -> dict:
        return {"rate": self.rate, "shadow": {k: v.clone() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.shadow) ^ set(state["shadow"])
        if missing:
            raise KeyError(f"EMA state does not match the model; differing parameters: {sorted(missing)[:8]}")
        self.rate = float(state["rate"])
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)

"""Loss head for deep supervision with ACT (architecture.md §2).

Per sample ``i`` of the local batch (labels taken from the carry's *current* data, pitfall 5):

    lm_i      = mean over i's supervised tokens (label != -100) of the token cross-entropy
                (softmax, or stablemax computed in float64)
    q_halt_i  = BCE_with_logits(q_halt_logit_i, 1[every supervised token of i is predicted right])
    q_cont_i  = BCE_with_logits(q_continue_logit_i, target_q_continue_i)          (only if the model returns it)
    extra_i   = sum_k weight_k * outputs[k]_i                                      (e.g. ETRM's per-sample KL)

    loss = sum_i [ lm_i + q_loss_weight * (q_halt_i + q_cont_i) + extra_i ]        (a SUM over the local batch;
                                                                                   the loop divides by the global
                                                                                   batch size)
Metrics (all sums, tensors, no host sync):
    count, accuracy, exact_accuracy, q_halt_accuracy, steps  -- over halted samples with >= 1 supervised token
    lm_loss, q_halt_loss, [q_continue_loss], [<k>_loss]      -- sums over *all* samples of the local batch
                                                                (divide by the global batch size, as TRM does)
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_LABEL_ID = -100

LOSS_TYPES = ("softmax_cross_entropy", "stable_max_cross_entropy")
_ALIASES = {"stablemax_cross_entropy": "stable_max_cross_entropy"}


def stablemax(x: torch.Tensor) -> torch.Tensor:
    """s(x) = x + 1 for x >= 0, 1 / (1 - x) for x < 0 (both branches finite everywhere, so gradients are too)."""
    return torch.where(x >= 0, x.clamp(min=0) + 1.0, 1.0 / (1.0 - x.clamp(max=0)))


def log_stablemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    s = stablemax(x)
    return torch.log(s / s.sum(dim=dim, keepdim=True))


def stable_max_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_LABEL_ID
) -> torch.Tensor:
    """Token-wise stablemax cross-entropy in float64; 0 at ignored positions. Shape of ``labels``."""
    logp = log_stablemax(logits.to(torch.float64), dim=-1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, 0).to(torch.long)
    picked = torch.gather(logp, -1, safe.unsqueeze(-1)).squeeze(-1)
    return -torch.where(valid, picked, torch.zeros_like(picked))


def softmax_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_LABEL_ID
) -> torch.Tensor:
    """Token-wise softmax cross-entropy in float32; 0 at ignored positions. Shape of ``labels``."""
    return F.cross_entropy(
        logits.to(torch.float32).reshape(-1, logits.shape[-1]),
        labels.to(torch.long).reshape(-1),
        ignore_index=ignore_index,
        reduction="none",
    ).view(labels.shape)


def get_loss_fn(loss_type: str):
    name = _ALIASES.get(loss_type, loss_type)
    if name not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    return {"softmax_cross_entropy": softmax_cross_entropy, "stable_max_cross_entropy": stable_max_cross_entropy}[name]


class ACTLossHead(nn.Module):
    """Wraps an ACT model; ``forward(carry, batch, return_keys=()) -> (new_carry, loss, metrics, outputs, all_halted)``.

    ``extra_loss_weights``: {output key: weight}; each such key must be a per-sample tensor [b] in the model's
    outputs (e.g. ``{"kl": beta}`` for ETRM). Extra keyword arguments of ``forward`` go to the model.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_type: str = "softmax_cross_entropy",
        q_loss_weight: float = 0.5,
        extra_loss_weights: Optional[Mapping[str, float]] = None,
        name: str = "ACTLossHead",
    ) -> None:
        super().__init__()
        self.model = model
        self.loss_type = _ALIASES.get(loss_type, loss_type)
        self.loss_fn = get_loss_fn(loss_type)
        self.q_loss_weight = float(q_loss_weight)
        self.extra_loss_weights = dict(extra_loss_weights or {})

    def initial_carry(self, batch: Dict[str, torch.Tensor]):
        return self.model.initial_carry(batch)

    @property
    def extra_metric_keys(self) -> Tuple[str, ...]:
        """Per-sample outputs of the model that are logged as sums but not added to the loss."""
        return tuple(getattr(self.model, "extra_metric_keys", ()))

    @property
    def per_sample_keys(self) -> Tuple[str, ...]:
        """The metrics that are per-sample sums (averaged over every sample of a log window, not the halted)."""
        return (*self.extra_loss_weights, *self.extra_metric_keys)

    @property
    def puzzle_emb(self):
        return getattr(self.model, "puzzle_emb", None)

    def forward(
        self, carry: Any, batch: Dict[str, torch.Tensor], return_keys: Sequence[str] = (), **model_kwargs
    ) -> Tuple[Any, torch.Tensor, Dict[str, torch.Tensor], Dict[str, torch.Tensor], torch.Tensor]:
        new_carry, outputs = self.model(carry, batch, **model_kwargs)
        loss, metrics = self.compute(new_carry, outputs)
        returned = {k: outputs[k].detach() for k in return_keys if k in outputs}
        return new_carry, loss, metrics, returned, new_carry.halted.all()

    def compute(self, new_carry: Any, outputs: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """Loss and metrics of one ACT step given the model's new carry and outputs (adds ``outputs["preds"]``)."""
        labels = new_carry.current_data["labels"]
        logits = outputs["logits"]
        q_halt = outputs["q_halt_logits"]
        with torch.no_grad():
            preds = torch.argmax(logits, dim=-1)
            outputs["preds"] = preds
            mask = labels != IGNORE_LABEL_ID
            counts = mask.sum(-1)
            divisor = counts.clamp_min(1).unsqueeze(-1)
            correct = mask & (preds == labels)
            seq_correct = correct.sum(-1) == counts
            valid = new_carry.halted & (counts > 0)
            metrics: Dict[str, torch.Tensor] = {
                "count": valid.sum(),
                "accuracy": torch.where(valid, (correct.to(torch.float32) / divisor).sum(-1), 0.0).sum(),
                "exact_accuracy": (valid & seq_correct).sum(),
                "q_halt_accuracy": (valid & ((q_halt >= 0) == seq_correct)).sum(),
                "steps": torch.where(valid, new_carry.steps, 0).sum(),
            }
        lm_loss = (self.loss_fn(logits, labels, ignore_index=IGNORE_LABEL_ID) / divisor).sum()
        q_halt_loss = F.binary_cross_entropy_with_logits(q_halt, seq_correct.to(q_halt.dtype), reduction="sum")
        loss = lm_loss + self.q_loss_weight * q_halt_loss
        metrics["lm_loss"] = lm_loss.detach()
        metrics["q_halt_loss"] = q_halt_loss.detach()
        if "target_q_continue" in outputs:
            q_cont_loss = F.binary_cross_entropy_with_logits(
                outputs["q_continue_logits"], outputs["target_q_continue"], reduction="sum"
            )
            loss = loss + self.q_loss_weight * q_cont_loss
            metrics["q_continue_loss"] = q_cont_loss.detach()
        for key, weight in self.extra_loss_weights.items():
            if key not in outputs:
                raise KeyError(
                    f"ACTLossHead: extra loss term {key!r} (weight {weight}) is configured but the model "
                    f"returned no outputs[{key!r}]; outputs have {sorted(outputs)}"
                )
            term = outputs[key]
            if term.shape != q_halt.shape:
                raise ValueError(
                    f"ACTLossHead: outputs[{key!r}] must be per-sample with shape {tuple(q_halt.shape)}, "
                    f"got {tuple(term.shape)}"
                )
            term_sum = term.to(torch.float32).sum()
            loss = loss + weight * term_sum
            metrics[key] = term_sum.detach()  # unweighted per-sample sum, e.g. "kl" -> train/kl
        for key in self.extra_metric_keys:  # logged only (e.g. ETRM's rule_exact -> train/rule_exact)
            if key in outputs:
                metrics[key] = outputs[key].detach().to(torch.float32).sum()
        return loss, metrics

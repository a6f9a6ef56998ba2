"""The run health monitor (docs/metrics.md defines every rule); the encoder statistics it reads come from
``encoders.stats`` (via ``ETRM.diagnostics``).

``HealthMonitor(HealthConfig).update(step, metrics) -> list[str]`` returns the warnings raised at this
step; ``stop_reason`` is the first warning of a rule listed in ``stop_on`` (the loop stops the run with it
when ``early_stop`` is on). A rule whose metric is absent is inactive (so TRM runs can use the same monitor).
"""

from __future__ import annotations

import math
from typing import Optional

import pydantic

RULES = ("gradient starvation", "encoder collapsed", "stuck", "diverged")


class HealthConfig(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    enabled: bool = True
    # gradient starvation: grad/encoder_norm below threshold for `patience` consecutive logged steps
    grad_starvation_threshold: float = 0.05
    grad_starvation_patience: int = pydantic.Field(5, ge=1)
    # encoder collapse: train/encoder_cross_sample_var below threshold for `patience` consecutive diagnostics
    collapse_threshold: float = 0.05
    collapse_patience: int = pydantic.Field(3, ge=1)
    # rules about the encoder (starvation, collapse) are only judged from this optimizer step on: a fresh encoder
    # fed similar demos can start with a small cross-sample variance and needs some steps to differentiate
    encoder_rules_min_step: int = pydantic.Field(500, ge=0)
    # stuck: train/exact_accuracy has not improved by more than min_delta for `stuck_steps` optimizer steps,
    # counted from the latest of: the best accuracy's step, the last step at which the learning rate still rose
    # (LR warmup: the rule never fires before warmup end + stuck_steps), and `stuck_min_step`
    stuck_steps: int = pydantic.Field(300, ge=1)
    stuck_min_step: int = pydantic.Field(0, ge=0)
    stuck_min_delta: float = 1e-4
    stuck_ignore_above: float = 0.999  # a run already at ~100% is not "stuck"
    # divergence: non-finite loss or grad norm, or loss > max(diverge_loss_abs, diverge_factor * best loss)
    diverge_loss_abs: float = 1e4
    diverge_factor: float = 100.0
    # metric keys
    loss_keys: list[str] = ["train/lm_loss", "train/loss"]
    accuracy_key: str = "train/exact_accuracy"
    grad_key: str = "grad/encoder_norm"
    collapse_key: str = "train/encoder_cross_sample_var"
    grad_norm_keys: list[str] = ["grad/total_norm"]
    lr_key: str = "train/lr"
    # which rules set stop_reason (the loop stops only when early_stop is on)
    stop_on: list[str] = list(RULES)

    @pydantic.field_validator("stop_on")
    @classmethod
    def _known_rules(cls, v):
        bad = [r for r in v if r not in RULES]
        if bad:
            raise ValueError(f"health.stop_on: unknown rule(s) {bad}; known: {list(RULES)}")
        return v


class HealthMonitor:
    """Feeds on the logged metrics; see module docstring. Each rule warns once per episode (it re-arms when
    its condition clears)."""

    def __init__(self, config: Optional[HealthConfig] = None):
        self.config = config or HealthConfig()
        self.stop_reason: Optional[str] = None
        self.stop_rule: Optional[str] = None
        self.warnings: list[tuple[int, str]] = []
        self._starve_count = 0
        self._collapse_count = 0
        self._best_acc: Optional[float] = None
        self._best_acc_step: Optional[int] = None
        self._best_loss: Optional[float] = None
        self._last_lr: Optional[float] = None
        self._lr_rise_step = 0  # last step at which the learning rate was above its previous logged value
        self._active: set[str] = set()
        self._step = 0

    def _fire(self, rule: str, message: str, out: list[str]) -> None:
        if rule in self._active:
            return
        self._active.add(rule)
        msg = f"{rule}: {message}"
        out.append(msg)
        self.warnings.append((self._step, msg))
        if self.stop_reason is None and rule in self.config.stop_on:
            self.stop_reason, self.stop_rule = msg, rule

    def _clear(self, rule: str) -> None:
        self._active.discard(rule)

    def update(self, step: int, metrics: dict[str, float]) -> list[str]:
        c = self.config
        out: list[str] = []
        if not c.enabled:
            return out
        self._step = step

        def get(key):
            v = metrics.get(key)
            if v is None:
                return None
            return float(v.item() if hasattr(v, "item") else v)

        loss = next((get(k) for k in c.loss_keys if k in metrics), None)
        gnorms = [(k, get(k)) for k in c.grad_norm_keys if k in metrics]
        if loss is not None or gnorms:
            self._check_diverged(step, loss, gnorms, out)

        # gradient starvation
        g = get(c.grad_key)
        if g is not None and step >= c.encoder_rules_min_step:
            if g < c.grad_starvation_threshold:
                self._starve_count += 1
                if self._starve_count >= c.grad_starvation_patience:
                    self._fire(
                        "gradient starvation",
                        f"{c.grad_key}={g:.4g} < {c.grad_starvation_threshold} for "
                        f"{self._starve_count} consecutive logs (step {step})",
                        out,
                    )
            else:
                self._starve_count = 0
                self._clear("gradient starvation")

        # collapse
        v = get(c.collapse_key)
        if v is not None and step >= c.encoder_rules_min_step:
            if v < c.collapse_threshold:
                self._collapse_count += 1
                if self._collapse_count >= c.collapse_patience:
                    self._fire(
                        "encoder collapsed",
                        f"{c.collapse_key}={v:.4g} < {c.collapse_threshold} for "
                        f"{self._collapse_count} consecutive diagnostics (step {step})",
                        out,
                    )
            else:
                self._collapse_count = 0
                self._clear("encoder collapsed")

        # stuck (its clock restarts while the learning rate rises: no verdict during LR warmup)
        lr = get(c.lr_key)
        if lr is not None and math.isfinite(lr):
            if self._last_lr is not None and lr > self._last_lr * (1 + 1e-6):
                self._lr_rise_step = step
            self._last_lr = lr
        a = get(c.accuracy_key)
        if a is not None and math.isfinite(a):
            if self._best_acc is None or a > self._best_acc + c.stuck_min_delta:
                self._best_acc, self._best_acc_step = a, step
                self._clear("stuck")
            else:
                since = max(self._best_acc_step, self._lr_rise_step, c.stuck_min_step)
                if self._best_acc < c.stuck_ignore_above and step - since >= c.stuck_steps:
                    why = (
                        ""
                        if since == self._best_acc_step
                        else ", the end of LR warmup"
                        if since == self._lr_rise_step
                        else ", stuck_min_step"
                    )
                    self._fire(
                        "stuck",
                        f"{c.accuracy_key} has not improved beyond {self._best_acc:.4f} for "
                        f"{step - since} steps (since step {since}{why})",
                        out,
                    )
        return out

    def _check_diverged(self, step: int, loss: Optional[float], gnorms: list[tuple[str, float]], out: list) -> None:
        """A non-finite loss or gradient norm, or a loss far above the best so far."""
        c = self.config
        bad = [f"{k}={v}" for k, v in gnorms if not math.isfinite(v)]
        if loss is not None and not math.isfinite(loss):
            bad.insert(0, f"loss={loss}")
        elif loss is not None:
            limit = c.diverge_loss_abs
            if self._best_loss is not None:
                limit = max(limit, c.diverge_factor * self._best_loss)
            if loss > limit:
                bad.insert(0, f"loss={loss:.4g} > {limit:.4g}")
            self._best_loss = loss if self._best_loss is None else min(self._best_loss, loss)
        if bad:
            self._fire("diverged", f"{', '.join(bad)} at step {step}", out)
        else:
            self._clear("diverged")

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "config"}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)

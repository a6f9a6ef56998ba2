"""The one ACT rollout at inference: supervision steps on a batch until every sample has halted.

Used by the evaluator (``evaluators.inference``), the ETRM latent search (``models.latent_search``) and the
science pipeline, so a change to halting is made here once.

    model = act_model_of(head)                                   # the ACT model inside a loss head / compile
    r = rollout(lambda c: model(c, batch), model.initial_carry(batch), max_steps=model.config.halt_max_steps)
    r.outputs["preds"], r.steps, r.carry.current_data["labels"]

Semantics (docs/evaluation.md): a sample's outputs are frozen at the first step where it halts; at
``max_steps`` every sample counts as halted. ``q_halt_rule=True`` also halts a sample as soon as its
``q_halt_logits > 0`` (the learned rule, for models without a ``halt_early_in_eval`` switch);
``stop_when_done=True`` ends the rollout once every sample has halted (halt-early evaluation) instead of
running ``max_steps`` steps. One host transfer per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Optional

import torch

# ``step(carry) -> (carry, outputs)`` or ``(carry, outputs, metric sums)`` (a loss head's metrics of that step)
StepFn = Callable[[Any], tuple]


@dataclass
class Rollout:
    carry: Any  # the carry after the last step
    outputs: dict[str, torch.Tensor]  # per-sample outputs frozen at each sample's halting step (+ "preds")
    steps: torch.Tensor  # int32 [b]: the step at which each sample halted (1-based)
    num_steps: int  # steps run
    # the loss head's metric sums added over the steps where some sample halted for the first time (None when the
    # step function returns no metrics)
    metric_sums: Optional[dict[str, torch.Tensor]]
    # False when a slot that had already halted halted again: its metrics were counted twice, the sums are not
    # per-sample exact
    metrics_exact: bool = True


def act_model_of(model: Any) -> Any:
    """The ACT model inside ``model``: unwraps ``torch.compile`` (``_orig_mod``) and a loss head (``.model``)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(getattr(model, "model", None), "initial_carry"):
            model = model.model
        else:
            return model


def halt_max_steps(model: Any) -> int:
    """``halt_max_steps`` of the (wrapped) ACT model: read from its arch config, the one source."""
    return int(act_model_of(model).config.halt_max_steps)


def rollout(
    step: StepFn,
    carry: Any,
    *,
    max_steps: int,
    keep: Optional[Collection[str]] = None,
    q_halt_rule: bool = False,
    stop_when_done: bool = False,
    detach: bool = True,
) -> Rollout:
    """Run ``step`` up to ``max_steps`` times from ``carry`` (see the module docstring). ``keep``: the output keys
    to freeze per sample (default: all); ``detach=False`` keeps their autograd graph (latent search)."""
    b = carry.halted.shape[0]
    device = carry.halted.device
    done = torch.zeros(b, dtype=torch.bool, device=device)
    done_step = torch.zeros(b, dtype=torch.int32, device=device)
    frozen: dict[str, torch.Tensor] = {}
    sums: Optional[dict[str, torch.Tensor]] = None
    exact = True
    n = 0
    for n in range(1, max_steps + 1):
        res = step(carry)
        carry, outs = res[0], res[1]
        metrics = res[2] if len(res) > 2 else None
        if "preds" not in outs and "logits" in outs:
            outs = dict(outs, preds=outs["logits"].argmax(-1))
        halted = carry.halted.to(device).bool()
        if q_halt_rule:
            halted = halted | (outs["q_halt_logits"].float() > 0)
        if n == max_steps:
            halted = torch.ones_like(halted)
        newly = halted & ~done
        any_new, rerun = torch.stack([newly.any(), (carry.halted.to(device).bool() & done).any()]).tolist()
        if metrics is not None:
            exact = exact and not rerun
            if any_new:
                step_sums = {k: v.detach().float().sum() for k, v in metrics.items()}
                sums = step_sums if sums is None else {k: sums[k] + step_sums.get(k, 0) for k in sums}
        if any_new:
            _freeze(frozen, outs, newly, keep, detach)
            done_step = torch.where(newly, torch.full_like(done_step, n), done_step)
            done = done | newly
        if stop_when_done and bool(done.all()):
            break
    return Rollout(carry=carry, outputs=frozen, steps=done_step, num_steps=n, metric_sums=sums, metrics_exact=exact)


def _freeze(
    frozen: dict[str, torch.Tensor],
    outs: dict[str, torch.Tensor],
    newly: torch.Tensor,
    keep: Optional[Collection[str]],
    detach: bool,
) -> None:
    """Store the outputs of the samples that halted for the first time at this step."""
    for k, v in outs.items():
        if keep is not None and k not in keep:
            continue
        v = v.detach() if detach else v
        if k not in frozen:
            frozen[k] = v.clone() if detach else v
        else:
            frozen[k] = torch.where(newly.view(-1, *([1] * (v.dim() - 1))), v, frozen[k])

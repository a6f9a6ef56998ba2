"""The one ACT rollout (models/rollout.py): per-sample outputs frozen at the halting step, halting rules, metric
sums and their exactness, gradient when asked."""

import pytest
import torch

from models.rollout import act_model_of, halt_max_steps, rollout
from tests.doubles import FakeACT, FakeLossHead


def _batch(b=4, s=6):
    labels = torch.randint(2, 12, (b, s))
    return {
        "inputs": labels.clone().int(),
        "labels": labels,
        "puzzle_identifiers": torch.ones(b, dtype=torch.int32),
        "example_index": torch.arange(b),
    }


def test_eval_rollout_runs_max_steps_and_freezes_at_the_last_step():
    model = FakeACT(halt_max_steps=3).eval()
    batch = _batch()
    r = rollout(lambda c: model(c, batch), model.initial_carry(batch), max_steps=3)
    assert r.num_steps == 3 and model.calls == 3
    assert r.steps.tolist() == [3, 3, 3, 3]
    assert torch.equal(r.outputs["preds"], batch["labels"])  # the oracle predicts the labels
    assert r.metric_sums is None  # a bare model returns no metrics


def test_q_halt_rule_freezes_each_sample_at_its_own_step_and_stops_when_done():
    # sample i halts (q > 0) from step i + 1 on; the rollout applies the rule (the model's own switch is off)
    q = lambda data, steps: torch.where(steps >= data["example_index"] + 1, 1.0, -1.0)  # noqa: E731
    model = FakeACT(halt_max_steps=10, q_fn=q).eval()
    batch = _batch()
    r = rollout(
        lambda c: model(c, batch), model.initial_carry(batch), max_steps=10, q_halt_rule=True, stop_when_done=True
    )
    assert r.steps.tolist() == [1, 2, 3, 4]
    assert r.num_steps == 4  # stopped once every sample had halted, not at max_steps
    assert r.outputs["q_halt_logits"].tolist() == [1.0, 1.0, 1.0, 1.0]  # frozen at the halting step
    r = rollout(lambda c: model(c, batch), model.initial_carry(batch), max_steps=10, q_halt_rule=True)
    assert r.num_steps == 10 and r.steps.tolist() == [1, 2, 3, 4]  # outputs still frozen at the first halt


def test_head_metric_sums_are_exact_only_when_no_slot_halts_twice():
    batch = _batch()
    head = FakeLossHead(FakeACT(halt_max_steps=3)).eval()

    def step(c):
        carry, _loss, metrics, outs, _ = head(c, batch, return_keys=("logits", "q_halt_logits"))
        return carry, outs, metrics

    r = rollout(step, head.initial_carry(batch), max_steps=3)
    assert r.metrics_exact and int(r.metric_sums["count"]) == 4 and float(r.metric_sums["exact_accuracy"]) == 4
    # with the model's own early halting every slot halts at step 1, is refilled with the same row and halts again
    head.model.halt_early_in_eval = True
    head.model.q_positive_from = 1
    r = rollout(step, head.initial_carry(batch), max_steps=3)
    assert not r.metrics_exact and r.steps.tolist() == [1, 1, 1, 1]


def test_detach_false_keeps_the_graph_of_the_frozen_outputs():
    model = FakeACT(halt_max_steps=2).eval()
    batch = _batch()
    r = rollout(lambda c: model(c, batch), model.initial_carry(batch), max_steps=2, keep=("logits",), detach=False)
    assert set(r.outputs) == {"logits"}
    r.outputs["logits"].sum().backward()
    assert model.dummy.grad is not None and float(model.dummy.grad) != 0.0
    r = rollout(lambda c: model(c, batch), model.initial_carry(batch), max_steps=2, keep=("logits",))
    assert not r.outputs["logits"].requires_grad


def test_halt_max_steps_is_read_through_wrappers():
    model = FakeACT(halt_max_steps=5)
    head = FakeLossHead(model)
    assert act_model_of(head) is model and halt_max_steps(head) == 5

    class Compiled(torch.nn.Module):  # what torch.compile's wrapper exposes
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

    assert act_model_of(Compiled(head)) is model
    with pytest.raises(AttributeError):
        halt_max_steps(torch.nn.Linear(1, 1))

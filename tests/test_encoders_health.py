"""Context statistics on hand-made tensors and the HealthMonitor rules."""

import math

import pydantic
import pytest
import torch

from encoders.stats import context_statistics, cross_sample_var, output_mean, output_norm, output_std, token_std
from training.health import HealthConfig, HealthMonitor


def test_identical_contexts_have_zero_cross_sample_var():
    one = torch.randn(1, 4, 8)
    ctx = one.expand(5, -1, -1)
    assert cross_sample_var(ctx).item() == pytest.approx(0.0, abs=1e-7)
    assert token_std(ctx).item() > 0.1  # tokens still differ from each other


def test_statistics_hand_computed():
    # two samples, two tokens, hidden 2
    ctx = torch.tensor([[[1.0, 1.0], [3.0, 3.0]], [[3.0, 3.0], [3.0, 3.0]]])
    # cross-sample variance per coordinate: token0: var(1,3)=1, token1: var(3,3)=0 -> mean 0.5
    assert cross_sample_var(ctx).item() == pytest.approx(0.5)
    assert output_mean(ctx).item() == pytest.approx(2.5)
    # token norms: sqrt(2), 3 sqrt(2), 3 sqrt(2), 3 sqrt(2) -> mean 2.5 sqrt(2)
    assert output_norm(ctx).item() == pytest.approx(2.5 * math.sqrt(2))
    # all entries: 1,1,3,3,3,3,3,3 -> mean 2.5, population var = (2*2.25 + 6*0.25)/8 = 0.75
    assert output_std(ctx).item() == pytest.approx(math.sqrt(0.75))
    # across tokens: sample0 std(1,3)=1 per feature, sample1 0 -> mean 0.5
    assert token_std(ctx).item() == pytest.approx(0.5)
    # mask drops sample 0 -> single sample -> cross-sample var 0, mean 3
    st = context_statistics(ctx, mask=torch.tensor([False, True]))
    assert st["train/encoder_cross_sample_var"] == 0.0 and st["train/encoder_output_mean"] == pytest.approx(3.0)
    assert set(context_statistics(ctx)) == {
        "train/encoder_cross_sample_var",
        "train/encoder_output_mean",
        "train/encoder_output_norm",
        "train/encoder_output_std",
        "train/encoder_token_std",
    }


def test_broadcast_context_has_zero_token_std():
    ctx = torch.randn(3, 1, 8).expand(-1, 6, -1)
    assert token_std(ctx).item() == pytest.approx(0.0, abs=1e-7)
    assert cross_sample_var(ctx).item() > 0.1


def test_gradient_starvation_needs_sustained_low_norm():
    mon = HealthMonitor(HealthConfig(grad_starvation_patience=3, encoder_rules_min_step=10))
    for s in range(5):  # before encoder_rules_min_step nothing is judged
        assert mon.update(s, {"grad/encoder_norm": 0.0}) == []
    assert mon.update(10, {"grad/encoder_norm": 0.01}) == []
    assert mon.update(20, {"grad/encoder_norm": 0.01}) == []
    assert mon.update(30, {"grad/encoder_norm": 0.5}) == []  # recovery resets the count
    for s in (40, 50):
        assert mon.update(s, {"grad/encoder_norm": 0.01}) == []
    w = mon.update(60, {"grad/encoder_norm": 0.01})
    assert len(w) == 1 and w[0].startswith("gradient starvation")
    assert mon.stop_rule == "gradient starvation"
    assert mon.update(70, {"grad/encoder_norm": 0.01}) == []  # warned once


def test_collapse_rule():
    mon = HealthMonitor(HealthConfig(collapse_patience=1, stop_on=["diverged"], encoder_rules_min_step=0))
    assert mon.update(0, {"train/encoder_cross_sample_var": 0.3}) == []
    w = mon.update(100, {"train/encoder_cross_sample_var": 0.01})
    assert w and w[0].startswith("encoder collapsed")
    assert mon.stop_reason is None  # not in stop_on


def test_stuck_rule():
    mon = HealthMonitor(HealthConfig(stuck_steps=300))
    mon.update(0, {"train/exact_accuracy": 0.1})
    assert mon.update(200, {"train/exact_accuracy": 0.2}) == []
    assert mon.update(450, {"train/exact_accuracy": 0.2}) == []  # 250 steps since the improvement
    w = mon.update(500, {"train/exact_accuracy": 0.19})
    assert w and w[0].startswith("stuck") and "since step 200" in w[0]
    mon2 = HealthMonitor()
    mon2.update(0, {"train/exact_accuracy": 1.0})
    assert mon2.update(1000, {"train/exact_accuracy": 1.0}) == []  # perfect is not stuck


def test_stuck_rule_waits_for_the_end_of_lr_warmup():
    """Accuracy 0 through a 1000-step warmup (normal: nothing is solved yet) is not 'stuck'; the clock starts
    when the LR stops rising, so the rule fires at warmup end + stuck_steps, not at stuck_steps."""
    mon = HealthMonitor(HealthConfig(stuck_steps=300))
    fired = None
    for step in range(10, 2001, 10):
        lr = 1e-4 * min(1.0, step / 1000) * (1.0 if step <= 1000 else 0.99 ** ((step - 1000) / 100))  # warmup, decay
        w = mon.update(step, {"train/exact_accuracy": 0.0, "train/lr": lr})
        if w and fired is None:
            fired = (step, w[0])
    assert fired is not None and fired[0] == 1300 and "since step 1000, the end of LR warmup" in fired[1]
    # an explicit minimum step works without an LR metric
    mon = HealthMonitor(HealthConfig(stuck_steps=100, stuck_min_step=500))
    steps = [s for s in range(10, 1001, 10) if mon.update(s, {"train/exact_accuracy": 0.0})]
    assert steps[0] == 600
    # a monitor restored from a checkpoint of an older version (no LR state) keeps working
    old = HealthMonitor(HealthConfig(stuck_steps=100))
    state = old.state_dict()
    del state["_last_lr"], state["_lr_rise_step"]
    new = HealthMonitor(HealthConfig(stuck_steps=100))
    new.load_state_dict(state)
    assert new.update(10, {"train/exact_accuracy": 0.0, "train/lr": 1.0}) == []


def test_diverged_rule():
    mon = HealthMonitor()
    assert mon.update(1, {"train/lm_loss": 2.0}) == []
    assert mon.update(2, {"train/lm_loss": 150.0}) == []  # < max(1e4, 100 * 2)
    w = mon.update(3, {"train/lm_loss": float("nan")})
    assert w and w[0].startswith("diverged") and mon.stop_rule == "diverged"
    mon = HealthMonitor(HealthConfig(diverge_loss_abs=10.0, diverge_factor=3.0))
    mon.update(1, {"train/lm_loss": 1.0})
    assert mon.update(2, {"train/lm_loss": 11.0})[0].startswith("diverged")
    mon = HealthMonitor()
    assert mon.update(1, {"grad/total_norm": float("inf")})[0].startswith("diverged")


def test_missing_metrics_make_rules_inactive():
    mon = HealthMonitor(
        HealthConfig(grad_starvation_patience=1, collapse_patience=1, stuck_steps=1, encoder_rules_min_step=0)
    )
    for s in range(0, 1000, 100):  # a TRM run: no encoder metrics, no accuracy logged
        assert mon.update(s, {"train/lm_loss": 1.0, "train/lr": 1e-4}) == []
    assert mon.stop_reason is None


def test_config_is_strict():
    with pytest.raises(pydantic.ValidationError, match="colapse_threshold"):
        HealthConfig(colapse_threshold=0.1)
    with pytest.raises(pydantic.ValidationError, match="unknown rule"):
        HealthConfig(stop_on=["bored"])

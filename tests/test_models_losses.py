"""ACTLossHead: hand-computed loss and metrics, stablemax vs softmax, labels from the carry, extra-term scale."""

import math
from types import SimpleNamespace

import pytest
import torch

from models.losses import (
    IGNORE_LABEL_ID,
    ACTLossHead,
    get_loss_fn,
    log_stablemax,
    softmax_cross_entropy,
    stable_max_cross_entropy,
    stablemax,
)


def test_stablemax_values():
    x = torch.tensor([0.0, 1.0, -1.0, 3.0, -3.0])
    assert torch.allclose(stablemax(x), torch.tensor([1.0, 2.0, 0.5, 4.0, 0.25]))
    lp = log_stablemax(torch.tensor([[0.0, 1.0, -1.0]], dtype=torch.float64))
    assert torch.allclose(lp.exp(), torch.tensor([[1 / 3.5, 2 / 3.5, 0.5 / 3.5]], dtype=torch.float64))


def test_stablemax_vs_softmax_cross_entropy():
    logits = torch.tensor([[[0.0, 1.0, -1.0], [2.0, 0.0, 0.0]]])
    labels = torch.tensor([[1, IGNORE_LABEL_ID]])
    sm = stable_max_cross_entropy(logits, labels)
    assert sm.dtype == torch.float64
    assert sm[0, 0].item() == pytest.approx(-math.log(2 / 3.5), rel=1e-12)
    assert sm[0, 1].item() == 0.0
    ce = softmax_cross_entropy(logits, labels)
    assert ce[0, 0].item() == pytest.approx(-math.log(math.e / (1 + math.e + math.exp(-1))), rel=1e-6)
    assert ce[0, 1].item() == 0.0
    assert abs(sm[0, 0].item() - ce[0, 0].item()) > 0.1  # genuinely different functions
    # gradients are finite even where the unused branch would blow up (x = 1 in 1/(1-x))
    z = torch.tensor([[[1.0, 1.0, 50.0]]], requires_grad=True)
    stable_max_cross_entropy(z, torch.tensor([[0]])).sum().backward()
    assert torch.isfinite(z.grad).all()
    assert get_loss_fn("stablemax_cross_entropy") is stable_max_cross_entropy
    with pytest.raises(ValueError, match="loss_type"):
        get_loss_fn("hinge")


class FakeACT(torch.nn.Module):
    """Returns fixed outputs and a carry whose current_data differs from the incoming batch."""

    def __init__(self, logits, q_halt, q_cont, carry_labels, halted, steps, extra=None):
        super().__init__()
        self.out = dict(logits=logits, q_halt_logits=q_halt, q_continue_logits=q_cont, **(extra or {}))
        self.carry = SimpleNamespace(current_data={"labels": carry_labels}, halted=halted, steps=steps)

    def forward(self, carry, batch):
        return self.carry, dict(self.out)


def hand_case(extra=None):
    # 2 samples, 3 tokens, vocab 2. Sample 0: labels [1, 0, -100]; sample 1: labels [1, 1, 1].
    logits = torch.tensor(
        [[[0.0, 2.0], [1.0, 0.0], [5.0, -5.0]], [[0.0, 1.0], [3.0, 0.0], [0.0, 0.5]]], requires_grad=True
    )
    labels = torch.tensor([[1, 0, IGNORE_LABEL_ID], [1, 1, 1]])
    q_halt = torch.tensor([0.5, -1.0], requires_grad=True)
    q_cont = torch.tensor([0.0, 0.0])
    halted = torch.tensor([True, False])
    steps = torch.tensor([3, 2], dtype=torch.int32)
    return FakeACT(logits, q_halt, q_cont, labels, halted, steps, extra), logits, labels


def ce(logit_row, label):
    return -(logit_row[label] - torch.logsumexp(logit_row, 0)).item()


def bce(x, y):
    return -(y * math.log(1 / (1 + math.exp(-x))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-x))))


def test_loss_and_metrics_hand_computed():
    model, logits, labels = hand_case()
    head = ACTLossHead(model, loss_type="softmax_cross_entropy")
    wrong_batch = {"labels": torch.zeros_like(labels)}  # must NOT be used (pitfall 5)
    carry, loss, metrics, outputs, all_halted = head(None, wrong_batch, return_keys=("preds", "logits"))
    l = logits.detach()
    lm0 = (ce(l[0, 0], 1) + ce(l[0, 1], 0)) / 2  # mean over supervised tokens
    lm1 = (ce(l[1, 0], 1) + ce(l[1, 1], 1) + ce(l[1, 2], 1)) / 3
    # sample 0: preds [1, 0] correct -> seq correct; sample 1: preds [1, 0, 1] -> not exact
    q0, q1 = bce(0.5, 1.0), bce(-1.0, 0.0)
    assert metrics["lm_loss"].item() == pytest.approx(lm0 + lm1, rel=1e-5)
    assert metrics["q_halt_loss"].item() == pytest.approx(q0 + q1, rel=1e-5)
    assert loss.item() == pytest.approx(lm0 + lm1 + 0.5 * (q0 + q1), rel=1e-5)
    # metrics over halted samples only (sample 0)
    assert metrics["count"].item() == 1
    assert metrics["accuracy"].item() == pytest.approx(1.0)
    assert metrics["exact_accuracy"].item() == 1
    assert metrics["q_halt_accuracy"].item() == 1  # q_halt 0.5 >= 0 and correct
    assert metrics["steps"].item() == 3
    assert "q_continue_loss" not in metrics
    assert outputs["preds"].tolist() == [[1, 0, 0], [1, 0, 1]]
    assert not outputs["logits"].requires_grad
    assert all_halted.item() is False
    loss.backward()
    assert logits.grad[0, 2].abs().sum() == 0  # ignored position gets no gradient


def test_accuracy_metric_partial_and_q_continue():
    model, logits, labels = hand_case(extra={"target_q_continue": torch.tensor([0.25, 1.0])})
    model.carry.halted = torch.tensor([True, True])
    head = ACTLossHead(model, loss_type="stable_max_cross_entropy", q_loss_weight=0.5)
    _, loss, metrics, _, all_halted = head(None, {})
    assert metrics["count"].item() == 2
    assert metrics["accuracy"].item() == pytest.approx(1.0 + 2 / 3, rel=1e-6)
    assert metrics["exact_accuracy"].item() == 1
    assert metrics["q_halt_accuracy"].item() == 2  # sample 1: q_halt < 0 and not exact -> right
    assert metrics["steps"].item() == 5
    qc = bce(0.0, 0.25) + bce(0.0, 1.0)
    assert metrics["q_continue_loss"].item() == pytest.approx(qc, rel=1e-5)
    expected = metrics["lm_loss"] + 0.5 * (metrics["q_halt_loss"] + metrics["q_continue_loss"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert all_halted.item() is True


def test_samples_without_supervised_tokens_are_not_counted():
    model, logits, labels = hand_case()
    model.carry.current_data["labels"] = torch.full_like(labels, IGNORE_LABEL_ID)
    model.carry.halted = torch.tensor([True, True])
    _, loss, metrics, _, _ = ACTLossHead(model)(None, {})
    assert metrics["count"].item() == 0 and metrics["lm_loss"].item() == 0.0
    assert torch.isfinite(loss)


def test_extra_per_sample_term_scale():
    """Pitfall 6: an extra per-sample term (ETRM's KL) enters the SUM like the LM loss: loss += w * sum_i kl_i."""
    kl = torch.tensor([1.0, 2.0])
    model, _, _ = hand_case(extra={"kl": kl})
    base = ACTLossHead(model)(None, {})[1]
    head = ACTLossHead(model, extra_loss_weights={"kl": 0.1})
    _, loss, metrics, _, _ = head(None, {})
    assert loss.item() == pytest.approx(base.item() + 0.1 * 3.0, rel=1e-6)
    assert metrics["kl"].item() == pytest.approx(3.0)
    with pytest.raises(KeyError, match="'beta'"):
        ACTLossHead(model, extra_loss_weights={"beta": 1.0})(None, {})
    model.out["kl"] = torch.tensor(3.0)
    with pytest.raises(ValueError, match="per-sample"):
        head(None, {})


def test_loss_head_on_real_model_uses_carry_labels():
    from models import build_loss_head, build_model

    torch.manual_seed(0)
    model = build_model(
        dict(
            name="trm",
            hidden_size=16,
            num_heads=2,
            H_cycles=1,
            L_cycles=1,
            halt_max_steps=4,
            puzzle_emb_ndim=16,
            puzzle_emb_len=1,
            forward_dtype="float32",
            halt_exploration_prob=0.0,
        ),
        vocab_size=5,
        seq_len=4,
        num_puzzle_identifiers=3,
        batch_size=2,
    )
    head = build_loss_head(model)
    b1 = {
        "inputs": torch.ones(2, 4, dtype=torch.int32),
        "labels": torch.full((2, 4), 2),
        "puzzle_identifiers": torch.ones(2, dtype=torch.int32),
    }
    b2 = {**b1, "labels": torch.full((2, 4), 3)}
    carry = head.initial_carry(b1)
    carry, loss1, _, _, _ = head(carry, b1)
    carry, loss2, m2, out, _ = head(carry, b2, return_keys=("logits",))  # nothing halted: still b1's labels
    assert torch.equal(carry.current_data["labels"], b1["labels"])
    ref = (softmax_cross_entropy(out["logits"], b1["labels"]).mean(-1)).sum()
    assert m2["lm_loss"].item() == pytest.approx(ref.item(), rel=1e-5)

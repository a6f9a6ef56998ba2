"""LPN test-time latent search: improves the fit of the demos, runs under inference_mode, eval-only."""

import torch
import torch.nn.functional as F

from models.latent_search import latent_search_context
from models.ttt import decode_logits as _decoder_logits
from tests.test_etrm_model import batch, build


def _demo_loss(m, b, ctx):
    B, D, S = b["demo_inputs"].shape
    ctx_rep = ctx.repeat_interleave(D, 0)
    logits = _decoder_logits(m, b["demo_inputs"].reshape(B * D, S), ctx_rep)
    labels = b["demo_labels"].reshape(B * D, S).long()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).item()


def test_latent_search_reduces_demo_loss_and_keeps_weights():
    m = build("lpn").eval()
    b = batch()
    b["demo_mask"][:] = True
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        ctx0 = latent_search_context(m, b["demo_inputs"], b["demo_labels"], b["demo_mask"], steps=0)
        torch.testing.assert_close(ctx0, m.encoder(b["demo_inputs"], b["demo_labels"], b["demo_mask"]).context)
    with torch.inference_mode():  # the evaluation path runs under inference_mode
        ctx = latent_search_context(
            m, b["demo_inputs"], b["demo_labels"], b["demo_mask"], steps=6, lr=0.5, leave_one_out=False
        )
    with torch.no_grad():
        assert _demo_loss(m, b, ctx) < _demo_loss(m, b, ctx0) - 1e-3
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.requires_grad for p in m.parameters())


def test_latent_search_in_etrm_eval_forward_only():
    m = build("lpn")
    b = batch()
    m.eval()
    with torch.inference_mode():
        base = m(m.initial_carry(b), b)[1]["logits"]
        m.latent_search_steps = 3
        carry, out = m(m.initial_carry(b), b)
        assert not torch.allclose(out["logits"], base)
        assert carry.cached_context is not None  # searched once per query, reused at later ACT steps
    m.train()  # training ignores the option
    torch.manual_seed(0)
    out_train = m(m.initial_carry(b), b)[1]
    assert out_train["encoder_context"].requires_grad


def test_evaluate_cli_switch_sets_search_and_refuses_models_without_encoder():
    """evaluate.py latent_search_steps/lr reach the ETRM model; a TRM checkpoint is refused by name."""
    import pytest

    from models import build_model
    from training.evaluation import EvaluateConfig, EvaluateError, _configure_latent_search

    m = build("lpn").eval()
    assert m.latent_search_steps == 0
    cfg = EvaluateConfig(checkpoint="x.pt", data_path="d", latent_search_steps=5, latent_search_lr=0.3)
    _configure_latent_search(m, cfg)
    assert m.latent_search_steps == 5 and m.latent_search_lr == 0.3
    # the switch changes predictions: the searched context differs from the plain encoding
    b = batch()
    b["demo_mask"][:] = True
    with torch.inference_mode():
        plain = latent_search_context(m, b["demo_inputs"], b["demo_labels"], b["demo_mask"], steps=0)
        searched = latent_search_context(
            m,
            b["demo_inputs"],
            b["demo_labels"],
            b["demo_mask"],
            steps=m.latent_search_steps,
            lr=m.latent_search_lr,
            leave_one_out=False,
        )
    assert (plain - searched).abs().max() > 1e-4

    trm = build_model(
        {
            "name": "trm",
            "hidden_size": 16,
            "num_heads": 2,
            "H_cycles": 1,
            "L_cycles": 1,
            "L_layers": 1,
            "puzzle_emb_ndim": 0,
            "puzzle_emb_len": 0,
            "halt_max_steps": 2,
        },
        vocab_size=12,
        seq_len=16,
        num_puzzle_identifiers=1,
        batch_size=2,
    )
    with pytest.raises(EvaluateError, match="latent_search_steps=5"):
        _configure_latent_search(trm, cfg)


def test_leave_one_out_starts_each_demo_from_the_other_demos_latent(monkeypatch):
    """Leave-one-out: at the first search step (delta = 0) demo j of sample i is decoded from the context of the
    mean latent of sample i's OTHER valid demos (computed here independently, by masking demo j out), in
    sample-major order over the valid pairs only; masked slots are never decoded."""
    import models.ttt as ttt

    m = build("lpn").eval()
    b = batch()  # sample 0 has its third slot masked: two valid demos
    b["demo_mask"][3, 1] = False  # and sample 3 its second
    seen = []
    orig = ttt.decode_logits

    def spy(model, inputs, context, demos=None, memory=None):
        seen.append((inputs.clone(), context.detach().clone()))
        return orig(model, inputs, context, demos, memory)

    monkeypatch.setattr(ttt, "decode_logits", spy)
    with torch.inference_mode():
        latent_search_context(
            m, b["demo_inputs"], b["demo_labels"], b["demo_mask"], steps=1, lr=0.5, leave_one_out=True
        )
    inputs, ctx = seen[0]
    exp_inputs, exp_ctx = [], []
    with torch.no_grad():
        for i in range(b["demo_inputs"].shape[0]):
            for j in range(b["demo_inputs"].shape[1]):
                if not b["demo_mask"][i, j]:
                    continue
                loo = b["demo_mask"][i : i + 1].clone()
                loo[0, j] = False
                z, _ = m.encoder.encode_latent(b["demo_inputs"][i : i + 1], b["demo_labels"][i : i + 1], loo)
                exp_ctx.append(m.encoder.context_from_latent(z)[0])
                exp_inputs.append(b["demo_inputs"][i, j])
    assert inputs.shape[0] == len(exp_inputs) == int(b["demo_mask"].sum())
    torch.testing.assert_close(inputs, torch.stack(exp_inputs))
    torch.testing.assert_close(ctx, torch.stack(exp_ctx), atol=1e-5, rtol=1e-5)


def test_evaluate_cli_refuses_latent_search_for_encoders_without_a_latent():
    import pytest

    from training.evaluation import EvaluateConfig, EvaluateError, _configure_latent_search

    m = build("standard").eval()
    with pytest.raises(EvaluateError, match="encoder=lpn"):
        _configure_latent_search(m, EvaluateConfig(checkpoint="x.pt", data_path="d", latent_search_steps=3))


def test_latent_search_on_a_core_that_reads_the_demo_memory_decodes_each_demo_with_the_others(monkeypatch):
    """arch=trm_local with the lpn encoder (the recipe's core): the search runs (it failed before: the decoder of a
    memory core was given no demos), demo j is decoded with the memory of the OTHER demos only (its own would hold
    its answer cell by cell), the fit lowers the demo loss, the context changes and no weight moves."""
    import models.ttt as mttt
    from tests.test_models_memory import batch as memory_batch
    from tests.test_models_memory import build as memory_build

    m = memory_build(name="trm_local", encoder="lpn", cell_descriptor=True).eval()
    b = memory_batch()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    demos = mttt.demo_set({k: b[k].bool() if k == "demo_mask" else b[k] for k in b})
    seen, orig = [], mttt.decode_logits

    def spy(model, inputs, prefix, demos_seen=None, memory=None):
        logits = orig(model, inputs, prefix, demos_seen, memory)
        seen.append((demos_seen[2].clone(), memory is not None, mttt.demo_loss(logits, demos)[0].item()))
        return logits

    monkeypatch.setattr(mttt, "decode_logits", spy)
    with torch.inference_mode():
        ctx = latent_search_context(m, b["demo_inputs"], b["demo_labels"], b["demo_mask"], steps=4, lr=0.05)
        ctx0 = latent_search_context(m, b["demo_inputs"], b["demo_labels"], b["demo_mask"], steps=0)
    assert len(seen) == 5 and all(given for _, given, _ in seen)  # steps + 1 decodes, each given the memory
    for k in range(demos.n):  # the pair's own slot is masked, the other valid slots are visible
        i, j = int(demos.owner[k]), int(demos.slot[k])
        expected = b["demo_mask"][i].clone()
        expected[j] = False
        assert torch.equal(seen[0][0][k], expected)
    assert seen[-1][2] < seen[0][2] - 1e-4 and not torch.allclose(ctx, ctx0)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k

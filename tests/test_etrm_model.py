"""ETRM = TRM core + demo encoder: construction, gradients (pitfalls 1, 2), recurrent carry, KL scale
(pitfall 6), diagnostics and pretrained-decoder loading (pitfall 10)."""

import pytest
import torch

import models
from encoders import ENCODER_REGISTRY
from models.etrm import ETRMCarry
from tests.toy_data import tiny_metadata
from training.build import build_etrm_model, load_pretrained_decoder
from training.config import config_from_dict

V, S, B, D, HID, L = 12, 16, 4, 3, 32, 2
NAMES = sorted(ENCODER_REGISTRY)


def meta():
    return tiny_metadata(
        vocab_size=V, seq_len=S, num_puzzle_identifiers=5, total_groups=4, mean_puzzle_examples=2.0, has_demos=True,
        max_demos=D,
    )  # fmt: skip


def arch(**kw):
    a = dict(
        name="trm",
        hidden_size=HID,
        num_heads=4,
        expansion=2,
        puzzle_emb_ndim=HID,
        puzzle_emb_len=L,
        H_cycles=2,
        L_cycles=1,
        L_layers=1,
        halt_max_steps=3,
        halt_exploration_prob=0.0,
        forward_dtype="float32",
    )
    a.update(kw)
    return a


def build(name="standard", *, encoder_cache=False, arch_kw=None, **enc_kw):
    torch.manual_seed(0)
    cfg = {
        "arch": arch(**(arch_kw or {})),
        "encoder": {"name": name, "hidden_size": 32, "num_heads": 4, **enc_kw},
        "encoder_cache": encoder_cache,
        "global_batch_size": B,
    }
    return build_etrm_model(config_from_dict(cfg), meta(), verbose=False)


def batch(seed=0, same_demos=False):
    g = torch.Generator().manual_seed(seed)
    di = torch.randint(2, V, (B, D, S), generator=g, dtype=torch.int32)
    dl = torch.randint(2, V, (B, D, S), generator=g, dtype=torch.int32)
    if same_demos:
        di, dl = di[:1].expand(B, -1, -1).clone(), dl[:1].expand(B, -1, -1).clone()
    mask = torch.ones(B, D, dtype=torch.bool)
    mask[0, 2] = False
    return {
        "inputs": torch.randint(2, V, (B, S), generator=g, dtype=torch.int32),
        "labels": torch.randint(2, V, (B, S), generator=g).long(),
        "puzzle_identifiers": torch.zeros(B, dtype=torch.int32),
        "demo_inputs": di,
        "demo_labels": dl,
        "demo_mask": mask,
    }


def test_build_names_and_shapes():
    m = build()
    names = [n for n, _ in m.named_parameters()]
    assert any(n.startswith("encoder.") for n in names) and any(n.startswith("inner.") for n in names)
    assert m.puzzle_emb is None and m.puzzle_emb_len == L  # no learned puzzle embedding, prefix kept
    b = batch()
    carry = m.initial_carry(b)
    assert isinstance(carry, ETRMCarry)
    carry, out = m(carry, b)
    assert out["logits"].shape == (B, S, V) and out["encoder_context"].shape == (B, L, HID)
    with pytest.raises(KeyError, match="demo_inputs"):
        m.initial_carry({k: v for k, v in b.items() if not k.startswith("demo")})


def test_unknown_encoder_key_is_an_error():
    from encoders import EncoderConfigError

    with pytest.raises(EncoderConfigError, match="kl_wieght"):
        build("variational", kl_wieght=1.0)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_gradient_through_the_loss_head(name):
    """Pitfall 1: one ACT step + backward reaches every trainable parameter of encoder and core."""
    over = {"variational": True} if name == "lpn" else {}
    m = build(name, context_scale="scalar", **over).train()
    head = models.build_loss_head(m, None)
    b = batch()
    carry = head.initial_carry(b)
    carry, loss, metrics, _, _ = head(carry, b)
    if name == "recurrent":  # second step: the state path must carry gradient as well
        carry, loss2, _, _, _ = head(carry, b)
        loss = loss + loss2
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert not missing, f"{name}: no gradient for {missing}"


def _encoder_grad_norm(m):
    gs = [p.grad.norm() for n, p in m.named_parameters() if n.startswith("encoder.") and p.grad is not None]
    return float(torch.stack(gs).norm()) if gs else 0.0


@pytest.mark.parametrize("cache", [False, True])
def test_encoder_cache_ablation_gradient(cache):
    """Pitfall 2: with encoder_cache the encoder gets gradient only from a sample's first ACT step."""
    m = build(encoder_cache=cache).train()
    head = models.build_loss_head(m, None)
    b = batch()
    carry = head.initial_carry(b)
    carry, loss1, _, _, _ = head(carry, b)  # step 1: every slot fresh
    loss1.backward()
    g1 = _encoder_grad_norm(m)
    m.zero_grad(set_to_none=True)
    assert not carry.halted.any()  # halt_max_steps=3, no exploration, Q bias -5: nobody halts after step 1
    carry, loss2, _, _, _ = head(carry, b)  # step 2: no slot refilled
    loss2.backward()
    g2 = _encoder_grad_norm(m)
    assert g1 > 0
    if cache:
        assert g2 == 0.0
    else:
        assert g2 > 1e-3 * g1


def test_recurrent_state_reset_on_halt_and_detached_when_stored():
    m = build("recurrent").train()
    b = batch()
    carry = m.initial_carry(b)
    carry, out = m(carry, b)
    assert carry.z_E is not None and not carry.z_E.requires_grad  # detached only when stored
    assert out["encoder_context"].requires_grad
    stored = carry.z_E.clone()
    seen = {}
    orig = m.encoder.forward

    def spy(*a, state=None, **k):
        seen["state"] = state
        return orig(*a, state=state, **k)

    m.encoder.forward = spy
    carry.halted = torch.tensor([True, False, True, False])
    m(carry, b)
    init = m.encoder.initial_state(B).detach()
    torch.testing.assert_close(seen["state"][0], init[0])  # halted slot: reset to the learned init
    torch.testing.assert_close(seen["state"][2], init[2])
    torch.testing.assert_close(seen["state"][1], stored[1])  # running slot: its own z_E
    assert not torch.allclose(stored[1], init[1])
    assert seen["state"].requires_grad  # the init rows carry gradient to z_init (not detached)


@pytest.mark.parametrize("name", ["variational", "hybrid"])
def test_kl_scale_is_per_sample_like_the_lm_loss(name):
    """Pitfall 6: loss = sum_i (lm_i + ... + w * kl_i); after the loop's / global_batch the KL term is
    w * mean_i kl_i, exactly the configured weight (not w / batch)."""
    w = 0.25
    m = build(name, kl_weight=w).eval()  # eval: posterior mean, deterministic
    assert m.config.loss.extra_loss_weights == {"kl": w}
    head = models.build_loss_head(m, None)
    head0 = models.ACTLossHead(m, extra_loss_weights={})
    b = batch()
    _, loss_w, metrics, _, _ = head(head.initial_carry(b), b)
    _, out = m(m.initial_carry(b), b)
    _, loss_0, _, _, _ = head0(head0.initial_carry(b), b)
    kl = out["kl"]
    assert kl.shape == (B,) and (kl > 0).all()
    torch.testing.assert_close(loss_w - loss_0, w * kl.sum(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close((loss_w - loss_0) / B, w * kl.mean(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(metrics["kl"], kl.sum(), rtol=1e-5, atol=1e-5)


def test_diagnostics_on_identical_and_different_demos():
    m = build().eval()
    b = batch(same_demos=True)
    _, out = m(m.initial_carry(b), b)
    d = m.diagnostics(out)
    assert set(d) >= {
        "train/encoder_cross_sample_var",
        "train/encoder_output_mean",
        "train/encoder_output_norm",
        "train/encoder_output_std",
        "train/encoder_token_std",
    }
    # sample 0 has one masked slot, the others the same three demos: compare samples 1..3 only
    b["demo_mask"][0, 2] = True
    _, out = m(m.initial_carry(b), b)
    assert m.diagnostics(out)["train/encoder_cross_sample_var"] == pytest.approx(0.0, abs=1e-10)
    _, out = m(m.initial_carry(batch()), batch())
    assert m.diagnostics(out)["train/encoder_cross_sample_var"] > 1e-6
    assert m.diagnostics({})["train/encoder_output_norm"] > 0  # fallback: the last forward's context


def test_load_pretrained_decoder_ours_and_arch_check(tmp_path):
    from training.checkpoint import FORMAT

    torch.manual_seed(1)
    trm = models.build_model(arch(), vocab_size=V, seq_len=S, num_puzzle_identifiers=5, batch_size=B)
    path = tmp_path / "step_1.pt"
    torch.save({"format": FORMAT, "model": trm.state_dict(), "ema": None, "arch": arch()}, path)
    m = build()
    load_pretrained_decoder(m, str(path), verbose=False)
    for k, v in trm.inner.state_dict().items():
        if not k.startswith("puzzle_emb"):
            torch.testing.assert_close(m.inner.state_dict()[k], v)
    enc_before = {k: v.clone() for k, v in m.encoder.state_dict().items()}
    assert all(torch.equal(enc_before[k], v) for k, v in m.encoder.state_dict().items())
    # an L_cycles mismatch (pitfall 10) is refused, naming the field
    m6 = build(arch_kw={"L_cycles": 2})
    with pytest.raises(Exception, match="L_cycles"):
        load_pretrained_decoder(m6, str(path), verbose=False)
    # the same through the config key
    cfg = {
        "arch": arch(),
        "encoder": {"name": "standard", "hidden_size": 32, "num_heads": 4},
        "load_pretrained_decoder": str(path),
        "global_batch_size": B,
    }
    m2 = build_etrm_model(config_from_dict(cfg), meta(), verbose=False)
    torch.testing.assert_close(m2.inner.state_dict()["lm_head.weight"], trm.inner.state_dict()["lm_head.weight"])


def test_load_pretrained_decoder_original_layout(tmp_path):
    torch.manual_seed(2)
    trm = models.build_model(arch(), vocab_size=V, seq_len=S, num_puzzle_identifiers=5, batch_size=B)
    sd = {f"_orig_mod.model.{k}": v for k, v in trm.state_dict().items()}
    path = tmp_path / "step_100"
    torch.save(sd, path)
    (tmp_path / "all_config.yaml").write_text(
        "arch:\n  hidden_size: %d\n  num_heads: 4\n  expansion: 2\n  L_layers: 1\n  H_cycles: 2\n  L_cycles: 3\n"
        "  puzzle_emb_ndim: %d\n  puzzle_emb_len: %d\n  pos_encodings: rope\n" % (HID, HID, L)
    )
    m = build()
    with pytest.raises(Exception, match="L_cycles"):
        load_pretrained_decoder(m, str(path), verbose=False)
    (tmp_path / "all_config.yaml").write_text(
        (tmp_path / "all_config.yaml").read_text().replace("L_cycles: 3", "L_cycles: 1")
    )
    load_pretrained_decoder(m, str(path), verbose=False)
    torch.testing.assert_close(m.inner.state_dict()["lm_head.weight"], trm.inner.state_dict()["lm_head.weight"])


def test_encoder_cache_refilled_slots_get_a_fresh_live_context_others_their_cached_one():
    """Pitfall 2 ablation, per slot: with encoder_cache a slot refilled at a later step gets the fresh (graph-carrying)
    encoding of its NEW demos; a running slot keeps its first-step context, stored detached."""
    m = build(encoder_cache=True).train()
    b1, b2 = batch(seed=0), batch(seed=1)
    carry, out1 = m(m.initial_carry(b1), b1)
    ctx1 = out1["encoder_context"].detach()
    carry.halted = torch.tensor([True, False, True, False])
    _, out2 = m(carry, b2)
    ctx2 = out2["encoder_context"]
    m.eval()  # the standard encoder is deterministic: its fresh encoding of b2
    fresh = m.encoder(b2["demo_inputs"], b2["demo_labels"], b2["demo_mask"]).context.detach()
    torch.testing.assert_close(ctx2[[0, 2]].detach(), fresh[[0, 2]])
    torch.testing.assert_close(ctx2[[1, 3]].detach(), ctx1[[1, 3]])
    enc_params = [p for p in m.encoder.parameters()]
    g_fresh = torch.autograd.grad(ctx2[0].sum(), enc_params, retain_graph=True, allow_unused=True)
    g_cached = torch.autograd.grad(ctx2[1].sum(), enc_params, retain_graph=True, allow_unused=True)
    assert sum(float(g.abs().sum()) for g in g_fresh if g is not None) > 0
    assert all(g is None or float(g.abs().sum()) == 0 for g in g_cached)


@pytest.mark.parametrize("name", ["standard", "variational", "recurrent"])
def test_eval_encodes_once_per_refill_and_matches_re_encoding(name):
    """Evaluator hot path: in eval a slot's demos do not change between ACT steps and the encoding is deterministic
    (posterior mean), so the encoder runs only when a slot is (re)filled; the contexts and KL equal a fresh
    re-encoding at every step. The recurrent encoder refines z_E and must still run every step."""
    m = build(name).eval()
    b = batch()
    calls = []
    orig = m.encoder.forward

    def spy(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    m.encoder.forward = spy
    with torch.inference_mode():
        carry = m.initial_carry(b)
        outs = []
        for _ in range(m.halt_max_steps):
            carry, out = m(carry, b)
            outs.append(out)
        assert len(calls) == (m.halt_max_steps if name == "recurrent" else 1)
        if name != "recurrent":
            ref = orig(b["demo_inputs"], b["demo_labels"], b["demo_mask"])
            for out in outs:
                torch.testing.assert_close(out["encoder_context"], ref.context)
                if name == "variational":
                    torch.testing.assert_close(out["kl"], ref.kl)
        # a refilled slot triggers a new encoding of its new demos
        carry.halted = torch.tensor([False, True, False, False])
        b2 = batch(seed=3)
        calls.clear()
        _, out = m(carry, b2)
        assert len(calls) == 1
        if name != "recurrent":
            torch.testing.assert_close(
                out["encoder_context"][1], orig(b2["demo_inputs"], b2["demo_labels"], b2["demo_mask"]).context[1]
            )
            torch.testing.assert_close(out["encoder_context"][0], outs[-1]["encoder_context"][0])

"""Encoder variants: shapes, padding / empty-slot invariance, demo-order invariance, gradients, KL, configs."""

import pytest
import torch

from encoders import ENCODER_REGISTRY, EncoderConfigError, build_encoder, gaussian_kl

# the demo encoders (every generic invariance below); variants of them (own registry names) have their own tests
NAMES = ["hybrid", "lpn", "recurrent", "standard", "variational"]
VARIANTS = ["dihedral_views"]
H, V, S, L = 16, 12, 12, 4


def make(name, seq_len=S, **over):
    cfg = {"name": name, "hidden_size": 32, "num_heads": 4, **over}
    torch.manual_seed(0)
    return build_encoder(cfg, hidden_size=H, vocab_size=V, seq_len=seq_len, puzzle_emb_len=L, verbose=False)


def demos(b=3, d=3, s=S, seed=1):
    g = torch.Generator().manual_seed(seed)
    di = torch.randint(2, V, (b, d, s), generator=g, dtype=torch.int32)
    dl = torch.randint(2, V, (b, d, s), generator=g, dtype=torch.int32)
    di[..., s // 2 :] = 0  # PAD tail, as on a canvas
    dl[..., -3:] = 0
    dl[..., -4] = 1  # an EOS token
    mask = torch.ones(b, d, dtype=torch.bool)
    mask[1, 2] = False
    return di, dl, mask


def run(enc, di, dl, m):
    out = enc(di, dl, m, state=None)
    if enc.capabilities.recurrent:  # second ACT step from the returned state
        out = enc(di, dl, m, state=out.state)
    return out


def test_registry_has_all_variants():
    assert sorted(ENCODER_REGISTRY) == sorted(NAMES + VARIANTS)


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_finiteness(name):
    enc = make(name)
    di, dl, m = demos()
    m[2] = False  # a sample without any demo must still be well defined (no NaN)
    out = run(enc.train(), di, dl, m)
    assert out.context.shape == (3, L, H)
    assert torch.isfinite(out.context).all()
    if name in ("variational", "hybrid"):
        assert out.kl.shape == (3,) and torch.isfinite(out.kl).all() and (out.kl > 0).all()
    if name == "recurrent":
        assert out.state is not None and out.state.shape[0] == 3 and out.state.requires_grad


@pytest.mark.parametrize("name", NAMES)
def test_padding_and_empty_slots_do_not_change_output(name):
    enc = make(name, seq_len=S + 5).eval()
    di, dl, m = demos()
    ref = run(enc, di, dl, m).context
    # 1) extra trailing PAD tokens on every demo canvas
    pad = torch.zeros(*di.shape[:2], 5, dtype=di.dtype)
    out_pad = run(enc, torch.cat([di, pad], -1), torch.cat([dl, pad], -1), m).context
    # 2) extra demo slots that are masked out (garbage content) or real-masked but all PAD
    g = torch.randint(2, V, (3, 2, S), dtype=di.dtype)
    di2, dl2 = torch.cat([di, g, torch.zeros_like(g)], 1), torch.cat([dl, g, torch.zeros_like(g)], 1)
    m2 = torch.cat([m, torch.zeros(3, 2, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)], 1)
    out_slots = run(enc, di2, dl2, m2).context
    # 3) garbage in the masked slot already present
    di3 = di.clone()
    di3[1, 2] = 7
    out_garbage = run(enc, di3, dl, m).context
    # 4) without cropping (full canvas attention with masks) the result is the same
    enc_nc = make(name, seq_len=S + 5, crop_padding=False, pack_tokens=False).eval()
    enc_nc.load_state_dict(enc.state_dict())
    out_nc = run(enc_nc, di, dl, m).context
    for o in (out_pad, out_slots, out_garbage, out_nc):
        torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    # sanity: the content of a real demo does matter
    di4 = di.clone()
    di4[0, 0, 0] = 2 if di[0, 0, 0] != 2 else 3
    assert not torch.allclose(run(enc, di4, dl, m).context[0], ref[0], atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_demo_order_invariance(name):
    enc = make(name).eval()
    di, dl, m = demos(d=4)
    ref = run(enc, di, dl, m).context
    perm = torch.tensor([2, 0, 3, 1])
    out = run(enc, di[:, perm], dl[:, perm], m[:, perm]).context
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_gradient(name):
    """Pitfall 1: one backward pass reaches every encoder parameter (incl. the recurrent z_E init)."""
    over = {"variational": True} if name == "lpn" else {}
    enc = make(name, context_scale="gate", **over).train()
    di, dl, m = demos()
    out = run(enc, di, dl, m)
    w = torch.randn_like(out.context)
    loss = (out.context * w).sum() + (out.kl.sum() if out.kl is not None else 0)
    loss.backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, f"{name}: parameters without gradient: {missing}"


def test_recurrent_state_is_refined_and_not_detached():
    enc = make("recurrent").train()
    di, dl, m = demos()
    s0 = enc.initial_state(3, "cpu")
    o1 = enc(di, dl, m, state=s0)
    assert not torch.allclose(o1.state, s0)
    o2 = enc(di, dl, m, state=o1.state)
    assert not torch.allclose(o2.context, o1.context)  # the context depends on the carried state
    # gradient of the step-2 context flows through the carried state into the trunk of step 1
    g = torch.autograd.grad(o2.context.sum(), o1.state, retain_graph=True)[0]
    assert g.abs().sum() > 0


def test_zero_demos_control_ignores_demos():
    enc = make("standard", zero_demos=True).eval()
    di, dl, m = demos()
    a = enc(di, dl, m).context
    b = enc(torch.randint(2, V, di.shape, dtype=di.dtype), dl, m).context
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a[0], a[1])  # every sample gets the same (demo-free) context
    normal = make("standard").eval()
    c = normal(di, dl, m).context
    assert not torch.allclose(c[0], c[1])


def test_gaussian_kl_matches_closed_form_and_is_per_sample():
    mu = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    logvar = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    # 0.5 * (mu^2 + e^lv - 1 - lv) summed over coordinates
    expected = torch.tensor([0.5, 0.5 * 4 + 0.5 * (torch.e - 1 - 1)])
    torch.testing.assert_close(gaussian_kl(mu, logvar), expected)
    # per sample, not a batch mean: duplicating the batch leaves each value and doubles the sum
    kl2 = gaussian_kl(torch.cat([mu, mu]), torch.cat([logvar, logvar]))
    torch.testing.assert_close(kl2.sum(), 2 * expected.sum())


@pytest.mark.parametrize("name", ["variational", "hybrid"])
def test_variational_sampling_train_vs_eval(name):
    enc = make(name)
    di, dl, m = demos()
    enc.train()
    a, b = enc(di, dl, m).context, enc(di, dl, m).context
    assert not torch.allclose(a, b)  # reparameterised sample
    enc.eval()
    c, d = enc(di, dl, m), enc(di, dl, m)
    torch.testing.assert_close(c.context, d.context)  # mean in evaluation
    assert enc.capabilities.kl_weight == pytest.approx(1e-3)


def test_config_errors_name_the_field():
    with pytest.raises(EncoderConfigError, match="latnt_dim"):
        make("variational", latnt_dim=3)
    with pytest.raises(EncoderConfigError, match="nope"):
        build_encoder({"name": "nope"}, hidden_size=H, vocab_size=V, seq_len=S, puzzle_emb_len=L)
    with pytest.raises(EncoderConfigError, match="num_heads"):
        make("standard", num_heads=5)


def test_yaml_configs_hold_only_what_differs_from_the_class_defaults():
    """config/encoder/<name>.yaml exists for every registered encoder (variants too) and holds no value: it starts
    from the Hydra node of its class defaults (encoders.hydra_defaults), so `encoder=<name>` composes exactly the
    class defaults and a key overrides there (`encoder.grid_coords=true`) as on any field. A restated default (or
    any other value) in the file fails here: the class is the one source of defaults."""
    import os

    from omegaconf import OmegaConf

    from training.config import load_config

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "encoder")
    assert sorted(f[:-5] for f in os.listdir(root)) == sorted(ENCODER_REGISTRY)
    for name in ENCODER_REGISTRY:
        raw = OmegaConf.to_container(OmegaConf.load(os.path.join(root, f"{name}.yaml")))
        assert raw == {"defaults": [{"defaults@_here_": name}, "_self_"]}, f"config/encoder/{name}.yaml sets values"
        cfg = load_config("cfg_pretrain_encoder_arc_agi_1", ["data_paths=[x]", f"encoder={name}"]).encoder
        assert cfg == ENCODER_REGISTRY[name].config(name=name)
        over = load_config(
            "cfg_pretrain_encoder_arc_agi_1",
            ["data_paths=[x]", f"encoder={name}", "encoder.grid_coords=true", "encoder.num_layers=1"],
        )
        assert over.encoder.grid_coords is True and over.encoder.num_layers == 1
        enc = build_encoder(
            dict(cfg.model_dump(), hidden_size=32, num_heads=4),
            hidden_size=H,
            vocab_size=V,
            seq_len=16,
            puzzle_emb_len=L,
            verbose=False,
        )
        assert type(enc) is ENCODER_REGISTRY[name].cls


def test_parameter_count_printed(capsys):
    build_encoder(
        {"name": "standard", "hidden_size": 32, "num_heads": 4},
        hidden_size=H,
        vocab_size=V,
        seq_len=S,
        puzzle_emb_len=L,
    )
    assert "trainable parameters" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["standard", "variational", "hybrid"])
def test_mean_aggregation_is_padding_and_order_invariant(name):
    enc = make(name, aggregation="mean").eval()
    di, dl, m = demos(d=4)
    ref = enc(di, dl, m).context
    perm = torch.tensor([3, 1, 0, 2])
    torch.testing.assert_close(enc(di[:, perm], dl[:, perm], m[:, perm]).context, ref, atol=1e-5, rtol=1e-5)
    extra = torch.zeros(3, 2, S, dtype=di.dtype)
    m2 = torch.cat([m, torch.zeros(3, 2, dtype=torch.bool)], 1)
    torch.testing.assert_close(
        enc(torch.cat([di, extra + 5], 1), torch.cat([dl, extra], 1), m2).context, ref, atol=1e-5, rtol=1e-5
    )


def test_context_scale_gate_and_scalar_scale_the_context():
    di, dl, m = demos()
    base = make("standard").eval()
    for mode, init, factor in (("scalar", 0.5, 0.5), ("gate", 0.25, 0.25)):
        enc = make("standard", context_scale=mode, context_scale_init=init).eval()
        enc.load_state_dict(base.state_dict(), strict=False)
        torch.testing.assert_close(enc(di, dl, m).context, factor * base(di, dl, m).context, atol=1e-6, rtol=1e-4)


def test_context_scale_norm_puts_every_context_token_at_token_embedding_scale():
    """``context_scale=norm``: each context token is the plain context's direction at RMS init/sqrt(hidden), whatever
    the plain context's size (a context grown 100x reaches the decoder at the same scale)."""
    di, dl, m = demos()
    base = make("standard").eval()
    enc = make("standard", context_scale="norm", context_scale_init=2.0).eval()
    enc.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        plain = base(di, dl, m).context
        ctx = enc(di, dl, m).context
        hidden = ctx.shape[-1]
        rms = ctx.square().mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.full_like(rms, 2.0 / hidden**0.5), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(
            ctx, plain / plain.square().mean(-1, keepdim=True).sqrt() * 2.0 / hidden**0.5, atol=1e-5, rtol=1e-4
        )
        for mod in (base, enc):
            mod.head.proj.weight.mul_(100.0)
        torch.testing.assert_close(enc(di, dl, m).context, ctx, atol=1e-5, rtol=1e-4)
        assert base(di, dl, m).context.abs().max() > 50 * plain.abs().max()


def test_activation_checkpointing_gives_the_same_gradients():
    di, dl, m = demos()
    grads = []
    for ckpt in (False, True):
        enc = make("standard", activation_checkpointing=ckpt).train()
        enc(di, dl, m).context.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "name,over,field",
    [
        ("lpn", {"aggregation": "mean"}, "aggregation"),
        ("lpn", {"num_queries": 4}, "num_queries"),
        ("lpn", {"kl_weight": 0.5}, "kl_weight"),
        ("recurrent", {"aggregation": "mean"}, "aggregation"),
    ],
)
def test_settings_an_encoder_does_not_use_are_refused_not_ignored(name, over, field):
    """Pitfall 8: a shared base-config key the chosen encoder never reads (lpn always mean-pools its pair latents
    into one latent; recurrent aggregates by its own z_E cross-attention; lpn's KL exists only with
    variational: true) must raise naming the field instead of silently doing nothing."""
    with pytest.raises(EncoderConfigError, match=field):
        make(name, **over)
    make(name)  # the defaults (as in config/encoder/*.yaml) stay valid
    if name == "lpn" and field == "kl_weight":
        assert make(name, variational=True, **over).capabilities.kl_weight == 0.5


# ------------------------------------------------------------------ trunk options: token aggregation, aligned pairs
# (name, overrides): every encoder with the aligned per-cell pair layout; every encoder that aggregates with
# cross-attention with ``aggregation: tokens`` (lpn always mean-pools its pair latents)
OPTIONS = (
    [(n, {"pair_layout": "aligned"}) for n in NAMES]
    + [(n, {"aggregation": "tokens"}) for n in NAMES if n != "lpn"]
    + [("standard", {"aggregation": "tokens", "pair_layout": "aligned"})]
)
OPTION_IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in OPTIONS]


def make_opt(name, over, **kw):
    return make(name, **{**over, **kw})


@pytest.mark.parametrize("name,over", OPTIONS, ids=OPTION_IDS)
def test_options_shapes_padding_order_and_gradients(name, over):
    """The trunk options keep every encoder invariant: shapes and no NaN without demos, trailing PAD / extra empty
    or masked slots / cropping change nothing, demo order changes nothing, and every parameter gets gradient."""
    di, dl, m = demos(d=4)
    enc = make_opt(name, over, seq_len=S + 5).eval()
    ref = run(enc, di, dl, m).context
    assert ref.shape == (3, L, H) and torch.isfinite(ref).all()
    m0 = m.clone()
    m0[2] = False  # a sample without any demo
    assert torch.isfinite(run(enc, di, dl, m0).context).all()
    pad = torch.zeros(*di.shape[:2], 5, dtype=di.dtype)
    g = torch.randint(2, V, (3, 2, S), dtype=di.dtype)
    m2 = torch.cat([m, torch.zeros(3, 2, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)], 1)
    nc = make_opt(name, over, seq_len=S + 5, crop_padding=False, pack_tokens=False).eval()
    nc.load_state_dict(enc.state_dict())
    perm = torch.tensor([2, 0, 3, 1])
    for out in (
        run(enc, torch.cat([di, pad], -1), torch.cat([dl, pad], -1), m).context,
        run(enc, torch.cat([di, g, torch.zeros_like(g)], 1), torch.cat([dl, g, torch.zeros_like(g)], 1), m2).context,
        run(nc, di, dl, m).context,
        run(enc, di[:, perm], dl[:, perm], m[:, perm]).context,
    ):
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    di4 = di.clone()
    di4[0, 0, 0] = 2 if di[0, 0, 0] != 2 else 3
    assert not torch.allclose(run(enc, di4, dl, m).context[0], ref[0], atol=1e-6)  # content matters
    extra = {"variational": True} if name == "lpn" else {}
    enc = make_opt(name, over, context_scale="gate", **extra).train()
    out = run(enc, di, dl, m)
    loss = (out.context * torch.randn_like(out.context)).sum() + (out.kl.sum() if out.kl is not None else 0)
    loss.backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, f"{name} {over}: parameters without gradient: {missing}"


def test_token_aggregation_attends_over_every_non_pad_token_of_every_valid_demo():
    enc = make("standard", aggregation="tokens", pair_layout="sequence").eval()
    di, dl, m = demos()
    keys, mask = enc.trunk.keys(di, dl, m)
    # cropped to the longest input (S/2) and output (S-3) canvas: T = 6 + 9 tokens per demo, 3 slots
    assert keys.shape == (3, 3 * 15, 32) and mask.shape == (3, 45)
    want = ((di != 0).sum(-1) + (dl != 0).sum(-1)) * m  # non-PAD tokens of the valid demos only
    assert mask.sum(-1).tolist() == want.sum(-1).tolist()
    assert (keys[~mask] == 0).all()
    pooled, valid = make("standard", aggregation="cross_attention").trunk.keys(di, dl, m)  # one pooled key per demo
    assert pooled.shape == (3, 3, 32) and valid.tolist() == m.tolist()


def test_aligned_layout_is_one_token_per_cell_and_keeps_the_direction_of_the_change():
    enc = make("standard", pair_layout="aligned", aggregation="tokens").eval()
    di, dl, m = demos()
    keys, mask = enc.trunk.keys(di, dl, m)
    assert keys.shape == (3, 3 * 9, 32)  # one token per cell up to the longer canvas (S-3), not 2*S
    assert mask.sum(-1).tolist() == ((((di != 0) | (dl != 0)).sum(-1)) * m).sum(-1).tolist()
    # input and output have separate colour tables: swapping them (the inverse rule) changes the context
    x = torch.randint(2, V, (1, 2, 9), dtype=di.dtype)
    y = torch.randint(2, V, (1, 2, 9), dtype=di.dtype)
    mm = torch.ones(1, 2, dtype=torch.bool)
    assert not torch.allclose(enc(x, y, mm).context, enc(y, x, mm).context, atol=1e-4)


def test_trunk_option_values_are_validated_and_unused_ones_refused():
    with pytest.raises(EncoderConfigError, match="pair_layout"):
        make("standard", pair_layout="interleaved")
    with pytest.raises(EncoderConfigError, match="aggregation"):
        make("lpn", aggregation="tokens")  # lpn always mean-pools its pair latents
    with pytest.raises(EncoderConfigError, match="aggregation"):
        make("recurrent", aggregation="mean")
    assert make("recurrent", aggregation="tokens").trunk.cfg.aggregation == "tokens"


def ragged_demos(b=4, d=5, s=40, seed=3):
    """Demos whose real-token counts span several packing buckets (1, 8, 16, 17, ..., s = a full bucket), with
    PAD holes inside the canvas (rows shorter than the canvas), an all-PAD slot and a masked slot."""
    g = torch.Generator().manual_seed(seed)
    di = torch.randint(2, V, (b, d, s), generator=g, dtype=torch.int32)
    dl = torch.randint(2, V, (b, d, s), generator=g, dtype=torch.int32)
    counts = torch.tensor([1, 8, 16, 17, 40, 3, 24, 9, 31, 8, 12, 5, 16, 40, 2, 20, 7, 11, 26, 40])[: b * d]
    keep = torch.zeros(b * d, s, dtype=torch.bool)
    for i, c in enumerate(counts.tolist()):
        keep[i, torch.randperm(s, generator=g)[:c]] = True
    keep = keep.view(b, d, s)
    di, dl = di * keep, dl * keep
    dl[1, 3] = 0
    di[1, 3] = 0  # an all-PAD slot (skipped)
    mask = torch.ones(b, d, dtype=torch.bool)
    mask[2, 1] = False
    return di, dl, mask


PACK_CASES = OPTIONS + [
    ("standard", {"pair_layout": "sequence"}),
    ("lpn", {"pair_layout": "sequence"}),
    ("standard", {"aggregation": "tokens", "activation_checkpointing": True}),
]


@pytest.mark.parametrize(
    "name,over", PACK_CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in PACK_CASES]
)
def test_packed_tokens_match_the_padded_path(name, over):
    """pack_tokens (the default) runs the per-demo blocks on the real tokens only, attention per length bucket:
    the context, the KL and every parameter's gradient equal the padded reference (pack_tokens=false, no cropping)
    on demos of ragged lengths."""
    from encoders.layers import TokenPacking

    di, dl, m = ragged_demos()
    real = (di != 0) | (dl != 0)
    if over.get("pair_layout") == "sequence":
        real = torch.cat([di != 0, dl != 0], -1)
    pk, _, _ = TokenPacking.build(real.flatten(0, 1)[real.flatten(0, 1).any(-1) & m.flatten()])
    assert len(pk.buckets) >= 4 and {b.index is None for b in pk.buckets} == {True, False}  # not vacuous
    outs = []
    for packed in (True, False):
        enc = make(name, seq_len=40, pack_tokens=packed, crop_padding=packed, **over).train()
        torch.manual_seed(5)  # the variational sample
        out = run(enc, di, dl, m)
        w = torch.randn(out.context.shape, generator=torch.Generator().manual_seed(7))
        ((out.context * w).sum() + (out.kl.sum() if out.kl is not None else 0)).backward()
        outs.append((out, {n: p.grad.clone() for n, p in enc.named_parameters()}))
    (a, ga), (b, gb) = outs
    torch.testing.assert_close(a.context, b.context, atol=2e-5, rtol=1e-5)
    if a.kl is not None:
        torch.testing.assert_close(a.kl, b.kl, atol=2e-5, rtol=1e-5)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=2e-5, rtol=1e-4, msg=lambda s, n=n: f"{n}: {s}")


def test_cross_attention_projects_only_attended_keys_with_the_same_numbers():
    """Cross-attention with a key mask projects only the attended keys (the aggregation's many PAD keys cost
    nothing): output and gradients equal softmax attention over the full projection with masked scores."""
    import torch.nn.functional as F

    from encoders.layers import Attention

    torch.manual_seed(0)
    att = Attention(16, 4)
    x, ctx = torch.randn(3, 2, 16), torch.randn(3, 9, 16, requires_grad=True)
    mask = torch.rand(3, 9) > 0.5
    mask[:, 0] = True
    out = att(x, ctx, mask)
    q = F.linear(x, att.q.weight).view(3, 2, 4, 4).transpose(1, 2)
    k, v = (t.view(3, 9, 4, 4).transpose(1, 2) for t in F.linear(ctx, att.kv.weight).chunk(2, -1))
    s = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask[:, None, None, :], float("-inf"))
    ref = F.linear((s.softmax(-1) @ v).transpose(1, 2).reshape(3, 2, 16), att.o.weight)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    (g,) = torch.autograd.grad(out.square().sum(), ctx)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), ctx)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5)
    assert (g[~mask] == 0).all() and (g[mask] != 0).any()


def grid_demos(b=3, d=3, side=7, seed=4):
    """Demos as real canvases: random grids (sides 1..5) written at random offsets of a side x side canvas."""
    import numpy as np

    from dataset.canvas import grid_to_canvas

    rng = np.random.default_rng(seed)

    def canvas():
        h, w = rng.integers(1, 6, size=2)
        off = (int(rng.integers(0, side - h + 1)), int(rng.integers(0, side - w + 1)))
        return grid_to_canvas(rng.integers(0, 10, size=(h, w)), offset=off, size=side)

    di = torch.from_numpy(np.stack([[canvas() for _ in range(d)] for _ in range(b)])).int()
    dl = torch.from_numpy(np.stack([[canvas() for _ in range(d)] for _ in range(b)])).int()
    mask = torch.ones(b, d, dtype=torch.bool)
    mask[1, 2] = False
    return di, dl, mask


def zeroed_tables_give_the_plain_encoder(demo_batch, prefix, name="standard", **over):
    """An encoder option (or variant ``name``) that adds tables (parameters named ``prefix``*) changes the context
    against the same weights without it, and with those tables zeroed gives exactly the standard encoder without
    the option. Returns it."""
    plain = make("standard", seq_len=49, pair_layout=over["pair_layout"]).eval()
    enc = make(name, seq_len=49, **over).eval()
    plain.load_state_dict({k: v for k, v in enc.state_dict().items() if not k.startswith(prefix)})
    ref = run(plain, *demo_batch).context
    assert not torch.allclose(run(enc, *demo_batch).context, ref, atol=1e-4)
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if n.startswith(prefix):
                p.zero_()
    torch.testing.assert_close(run(enc, *demo_batch).context, ref, atol=1e-6, rtol=1e-6)
    return enc


def packed_equals_padded(demo_batch, name="standard", **over):
    """The packed path (pack_tokens, crop_padding) gives the context and every gradient of the padded reference on
    real canvases (seq_len 49); returns the packed run's gradients."""
    outs = []
    for packed in (True, False):
        e = make(name, seq_len=49, pack_tokens=packed, crop_padding=packed, **over).train()
        out = run(e, *demo_batch)
        (out.context * torch.randn(out.context.shape, generator=torch.Generator().manual_seed(7))).sum().backward()
        outs.append((out.context, {n: p.grad.clone() for n, p in e.named_parameters()}))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-5, rtol=1e-5)
    for n in outs[0][1]:
        torch.testing.assert_close(outs[0][1][n], outs[1][1][n], atol=2e-5, rtol=1e-4, msg=lambda s, n=n: f"{n}: {s}")
    return outs[0][1]


@pytest.mark.parametrize("layout", ["aligned", "sequence"])
def test_grid_coords_in_the_encoder_add_grid_offsets_and_keep_the_packed_path_exact(layout):
    """encoder.grid_coords: each token gets the offsets of its cell from the edges of the input grid and the
    output grid. Zeroed offset tables give exactly the encoder without them; non-zero ones change the context;
    the packed path still equals the padded reference (context and every gradient)."""
    di, dl, m = grid_demos()
    enc = zeroed_tables_give_the_plain_encoder((di, dl, m), "trunk.coord_", pair_layout=layout, grid_coords=True)
    assert enc.trunk.coord_in.shape == enc.trunk.coord_out.shape == (4, 15, 32)
    grads = packed_equals_padded((di, dl, m), pair_layout=layout, grid_coords=True)
    assert grads["trunk.coord_out"].abs().sum() > 0
    with pytest.raises(EncoderConfigError, match="square canvas"):
        make("standard", seq_len=40, grid_coords=True)


@pytest.mark.parametrize(
    "name,layout,init",
    [
        ("standard", "aligned", "identity"),
        ("standard", "sequence", "identity"),
        ("lpn", "sequence", "identity"),
        ("recurrent", "aligned", "identity"),
    ],
)
def test_pointer_rope_in_the_encoder_is_wired_and_keeps_the_packed_path_exact(name, layout, init):
    """encoder.pointer: every per-demo self-attention layer gets a pointer projection (zero weights, the bias at the
    starting pointers) and rotates queries / keys by pointer RoPE relative to each demo's input grid. It changes the
    context against the same weights without it, the pointer weights get gradient, and the packed path equals the
    padded reference (context and every gradient) on real canvases of several grid sizes and offsets."""
    from core.ops import pointer_bias

    di, dl, m = grid_demos()
    plain = make(name, seq_len=49, pair_layout=layout).eval()
    enc = make(name, seq_len=49, pair_layout=layout, pointer=init).eval()
    pointers = [blk.attn.pointer for blk in enc.trunk.blocks]
    assert pointers and all(torch.equal(p.bias.detach(), pointer_bias(4, init)) for p in pointers)
    plain.load_state_dict({k: v for k, v in enc.state_dict().items() if ".pointer" not in k})
    assert not torch.allclose(run(enc, di, dl, m).context, run(plain, di, dl, m).context, atol=1e-4)
    outs = []
    for packed in (True, False):
        e = make(name, seq_len=49, pair_layout=layout, pointer=init, pack_tokens=packed, crop_padding=packed).train()
        torch.manual_seed(5)
        out = run(e, di, dl, m)
        (out.context * torch.randn(out.context.shape, generator=torch.Generator().manual_seed(7))).sum().backward()
        outs.append((out.context, {n: p.grad.clone() for n, p in e.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-5, rtol=1e-5)
    assert outs[0][1].keys() == outs[1][1].keys()
    for n in outs[0][1]:
        torch.testing.assert_close(outs[0][1][n], outs[1][1][n], atol=2e-5, rtol=1e-4, msg=lambda s, n=n: f"{n}: {s}")
    assert all(outs[0][1][f"trunk.blocks.{i}.attn.pointer.weight"].abs().sum() > 0 for i in range(len(pointers)))


def test_encoder_pointer_needs_a_square_canvas_and_a_head_dim_of_at_least_8():
    with pytest.raises(EncoderConfigError, match="square canvas"):
        make("standard", seq_len=40, pointer="identity")
    with pytest.raises(EncoderConfigError, match="at least 8"):
        make("standard", seq_len=49, pointer="identity", num_heads=8)  # head dim 4
    with pytest.raises(EncoderConfigError):
        make("standard", seq_len=49, pointer="sideways")


@pytest.mark.parametrize("name,layout", [("standard", "aligned"), ("standard", "sequence"), ("lpn", "sequence")])
def test_encoder_pointer_features_are_relative_to_each_demos_input_grid(name, layout):
    """Every token's pointer features are those of its canvas cell relative to the demo's *input* grid -- output
    tokens of the sequence layout included (so an output cell can point into the input) -- in the token order
    ([CLS,] cells or [CLS,] input cells then output cells); a CLS token gets (0, 0, 0, 0, 1)."""
    from core.ops import pointer_features

    enc = make(name, seq_len=49, pair_layout=layout, pointer="identity")
    trunk = enc.trunk
    di, dl, _ = grid_demos()
    inp = di[:, 0].long()
    last = lambda t: int(((t != 0).any(0) * torch.arange(1, 50)).max())  # noqa: E731 - kept length, as cropped
    li, lo = last(inp), last(dl[:, 0])
    got = trunk._pointers(inp[:, :li], li, lo)
    ref, _ = pointer_features(inp, 7)
    P = 1 if trunk.cls is not None else 0
    if P:
        assert torch.equal(got.feats[:, 0], torch.tensor([0.0, 0, 0, 0, 1]).expand(inp.shape[0], 5))
    assert torch.equal(got.feats[:, P : P + li], ref[:, :li])
    if layout == "sequence":
        assert got.feats.shape[1] == P + li + lo and torch.equal(got.feats[:, P + li :], ref[:, :lo])
    else:
        assert got.feats.shape[1] == P + li
    assert got.k_cos.shape == (inp.shape[0], got.feats.shape[1], 1, 8)


def test_pointer_rotation_keeps_the_compute_dtype_under_autocast():
    """Under bf16 autocast the rotated q / k come back in q's dtype (the pointers themselves are computed in fp32)."""
    from encoders.layers import Attention

    enc = make("standard", seq_len=49, pointer="identity")
    di, dl, m = grid_demos()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ctx = enc(di, dl, m).context
    assert torch.isfinite(ctx.float()).all()
    att = Attention(32, 4, pointer="identity")
    pts = enc.trunk._pointers(di[:, 0].long(), 49, 49)
    x = torch.randn(3, 49, 32)
    q = torch.randn(3, 49, 4, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qr, kr = att._rotate(x, q, q.clone(), pts)
    assert qr.dtype == kr.dtype == torch.bfloat16


# ------------------------------------------------------------------ the dihedral_views variant (encoder=dihedral_views)
def mapped_demos(maps, side=7, seed=3):
    """One demo per map of ``maps``: a random grid at a random offset and its image under the map at the same
    top-left corner (as the builder writes a demo pair, translated together)."""
    import numpy as np

    from dataset.canvas import grid_to_canvas
    from dataset.dihedral import dihedral_transform

    rng = np.random.default_rng(seed)
    ins, outs = [], []
    for d in maps:
        h, w = (int(v) for v in rng.integers(2, 6, size=2))
        g = rng.integers(0, 10, size=(h, w))
        off = (int(rng.integers(0, side - max(h, w) + 1)), int(rng.integers(0, side - max(h, w) + 1)))
        ins.append(grid_to_canvas(g, offset=off, size=side))
        outs.append(grid_to_canvas(dihedral_transform(g, d), offset=off, size=side))
    return torch.from_numpy(np.stack(ins)).long(), torch.from_numpy(np.stack(outs)).long()


def test_dihedral_agreement_marks_exactly_the_map_each_demo_shows():
    """core.ops.dihedral_sources / dihedral_agreement: for a demo whose output is its input under map d, every
    output colour cell agrees under d (its source is the input cell dihedral_transform copies there), on grids of
    several shapes and offsets; under every other map some cell does not (random grids have no symmetry)."""
    from core.ops import dihedral_agreement

    maps = [d for d in range(8) for _ in range(6)]
    inp, out = mapped_demos(maps)
    colour, agreement = dihedral_agreement(inp, out, 7)
    cells = out >= 2
    for i, d in enumerate(maps):
        assert (agreement[i, d][cells[i]] == 2).all() and (colour[i, d][cells[i]] == out[i][cells[i]]).all()
        assert (agreement[i, d][~cells[i]] == 0).all()
        others = [e for e in range(8) if e != d]
        assert all(not (agreement[i, e][cells[i]] == 2).all() for e in others), (i, d)


def test_dihedral_views_are_wired_and_keep_the_packed_path_exact():
    """encoder=dihedral_views adds per-map source-colour and agreement embeddings to each aligned token of the
    standard encoder: zeroed tables give exactly the standard encoder, non-zero ones change the context, the packed
    path equals the padded reference (context and every gradient), and the options it needs are checked."""
    di, dl, m = grid_demos()
    enc = zeroed_tables_give_the_plain_encoder((di, dl, m), "trunk.view_", name="dihedral_views", pair_layout="aligned")
    assert enc.trunk.view_tok.shape == (8, V, 32) and enc.trunk.view_eq.shape == (8, 3, 32)
    from core.ops import dihedral_agreement

    with torch.no_grad():  # the bag of 16 rows per cell = the sum over maps of the two tables' rows
        enc.trunk.view_tok.normal_()
        enc.trunk.view_eq.normal_()
        inp, out = di.flatten(0, 1).long(), dl.flatten(0, 1).long()
        colour, agreement = dihedral_agreement(inp, out, 7)
        want = sum(enc.trunk.view_tok[d][colour[:, d]] + enc.trunk.view_eq[d][agreement[:, d]] for d in range(8))
        torch.testing.assert_close(enc.trunk.cell_features(inp, out), want, atol=1e-5, rtol=1e-5)
    grads = packed_equals_padded((di, dl, m), name="dihedral_views", pair_layout="aligned")
    assert grads["trunk.view_eq"].abs().sum() > 0 and grads["trunk.view_tok"].abs().sum() > 0
    with pytest.raises(EncoderConfigError, match="pair_layout=aligned"):
        make("dihedral_views", seq_len=49, pair_layout="sequence")
    with pytest.raises(EncoderConfigError, match="dihedral_views needs a square canvas"):
        make("dihedral_views", seq_len=40)


def test_dihedral_views_keep_the_encoder_invariances():
    """The variant keeps what every demo encoder guarantees (as the generic tests above check for NAMES): no NaN
    without demos, extra masked / all-PAD slots and demo order change nothing, every parameter gets gradient."""
    enc = make("dihedral_views", seq_len=49).eval()
    di, dl, m = grid_demos()
    ref = run(enc, di, dl, m).context
    perm = torch.tensor([2, 0, 1])
    torch.testing.assert_close(run(enc, di[:, perm], dl[:, perm], m[:, perm]).context, ref, atol=1e-5, rtol=1e-5)
    junk = torch.randint(2, V, (3, 1, 49), dtype=di.dtype)
    di2, dl2 = torch.cat([di, junk, torch.zeros_like(junk)], 1), torch.cat([dl, junk, torch.zeros_like(junk)], 1)
    m2 = torch.cat([m, torch.zeros(3, 1, dtype=torch.bool), torch.ones(3, 1, dtype=torch.bool)], 1)
    torch.testing.assert_close(run(enc, di2, dl2, m2).context, ref, atol=1e-5, rtol=1e-5)
    m0 = m.clone()
    m0[2] = False
    assert torch.isfinite(run(enc, di, dl, m0).context).all()
    enc = make("dihedral_views", seq_len=49, context_scale="gate").train()
    (run(enc, di, dl, m).context * torch.randn(3, L, H)).sum().backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing

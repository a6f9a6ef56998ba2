"""TRM / HRM / transformer: shapes, ACT semantics, gradient flow, puzzle prefix, config strictness."""

from typing import Any, Dict

import pytest
import torch

from models import ARCH_REGISTRY, ArchConfigError, build_loss_head, build_model, parse_arch_config
from models.layers import rms_norm

VOCAB, SEQ, NPUZ = 12, 8, 6

TINY: Dict[str, Dict[str, Any]] = {
    "trm": dict(
        name="trm",
        hidden_size=16,
        num_heads=2,
        H_cycles=3,
        L_cycles=2,
        L_layers=2,
        halt_max_steps=4,
        puzzle_emb_ndim=16,
        puzzle_emb_len=3,
        forward_dtype="float32",
    ),
    "hrm": dict(
        name="hrm",
        hidden_size=16,
        num_heads=2,
        H_cycles=2,
        L_cycles=2,
        H_layers=1,
        L_layers=1,
        halt_max_steps=4,
        puzzle_emb_ndim=16,
        forward_dtype="float32",
    ),
    "transformer": dict(
        name="transformer",
        hidden_size=16,
        num_heads=2,
        num_layers=2,
        puzzle_emb_ndim=16,
        puzzle_emb_len=2,
        forward_dtype="float32",
    ),
}


def make(name="trm", batch_size=4, **over):
    cfg = {**TINY[name], **over}
    torch.manual_seed(0)
    return build_model(cfg, vocab_size=VOCAB, seq_len=SEQ, num_puzzle_identifiers=NPUZ, batch_size=batch_size)


def batch_of(b=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "inputs": torch.randint(0, VOCAB, (b, SEQ), generator=g, dtype=torch.int32),
        "labels": torch.randint(0, VOCAB, (b, SEQ), generator=g).long(),
        "puzzle_identifiers": torch.randint(1, NPUZ, (b,), generator=g, dtype=torch.int32),
    }


def set_q_bias(model, halt: float, cont: float = -5.0):
    with torch.no_grad():
        model.inner.q_head.bias.copy_(torch.tensor([halt, cont]))


# ---------------------------------------------------------------------------------------------- shapes / registry
@pytest.mark.parametrize("name", sorted(TINY))
def test_shapes_and_output_dtypes(name):
    model = make(name)
    batch = batch_of()
    carry = model.initial_carry(batch)
    assert carry.halted.all() and carry.steps.dtype == torch.int32
    carry, out = model(carry, batch)
    assert out["logits"].shape == (4, SEQ, VOCAB)  # prefix positions removed
    assert out["q_halt_logits"].shape == (4,) and out["q_halt_logits"].dtype == torch.float32
    assert out["q_continue_logits"].shape == (4,)
    assert carry.steps.tolist() == [1, 1, 1, 1]


def test_trm_config_holds_the_paper_s_fields_only():
    """TRMConfig reads like the paper (sizes, puzzle embedding, positions, recursion depth, halting, loss): a
    research switch goes into a variant module with its own name (models/variants/), not into the core."""
    from models import TRMConfig

    assert set(TRMConfig.model_fields) == {
        "name",
        "vocab_size",
        "seq_len",
        "hidden_size",
        "num_heads",
        "expansion",
        "puzzle_emb_ndim",
        "puzzle_emb_len",
        "pos_encodings",
        "rms_norm_eps",
        "rope_theta",
        "forward_dtype",
        "loss",
        "halt_max_steps",
        "halt_exploration_prob",
        "halt_early_in_eval",
        "no_ACT_continue",
        "H_cycles",
        "L_cycles",
        "L_layers",
        "H_layers",
        "mlp_t",
    }


def test_registry_and_build_model_types():
    from models import HRM, TRM, TransformerBaseline

    assert {"trm", "hrm", "transformer"} <= set(ARCH_REGISTRY)
    assert isinstance(make("trm"), TRM) and isinstance(make("hrm"), HRM)
    assert isinstance(make("transformer"), TransformerBaseline)


STEM_KEYS = ["embed_tokens.embedding_weight", "lm_head.weight", "q_head.weight", "q_head.bias", "puzzle_emb.weights"]
BLOCK_KEYS = ["self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight"]


@pytest.mark.parametrize(
    "name,states,levels",
    [
        ("trm", True, [("L_level", 2)]),
        ("hrm", True, [("H_level", 1), ("L_level", 1)]),
        ("transformer", False, [("layers", 2)]),
    ],
)
def test_one_core_base_keeps_the_published_names_and_resets_to_the_initial_states(name, states, levels):
    """TRM, HRM and the transformer are one ACTCore (built from ``inner_cls``); TRM and HRM share RecurrentInner
    (the initial states and their reset). The state_dict names (old checkpoints load) and the carry's class name
    (stored in a checkpoint's ACT carry) are those of the published models."""
    from models.base import ACTCore, RecurrentInner

    model = make(name)
    assert isinstance(model, ACTCore) and "__init__" not in type(model).__dict__
    assert isinstance(model.inner, RecurrentInner) == states
    blocks = [f"{lvl}.layers.{i}.{k}" for lvl, n in levels for i in range(n) for k in BLOCK_KEYS]
    assert list(model.state_dict()) == [
        f"inner.{k}" for k in (["H_init", "L_init"] if states else []) + STEM_KEYS + blocks
    ]
    b = batch_of()
    carry = model.refill(model.initial_carry(b), b)  # every slot takes new data: the fixed initial states
    if not states:
        assert carry.inner_carry is None
        return
    assert f"{type(carry.inner_carry).__module__}:{type(carry.inner_carry).__qualname__}" == (
        f"models.{name}:{name.upper()}InnerCarry"
    )
    assert torch.equal(carry.inner_carry.z_H, model.inner.H_init.expand_as(carry.inner_carry.z_H))
    assert torch.equal(carry.inner_carry.z_L, model.inner.L_init.expand_as(carry.inner_carry.z_L))
    carry.halted[:] = torch.tensor([True, False, True, False])
    moved = type(carry.inner_carry)(carry.inner_carry.z_H + 1, carry.inner_carry.z_L - 1)
    reset = model.inner.reset_carry(carry.halted, moved)
    assert torch.equal(reset.z_H[0], model.inner.H_init.expand_as(reset.z_H[0])) and torch.equal(
        reset.z_H[1], moved.z_H[1]
    )
    assert torch.equal(reset.z_L[2], model.inner.L_init.expand_as(reset.z_L[2])) and torch.equal(
        reset.z_L[3], moved.z_L[3]
    )


def test_declared_core_attributes_no_puzzle_embedding_and_no_memory_read():
    model = make("trm", puzzle_emb_ndim=0)
    assert model.puzzle_emb is None and model.inner.puzzle_emb is None and not model.reads_memory
    assert "puzzle_emb" not in dict(model.named_modules())  # nothing in the state_dict either
    assert make("transformer").halt_early_in_eval is False


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_trainable_parameter_gets_gradient(name):
    """Pitfall 1: one backward pass reaches every parameter (and the sparse puzzle embedding's local copy). The
    variants: tests/test_models_variants.py (which checks that the two files cover the registry)."""
    over = {"no_ACT_continue": False} if name != "transformer" else {}
    model = make(name, **over)
    model.train()
    head = build_loss_head(model)
    batch = batch_of()
    carry = head.initial_carry(batch)
    carry, loss, metrics, _, _ = head(carry, batch)
    loss.backward()
    dead = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert dead == []
    assert model.puzzle_emb.local_weights.grad.abs().sum() > 0


def test_bf16_forward_dtype():
    model = make("trm", forward_dtype="bfloat16")
    carry, out = model(model.initial_carry(batch_of()), batch_of())
    assert out["logits"].dtype == torch.bfloat16 and out["q_halt_logits"].dtype == torch.float32
    assert carry.inner_carry.z_H.dtype == torch.bfloat16
    assert model.inner.L_level.layers[0].mlp.down_proj.weight.dtype == torch.float32  # fp32 master weights


# ---------------------------------------------------------------------------------------------- init
def test_q_head_init_and_initial_states():
    model = make("trm")
    assert torch.count_nonzero(model.inner.q_head.weight) == 0
    assert model.inner.q_head.bias.tolist() == [-5.0, -5.0]
    _, out = model(model.initial_carry(batch_of()), batch_of())
    assert torch.allclose(out["q_halt_logits"], torch.full((4,), -5.0))
    sd = model.state_dict()
    assert "inner.H_init" in sd and "inner.L_init" in sd  # persistent buffers, as in the original
    assert "inner.H_init" not in dict(model.named_parameters())
    assert model.inner.puzzle_emb.weights.abs().sum() == 0  # zero-init puzzle embedding (buffer)
    assert "inner.puzzle_emb.weights" in sd and "inner.puzzle_emb.local_weights" not in sd


# ---------------------------------------------------------------------------------------------- recursion / gradient
def test_trm_recursion_order_and_gradient_only_in_last_cycle():
    model = make("trm", H_cycles=3, L_cycles=2)
    model.train()
    grad_flags = []
    model.inner.L_level.register_forward_hook(lambda m, i, o: grad_flags.append(torch.is_grad_enabled()))
    batch = batch_of()
    carry = model.refill(model.initial_carry(batch), batch)
    new_carry, out = model.step(carry)
    # H_cycles * (L_cycles + 1) network applications, only the last L_cycles + 1 with grad
    assert grad_flags == [False] * 6 + [True] * 3
    assert not new_carry.inner_carry.z_H.requires_grad and not new_carry.inner_carry.z_L.requires_grad

    # Reference recursion written out by hand: same numbers
    inner = model.inner
    x = inner.input_embeddings(carry.current_data["inputs"], carry.current_data["puzzle_identifiers"])
    net = lambda h, inj: inner.L_level(h, inj, inner.cos_sin(carry.current_data["inputs"]))  # noqa: E731
    z_H, z_L = carry.inner_carry.z_H, carry.inner_carry.z_L
    for _ in range(3):
        for _ in range(2):
            z_L = net(z_L, z_H + x)
        z_H = net(z_H, z_L)
    assert torch.allclose(new_carry.inner_carry.z_H, z_H, atol=1e-5)
    assert torch.allclose(out["logits"], inner.lm_head(z_H)[:, inner.puzzle_emb_len :], atol=1e-5)

    # The gradient equals that of the reference with the first two cycles detached ...
    w = model.inner.L_level.layers[0].mlp.down_proj.weight
    g_model = torch.autograd.grad(out["logits"].square().sum(), w)[0]
    z_H, z_L = carry.inner_carry.z_H, carry.inner_carry.z_L
    with torch.no_grad():
        for _ in range(2):
            for _ in range(2):
                z_L = net(z_L, z_H + x)
            z_H = net(z_H, z_L)
    for _ in range(2):
        z_L = net(z_L, z_H + x)
    z_H = net(z_H, z_L)
    g_ref = torch.autograd.grad(inner.lm_head(z_H)[:, inner.puzzle_emb_len :].square().sum(), w)[0]
    assert torch.allclose(g_model, g_ref, atol=1e-5)


def test_hrm_one_step_gradient():
    model = make("hrm", H_cycles=2, L_cycles=3, no_ACT_continue=True)
    flags = []
    model.inner.L_level.register_forward_hook(lambda m, i, o: flags.append(("L", torch.is_grad_enabled())))
    model.inner.H_level.register_forward_hook(lambda m, i, o: flags.append(("H", torch.is_grad_enabled())))
    model(model.initial_carry(batch_of()), batch_of())
    assert flags == [("L", False)] * 3 + [("H", False)] + [("L", False)] * 2 + [("L", True), ("H", True)]


# ---------------------------------------------------------------------------------------------- ACT semantics
def run_until(model, batch, n):
    carry = model.initial_carry(batch)
    history = []
    for _ in range(n):
        carry, out = model(carry, batch)
        history.append((carry.steps.clone(), carry.halted.clone()))
    return carry, history


def test_forced_halt_at_max_steps_in_training():
    model = make("trm", halt_max_steps=3, halt_exploration_prob=0.0)
    model.train()
    set_q_bias(model, -5.0)  # never wants to halt
    _, hist = run_until(model, batch_of(), 4)
    assert [h.tolist() for _, h in hist] == [[False] * 4, [False] * 4, [True] * 4, [False] * 4]
    assert [s.tolist() for s, _ in hist] == [[1] * 4, [2] * 4, [3] * 4, [1] * 4]  # reset after the halt


def test_q_halt_positive_halts_in_training_but_not_in_eval():
    model = make("trm", halt_max_steps=4, halt_exploration_prob=0.0)
    set_q_bias(model, 5.0)
    model.train()
    _, hist = run_until(model, batch_of(), 1)
    assert hist[0][1].all()
    model.eval()  # evaluation runs all halt_max_steps
    _, hist = run_until(model, batch_of(), 4)
    assert [h.all().item() for _, h in hist] == [False, False, False, True]
    model.halt_early_in_eval = True
    _, hist = run_until(model, batch_of(), 1)
    assert hist[0][1].all()
    assert make("trm", halt_early_in_eval=True).halt_early_in_eval


def test_q_continue_mode_halts_when_halt_beats_continue_and_returns_target():
    model = make("trm", halt_max_steps=4, halt_exploration_prob=0.0, no_ACT_continue=False)
    model.train()
    set_q_bias(model, 1.0, 2.0)  # q_halt > 0 but < q_continue: keep going
    carry, out = model(model.initial_carry(batch_of()), batch_of())
    assert not carry.halted.any()
    assert "target_q_continue" in out and out["target_q_continue"].shape == (4,)
    # target = sigmoid(max(next q_halt, next q_continue)) = sigmoid(2) with zero q-head weights
    assert torch.allclose(out["target_q_continue"], torch.sigmoid(torch.tensor(2.0)).expand(4))
    set_q_bias(model, 3.0, 2.0)
    carry, _ = model(model.initial_carry(batch_of()), batch_of())
    assert carry.halted.all()


def test_exploration_min_steps_within_bounds():
    torch.manual_seed(1)
    b = 64
    model = make("trm", batch_size=b, halt_max_steps=5, halt_exploration_prob=1.0)
    model.train()
    set_q_bias(model, 5.0)  # wants to halt at once; exploration forces a random minimum in [2, 5]
    batch = batch_of(b)
    carry = model.initial_carry(batch)
    halt_step = torch.zeros(b, dtype=torch.long)
    for step in range(1, 6):
        carry, _ = model(carry, batch)
        newly = carry.halted & (halt_step == 0)
        halt_step[newly] = step
    assert halt_step.min() >= 2 and halt_step.max() <= 5
    assert set(halt_step.tolist()) == {2, 3, 4, 5}


def test_halted_slots_are_reset_and_refilled_others_kept():
    model = make("trm", halt_max_steps=4, halt_exploration_prob=0.0)
    model.train()
    b1, b2 = batch_of(4, seed=1), batch_of(4, seed=2)
    carry, _ = model(model.initial_carry(b1), b1)
    carry.halted = torch.tensor([True, False, True, False])
    refilled = model.refill(carry, b2)
    for k in b1:
        assert torch.equal(refilled.current_data[k][[0, 2]], b2[k][[0, 2]])
        assert torch.equal(refilled.current_data[k][[1, 3]], b1[k][[1, 3]])
    assert refilled.steps.tolist() == [0, 1, 0, 1]
    z_H = refilled.inner_carry.z_H
    assert torch.equal(z_H[0], model.inner.H_init.expand_as(z_H[0]))
    assert torch.equal(z_H[1], carry.inner_carry.z_H[1])
    assert torch.equal(refilled.inner_carry.z_L[2], model.inner.L_init.expand_as(z_H[2]))
    new_carry, _ = model(carry, b2)
    assert new_carry.steps.tolist() == [1, 2, 1, 2]
    assert torch.equal(new_carry.current_data["labels"][0], b2["labels"][0])


def test_transformer_halts_after_one_step():
    model = make("transformer")
    for mode in (model.train, model.eval):
        mode()
        carry, _ = model(model.initial_carry(batch_of()), batch_of())
        assert carry.halted.all() and carry.steps.tolist() == [1] * 4
    assert model.halt_max_steps == 1


# ---------------------------------------------------------------------------------------------- prefix
def test_puzzle_embedding_fills_first_prefix_token_only():
    model = make("trm", puzzle_emb_len=3)
    model.train()
    with torch.no_grad():
        model.inner.puzzle_emb.weights.copy_(torch.randn(NPUZ, 16))
    batch = batch_of()
    emb = model.inner.input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
    assert emb.shape == (4, 3 + SEQ, 16)
    scale = 16**0.5
    expected = scale * model.inner.puzzle_emb.weights[batch["puzzle_identifiers"].long()]
    assert torch.allclose(emb[:, 0], expected)
    assert torch.count_nonzero(emb[:, 1:3]) == 0  # pitfall 23: the other prefix tokens are zeros
    assert torch.equal(model.inner.puzzle_emb.local_ids, batch["puzzle_identifiers"])


def test_prefix_context_replaces_puzzle_prefix():
    model = make("trm", puzzle_emb_len=3)
    batch = batch_of()
    ctx = torch.randn(4, 3, 16, requires_grad=True)
    emb = model.inner.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context=ctx)
    assert torch.allclose(emb[:, :3], 16**0.5 * ctx)
    carry = model.initial_carry(batch)
    _, out_plain = model(carry, batch)
    _, out_ctx = model(carry, batch, prefix_context=ctx)
    assert not torch.allclose(out_plain["logits"], out_ctx["logits"])
    out_ctx["logits"].sum().backward()
    assert ctx.grad is not None and ctx.grad.abs().sum() > 0  # the encoder gets gradient through the context
    with pytest.raises(ValueError, match="prefix_context must have shape"):
        model(carry, batch, prefix_context=torch.randn(4, 2, 16))


def test_prefix_without_puzzle_embedding_is_zeros_and_context_still_works():
    model = make("trm", puzzle_emb_ndim=0, puzzle_emb_len=3)
    assert model.puzzle_emb is None and model.puzzle_emb_len == 3
    batch = batch_of()
    emb = model.inner.input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
    assert torch.count_nonzero(emb[:, :3]) == 0
    carry, out = model(model.initial_carry(batch), batch, prefix_context=torch.randn(4, 3, 16))
    assert out["logits"].shape == (4, SEQ, VOCAB)


def test_learned_positions_and_mlp_t_variants_run():
    for over in (dict(pos_encodings="learned"), dict(mlp_t=True, pos_encodings="none")):
        model = make("trm", **over)
        _, out = model(model.initial_carry(batch_of()), batch_of())
        assert torch.isfinite(out["logits"]).all()


def _scores(table, q, k):
    """Attention logits between every pair of positions for one fixed query vector q and key vector k."""
    from models.layers import apply_rotary_pos_emb

    cos, sin = table
    n = cos.shape[0]
    qr, kr = apply_rotary_pos_emb(q.expand(1, n, 1, -1), k.expand(1, n, 1, -1), cos, sin)
    return qr[0, :, 0] @ kr[0, :, 0].T


def test_unknown_key_is_an_error_naming_it():
    with pytest.raises(ArchConfigError, match="unknown key 'arch.latent_dim'"):
        parse_arch_config({**TINY["trm"], "latent_dim": 7})
    with pytest.raises(ArchConfigError, match="arch.loss.kl_wieght"):
        parse_arch_config({**TINY["trm"], "loss": {"kl_wieght": 1.0}})
    with pytest.raises(ArchConfigError, match="arch.L_cycles"):
        parse_arch_config({**TINY["trm"], "L_cycles": "many"})
    with pytest.raises(ArchConfigError, match="unknown arch "):
        parse_arch_config({**TINY["trm"], "name": "trn"})
    with pytest.raises(ArchConfigError, match=r"hidden_size \(16\) must be divisible by num_heads \(3\)"):
        parse_arch_config({**TINY["trm"], "num_heads": 3})
    with pytest.raises(ArchConfigError, match="divisible"):
        parse_arch_config({**TINY["transformer"], "num_heads": 5})
    with pytest.raises(ArchConfigError, match="unknown key 'arch.L_cycles'"):  # a TRM key is not a transformer key
        parse_arch_config({**TINY["transformer"], "L_cycles": 2, "num_layers": 2})


def test_omegaconf_input_and_yaml_files():
    """Every config/arch/*.yaml composes (Hydra, over its class defaults: node arch/defaults/<name>) into the config
    class its name registers, an OmegaConf DictConfig is accepted as it is, and each file holds only what differs
    from the class defaults: the variants' defaults are the science recipe's core (trm.yaml's values)."""
    from pathlib import Path

    import yaml
    from omegaconf import OmegaConf

    from models import hydra_defaults
    from training.config import load_config

    root = Path(__file__).resolve().parents[1] / "config" / "arch"
    names = {
        f.stem: load_config("cfg_pretrain", [f"arch={f.stem}", "data_paths=[x]"]).arch for f in root.glob("*.yaml")
    }
    assert parse_arch_config(OmegaConf.create(names["trm"].model_dump())) == names["trm"]
    assert names["trm"].L_cycles == 4 and names["trm"].hidden_size == 512 and names["trm"].puzzle_emb_len == 16
    assert names["trm"].loss.loss_type == "stable_max_cross_entropy"
    assert names["trm_mlp_t"].mlp_t and names["trm_mlp_t"].L_cycles == 6
    assert names["hrm"].name == "hrm" and names["transformer"].name == "transformer"
    for stem, cfg in names.items():
        assert type(cfg) is ARCH_REGISTRY.entry(cfg.name).config, stem
        own = {k: v for k, v in yaml.safe_load((root / f"{stem}.yaml").read_text()).items() if k != "defaults"}
        defaults = hydra_defaults(cfg.name)
        assert all(v != defaults.get(k) for k, v in own.items() if k != "loss"), stem  # only what differs
    trm = names["trm"].model_dump(exclude={"name"})
    assert names["trm_grid"].model_dump(exclude={"name"}) == trm
    memory = {"memory_read": "cycle", "memory_width": None, "memory_max_demos": 16}
    assert names["trm_memory"].model_dump(exclude={"name"}) == {**trm, **memory}
    views = {"views": ["dihedral", "shift", "roll", "scale", "tile", "settle"], "views_gate": "match"}
    views.update(views_match="agree", views_gate_scale=1.0, views_match_scale=10.0)
    views.update(cell_features=["object_size", "rays"], demo_lookup=["colour", "object"])  # the science recipe's
    views.update(views_embed="kind")
    assert names["trm_views"].model_dump(exclude={"name"}) == {**trm, **memory, **views}
    # the class defaults are the recipe's (what the tests build is what runs): the file adds the paper's loss only
    assert {k: v for k, v in hydra_defaults("trm_views").items() if k != "loss"} == {
        k: v for k, v in names["trm_views"].model_dump(mode="json").items() if k != "loss"
    }


def test_loss_head_from_config():
    model = make("trm", loss={"loss_type": "stablemax_cross_entropy"})
    head = build_loss_head(model)
    assert head.loss_type == "stable_max_cross_entropy" and head.q_loss_weight == 0.5
    head = build_loss_head(model, extra_loss_weights={"kl": 0.25})
    assert head.extra_loss_weights == {"kl": 0.25}


def test_tiny_trm_post_norm_state_is_normalised():
    """z_H after a step is the output of a post-norm block: unit RMS per position."""
    model = make("trm")
    carry, _ = model(model.initial_carry(batch_of()), batch_of())
    z = carry.inner_carry.z_H
    assert torch.allclose(z.pow(2).mean(-1), torch.ones_like(z[..., 0]), atol=1e-3)
    assert torch.allclose(rms_norm(z, 1e-5), z, atol=1e-4)


def test_act_step_compiles_without_graph_breaks():
    """Pitfall 18: no .item()/host syncs or data-dependent Python branches in the forward (fullgraph=True)."""
    torch._dynamo.reset()
    model = make("trm", H_cycles=2, L_cycles=1, L_layers=1)
    model.train()
    head = build_loss_head(model)
    compiled = torch.compile(head, backend="eager", fullgraph=True)
    batch = batch_of()
    carry = head.initial_carry(batch)
    for _ in range(2):
        carry, loss, metrics, _, _ = compiled(carry, batch)
        loss.backward()
    assert carry.steps.tolist() == [2] * 4
    assert model.puzzle_emb.local_weights.grad.abs().sum() > 0
    torch._dynamo.reset()


def test_tiny_trm_fits_a_fixed_batch_with_adamatan2_and_sign_sgd():
    """End-to-end sanity of model + loss head + both optimizers: the loss on one fixed batch collapses."""
    from models.sparse_embedding import SignSGDSparse
    from training.optim import AdamATan2

    model = make(
        "trm",
        H_cycles=2,
        L_cycles=1,
        L_layers=1,
        halt_max_steps=1,
        hidden_size=32,
        puzzle_emb_ndim=32,
        puzzle_emb_len=1,
    )
    model.train()
    head = build_loss_head(model)
    opt = AdamATan2(model.parameters(), lr=3e-3, weight_decay=0.0)
    emb_opt = SignSGDSparse(model.puzzle_emb, lr=1e-2, weight_decay=0.0)
    batch = batch_of()
    losses = []
    for _ in range(60):
        carry = head.initial_carry(batch)
        carry, loss, metrics, _, _ = head(carry, batch)
        loss.backward()
        opt.step()
        emb_opt.step()
        opt.zero_grad()
        emb_opt.zero_grad()
        losses.append(metrics["lm_loss"].item() / 4)
    assert losses[-1] < 0.2 * losses[0]
    assert metrics["exact_accuracy"].item() == 4
    touched = batch["puzzle_identifiers"].long().unique()
    assert model.puzzle_emb.weights[touched].abs().sum() > 0
    assert model.puzzle_emb.weights[0].abs().sum() == 0  # untouched row stays zero

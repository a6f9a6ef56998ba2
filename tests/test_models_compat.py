"""Original TRM checkpoints load into our TRM; structural arch mismatches are refused (pitfall 10)."""

import warnings

import pytest
import torch

from models import build_loss_head, build_model
from models.compat import (
    ArchMismatchError,
    check_arch_compat,
    load_original_trm_checkpoint,
    normalise_original_keys,
    original_arch_to_ours,
)

CFG = dict(
    name="trm",
    hidden_size=16,
    num_heads=2,
    H_cycles=2,
    L_cycles=2,
    L_layers=2,
    halt_max_steps=3,
    puzzle_emb_ndim=16,
    puzzle_emb_len=4,
    forward_dtype="float32",
)
DIMS = dict(vocab_size=12, seq_len=6, num_puzzle_identifiers=5, batch_size=2)

# The original code's key layout for L_layers=2, rope, attention (see models/compat.py docstring).
ORIGINAL_KEYS = {
    "model.inner.embed_tokens.embedding_weight",
    "model.inner.lm_head.weight",
    "model.inner.q_head.weight",
    "model.inner.q_head.bias",
    "model.inner.puzzle_emb.weights",
    "model.inner.H_init",
    "model.inner.L_init",
    *[
        f"model.inner.L_level.layers.{i}.{m}"
        for i in range(2)
        for m in (
            "self_attn.qkv_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_up_proj.weight",
            "mlp.down_proj.weight",
        )
    ],
}


def make(seed, **over):
    torch.manual_seed(seed)
    return build_model({**CFG, **over}, **DIMS)


def to_original_layout(model, compiled=True):
    """Synthesise a state dict exactly as the original code writes it (compiled ACTLossHead, bf16 init states)."""
    prefix = "_orig_mod.model." if compiled else "model."
    sd = {}
    for k, v in model.state_dict().items():
        v = v.clone()
        if k.endswith(("H_init", "L_init")):
            v = v.to(torch.bfloat16)  # the original stores them in forward_dtype
        sd[prefix + k] = v
    return sd


def test_our_state_dict_has_the_original_layout():
    keys = {"model." + k for k in make(0).state_dict()}
    assert keys == ORIGINAL_KEYS


def test_load_original_checkpoint_reproduces_outputs(tmp_path):
    src = make(1)
    with torch.no_grad():
        src.inner.puzzle_emb.weights.normal_()
        src.inner.q_head.weight.normal_()
    path = tmp_path / "step_1000"
    torch.save(to_original_layout(src), path)
    dst = make(2)
    assert not torch.equal(dst.inner.lm_head.weight, src.inner.lm_head.weight)
    report = load_original_trm_checkpoint(
        dst,
        str(path),
        original_arch={
            "name": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",
            "loss": {"name": "losses@ACTLossHead"},
            "hidden_size": 16,
            "num_heads": 2,
            "H_cycles": 2,
            "L_cycles": 2,
            "L_layers": 2,
            "H_layers": 0,
            "puzzle_emb_ndim": 16,
            "puzzle_emb_len": 4,
            "halt_max_steps": 3,
            "pos_encodings": "rope",
            "expansion": 4,
            "mlp_t": False,
            "forward_dtype": "float32",
        },
    )
    assert report["missing"] == [] and report["unexpected"] == []
    for k, v in src.state_dict().items():
        if k.endswith(("H_init", "L_init")):
            assert torch.equal(dst.state_dict()[k], v.to(torch.bfloat16).float())
        else:
            assert torch.equal(dst.state_dict()[k], v), k
    # Same predictions (up to the bf16 rounding of the initial states, which we load as stored)
    batch = {
        "inputs": torch.randint(0, 12, (2, 6), dtype=torch.int32),
        "labels": torch.randint(0, 12, (2, 6)),
        "puzzle_identifiers": torch.tensor([1, 3], dtype=torch.int32),
    }
    with torch.no_grad():
        src.inner.H_init.copy_(src.inner.H_init.bfloat16().float())
        src.inner.L_init.copy_(src.inner.L_init.bfloat16().float())
    src.eval()
    dst.eval()
    _, a = src(src.initial_carry(batch), batch)
    _, b = dst(dst.initial_carry(batch), batch)
    assert torch.allclose(a["logits"], b["logits"], atol=1e-6)


def test_load_into_loss_head_and_uncompiled_layout():
    src = make(1)
    head = build_loss_head(make(2))
    load_original_trm_checkpoint(head, to_original_layout(src, compiled=False))
    assert torch.equal(head.model.inner.lm_head.weight, src.inner.lm_head.weight)


def test_key_normalisation():
    sd = {"_orig_mod.model.inner.lm_head.weight": torch.zeros(1), "model.inner.H_init": torch.zeros(1)}
    assert set(normalise_original_keys(sd)) == {"inner.lm_head.weight", "inner.H_init"}


def test_l_cycles_mismatch_refused_unless_allowed():
    src = make(1)
    dst = make(2, L_cycles=6)
    original = {
        "hidden_size": 16,
        "num_heads": 2,
        "H_cycles": 2,
        "L_cycles": 4,
        "L_layers": 2,
        "puzzle_emb_ndim": 16,
        "puzzle_emb_len": 4,
    }
    with pytest.raises(ArchMismatchError, match="L_cycles: original TRM checkpoint has 4, model has 6"):
        load_original_trm_checkpoint(dst, to_original_layout(src), original_arch=original)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        load_original_trm_checkpoint(dst, to_original_layout(src), original_arch=original, allow=["L_cycles"])
    assert any("L_cycles" in str(x.message) for x in w)
    assert torch.equal(dst.inner.lm_head.weight, src.inner.lm_head.weight)


def test_shape_mismatch_names_key_and_shapes():
    src = make(1)
    dst = build_model({**CFG, "hidden_size": 32}, **DIMS)
    with pytest.raises(
        ArchMismatchError, match=r"inner\.embed_tokens\.embedding_weight: checkpoint \(12, 16\) vs model \(12, 32\)"
    ):
        load_original_trm_checkpoint(dst, to_original_layout(src))
    dst2 = build_model(CFG, **{**DIMS, "num_puzzle_identifiers": 9})
    with pytest.raises(ArchMismatchError, match="puzzle_emb.weights"):
        load_original_trm_checkpoint(dst2, to_original_layout(src))


def test_missing_keys_strict():
    sd = to_original_layout(make(1))
    del sd["_orig_mod.model.inner.q_head.bias"]
    with pytest.raises(ArchMismatchError, match="q_head.bias"):
        load_original_trm_checkpoint(make(2), sd)
    rep = load_original_trm_checkpoint(make(2), sd, strict=False)
    assert rep["missing"] == ["inner.q_head.bias"]


def test_check_arch_compat_fields():
    check_arch_compat(CFG, {**CFG})  # identical: fine
    check_arch_compat({k: v for k, v in CFG.items() if k != "rope_theta"}, {**CFG, "rope_theta": 10000.0})  # default
    with pytest.raises(ArchMismatchError) as e:
        check_arch_compat({**CFG, "hidden_size": 32, "num_heads": 4}, CFG)
    assert "hidden_size: checkpoint has 32, model has 16" in str(e.value)
    assert "num_heads: checkpoint has 4, model has 2" in str(e.value)
    with pytest.raises(ArchMismatchError, match="puzzle_emb_len"):
        check_arch_compat({**CFG, "puzzle_emb_len": 16}, CFG)
    with pytest.raises(ArchMismatchError, match="name: checkpoint has 'hrm'"):
        check_arch_compat({"name": "hrm"}, CFG)
    with pytest.warns(UserWarning, match="halt_max_steps"):
        check_arch_compat({**CFG, "halt_max_steps": 16}, CFG)  # behavioural: warn only


def test_original_arch_translation():
    ours = original_arch_to_ours(
        {
            "name": "recursive_reasoning.trm@X",
            "loss": {"loss_type": "stablemax_cross_entropy"},
            "hidden_size": 512,
            "L_cycles": 4,
            "unknown_original_key": 1,
        }
    )
    assert ours == {"name": "trm", "hidden_size": 512, "L_cycles": 4, "loss": {"loss_type": "stablemax_cross_entropy"}}


# ----------------------------------------------------------------- every field of the config class is compared
def test_every_config_field_is_compared_unless_declared_run_time():
    """compat takes its fields from the config classes: each field of each registered class is compared (refused or,
    declared behavioural, warned) unless it is in the declared run-time set; nothing is compared that no class has."""
    from models import ARCH_REGISTRY
    from models.compat import BEHAVIOURAL_FIELDS, RUNTIME_FIELDS, compared_fields

    every = {f for c in ARCH_REGISTRY.configs() for f in c.model_fields}
    assert RUNTIME_FIELDS | BEHAVIOURAL_FIELDS <= every
    for name in ARCH_REGISTRY:
        fields = set(ARCH_REGISTRY.entry(name).config.model_fields)
        assert set(compared_fields({"name": name})) == fields - RUNTIME_FIELDS, name
    assert {"memory_read", "views", "views_gate", "cell_features", "demo_lookup"} <= set(
        compared_fields({"name": "trm_views"})
    )


MEMORY = dict(CFG, name="trm_memory", puzzle_emb_ndim=0, puzzle_emb_len=2, memory_width=16, memory_read="cycle")


def test_a_fine_tune_across_memory_read_is_refused_in_one_line(tmp_path):
    """load_checkpoint= of a trm_memory checkpoint trained with memory_read=cycle into memory_read=step: the same name
    and parameters, another computation. Refused in one line naming the field and both values (at 3548346 it loaded
    silently: compat compared two hand-written lists without the variant's fields). The same values load."""
    from core.errors import one_line
    from training.checkpoint import FORMAT, CheckpointError, check_arch_compatible, load_weights

    with pytest.raises(ArchMismatchError, match="memory_read: checkpoint has 'cycle', model has 'step'"):
        check_arch_compat(MEMORY, {**MEMORY, "memory_read": "step"})
    path = str(tmp_path / "step_5.pt")
    torch.save({"format": FORMAT, "arch": MEMORY, "model": {}}, path)
    with pytest.raises(CheckpointError) as e:
        load_weights(torch.nn.Linear(1, 1), path, arch={**MEMORY, "memory_read": "step"}, strict=False)
    msg = str(e.value)
    assert (
        one_line(msg) == msg and msg.startswith(path) and "memory_read: checkpoint has 'cycle', model has 'step'" in msg
    )
    check_arch_compatible(MEMORY, dict(MEMORY))  # the same config: accepted
    check_arch_compatible(MEMORY, {**MEMORY, "memory_width": None})  # a width the encoder fills: not compared
    with pytest.raises(CheckpointError, match="views_gate: checkpoint has 'match', model has 'tiebreak'"):
        views = {**MEMORY, "name": "trm_views"}
        check_arch_compatible(views, {**views, "views_gate": "tiebreak"})

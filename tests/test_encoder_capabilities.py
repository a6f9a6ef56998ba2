"""Declared encoder capabilities (encoders.interface.EncoderCapabilities): every registered encoder declares them,
each declaration matches what the encoder does, and models.etrm.ETRM acts on the declaration (no attribute probes,
no borrowed methods: its ACT step is the core's)."""

import dataclasses
import pathlib
import re

import pytest
import torch

from encoders import ENCODER_REGISTRY, DemoEncoder, build_encoder
from encoders.interface import EncoderCapabilities
from models import ARCH_REGISTRY
from models.act import ACTModel
from tests.test_etrm_model import HID, B, L, arch, batch, build, meta
from training.build import build_etrm_model
from training.config import config_from_dict

# every registered encoder, and the configs that change a declaration
CASES = [(name, {}) for name in sorted(ENCODER_REGISTRY)] + [
    ("standard", {"pair_layout": "sequence", "aggregation": "mean"}),
    ("lpn", {"variational": True, "kl_weight": 0.01}),
    ("lpn", {"search_steps": 2, "search_lr": 0.3}),
    ("variational", {"kl_weight": 0.0}),
    ("recurrent", {"pair_layout": "sequence"}),
]
ids = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for n, kw in CASES]


def encoder(name, **kw):
    torch.manual_seed(0)
    cfg = {"name": name, "hidden_size": 32, "num_heads": 4, **kw}
    return build_encoder(cfg, hidden_size=HID, vocab_size=12, seq_len=16, puzzle_emb_len=L, verbose=False)


def demos():
    b = batch()
    return b["demo_inputs"], b["demo_labels"], b["demo_mask"]


@pytest.mark.parametrize("name", sorted(ENCODER_REGISTRY))
def test_every_registered_encoder_declares_its_capabilities(name):
    cls = ENCODER_REGISTRY[name].cls
    assert issubclass(cls, DemoEncoder) and cls.declare.__func__ is not DemoEncoder.declare.__func__, name
    caps = encoder(name).capabilities
    assert type(caps) is EncoderCapabilities
    with pytest.raises(
        dataclasses.FrozenInstanceError
    ):  # frozen: what ETRM reads cannot drift from what the encoder was built as
        caps.recurrent = not caps.recurrent


def test_a_class_that_declares_nothing_is_refused():
    class Silent(DemoEncoder):
        pass

    cfg = ENCODER_REGISTRY["standard"].config(name="standard")
    with pytest.raises(NotImplementedError, match="Silent declares no capabilities"):
        Silent(cfg, hidden_size=HID, vocab_size=12, seq_len=16, puzzle_emb_len=L)


@pytest.mark.parametrize("name,kw", CASES, ids=ids)
def test_each_declaration_matches_what_the_encoder_does(name, kw):
    enc = encoder(name, **kw).eval()
    caps = enc.capabilities
    di, dl, dm = demos()
    out = enc(di, dl, dm, state=None)
    # recurrent: a state comes back, and refining from it changes the context
    assert (out.state is not None) == caps.recurrent
    if caps.recurrent:
        again = enc(di, dl, dm, state=out.state)
        assert not torch.allclose(again.context, out.context)
        assert enc.initial_state(B, None).shape == out.state.shape
    else:
        assert enc.initial_state(B, None) is None
    # KL: given iff declared, per sample; the weight is the config's
    assert (out.kl is not None) == caps.gives_kl
    if caps.gives_kl:
        assert out.kl.shape == (B,) and bool((out.kl > 0).all())
    assert caps.kl_weight == (enc.cfg.kl_weight if caps.gives_kl else 0.0)
    # memory: one state per demo cell, the cells of the aligned layout (sequence: declared absent)
    assert caps.gives_memory == (enc.cfg.pair_layout == "aligned")
    if caps.gives_memory:
        mem = enc.demo_memory(di, dl, dm)
        assert mem.states.shape[0] == B and int(mem.cell.max()) < 16 and bool(mem.mask.any())
    # latent search: the latent's context is the forward context
    assert caps.latent_search == (name == "lpn")
    if caps.latent_search:
        z, _ = enc.encode_latent(di, dl, dm)
        torch.testing.assert_close(enc.context_from_latent(z), out.context)
        assert (caps.search_steps, caps.search_lr) == (kw.get("search_steps", 0), kw.get("search_lr", 0.1))
    assert caps.rule_readout == 0.0 and enc.rule_head is None and not caps.rule_oracle and enc.rule_oracle is None


@pytest.mark.parametrize("probe", ["rule_readout", "oracle_context"])
def test_the_probes_are_declared_from_the_config(probe):
    enc = encoder("variational", **{probe: 0.5 if probe == "rule_readout" else True})
    caps = enc.capabilities
    assert caps.rule_readout == (0.5 if probe == "rule_readout" else 0.0)
    assert (enc.rule_head is not None) == (caps.rule_readout > 0)
    assert caps.rule_oracle == (probe == "oracle_context") == (enc.rule_oracle is not None)
    assert caps.gives_kl  # the encoder's own capabilities are kept beside the probes


def test_impossible_declarations_are_refused():
    with pytest.raises(ValueError, match="gives no KL"):
        EncoderCapabilities(kl_weight=0.1)
    with pytest.raises(ValueError, match="without latent search"):
        EncoderCapabilities(search_steps=3)


@pytest.mark.parametrize("mode,gain", [("none", None), ("norm", None), ("scalar", 0.7), ("gate", 0.3)])
def test_the_context_gain_is_the_head_s_learned_scale_and_etrm_logs_it(mode, gain):
    model = build("standard", context_scale=mode, context_scale_init=0.3 if mode == "gate" else 0.7)
    enc_gain = model.encoder.context_gain()
    assert enc_gain == (None if gain is None else pytest.approx(gain, rel=1e-5))
    carry = model.initial_carry(batch())
    _, out = model(carry, batch())
    stats = model.diagnostics(out)
    assert stats.get("train/encoder_context_scale") == enc_gain


def test_etrm_acts_on_the_declarations():
    # recurrent: the carry keeps z_E; not recurrent: none
    m = build("recurrent").train()
    carry, _ = m(m.initial_carry(batch()), batch())
    assert carry.z_E is not None and carry.z_E.shape == m.encoder.initial_state(B, None).shape
    m = build("standard").train()
    carry, out = m(m.initial_carry(batch()), batch())
    assert carry.z_E is None and "kl" not in out and m.extra_loss_weights == {}
    # variational: the KL is in the outputs and in the loss weights at the declared weight
    m = build("variational", kl_weight=0.02).train()
    carry, out = m(m.initial_carry(batch()), batch())
    assert out["kl"].shape == (B,) and m.extra_loss_weights == {"kl": 0.02}
    # lpn: latent search at evaluation as declared
    m = build("lpn", search_steps=2, search_lr=0.3)
    assert (m.latent_search_steps, m.latent_search_lr) == (2, 0.3)
    # rule readout: its loss and metric
    torch.manual_seed(0)
    cfg = {"arch": arch(), "encoder": {"name": "standard", "hidden_size": 32, "num_heads": 4, "rule_readout": 0.5}}
    cfg.update(global_batch_size=B, rule_labels="rules.json", data_paths=["data"])  # read by the loop, not here
    m = build_etrm_model(config_from_dict(cfg), meta(), verbose=False)
    assert m.extra_loss_weights == {"rule_readout": 0.5} and m.extra_metric_keys == ("rule_exact",)
    # encoder_cache with a recurrent encoder: refused by the declaration
    with pytest.raises(ValueError, match="recurrent encoder"):
        build("recurrent", encoder_cache=True)


def test_a_memory_core_needs_an_encoder_that_declares_memory():
    assert build("standard", arch_kw={"name": "trm_memory"}).reads_memory
    with pytest.raises(ValueError, match="does not give them: use pair_layout=aligned"):
        build("standard", pair_layout="sequence", arch_kw={"name": "trm_memory"})


def test_etrm_probes_no_attributes_and_borrows_no_method():
    src = (pathlib.Path(__file__).parents[1] / "models" / "etrm.py").read_text()
    assert not re.findall(r"\b(getattr|hasattr)\(", src)
    assert "_core_cls" not in src and ".step(self" not in src


@pytest.mark.parametrize("arch", sorted(ARCH_REGISTRY))
def test_every_architecture_runs_the_one_act_step_so_etrm_runs_its_core_s(arch):
    cls = ARCH_REGISTRY[arch].cls
    for method in ("initial_carry", "refill", "step", "forward"):
        assert getattr(cls, method) is getattr(ACTModel, method), f"{arch} overrides ACTModel.{method}"


def test_etrm_steps_exactly_as_its_core_given_the_same_context():
    model = build("standard").eval()
    core = ARCH_REGISTRY["trm"].cls(model.config, vocab_size=12, seq_len=16, num_puzzle_identifiers=5, batch_size=B)
    core.inner = model.inner  # the same weights
    core.eval()
    ctx = torch.randn(B, L, HID) / HID**0.5
    b = batch()
    c1, c2 = model.initial_carry(b), core.initial_carry(b)
    for _ in range(2):
        c1, o1 = model(c1, b, prefix_context=ctx)
        c2, o2 = core(c2, b, prefix_context=ctx)
        assert torch.equal(o1["logits"], o2["logits"]) and torch.equal(o1["q_halt_logits"], o2["q_halt_logits"])
        assert torch.equal(c1.halted, c2.halted) and torch.equal(c1.steps, c2.steps)

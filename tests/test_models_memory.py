"""arch=trm_memory (models/variants/trm_views.py): the core reads the encoder's per-cell demo states. Every parameter
trains, the read respects padding, empty demo slots and variable demo counts (a sample's answer does not depend on
what else is in the batch), each ``memory_read`` place changes the computation, the memory width follows the
encoder, it compiles without graph breaks, it refuses what cannot work; checkpoint -> evaluate.py and torchrun
(2 gloo ranks == 1 process) run the real commands."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from encoders import ENCODER_REGISTRY, DemoMemory
from models.etrm import ETRM
from tests.test_etrm_model import meta  # the same sizes: vocab 12, seq 16, 3 demo slots
from tests.toy_data import built_synthetic_arc
from training.build import build_etrm_model, build_loss_head
from training.config import config_from_dict

V, SIDE, B, D, HID = 12, 4, 4, 3, 32
S = SIDE * SIDE
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


ARCHS = ("trm_memory", "trm_local", "trm_views")


def build(seed=0, enc_hidden=24, name="trm_memory", encoder="standard", **arch_kw) -> ETRM:
    torch.manual_seed(seed)
    arch = dict(
        name=name,
        hidden_size=HID,
        num_heads=4,
        expansion=2,
        puzzle_emb_ndim=0,
        puzzle_emb_len=2,
        H_cycles=2,
        L_cycles=2,
        L_layers=1,
        halt_max_steps=2,
        halt_exploration_prob=0.0,
        forward_dtype="float32",
    )
    if name == "trm_local":  # its grid layers act from the start (their default starts them at zero: test_models_local)
        arch["grid_ops_out_init"] = 1.0
    arch.update(arch_kw)
    enc = {"name": encoder, "hidden_size": enc_hidden, "num_heads": 4, "grid_coords": True}
    cfg = {"arch": arch, "encoder": enc, "global_batch_size": B}
    return build_etrm_model(config_from_dict(cfg), meta(), verbose=False)


def grid(g, h, w):
    """A SIDE x SIDE canvas with an h x w grid of colours (tokens 2..11) at the top-left, PAD (0) elsewhere."""
    c = torch.zeros(SIDE, SIDE, dtype=torch.int32)
    c[:h, :w] = torch.randint(2, V, (h, w), generator=g, dtype=torch.int32)
    return c.view(S)


def batch(seed=0, demos_per_sample=(3, 2, 1, 3)):
    g = torch.Generator().manual_seed(seed)
    b = len(demos_per_sample)
    di = torch.zeros(b, D, S, dtype=torch.int32)
    dl = torch.zeros(b, D, S, dtype=torch.int32)
    mask = torch.zeros(b, D, dtype=torch.bool)
    for i, n in enumerate(demos_per_sample):
        for j in range(n):
            h, w = torch.randint(2, SIDE + 1, (2,), generator=g).tolist()
            di[i, j], dl[i, j] = grid(g, h, w), grid(g, h, w)
            mask[i, j] = True
    return {
        "inputs": torch.stack([grid(g, 3, 3) for _ in range(b)]),
        "labels": torch.stack([grid(g, 3, 3) for _ in range(b)]).long(),
        "puzzle_identifiers": torch.zeros(b, dtype=torch.int32),
        "demo_inputs": di,
        "demo_labels": dl,
        "demo_mask": mask,
    }


def eval_logits(model, data):
    """The logits of the last ACT step of an evaluation rollout."""
    model.eval()
    with torch.no_grad():
        carry = model.initial_carry(data)
        for _ in range(model.halt_max_steps):
            carry, out = model(carry, data)
    return out["logits"]


def dead_parameters(model) -> list[str]:
    """The trainable parameters that get no gradient from one training step's loss on :func:`batch`."""
    model.train()
    head = build_loss_head(model)
    data = batch()
    _, loss, _, _, _ = head(head.initial_carry(data), data)
    loss.backward()
    return [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]


def take(data, rows):
    return {k: v[rows] for k, v in data.items()}


@pytest.mark.parametrize("name", ARCHS)
def test_every_parameter_gets_gradient_and_the_memory_width_follows_the_encoder(name):
    model = build(enc_hidden=24, name=name)
    assert model.reads_memory and model.config.memory_width == 24
    assert model.inner.memory_read.in_proj.weight.shape == (HID, 24)
    assert dead_parameters(model) == []


@pytest.mark.parametrize("encoder", sorted(set(ENCODER_REGISTRY) - {"standard"}))
def test_every_encoder_gives_the_memory_and_trains_with_the_memory_core(encoder):
    """Encoders that pool before aggregating (lpn: a CLS token per demo, left out of the memory) give it by one more
    trunk pass; every parameter still gets gradient, and the memory holds each demo's cells, not its CLS."""
    model = build(encoder=encoder)
    data = batch()
    m = model.encoder.demo_memory(data["demo_inputs"], data["demo_labels"], data["demo_mask"])
    _assert_cells(m, data)
    model.train()
    head = build_loss_head(model)
    _, loss, _, _, _ = head(head.initial_carry(data), data)
    loss.backward()
    dead = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert dead == []


def _assert_cells(m, data):
    """The memory holds exactly the non-PAD cells of the valid demos, each once, named by its demo slot and cell."""
    rows = torch.arange(m.mask.shape[0])[:, None]
    held = data["demo_mask"][rows, m.demo[None, :]] & (
        (data["demo_inputs"][rows, m.demo[None, :], m.cell] > 0)
        | (data["demo_labels"][rows, m.demo[None, :], m.cell] > 0)
    )
    assert torch.equal(m.mask, m.mask & held)
    want = data["demo_mask"][:, :, None] & ((data["demo_inputs"] > 0) | (data["demo_labels"] > 0))
    for i in range(m.mask.shape[0]):
        got = {(int(d), int(c)) for d, c, k in zip(m.demo, m.cell[i], m.mask[i]) if k}
        assert got == {tuple(map(int, t)) for t in want[i].nonzero()} and len(got) == int(m.mask[i].sum())


@pytest.mark.parametrize("encoder", ["standard", "lpn"])
def test_packed_tokens_give_the_memory_of_the_unpacked_path_cell_by_cell(encoder):
    """pack_tokens lays each demo's tokens out left-aligned; the memory names each token's canvas cell, so the
    packed and the reference path (every demo padded to the canvas) agree on every (demo, cell)."""
    data = batch()
    mems = []
    for packed in (True, False):
        model = build(encoder=encoder)
        model.encoder.cfg.pack_tokens = packed
        with torch.no_grad():
            mems.append(model.encoder.demo_memory(data["demo_inputs"], data["demo_labels"], data["demo_mask"]))
    table = []
    for m in mems:
        _assert_cells(m, data)
        t = torch.zeros(B, D, S, m.states.shape[-1])
        rows = torch.arange(B)[:, None].expand_as(m.cell)
        t[rows[m.mask], m.demo[None, :].expand_as(m.cell)[m.mask], m.cell[m.mask]] = m.states[m.mask]
        table.append(t)
    torch.testing.assert_close(table[0], table[1], atol=1e-5, rtol=1e-5)


def test_the_oracle_control_is_told_the_rule_and_reads_no_memory():
    model = build(encoder="standard")
    model.encoder.rule_oracle = lambda t: torch.zeros(t.shape[0], 2, HID)  # the oracle path (encoders.probes)
    enc, _ = model._oracle_context(batch())
    assert enc.memory is not None and not enc.memory.mask.any()


def oracle(demos: bool) -> ETRM:
    """trm_memory told the rule (``encoder.oracle_context``), with or without the demos (``encoder.oracle_demos``)."""
    torch.manual_seed(0)
    arch = dict(build().config.model_dump(), name="trm_memory")
    enc = {"name": "standard", "hidden_size": 24, "num_heads": 4, "grid_coords": True, "oracle_context": True}
    cfg = {"arch": arch, "encoder": dict(enc, oracle_demos=demos), "global_batch_size": B, "rule_labels": "r.json"}
    return build_etrm_model(config_from_dict(cfg), meta(), verbose=False)


def test_the_oracle_told_and_shown_reads_the_demo_memory_a_read_run_reads():
    """encoder.oracle_demos: the context is still the rule labels' (zeros without labels), the memory is the demos'
    own, so the answer reads the demos; without it the memory is empty and the demos do not reach the answer."""
    data = batch()
    shown, told = oracle(True), oracle(False)
    enc, ctx = shown._oracle_context(data)
    assert torch.equal(ctx, torch.zeros(B, 2, HID))  # told: no labels here, so no context; the encoder gave none
    want = shown.encoder.demo_memory(data["demo_inputs"], data["demo_labels"], data["demo_mask"])
    assert enc.memory.mask.any() and torch.equal(enc.memory.mask, want.mask)
    torch.testing.assert_close(enc.memory.states, want.states)
    changed = {k: v.clone() for k, v in data.items()}
    changed["demo_labels"][0, 0] = torch.where(changed["demo_labels"][0, 0] > 1, 2, 0).int()
    assert not torch.allclose(eval_logits(shown, changed)[0], eval_logits(shown, data)[0], atol=1e-4)
    torch.testing.assert_close(eval_logits(told, changed), eval_logits(told, data))


def test_the_oracle_control_of_a_variational_encoder_asks_for_no_kl_term():
    """Told the rule, the encoder does not run: the loss head must not ask for its KL (it raised a KeyError)."""
    arch = dict(build().config.model_dump(), name="trm_memory")
    enc = {"name": "variational", "hidden_size": 24, "num_heads": 4, "grid_coords": True, "oracle_context": True}
    model = build_etrm_model(
        config_from_dict({"arch": arch, "encoder": enc, "global_batch_size": B, "rule_labels": "rules.json"}),
        meta(),
        verbose=False,
    )
    assert model.kl_weight > 0 and model.encoder.capabilities.rule_oracle
    data = batch()
    _, outputs = model(model.initial_carry(data), data)
    assert "kl" not in outputs and set(model.extra_loss_weights) <= set(outputs)


@pytest.mark.parametrize("name", ARCHS)
def test_the_answer_reads_the_demo_cells_and_ignores_pad_empty_slots_and_the_rest_of_the_batch(name):
    model = build(name=name)
    data = batch()
    ref = eval_logits(model, data)
    # a demo's output colours reach the answer
    changed = {k: v.clone() for k, v in data.items()}
    changed["demo_labels"][0, 0] = torch.where(changed["demo_labels"][0, 0] > 1, 2, 0).int()
    assert not torch.allclose(eval_logits(model, changed)[0], ref[0], atol=1e-4)
    # junk in an empty slot (demo_mask False) changes nothing
    junk = {k: v.clone() for k, v in data.items()}
    junk["demo_inputs"][2, 2] = 7
    junk["demo_labels"][2, 2] = 9
    torch.testing.assert_close(eval_logits(model, junk), ref, atol=1e-5, rtol=1e-5)
    # each sample alone (different demo counts, its own crop) = inside the batch
    for i in range(B):
        torch.testing.assert_close(eval_logits(model, take(data, [i])), ref[i : i + 1], atol=5e-5, rtol=1e-4)
    # a sample without any demo reads the null key only: finite
    none = {k: v.clone() for k, v in data.items()}
    none["demo_mask"][1] = False
    assert torch.isfinite(eval_logits(model, none)).all()


def test_memory_read_places_differ_and_read_keeps_the_trained_weights_names():
    data = batch()
    outs = {w: eval_logits(build(memory_read=w), data) for w in ("once", "cycle", "step")}
    assert not torch.allclose(outs["once"], outs["cycle"], atol=1e-4)
    assert not torch.allclose(outs["cycle"], outs["step"], atol=1e-4)
    names = {n for n, _ in build().named_parameters()}
    assert {
        "inner.memory_read.in_proj.weight",
        "inner.memory_read.null_key",
        "inner.embed_grid.embedding_weight",
    } <= names


def compiled_core_logits(model):
    """model.inner compiled (fullgraph, eager backend) on a 4-sample batch with demos: (its logits, a function that
    gives the eager logits of the same call)."""
    torch._dynamo.reset()
    model.train()
    data = batch(demos_per_sample=(3, 3, 3, 3))
    enc = model.encoder(data["demo_inputs"], data["demo_labels"], data["demo_mask"])
    assert isinstance(enc.memory, DemoMemory)
    carry = model.inner.reset_carry(torch.ones(B, dtype=torch.bool), model.inner.empty_carry(B, torch.device("cpu")))
    compiled = torch.compile(model.inner, backend="eager", fullgraph=True)
    _, logits, _ = compiled(carry, data, prefix_context=enc.context, memory=enc.memory)
    return logits, lambda: model.inner(carry, data, prefix_context=enc.context, memory=enc.memory)[1]


@pytest.mark.parametrize("name", ARCHS)
def test_the_core_compiles_without_graph_breaks(name):
    # the object sizes of the cell counts and the object lookup are one graph break by design (views_ops.object_sizes)
    counts_off = {"cell_features": [], "demo_lookup": []} if name == "trm_views" else {}
    logits, eager = compiled_core_logits(build(name=name, **counts_off))
    torch.testing.assert_close(logits, eager())


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="does not give"):
        torch.manual_seed(0)
        cfg = {
            "arch": {
                "name": "trm_memory",
                "hidden_size": 16,
                "num_heads": 2,
                "puzzle_emb_ndim": 0,
                "puzzle_emb_len": 2,
            },
            "encoder": {"name": "standard", "hidden_size": 16, "num_heads": 2, "pair_layout": "sequence"},
            "global_batch_size": 2,
        }
        build_etrm_model(config_from_dict(cfg), meta(), verbose=False)
    model = build(memory_max_demos=2)
    with pytest.raises(ValueError, match="memory_max_demos=2"):
        eval_logits(model, batch())
    with pytest.raises(ValueError, match="run it as an ETRM"):
        carry = model.inner.empty_carry(1, torch.device("cpu"))
        model.inner(carry, take(batch(), [0]))


def _science_data(root):
    built, _ = built_synthetic_arc(
        root, num_train=24, num_test=8, num_aug=1, mode="etrm", max_grid=None, seed=0, canvas=6, prefix="synth",
        generator_aug=True,
    )  # fmt: skip
    return built


def _run(cmd, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=ROOT)
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


TINY_MEMORY = [
    "--config-name",
    "cfg_science",
    "arch=trm_memory",
    "arch.hidden_size=16",
    "arch.num_heads=2",
    "encoder.hidden_size=16",
    "encoder.num_heads=2",
    "global_batch_size=8",
    "max_steps=4",
    "lr_warmup_steps=1",
    "log_interval=2",
    "checkpoint_every=4",
]


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_equal_one_process_and_evaluate_reads_the_checkpoint(tmp_path):
    data = _science_data(str(tmp_path))
    args = [*TINY_MEMORY, f"data_paths=[{data}]", "+run_name=mem"]
    script = os.path.join(ROOT, "pretrain_encoder.py")
    _run([sys.executable, script, *args, f"checkpoint_path={tmp_path / 'one'}"], str(tmp_path))
    two = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            script,
            *args,
            f"checkpoint_path={tmp_path / 'two'}",
        ],
        str(tmp_path),
    )
    assert "world size 2" in two.stdout + two.stderr
    a = torch.load(tmp_path / "one" / "step_4.pt", weights_only=False)
    b = torch.load(tmp_path / "two" / "step_4.pt", weights_only=False)
    assert a["config"]["arch"]["name"] == "trm_memory"
    assert any(k.startswith("inner.memory_read.") for k in a["model"])
    for k in a["model"]:
        assert torch.allclose(a["model"][k].float(), b["model"][k].float(), atol=1e-5, rtol=0), k
    out = tmp_path / "eval"
    _run(
        [
            sys.executable,
            os.path.join(ROOT, "evaluate.py"),
            f"checkpoint={tmp_path / 'one' / 'step_4.pt'}",
            f"data_path={data}",
            f"output_dir={out}",
        ],
        str(tmp_path),
    )
    metrics = json.load(open(out / "metrics.json"))["metrics"]
    assert metrics["eval/num_examples"] > 0 and np.isfinite(metrics["all.lm_loss"]) and "ARC/pass@1" in metrics

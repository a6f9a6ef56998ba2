"""Unit tests of the training platform's pieces: config validation, LR schedule, EMA, summary,
checkpoint files, optimizer wiring. Each test is sub-second."""

import json
import math
import os

import pytest
import torch

from tests.toy_data import toy_train_config, write_toy_dataset
from training import checkpoint as ckpt
from training.config import ConfigError, config_from_dict, load_config
from training.distributed import local_batch_size
from training.ema import EMA
from training.metrics import metric_direction
from training.schedule import lr_at_step
from training.summary import RunSummary, read_summary

BASE = {"arch": {"name": "trm"}, "data_paths": ["data/x"]}


# ------------------------------------------------------------------------------------------ config
def test_unknown_top_level_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key 'lrr'"):
        config_from_dict({**BASE, "lrr": 1e-3})


def test_unknown_nested_key_has_dotted_name():
    with pytest.raises(ConfigError, match=r"'wandb\.mod'"):
        config_from_dict({**BASE, "wandb": {"mod": "offline"}})
    with pytest.raises(ConfigError, match=r"'evaluators\.0\.kwarg'"):
        config_from_dict({**BASE, "evaluators": [{"name": "arc", "kwarg": {}}]})


def test_bad_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"global_batch_size=-3: "):
        config_from_dict({**BASE, "global_batch_size": -3})
    with pytest.raises(ConfigError, match=r"ema_rate"):
        config_from_dict({**BASE, "ema_rate": 1.5})


def test_hydra_overrides_published_names():
    cfg = load_config(
        "cfg_pretrain",
        [
            "arch=trm",
            "data_paths=[data/arc1]",
            "arch.L_layers=2",
            "arch.H_cycles=3",
            "arch.L_cycles=6",
            "global_batch_size=64",
            "epochs=7",
            "eval_interval=2",
            "lr=3e-4",
            "puzzle_emb_lr=1e-3",
            "weight_decay=0.5",
            "ema=True",
            "+run_name=foo",
            "+project_name=bar",
            "checkpoint_every=5",
            "seed=3",
        ],
    )
    assert cfg.arch.L_cycles == 6 and cfg.arch.H_cycles == 3 and cfg.arch.hidden_size == 512
    assert (cfg.run_name, cfg.project_name, cfg.lr, cfg.puzzle_emb_lr, cfg.weight_decay) == (
        "foo",
        "bar",
        3e-4,
        1e-3,
        0.5,
    )
    assert (cfg.global_batch_size, cfg.epochs, cfg.eval_interval, cfg.checkpoint_every, cfg.seed) == (64, 7, 2, 5, 3)
    assert cfg.ema is True and cfg.data_paths == ["data/arc1"]
    assert cfg.run_name is not None and load_config("cfg_pretrain", []).run_name is None


def test_hydra_added_unknown_key_fails_with_name():
    with pytest.raises(ConfigError, match=r"'foo_bar'"):
        load_config("cfg_pretrain", ["+foo_bar=1"])


def test_unknown_arch_or_encoder_key_fails_when_the_config_is_composed(tmp_path):
    """arch / encoder are typed sections: validated once, when the config is composed, naming the dotted key."""
    from encoders import EncoderConfigError
    from models import ArchConfigError, TRMConfig

    data = write_toy_dataset(str(tmp_path / "toy"))
    with pytest.raises(ArchConfigError, match=r"arch\.hiden_size"):
        config_from_dict(toy_train_config(data, str(tmp_path / "run"), arch={"hiden_size": 16}))
    with pytest.raises(ArchConfigError, match=r"arch\.hiden_size"):
        load_config("cfg_pretrain", ["+arch.hiden_size=16"])
    with pytest.raises(EncoderConfigError, match=r"encoder\.hiden_size"):
        config_from_dict(toy_train_config(data, str(tmp_path / "run"), encoder={"name": "standard", "hiden_size": 8}))
    cfg = config_from_dict(toy_train_config(data, str(tmp_path / "run"), arch={"hidden_size": 16}))
    assert isinstance(cfg.arch, TRMConfig) and cfg.arch.hidden_size == 16 and cfg.arch.halt_max_steps == 2


def test_vocab_and_seq_len_mismatch_names_both_values(tmp_path):
    from dataset.metadata import load_metadata
    from training.build import check_data_matches_arch

    data = write_toy_dataset(str(tmp_path / "toy"), seq_len=8)
    meta = load_metadata(os.path.join(data, "train"))
    from models import parse_arch_config

    with pytest.raises(ConfigError, match=r"vocab_size=12.*arch\.vocab_size=10"):
        check_data_matches_arch(parse_arch_config({"name": "trm", "vocab_size": 10}), meta, data)
    with pytest.raises(ConfigError, match=r"seq_len=8.*arch\.seq_len=900"):
        check_data_matches_arch(parse_arch_config({"name": "trm", "seq_len": 900}), meta, data)
    arch = parse_arch_config({"name": "trm", "seq_len": 8, "vocab_size": 12})
    check_data_matches_arch(arch, meta, data)  # matches: no error
    assert "vocab_size" not in arch.model_dump() and "seq_len" not in arch.model_dump()  # never stored


def test_batch_not_divisible_by_world_size():
    assert local_batch_size(12, 4) == 3
    with pytest.raises(ConfigError, match=r"global_batch_size=10 is not divisible by the world size 4"):
        local_batch_size(10, 4)


# ------------------------------------------------------------------------------------------ schedule
def test_lr_warmup_then_cosine_to_min_ratio():
    f = lambda s: lr_at_step(s, base_lr=2.0, warmup_steps=4, total_steps=12, min_ratio=0.1)  # noqa: E731
    assert [f(s) for s in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert f(4) == pytest.approx(2.0)
    # halfway through the decay: min + (1-min)/2
    assert f(8) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
    assert f(6) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25))))
    assert f(12) == pytest.approx(0.2)
    assert f(50) == pytest.approx(0.2)  # clamps after the end
    assert lr_at_step(7, base_lr=1.0, warmup_steps=0, total_steps=10, min_ratio=1.0) == 1.0


# ------------------------------------------------------------------------------------------ EMA
def test_ema_update_and_buffers_excluded():
    m = torch.nn.Linear(2, 1)
    m.register_buffer("table", torch.zeros(3))
    ema = EMA(m, rate=0.9)
    w0 = m.weight.detach().clone()
    with torch.no_grad():
        m.weight.add_(1.0)
        m.table.fill_(5.0)
    ema.update(m)
    assert torch.allclose(ema.shadow["weight"], 0.9 * w0 + 0.1 * (w0 + 1.0))
    assert "table" not in ema.shadow
    copy = ema.materialize(m)
    assert torch.allclose(copy.weight, 0.9 * w0 + 0.1 * (w0 + 1.0))
    assert torch.equal(copy.table, torch.full((3,), 5.0))  # live buffer, not averaged
    assert torch.allclose(m.weight, w0 + 1.0)  # live model untouched
    st = ema.state_dict()
    ema2 = EMA(torch.nn.Linear(2, 1), rate=0.5)
    ema2.load_state_dict(st)
    assert ema2.rate == 0.9 and torch.equal(ema2.shadow["weight"], ema.shadow["weight"])


# ------------------------------------------------------------------------------------------ summary
def test_summary_final_best_and_atomic_write(tmp_path):
    s = RunSummary(str(tmp_path), run_name="r", project_name="p", config_path=None, total_steps=10)
    s.update_metrics(1, {"train/exact_accuracy": 0.2, "train/lm_loss": 3.0, "train/lr": 1e-3})
    s.update_metrics(2, {"train/exact_accuracy": 0.5, "train/lm_loss": 4.0, "ARC/pass@1": 0.25})
    s.update_metrics(3, {"train/exact_accuracy": 0.4, "train/lm_loss": float("nan")})
    out = s.finish("completed", 0)
    d = read_summary(str(tmp_path))
    assert d == json.loads(json.dumps(out))
    assert d["final"]["train/exact_accuracy"] == 0.4 and d["best"]["train/exact_accuracy"] == 0.5
    assert d["best_step"]["train/exact_accuracy"] == 2
    assert d["best"]["train/lm_loss"] == 3.0 and d["final"]["train/lm_loss"] == 4.0  # NaN not recorded
    assert d["best"]["ARC/pass@1"] == 0.25 and "train/lr" not in d["best"]
    assert d["stop_reason"] == "completed" and d["exit_status"] == 0 and d["status"] == "finished"
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_best_only_for_metrics_with_a_direction(tmp_path):
    """best/* holds accuracies (max) and losses (min) only: not the slowest eval, example counts or encoder
    statistics, whose "best" means nothing."""
    s = RunSummary(str(tmp_path), run_name="r", project_name="p", config_path=None, total_steps=10)
    s.update_metrics(
        1,
        {
            "eval/seconds": 5.0,
            "eval/num_examples": 100.0,
            "train/encoder_output_mean": 0.3,
            "eval/all.exact_accuracy": 0.1,
            "eval/all.lm_loss": 2.0,
            "train/kl": 0.5,
            "train/q_halt_accuracy": 0.7,
            "eval/ARC/pass@2": 0.2,
            "grad/total_norm": 1.0,
        },
    )
    s.update_metrics(
        2,
        {
            "eval/seconds": 9.0,
            "eval/all.exact_accuracy": 0.3,
            "eval/all.lm_loss": 1.0,
            "train/kl": 0.9,
            "eval/ARC/pass@2": 0.1,
        },
    )
    d = s.finish("completed", 0)
    assert d["best"] == {
        "eval/all.exact_accuracy": 0.3,
        "eval/all.lm_loss": 1.0,
        "train/kl": 0.5,
        "train/q_halt_accuracy": 0.7,
        "eval/ARC/pass@2": 0.2,
    }
    assert d["best_step"]["train/kl"] == 1 and d["best_step"]["eval/all.lm_loss"] == 2
    assert d["final"]["eval/seconds"] == 9.0  # still reported as the final value
    assert [metric_direction(k) for k in ("train/rule_exact", "train/steps", "train/lr", "eval/all.steps")] == [
        "max",
        None,
        None,
        None,
    ]


# ------------------------------------------------------------------------------------------ checkpoint files
def test_checkpoint_files_atomic_list_prune(tmp_path):
    d = str(tmp_path)
    for step in (2, 10, 4):
        ckpt.save_checkpoint_atomic({"format": ckpt.FORMAT, "step": step}, ckpt.checkpoint_file(d, step))
    open(os.path.join(d, ".tmp-partial.pt"), "wb").write(b"garbage")  # a write interrupted by a crash
    assert [s for s, _ in ckpt.list_checkpoints(d)] == [2, 4, 10]
    assert ckpt.find_latest_checkpoint(d).endswith("step_10.pt")
    assert ckpt.load_checkpoint_file(d)["step"] == 10
    ckpt.prune_checkpoints(d, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(d)] == [4, 10]
    torch.save({"hello": 1}, os.path.join(d, "other.pt"))
    with pytest.raises(ckpt.CheckpointError, match="not a trm-platform checkpoint"):
        ckpt.load_checkpoint_file(os.path.join(d, "other.pt"))


def test_arch_compat_refuses_other_architecture():
    a = {"name": "trm", "L_cycles": 4, "hidden_size": 512, "halt_exploration_prob": 0.1}
    ckpt.check_arch_compatible(a, dict(a, halt_exploration_prob=0.0))  # run-time knob: fine
    with pytest.raises(ckpt.CheckpointError, match=r"name.*'trm'.*'hrm'"):
        ckpt.check_arch_compatible(a, dict(a, name="hrm"))
    with pytest.raises(ckpt.CheckpointError, match=r"L_cycles: checkpoint has 4, model has 6"):
        ckpt.check_arch_compatible(a, dict(a, L_cycles=6))


def test_tree_map_tensors_handles_carry_dataclass():
    from models.act import ACTCarry

    c = ACTCarry(
        inner_carry={"z": torch.ones(2)},
        steps=torch.zeros(2, dtype=torch.int32),
        halted=torch.ones(2, dtype=torch.bool),
        current_data={"inputs": torch.arange(2)},
    )
    c2 = ckpt.tree_map_tensors(c, lambda t: t * 2)
    assert isinstance(c2, ACTCarry) and torch.equal(c2.inner_carry["z"], torch.full((2,), 2.0))
    assert torch.equal(c2.current_data["inputs"], torch.tensor([0, 2])) and torch.equal(c.steps, c2.steps)


# ------------------------------------------------------------------------------------------ optimizers
def test_optimizer_wiring_adamatan2_and_sparse_puzzle_emb(tmp_path):
    """AdamATan2 gets every trainable parameter (lr / betas / wd from the config); the puzzle-embedding
    buffer goes to SignSGDSparse with puzzle_emb_lr / puzzle_emb_weight_decay; one step moves only the
    touched rows by exactly lr * sign(grad)."""
    from dataset.metadata import load_metadata
    from training.build import build_act_model, build_loss_head, build_optimizers
    from training.optim import AdamATan2

    data = write_toy_dataset(str(tmp_path / "toy"))
    cfg = config_from_dict(
        toy_train_config(
            data,
            str(tmp_path / "r"),
            lr=2e-3,
            beta1=0.8,
            beta2=0.9,
            weight_decay=0.05,
            puzzle_emb_lr=0.5,
            puzzle_emb_weight_decay=0.0,
        )
    )
    torch.manual_seed(0)
    model = build_act_model(cfg, load_metadata(os.path.join(data, "train")), batch_size=4)
    opts = build_optimizers(cfg, model, world_size=1)
    assert isinstance(opts["adam"], AdamATan2)
    g = opts["adam"].param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (2e-3, (0.8, 0.9), 0.05)
    adam_ids = {id(p) for grp in opts["adam"].param_groups for p in grp["params"]}
    assert adam_ids == {id(p) for p in model.parameters() if p.requires_grad}
    emb = model.puzzle_emb
    assert {id(t) for t in opts["puzzle_emb"].param_groups[0]["params"]} == {id(t) for t in emb.buffers()}
    assert opts["puzzle_emb"].param_groups[0]["lr"] == 0.5
    head = build_loss_head(model, None)
    batch = {
        "inputs": torch.randint(2, 12, (4, 8), dtype=torch.int32),
        "labels": torch.randint(2, 12, (4, 8)),
        "puzzle_identifiers": torch.tensor([1, 1, 3, 3], dtype=torch.int32),
        "example_index": torch.arange(4),
    }
    carry = head.initial_carry(batch)
    _, loss, *_ = head(carry=carry, batch=batch)
    loss.backward()
    before = emb.weights.detach().clone()
    opts["puzzle_emb"].step()
    delta = emb.weights - before
    assert torch.count_nonzero(delta[[0, 2, 4]]) == 0
    assert torch.allclose(delta[[1, 3]].abs(), torch.full_like(delta[[1, 3]], 0.5))
    # the implementation: config key optimizer_impl (default auto = torch for CPU parameters)
    assert (cfg.optimizer_impl, opts["adam"].impl, opts["adam"].implementation) == ("auto", "auto", "torch")
    cfg_t = cfg.model_copy(update={"optimizer_impl": "torch"})
    assert build_optimizers(cfg_t, model, world_size=1)["adam"].implementation == "torch"
    with pytest.raises(ConfigError, match="optimizer_impl"):
        config_from_dict(toy_train_config(data, str(tmp_path / "r"), optimizer_impl="cuda"))


def _grads_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from training import distributed as D

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        both, only0, unused = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
        both.grad = torch.full((3,), float(rank + 1))
        if rank == 0:
            only0.grad = torch.ones(3)
        D.all_reduce_grads_([both, only0, unused])
        torch.save(
            {"both": both.grad, "only0": only0.grad, "unused": unused.grad}, os.path.join(out_dir, f"rank{rank}.pt")
        )
    finally:
        dist.destroy_process_group()


def test_all_reduce_grads_sums_and_keeps_none_for_params_without_grad_anywhere(tmp_path):
    """A parameter with no gradient on ANY rank must keep grad None (as in one process, where AdamATan2 then
    skips it: no weight decay, no momentum step); one with a gradient on some ranks gets the sum."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _grads_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True, start_method="fork"
    )
    for rank in range(2):
        g = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(g["both"], torch.full((3,), 3.0))
        assert torch.equal(g["only0"], torch.ones(3))
        assert g["unused"] is None


def test_reduce_window_uses_trm_metric_semantics():
    """Log window of 2 steps, global batch 8: loss terms (and per-sample extra terms such as kl) / (B * steps),
    accuracies and steps / halted count, count and grad norms / steps (docs/metrics.md, pitfall 17)."""
    from training.metrics import reduce_window

    acc = {
        "loss": 48.0,
        "lm_loss": 32.0,
        "q_halt_loss": 16.0,
        "kl": 8.0,
        "count": 6.0,
        "accuracy": 4.5,
        "exact_accuracy": 3.0,
        "q_halt_accuracy": 5.0,
        "steps": 12.0,
        "grad/total_norm": 3.0,
        "new_examples": 10.0,
        "train/decoder_frozen": 1.0,
    }
    out = reduce_window(acc, 2, global_batch_size=8, extra_loss_keys={"kl": 0.1})
    expected = {
        "train/loss": 3.0,
        "train/lm_loss": 2.0,
        "train/q_halt_loss": 1.0,
        "train/kl": 0.5,
        "train/count": 3.0,
        "train/accuracy": 0.75,
        "train/exact_accuracy": 0.5,
        "train/q_halt_accuracy": 5 / 6,
        "train/steps": 2.0,
        "grad/total_norm": 1.5,
        "train/decoder_frozen": 0.5,
    }
    assert out == pytest.approx(expected)
    # no halted sample in the window: accuracies are 0, not NaN
    out = reduce_window({"loss": 8.0, "count": 0.0, "accuracy": 0.0}, 1, global_batch_size=8)
    assert out["train/accuracy"] == 0.0 and out["train/count"] == 0.0


# ------------------------------------------------------------------------------------------ one defaults source
def test_config_defaults_have_one_source():
    """cfg_pretrain.yaml / cfg_evaluate.yaml hold no values (the pydantic field defaults are composed through
    Hydra's ConfigStore), and every encoder group option states exactly its class's defaults: `encoder=standard`
    and `{"name": "standard"}` build the same encoder. Arch group options are named recipes (trm = the paper's
    ARC configuration) and must validate strictly."""
    from omegaconf import OmegaConf

    from encoders import ENCODER_REGISTRY
    from models import parse_arch_config
    from training.config import CONFIG_DIR, PretrainConfig, pretrain_defaults

    for name in ("cfg_pretrain", "cfg_evaluate"):
        raw = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, f"{name}.yaml")))
        assert set(raw) == {"defaults", "hydra"}, f"{name}.yaml sets values: {set(raw) - {'defaults', 'hydra'}}"
    composed = load_config("cfg_pretrain", ["data_paths=[x]"])
    fresh = PretrainConfig(arch=composed.arch, data_paths=["x"])
    assert composed == fresh  # every key's default is the field default
    assert pretrain_defaults()["ema"] is True and pretrain_defaults()["evaluators"] == [{"name": "arc", "kwargs": {}}]
    for path in sorted(os.listdir(os.path.join(CONFIG_DIR, "encoder"))):  # each starts from its class defaults
        name = path.removesuffix(".yaml")
        raw = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, "encoder", path)))
        assert raw == {"defaults": [{"defaults@_here_": name}, "_self_"]}, f"config/encoder/{path} sets values"
        cls = ENCODER_REGISTRY[name].config
        got = load_config("cfg_pretrain_encoder_arc_agi_1", ["data_paths=[x]", f"encoder={name}"]).encoder
        assert got == cls(name=name), f"encoder={name} differs from {cls.__name__} defaults"
    for path in sorted(os.listdir(os.path.join(CONFIG_DIR, "arch"))):  # each composes and validates strictly
        if path.endswith(".yaml"):
            arch = load_config("cfg_pretrain", ["data_paths=[x]", f"arch={path.removesuffix('.yaml')}"]).arch
            assert parse_arch_config(arch.model_dump(mode="json")) == arch


def test_lr_schedule_is_a_lambdalr_whose_state_is_checkpointed(tmp_path):
    """torch's LambdaLR drives every optimizer (AdamATan2 groups and the puzzle embedding's SignSGD) with the
    warmup + cosine factor of training.schedule.lr_at_step; its position is in the checkpoint."""
    from torch.optim.lr_scheduler import LambdaLR

    from training import checkpoint as ckpt
    from training.distributed import DistInfo
    from training.loop import Trainer

    data = write_toy_dataset(str(tmp_path / "toy"))
    cfg = config_from_dict(
        toy_train_config(data, str(tmp_path / "run"), epochs=2, lr_warmup_steps=3, lr_min_ratio=0.1, puzzle_emb_lr=1e-2)
    )
    t = Trainer(cfg, DistInfo())
    assert set(t.schedulers) == {"adam", "puzzle_emb"} and all(isinstance(s, LambdaLR) for s in t.schedulers.values())
    it = iter(t.data.train_loader)
    for k in range(1, t.total_steps + 1):
        expect = dict(warmup_steps=3, total_steps=t.total_steps, min_ratio=0.1)
        assert t.optimizers["adam"].param_groups[0]["lr"] == pytest.approx(lr_at_step(k, base_lr=1e-3, **expect))
        assert t.optimizers["puzzle_emb"].param_groups[0]["lr"] == pytest.approx(lr_at_step(k, base_lr=1e-2, **expect))
        t.train_step(next(it)[1])
    path = t.save_checkpoint()
    t.close()
    assert ckpt.read_checkpoint(path)["schedulers"]["adam"]["last_epoch"] == t.total_steps


def test_a_normal_exit_waits_for_every_rank_before_destroying_the_process_group(monkeypatch):
    """Rank 1 must not tear its gloo connections down while rank 0 still writes its summary; an error path does
    not wait (another rank may be gone). training.loop.train uses the barrier only when the run returned."""
    import training.distributed as D
    import training.loop as L

    calls = []
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(D.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(D.gc, "collect", lambda: calls.append("gc"))
    two = D.DistInfo(rank=0, world_size=2, initialized_here=True)
    D.shutdown_distributed(two, barrier=True)
    D.shutdown_distributed(two)
    D.shutdown_distributed(D.DistInfo(world_size=1, initialized_here=True), barrier=True)
    # garbage collected around the destroy, while the interpreter is alive (gloo aborted at exit without it)
    assert calls == ["barrier", "gc", "destroy", "gc"] + ["gc", "destroy", "gc"] * 2

    calls.clear()
    monkeypatch.setattr(L.D, "init_distributed", lambda device: two)
    monkeypatch.setattr(L, "config_from_dict", lambda d: type("Cfg", (), {"device": "cpu"})())

    class Ok:
        def __init__(self, cfg, info):
            pass

        def run(self):
            return {"exit_status": 0}

    class Fails(Ok):
        def run(self):
            raise RuntimeError("boom")

    monkeypatch.setattr(L, "Trainer", Ok)
    assert L.train({}) == {"exit_status": 0} and calls == ["barrier", "gc", "destroy", "gc"]
    calls.clear()
    monkeypatch.setattr(L, "Trainer", Fails)
    with pytest.raises(RuntimeError, match="boom"):
        L.train({})
    assert calls == ["gc", "destroy", "gc"]

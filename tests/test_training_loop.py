"""End-to-end behaviour of training.loop on a tiny on-disk task (CPU, seconds per run)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.toy_data import toy_train_config
from training import checkpoint as ckpt
from training.config import config_from_dict
from training.loop import Trainer, train
from training.summary import read_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(path):
    st = torch.load(path, map_location="cpu", weights_only=False)
    return st


def _assert_same_weights(a: dict, b: dict, tol: float = 1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=tol, rtol=0), f"{k} differs"


# ---------------------------------------------------------------------------------------------- learning
@pytest.fixture(scope="module")
def learned_run(toy, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("learn") / "run")
    summary = train(toy_train_config(toy, run, epochs=300, ema=True, ema_rate=0.99, eval_interval=150))
    return run, summary


@pytest.mark.slow
def test_tiny_trm_learns_toy_task_and_writes_summary(learned_run):
    run, summary = learned_run
    assert summary["final"]["train/exact_accuracy"] >= 0.95
    assert summary["final"]["train/q_halt_accuracy"] >= 0.9
    # the eval hook ran on the held-out test split with the EMA weights
    assert summary["final"]["eval/all.exact_accuracy"] >= 0.95
    assert summary["final"]["eval/num_examples"] == 16  # 4 puzzles x 4 test examples, each once
    d = read_summary(run)
    assert d == json.loads(json.dumps(summary))
    assert d["stop_reason"] == "completed" and d["exit_status"] == 0 and d["status"] == "finished"
    assert d["steps"] == d["total_steps"] == 300 * 4  # epochs * (64 samples // 16)
    assert d["epochs_completed"] == pytest.approx(300)
    # halt_max_steps=2: each slot is trained on for 1-2 steps, so between half and all rows are new data
    assert 0.5 * 1200 * 16 <= d["examples_seen"] <= 1200 * 16
    assert d["final"]["train/examples_seen"] == d["examples_seen"]
    assert d["best"]["train/exact_accuracy"] >= d["final"]["train/exact_accuracy"]
    assert d["num_params"] > 0 and d["last_checkpoint"].endswith("step_1200.pt")
    assert os.path.isfile(d["last_checkpoint"])


# ---------------------------------------------------------------------------------------------- resume
def _resume_cfg(toy, run, init=None, **kw):
    # Starting from the learned weights makes the ACT halting (q_halt > 0) and hence the random
    # exploration matter: a resume that lost the RNG state, the carry or the data position diverges.
    return toy_train_config(
        toy,
        run,
        epochs=3,
        ema=True,
        ema_rate=0.9,
        checkpoint_every=4,
        checkpoint_keep=None,
        lr_warmup_steps=3,
        lr_min_ratio=0.1,
        arch={"halt_exploration_prob": 0.5},
        load_checkpoint=init,
        **kw,
    )


@pytest.fixture(scope="module")
def straight_run(toy, learned_run, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("straight") / "run")
    summary = train(_resume_cfg(toy, run, init=learned_run[0]))
    assert summary["steps"] == 12
    return run


def test_resume_after_hard_kill_is_exact(toy, learned_run, straight_run, tmp_path):
    """12 steps straight == 8 steps, SIGKILL right after checkpoint 8, resume, 4 more steps."""
    run = str(tmp_path / "killed")
    cfg = _resume_cfg(toy, run, init=learned_run[0])
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        from training import loop
        orig = loop.Trainer.save_checkpoint
        def save(self):
            path = orig(self)
            if self.step == 8:
                os.kill(os.getpid(), signal.SIGKILL)
            return path
        loop.Trainer.save_checkpoint = save
        loop.train({cfg!r})
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [4, 8]
    assert read_summary(run)["status"] == "running"

    summary = train(dict(cfg, resume=True))
    assert summary["steps"] == 12 and summary["stop_reason"] == "completed"
    a, b = _state(os.path.join(straight_run, "step_12.pt")), _state(os.path.join(run, "step_12.pt"))
    _assert_same_weights(a["model"], b["model"])  # includes the sparse puzzle-embedding table
    _assert_same_weights(a["ema"]["shadow"], b["ema"]["shadow"])
    assert a["examples_seen"] == b["examples_seen"]
    assert a["per_rank"][0]["data_state"] == b["per_rank"][0]["data_state"]
    for x, y in zip(a["optimizers"]["adam"]["state"].values(), b["optimizers"]["adam"]["state"].values()):
        _assert_same_weights(
            {k: v for k, v in x.items() if torch.is_tensor(v)}, {k: v for k, v in y.items() if torch.is_tensor(v)}
        )
    # the open log window (8 of the 12 steps of the only window) was checkpointed: same summary numbers
    _assert_same_summary(read_summary(straight_run), read_summary(run))


def _assert_same_summary(a: dict, b: dict):
    assert a["steps"] == b["steps"] and a["examples_seen"] == b["examples_seen"]
    for key in ("final", "best"):
        assert a[key].keys() == b[key].keys()
        for k in a[key]:
            if "second" in k:  # eval timing (wall clock)
                continue
            assert b[key][k] == pytest.approx(a[key][k], rel=1e-6, abs=1e-7), f"{key}[{k}]"
    assert a["best_step"] == b["best_step"]


def _all_tensors(state: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in state.items() if isinstance(state, dict) else enumerate(state):
        if torch.is_tensor(v):
            out[f"{prefix}{k}"] = v
        elif isinstance(v, (dict, list, tuple)):
            out.update(_all_tensors(v, f"{prefix}{k}."))
    return out


def test_ctrl_c_resume_is_exact(toy, learned_run, straight_run, tmp_path):
    """Ctrl-C (SIGINT) lands in the middle of step 6 (after the forward pass, before the optimizer update): the
    steps in flight complete (all ranks agree on the stop at the next step boundary), the run stops with a
    checkpoint at step 7 (exit 130), and a resume ends exactly where the uninterrupted 12-step run does -- every
    tensor of the checkpoint and the summary's final / best numbers."""
    run = str(tmp_path / "ctrlc")
    cfg = _resume_cfg(toy, run, init=learned_run[0])
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        from training import loop
        orig, calls = loop.global_grad_norm, []
        def grad_norm(params, device):  # once per step (no encoder): the 6th call is inside step 6
            calls.append(1)
            if len(calls) == 6:
                os.kill(os.getpid(), signal.SIGINT)  # mid-step: the carry and data have advanced already
            return orig(params, device)
        loop.global_grad_norm = grad_norm
        s = loop.train({cfg!r})
        sys.exit(s["exit_status"])
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "SIGINT: stopping after the current step" in proc.stderr
    d = read_summary(run)
    assert (d["stop_reason"], d["message"], d["steps"]) == ("interrupted", "SIGINT", 7)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [4, 7]

    summary = train(dict(cfg, resume=True))
    assert summary["steps"] == 12 and summary["stop_reason"] == "completed"
    a = ckpt.read_checkpoint(os.path.join(straight_run, "step_12.pt"))
    b = ckpt.read_checkpoint(os.path.join(run, "step_12.pt"))
    ta = _all_tensors({k: a[k] for k in ("model", "ema", "optimizers", "per_rank")})
    tb = _all_tensors({k: b[k] for k in ("model", "ema", "optimizers", "per_rank")})
    assert len(ta) > 15 and ta.keys() == tb.keys()
    _assert_same_weights(ta, tb)  # weights, EMA, optimizer moments, RNG states, ACT carry
    assert a["per_rank"][0]["data_state"] == b["per_rank"][0]["data_state"]
    assert a["examples_seen"] == b["examples_seen"]
    _assert_same_summary(read_summary(straight_run), read_summary(run))


def test_resume_applies_this_runs_optimizer_settings_and_says_so(toy, tmp_path, capsys):
    """A resume with another weight_decay / lr uses them (moments still come from the checkpoint), loudly."""
    run = str(tmp_path / "r")
    train(toy_train_config(toy, run, epochs=3, max_steps=4, checkpoint_every=4, weight_decay=0.0))
    capsys.readouterr()
    summary = train(
        toy_train_config(toy, run, epochs=3, max_steps=8, checkpoint_every=4, weight_decay=0.25, lr=5e-4, resume=True)
    )
    out = capsys.readouterr().out
    assert summary["steps"] == 8
    assert "weight_decay=0.25 (checkpoint had 0.0)" in out and "base_lr=0.0005 (checkpoint had 0.001)" in out
    groups = _state(os.path.join(run, "step_8.pt"))["optimizers"]["adam"]["param_groups"]
    assert all(g["weight_decay"] == 0.25 and g["base_lr"] == 5e-4 for g in groups)


def test_resume_without_checkpoint_needs_run_name(toy, tmp_path):
    cfg = _resume_cfg(toy, str(tmp_path / "r"))
    cfg.pop("run_name")
    cfg.pop("checkpoint_path")
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="resume=true needs"):
        train(dict(cfg, resume=True))


# ---------------------------------------------------------------------------------------------- failures
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(toy, tmp_path, monkeypatch):
    run = str(tmp_path / "nan")
    orig = Trainer.train_step

    def poisoned(self, batch):
        if self.step == 6:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return orig(self, batch)

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    summary = train(toy_train_config(toy, run, epochs=3, checkpoint_every=4, checkpoint_keep=None))
    assert summary["stop_reason"] == "non-finite loss" and summary["exit_status"] == 2
    assert summary["status"] == "failed" and "step 7" in summary["message"] and "loss=nan" in summary["message"]
    assert summary["steps"] == 6
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [4]  # nothing written after the last good one
    good = _state(os.path.join(run, "step_4.pt"))
    assert all(torch.isfinite(v).all() for v in good["model"].values() if v.is_floating_point())
    assert read_summary(run)["stop_reason"] == "non-finite loss"


class _CountingEvaluator:
    required_outputs = {"preds"}
    calls = []

    def __init__(self, data_path, metadata, output_dir, fail=False):
        self.fail, self.n = fail, 0

    def begin_eval(self):
        self.n = 0

    def update(self, batch, outputs):
        if self.fail:
            raise RuntimeError("evaluator exploded")
        self.n += int((batch["example_index"] >= 0).sum())

    def result(self, save_path=None):
        _CountingEvaluator.calls.append(self.n)
        return {"count/examples": float(self.n)}


def test_evaluators_receive_every_test_example_and_failures_raise(toy, tmp_path, monkeypatch):
    import evaluators

    monkeypatch.setitem(evaluators.EVALUATOR_REGISTRY, "counting", _CountingEvaluator)
    _CountingEvaluator.calls = []
    s = train(
        toy_train_config(toy, str(tmp_path / "ok"), epochs=2, eval_interval_steps=4, evaluators=[{"name": "counting"}])
    )
    assert _CountingEvaluator.calls == [16, 16]  # step 4 and the end (step 8)
    assert s["final"]["count/examples"] == 16.0
    with pytest.raises(RuntimeError, match="evaluator exploded"):
        train(
            toy_train_config(
                toy,
                str(tmp_path / "bad"),
                epochs=2,
                eval_interval_steps=4,
                evaluators=[{"name": "counting", "kwargs": {"fail": True}}],
            )
        )
    failed = read_summary(str(tmp_path / "bad"))
    assert (failed["status"], failed["stop_reason"], failed["exit_status"]) == ("failed", "error", 1)
    assert "evaluator exploded" in failed["message"] and failed["steps"] == 4
    # construction failure (toy data has no ARC ground truth) raises at start, never "no evaluator found"
    with pytest.raises(Exception, match="arc"):
        train(toy_train_config(toy, str(tmp_path / "arc"), epochs=1, evaluators=[{"name": "arc"}]))
    with pytest.raises(Exception, match="unknown evaluator 'nope'"):
        train(toy_train_config(toy, str(tmp_path / "nope"), epochs=1, evaluators=[{"name": "nope"}]))


# ---------------------------------------------------------------------------------------------- step mechanics
def test_grad_norm_logged_before_clipping_and_max_steps(toy, tmp_path):
    s = train(
        toy_train_config(
            toy, str(tmp_path / "clip"), epochs=50, max_steps=5, grad_clip=1e-4, log_interval=1, eval_at_end=False
        )
    )
    assert s["stop_reason"] == "max_steps" and s["steps"] == 5 and s["total_steps"] == 5
    assert s["final"]["grad/total_norm"] > 1e-2  # pre-clip norm, far above the clip value


def test_freeze_decoder_steps_freezes_every_decoder_param(toy, tmp_path):
    from dataset.metadata import load_metadata
    from training import distributed as D
    from training.build import build_act_model

    cfg = toy_train_config(
        toy, str(tmp_path / "frz"), epochs=50, max_steps=3, freeze_decoder_steps=3, log_interval=1, eval_at_end=False
    )
    s = train(cfg)
    assert s["final"]["train/decoder_frozen"] == 1.0
    D.seed_everything(0, 0)
    init = build_act_model(config_from_dict(cfg), load_metadata(os.path.join(toy, "train")), 16).state_dict()
    _assert_same_weights(init, _state(os.path.join(cfg["checkpoint_path"], "step_3.pt"))["model"], tol=0)
    s2 = train(dict(cfg, freeze_decoder_steps=1, checkpoint_path=str(tmp_path / "frz1")))
    assert s2["final"]["train/decoder_frozen"] == 0.0
    moved = _state(os.path.join(tmp_path / "frz1", "step_3.pt"))["model"]
    changed = [k for k in init if init[k].is_floating_point() and not torch.equal(init[k], moved[k])]
    assert any("puzzle_emb" in k for k in changed)  # trained after the frozen step
    assert len([k for k in changed if "puzzle_emb" not in k]) >= len(init) // 2


def test_weights_only_load_and_inference_loader(toy, straight_run, tmp_path):
    from training.build import load_model_for_inference
    from training.checkpoint import CheckpointError

    path = os.path.join(straight_run, "step_12.pt")
    saved = _state(path)
    cfg = config_from_dict(toy_train_config(toy, str(tmp_path / "ft"), load_checkpoint=path))
    from training.distributed import DistInfo

    t = Trainer(cfg, DistInfo())
    _assert_same_weights(saved["model"], t.model.state_dict(), tol=0)
    assert t.step == 0  # weights only: a fresh optimizer / schedule
    bad = config_from_dict(toy_train_config(toy, str(tmp_path / "ft2"), load_checkpoint=path, arch={"L_cycles": 2}))
    with pytest.raises(CheckpointError, match=r"L_cycles: checkpoint has 1, model has 2"):
        Trainer(bad, DistInfo())

    model, mcfg, meta = load_model_for_inference(straight_run, use_ema=True, device="cpu")
    assert meta.seq_len == 8 and mcfg.epochs == 3 and not model.training
    sd = model.state_dict()
    for k, v in saved["ema"]["shadow"].items():
        assert torch.equal(sd[k], v)
    emb_key = next(k for k in sd if k.endswith("puzzle_emb.weights"))
    assert torch.equal(sd[emb_key], saved["model"][emb_key])  # live table (never EMA-averaged)


def test_weights_only_init_applies_under_resume_until_the_run_has_its_own_checkpoint(toy, straight_run, tmp_path):
    """resume=true (what the science command always passes) with load_checkpoint and no checkpoint of its own is a
    fresh run: the init must apply (it was silently skipped); once the run has a checkpoint, resume wins."""
    from training.distributed import DistInfo

    path = os.path.join(straight_run, "step_12.pt")
    saved = _state(path)["model"]
    run = str(tmp_path / "ft")
    cfg = toy_train_config(toy, run, load_checkpoint=path, resume=True, max_steps=2, checkpoint_every=1)
    t = Trainer(config_from_dict(cfg), DistInfo())
    _assert_same_weights(saved, t.model.state_dict(), tol=0)
    assert t.step == 0
    t.close()
    train(cfg)  # trains 2 steps from the init, writes its own checkpoints
    own = _state(os.path.join(run, "step_2.pt"))["model"]
    assert any(not torch.equal(own[k], saved[k]) for k in saved if saved[k].is_floating_point())
    t2 = Trainer(config_from_dict(dict(cfg, max_steps=3)), DistInfo())
    assert t2.step == 2  # resumed its own step 2, not re-initialised from load_checkpoint
    _assert_same_weights(own, t2.model.state_dict(), tol=0)


def test_sigterm_checkpoints_and_resume_continues(toy, tmp_path, monkeypatch):
    """A stop request (SIGTERM) ends the step loop, saves a checkpoint (exit 130); resume finishes the run."""
    import signal as _signal

    run = str(tmp_path / "term")
    orig = Trainer.train_step

    def term_at_5(self, batch):
        if self.step == 4:
            _signal.raise_signal(_signal.SIGTERM)  # handled by the loop's SIGTERM handler
        return orig(self, batch)

    monkeypatch.setattr(Trainer, "train_step", term_at_5)
    s = train(toy_train_config(toy, run, epochs=3))
    assert (s["stop_reason"], s["exit_status"], s["steps"]) == ("interrupted", 130, 5)
    assert [st for st, _ in ckpt.list_checkpoints(run)] == [5]
    monkeypatch.setattr(Trainer, "train_step", orig)
    s2 = train(toy_train_config(toy, run, epochs=3, resume=True))
    assert (s2["stop_reason"], s2["steps"]) == ("completed", 12)


def test_health_early_stop_saves_checkpoint_and_exit_status_3(toy, tmp_path):
    run = str(tmp_path / "stuck")
    s = train(
        toy_train_config(
            toy,
            run,
            epochs=5,
            lr=0.0,
            puzzle_emb_lr=0.0,
            log_interval=1,
            early_stop=True,
            health={"stuck_steps": 3, "stop_on": ["stuck"]},
            eval_at_end=False,
        )
    )
    assert s["stop_reason"].startswith("early_stop: stuck") and s["exit_status"] == 3
    assert s["status"] == "finished" and s["steps"] < 20
    assert any("stuck" in w for w in s["warnings"])
    assert ckpt.find_latest_checkpoint(run).endswith(f"step_{s['steps']}.pt")


@pytest.mark.slow
def test_wandb_offline_run_lives_in_the_run_dir(toy, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login -> auto = offline
    run = str(tmp_path / "wb")
    s = train(toy_train_config(toy, run, epochs=1, wandb={"mode": "auto", "save_code": False}))
    assert s["stop_reason"] == "completed"
    runs = [d for d in os.listdir(os.path.join(run, "wandb")) if d.startswith("offline-run-")]
    assert len(runs) == 1
    files = os.listdir(os.path.join(run, "wandb", runs[0]))
    assert any(f.endswith(".wandb") for f in files)


def test_eval_interval_counts_passes_when_an_epoch_packs_several(toy, tmp_path):
    """64 training examples, global batch 128: each loader epoch packs 2 passes into 1 batch, so one step = 2
    epochs (passes). eval_interval is in epochs: eval_interval=2 must evaluate after every step, and
    min_eval_interval=4 (epochs) must skip the first step (2 epochs)."""
    from training.distributed import DistInfo

    cfg = toy_train_config(
        toy,
        str(tmp_path / "pp"),
        global_batch_size=128,
        epochs=8,
        eval_interval=2,
        min_eval_interval=4,
        checkpoint_keep=None,
        eval_at_end=False,
    )
    t = Trainer(config_from_dict(cfg), DistInfo())
    assert (t.passes_per_epoch, t.batches_per_epoch, t.total_steps) == (2, 1, 4)
    due = []
    for step in range(1, 5):
        t.step = step
        due.append(t._eval_due())
    assert due == [False, True, True, True]
    t.cfg.eval_interval, t.cfg.min_eval_interval = 3, 0  # evaluate at the first step reaching 3, 6, ... epochs
    due = []
    for step in range(1, 6):
        t.step = step
        due.append(t._eval_due())
    assert due == [False, True, True, False, True]


def test_metrics_jsonl_and_training_curves(toy, tmp_path):
    """Every logged value lands in <run>/metrics.jsonl (a resumed run's file equals an uninterrupted one's), and
    `python -m training.plot_run` draws it to PNG without W&B."""
    from training.plot_run import PlotError, read_metrics
    from training.plot_run import main as plot_main

    straight, cut = str(tmp_path / "a"), str(tmp_path / "b")
    train(toy_train_config(toy, straight, epochs=3, log_interval=2, checkpoint_every=4))
    train(toy_train_config(toy, cut, epochs=3, log_interval=2, checkpoint_every=4, max_steps=6))  # stops at 6
    train(toy_train_config(toy, cut, epochs=3, log_interval=2, checkpoint_every=4, resume=True))
    with open(os.path.join(straight, "metrics.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    assert sorted({r["step"] for r in rows if set(r) != {"step", "train/lr"}}) == [0, 2, 4, 6, 8, 10, 12]  # + the
    # end-of-run eval's line at 12; the lr alone at every other step (at least training.loop.LR_POINTS per run)
    assert [r["step"] for r in rows if set(r) == {"step", "train/lr"}] == [1, 3, 5, 7, 9, 11]
    with open(os.path.join(cut, "metrics.jsonl")) as f:
        resumed = [json.loads(x) for x in f]
    train_lines = lambda rs: [(r["step"], r["train/lm_loss"]) for r in rs if "train/lm_loss" in r]  # noqa: E731
    # the training log of the cut + resumed run is the uninterrupted one's (the cut run's end-of-run evaluation at
    # step 6 is an extra line: it happened)
    assert [s for s, _ in train_lines(resumed)] == [2, 4, 6, 8, 10, 12]
    assert [v for _, v in train_lines(resumed)] == pytest.approx([v for _, v in train_lines(rows)], rel=1e-5)
    m = read_metrics(straight)
    assert m["train/lm_loss"][0] == [2, 4, 6, 8, 10, 12] and m["train/lr"][0] == list(range(1, 13))  # every step
    png = plot_main([straight])
    assert png == os.path.join(straight, "curves.png") and os.path.getsize(png) > 10_000
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(PlotError, match="metrics.jsonl: not found"):
        read_metrics(str(tmp_path))


class _FakeWandbRun:
    def __init__(self, **kw):
        self.kw, self.summary, self.logged, self.id, self.dir = kw, {}, [], "fake", None

    def log(self, metrics, step=None, commit=None):
        self.logged.append((step, dict(metrics)))

    def log_code(self, *a, **k):
        pass

    def finish(self, exit_code=0):
        pass


def test_wandb_runs_carry_group_tags_job_type_and_best(toy, tmp_path, monkeypatch):
    """Training runs: group (wandb.group, else the queue line's id, else the run name; stored with the checkpoint's
    config), tags (arch, encoder or trm, dataset), job_type train, best/* in the summary, encoder.name "none" for
    TRM; evaluate.py joins the training run's group (whatever its own queue job) with job_type eval and falls back
    to offline without a login."""
    import wandb

    import evaluate
    from training.logging import wandb_identity

    runs = []
    monkeypatch.setattr(wandb, "init", lambda **kw: runs.append(_FakeWandbRun(**kw)) or runs[-1])
    monkeypatch.delenv("TRM_JOB_ID", raising=False)
    run = str(tmp_path / "wbg")
    s = train(toy_train_config(toy, run, epochs=2, wandb={"mode": "offline", "save_code": False, "tags": ["x"]}))
    kw = runs[0].kw
    assert (kw["group"], kw["job_type"], kw["tags"]) == ("toy", "train", ["arch:trm", "encoder:none", "data:toy", "x"])
    assert kw["config"]["encoder"] == {"name": "none"} and kw["config"]["arch"]["name"] == "trm"
    assert runs[0].summary["best/train/exact_accuracy"] == s["best"]["train/exact_accuracy"]
    assert runs[0].summary["train/exact_accuracy"] == s["final"]["train/exact_accuracy"]
    monkeypatch.setenv("TRM_JOB_ID", "overfit-32")  # run_jobs.py: the line's id=
    queued = str(tmp_path / "wbq")
    train(toy_train_config(toy, queued, epochs=1, wandb={"mode": "offline", "save_code": False}))
    assert runs[1].kw["group"] == "overfit-32"
    assert ckpt.read_checkpoint(ckpt.find_latest_checkpoint(queued))["config"]["wandb"]["group"] == "overfit-32"
    monkeypatch.setenv("TRM_JOB_ID", "eval-of-32")  # the evaluation is another queue job: still the training group
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no login: offline, not a crash
    for ckpt_dir, group in ((run, "toy"), (queued, "overfit-32")):
        evaluate.run(
            evaluate.EvaluateConfig(
                checkpoint=ckpt_dir, data_path=toy, device="cpu", progress=False, wandb_project="p", num_pictures=0
            )
        )
        ev = runs[-1].kw
        assert (ev["group"], ev["job_type"], ev["mode"]) == (group, "eval", "offline")
        assert ev["tags"][:2] == ["arch:trm", "encoder:none"]
    # the evaluation lands on the training run's eval charts: its keys, the checkpoint's step, the run's name and
    # the checkpoint's real config (not the evaluation config's unused arch group)
    ((step, logged),) = runs[-1].logged
    q = read_summary(queued)
    assert step == q["steps"] and set(q["final"]) >= set(logged) - {"eval/wall_seconds"}
    assert "eval/all.exact_accuracy" in logged and not any(k.startswith("all.") for k in logged)
    ev = runs[-1].kw
    assert ev["name"] == f"toy-eval-step_{q['steps']}"
    trained = ckpt.read_checkpoint(ckpt.find_latest_checkpoint(queued))["config"]
    assert ev["config"]["arch"] == trained["arch"] and ev["config"]["run_name"] == trained["run_name"]
    assert "arch" not in ev["config"]["evaluate"] and ev["config"]["evaluate"]["wandb_project"] == "p"
    etrm = wandb_identity({"arch": {"name": "trm"}, "encoder": {"name": "lpn"}, "data_paths": ["data/arc1/"]}, "r")
    assert etrm["tags"] == ["arch:trm", "encoder:lpn", "data:arc1"] and etrm["config"]["encoder"] == {"name": "lpn"}


def test_metrics_jsonl_of_a_run_resumed_after_a_crash_equals_the_uninterrupted_one(toy, tmp_path):
    """A crash after step 8 (checkpoint at 4, a line cut short mid-write): the resumed run drops the lines after step
    4 and the cut line, and its metrics.jsonl equals the uninterrupted run's (timings aside); with no checkpoint
    left, resume=true starts the file afresh too."""
    import shutil

    straight, crashed = str(tmp_path / "a"), str(tmp_path / "c")
    train(toy_train_config(toy, straight, epochs=3, log_interval=2, checkpoint_every=4))
    shutil.copytree(straight, crashed)
    for name in os.listdir(crashed):
        if name.startswith("step_") and name != "step_4.pt":
            os.remove(os.path.join(crashed, name))
    with open(os.path.join(crashed, "metrics.jsonl"), "a") as f:
        f.write('{"step": 13, "train/lo')  # the process died mid-write
    train(toy_train_config(toy, crashed, epochs=3, log_interval=2, checkpoint_every=4, resume=True))

    def rows(run):
        with open(os.path.join(run, "metrics.jsonl")) as f:
            return [{k: v for k, v in json.loads(x).items() if "second" not in k} for x in f]

    assert rows(crashed) == rows(straight) and [r["step"] for r in rows(straight)][:3] == [0, 1, 2]
    for name in os.listdir(crashed):  # no checkpoint left: resume=true starts fresh, and so does the file
        if name.startswith("step_"):
            os.remove(os.path.join(crashed, name))
    train(toy_train_config(toy, crashed, epochs=3, log_interval=2, checkpoint_every=4, resume=True))
    assert rows(crashed) == rows(straight)

"""The README demo pipeline (training.demo) and the train-step benchmark, in tiny sizes."""

import json
import os
import shutil

import pytest

from training.config import load_config


@pytest.mark.slow
def test_demo_builds_data_trains_evaluates_and_reports(tmp_path, capsys):
    from training import demo

    data, run = str(tmp_path / "sud4"), str(tmp_path / "run")
    summary = demo.main(
        [
            f"data_paths=[{data}]",
            f"checkpoint_path={run}",
            "epochs=2",
            "progress=false",
            "wandb.mode=disabled",
            "+run_name=demo_test",
        ]
    )
    out = capsys.readouterr().out
    assert os.path.isfile(os.path.join(data, "train", "dataset.json"))  # built because it was missing
    assert summary["stop_reason"] == "completed" and summary["steps"] == summary["total_steps"] > 0
    assert summary["final"]["eval/num_examples"] == 200  # every generated test puzzle evaluated once
    assert f"[demo] summary    : {os.path.join(run, 'summary.json')}" in out
    assert f"[demo] checkpoint : {summary['last_checkpoint']}" in out and os.path.isfile(summary["last_checkpoint"])
    with open(os.path.join(run, "summary.json")) as f:
        assert json.load(f)["run_name"] == "demo_test"
    assert demo.ensure_demo_dataset(data) is False  # second call: already there
    # the same run directory again without resume=true: one line naming it, exit 1, the first run untouched
    before = sorted(os.listdir(run))
    with pytest.raises(SystemExit) as e:
        demo.main(
            [
                f"data_paths=[{data}]",
                f"checkpoint_path={run}",
                "epochs=2",
                "progress=false",
                "wandb.mode=disabled",
                "+run_name=demo_test",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and err.startswith("error: ") and run in err and "resume=true" in err
    assert "\n" not in err and sorted(os.listdir(run)) == before


def test_train_step_benchmark_reports_throughput_and_flops():
    from benchmarks import train_step

    tiny = dict(hidden_size=32, num_heads=2, puzzle_emb_ndim=32, puzzle_emb_len=2, H_cycles=1, L_cycles=1, L_layers=1)
    out = train_step.run(batch=2, steps=1, warmup=0, device="cpu", compile="eager", arch_overrides=tiny)
    r = out["eager"]
    assert out["seq_len"] == 902 and out["batch"] == 2 and out["dtype"] == "fp32"
    assert r["samples_per_s"] == pytest.approx(2 / r["seconds_per_step"])
    assert r["tokens_per_s"] == pytest.approx(902 * r["samples_per_s"])
    # analytic model FLOPs: (H*(L+1) forward + 2*(L+1) backward passes) x blocks x per-token cost
    h, seq = 32, 902
    from models.layers import swiglu_intermediate_size

    inter = swiglu_intermediate_size(32, 4)
    per_tok = 8 * h * h + 6 * h * inter + 4 * seq * h
    assert out["flops_per_step"] == pytest.approx(2 * seq * ((1 * 2 + 2 * 2) * per_tok + 6 * h * 12))
    # the FLOP counter sees at least the projection + MLP matmuls of the same passes
    assert out["flops_per_step_counted"] >= 0.99 * 2 * seq * 6 * (8 * h * h + 6 * h * inter)
    assert r["model_flops_per_s"] == pytest.approx(out["flops_per_step"] / r["seconds_per_step"])
    # it timed config/arch/trm.yaml as composed (every key), changed only by the test's tiny sizes
    composed = load_config("cfg_pretrain", ["arch=trm", "data_paths=[x]"]).arch.model_dump(mode="json")
    assert out["arch"] == {**composed, **tiny}


def test_the_benchmarks_take_their_arch_from_config_arch_trm_yaml(tmp_path, monkeypatch):
    """benchmarks.train_step and benchmarks.eval_throughput time ``arch=trm`` as Hydra composes it, changed only by
    the overrides they list (eval: its halt_max_steps and the device's dtype); an edit of trm.yaml (in a copy of
    config/) reaches both."""
    from benchmarks import eval_throughput
    from benchmarks.arc_arch import arc_arch
    from training import config as tc

    composed = load_config("cfg_pretrain", ["arch=trm", "data_paths=[x]"]).arch.model_dump(mode="json")
    assert arc_arch() == composed
    assert (composed["hidden_size"], composed["H_cycles"], composed["L_cycles"], composed["L_layers"]) == (512, 3, 4, 2)
    ev = eval_throughput.eval_arch(8, cuda=False)
    assert {k: v for k, v in ev.items() if v != composed[k]} == {"halt_max_steps": 8, "forward_dtype": "float32"}
    assert eval_throughput.eval_arch(16, cuda=True)["forward_dtype"] == "bfloat16"
    cfg = tmp_path / "config"
    shutil.copytree(tc.CONFIG_DIR, cfg)
    trm = cfg / "arch" / "trm.yaml"
    trm.write_text(trm.read_text() + "L_cycles: 6\nhidden_size: 256\n")
    monkeypatch.setattr(tc, "CONFIG_DIR", str(cfg))
    edited = arc_arch()
    assert {k: v for k, v in edited.items() if v != composed[k]} == {"L_cycles": 6, "hidden_size": 256}
    assert eval_throughput.eval_arch(16, cuda=False)["L_cycles"] == 6


def test_science_step_benchmark_times_the_real_training_step_with_a_phase_split(tmp_path):
    """--config science: cfg_science's own Trainer.train_step on generated canvas-8 data (ETRM standard encoder),
    phases from hooks that add up to the step, and a FLOP count of one step."""
    from benchmarks import trainer_step
    from training.config import load_config

    batch = load_config("cfg_science", ["data_paths=[unused]", "encoder=standard"]).global_batch_size  # the recipe's
    r = trainer_step.measure("science", steps=2, warmup=1, compiled=False, root=str(tmp_path))
    assert r["batch"] == batch and r["num_params"] > 100_000 and r["mode"] == "eager"
    ph = r["phases_s"]
    assert ph["encoder_forward"] > 0 and ph["core_forward"] > 0 and ph["optimizer"] > 0 and ph["loss_backward_rest"] > 0
    assert sum(v for k, v in ph.items() if k != "step") == pytest.approx(r["seconds_per_step"], rel=1e-6)
    assert r["samples_per_s"] == pytest.approx(batch / r["seconds_per_step"])
    assert r["flops_per_step_counted"] > 1e9 and r["flops_per_s"] == pytest.approx(
        r["flops_per_step_counted"] / r["seconds_per_step"]
    )


def test_science_benchmark_reports_the_fp32_matmul_ceiling_and_the_step_floor(monkeypatch):
    """On CPU, run() measures an fp32 matmul in the same run and reports the fastest step at identical FLOPs
    (counted FLOPs / ceiling) and the achieved fraction; the matmul measurement itself is a real rate."""
    from benchmarks import trainer_step

    rate = trainer_step.fp32_matmul_flops(m=256, k=64, n=128, iters=5)
    assert 1e8 < rate < 1e13
    fake = {
        "config": "science",
        "mode": "eager",
        "seconds_per_step": 0.3,
        "flops_per_step_counted": 12e9,
        "flops_per_s": 40e9,
        "phases_s": {},
        "samples_per_s": 1.0,
    }
    monkeypatch.setattr(trainer_step, "measure", lambda *a, **k: dict(fake))
    monkeypatch.setattr(trainer_step, "fp32_matmul_flops", lambda: 80e9)
    out = trainer_step.run("science", steps=1, warmup=0, compile="eager", device="cpu")
    assert out["fp32_matmul_flops_per_s"] == 80e9
    assert out["eager"]["floor_s_per_step"] == pytest.approx(0.15)  # 12 GFLOP at 80 GFLOP/s
    assert out["eager"]["fraction_of_fp32_matmul"] == pytest.approx(0.5)


def test_batch_flag_reaches_the_science_trainer(monkeypatch):
    """--batch sets the science / trm-tiny config's global_batch_size (it was silently ignored there): main() ->
    run() -> measure() -> the Trainer's config overrides (make_trainer composes them with load_config)."""
    from benchmarks import train_step, trainer_step

    class Built(Exception):
        pass

    seen = []

    def fake_make_trainer(config, data, run_dir, compiled, device, overrides=()):
        seen.append(list(overrides))
        raise Built  # stop before any training

    monkeypatch.setattr(trainer_step, "make_data", lambda config, root: root)
    monkeypatch.setattr(trainer_step, "make_trainer", fake_make_trainer)
    for argv in (["--batch", "128"], []):
        with pytest.raises(Built):
            train_step.main(["--config", "science", "--device", "cpu", "--compile", "eager", *argv])
    assert seen == [["global_batch_size=128"], []]


def test_compile_flag_is_honoured_on_cpu():
    import torch

    from training import distributed as D

    cpu = torch.device("cpu")
    assert D.should_compile(None, cpu) is False and D.should_compile(False, cpu) is False
    assert D.should_compile(True, cpu) is True  # a C++ compiler is on this machine's PATH (inductor needs it)


def test_science_fast_path_gives_the_reference_loss_curve(tmp_path, monkeypatch):
    """The science step's CPU speed-ups (packed encoder tokens, per-chunk projections, RoPE sign on the table,
    cross-attention keys projected only where attended) keep the numbers: five steps of cfg_science on the same
    data from the same seed give the reference path's losses, gradient norms and weights to fp32 tolerance."""
    import torch

    from benchmarks import trainer_step
    from core import ops

    data = trainer_step.make_data("science", str(tmp_path))
    runs = {}
    for fast in (True, False):
        monkeypatch.setattr(ops, "split_projections", lambda x, fast=fast: fast and not x.is_cuda)
        tr = trainer_step.make_trainer(
            "science",
            data,
            str(tmp_path / f"run-{fast}"),
            False,
            "cpu",
            [] if fast else ["encoder.pack_tokens=false", "encoder.crop_padding=false"],
        )
        assert tr.model.encoder.trunk.cfg.pack_tokens is fast
        it = iter(tr.data.train_loader)
        curve = [tr.train_step(next(it)[1]) for _ in range(5)]
        runs[fast] = (
            [v for m in curve for v in (m["loss"], m["grad/total_norm"])],
            {k: v.detach().clone() for k, v in tr.model.state_dict().items()},
        )
        tr.close()
    (fast_curve, fast_w), (ref_curve, ref_w) = runs[True], runs[False]
    assert fast_curve == pytest.approx(ref_curve, rel=2e-5)
    assert len({round(loss, 3) for loss in ref_curve[::2]}) > 1  # the weights moved: a curve, not one point
    for k in ref_w:
        torch.testing.assert_close(fast_w[k], ref_w[k], atol=2e-5, rtol=1e-4, msg=lambda s, k=k: f"{k}: {s}")


def test_compare_commits_alternates_old_and_new_and_reports_the_median_ratio(capsys, monkeypatch):
    """benchmarks.compare_commits: each round times the old commit's tree, then this one (a temporary git
    worktree, removed afterwards); the ratio per round is old/new and the median is quoted."""
    from benchmarks import compare_commits as cc

    s = cc.summarise([3.0, 2.0, 4.0], [1.0, 2.0, 1.0])
    assert s["ratios"] == [3.0, 1.0, 4.0] and s["median_ratio"] == 3.0
    with pytest.raises(ValueError):
        cc.summarise([1.0], [])
    with pytest.raises(cc.CompareError, match="no-such-rev"):
        cc.compare("no-such-rev", rounds=1, steps=1)
    # the alternation, with the timings faked: old tree (a checkout of the asked commit) first, then this one
    calls = []

    def fake_time(tree, config, steps, threads, out_json):
        calls.append((tree, cc._git("-C", tree, "rev-parse", "HEAD"), config, steps, threads))
        return 2.0 if tree != cc.REPO else 1.0

    head = cc._git("rev-parse", "HEAD")  # (a clone may be shallow: HEAD is the commit surely there)
    monkeypatch.setattr(cc, "_time_step", fake_time)
    fake = cc.compare("HEAD", config="trm-tiny", threads=2, rounds=2, steps=3)
    assert [c[0] == cc.REPO for c in calls] == [False, True, False, True]
    assert {c[1] for c in calls[::2]} == {head} and calls[0][0] == calls[2][0] != cc.REPO
    assert {c[2:] for c in calls} == {("trm-tiny", 3, 2)}
    assert fake["ratios"] == [2.0, 2.0] and fake["old"] == head and not os.path.exists(calls[0][0])
    monkeypatch.undo()
    # one real round: both trees run the benchmark command
    before = cc._git("worktree", "list")
    out = cc.compare("HEAD", config="trm-tiny", rounds=1, steps=1)
    log = capsys.readouterr().out
    assert out["old"] == cc._git("rev-parse", "HEAD") and len(out["ratios"]) == 1 and out["ratios"][0] > 0
    assert log.index("round 1/1 old") < log.index("round 1/1 new") and "median" in log
    assert cc._git("worktree", "list") == before  # the temporary tree is gone

"""pretrain.py as a command: Hydra overrides, torchrun (2-process gloo) == 1 process, --multirun, exit codes."""

import glob
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.toy_data import TINY_TRM, write_toy_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [*TINY_TRM, "arch.halt_exploration_prob=0", "epochs=3", "lr=1e-3"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return write_toy_dataset(str(tmp_path_factory.mktemp("data") / "toy"), seq_len=8)


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=ROOT)


def _run(cmd, cwd, timeout=300):
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    return p


@pytest.mark.slow
def test_torchrun_two_process_gloo_equals_one_process(toy, tmp_path):
    """Same global batch of 16: 1 process (16 rows) vs torchrun 2 x gloo (8 rows each) -> same weights."""
    args = TINY + [f"data_paths=[{toy}]", "+run_name=ddp", "hydra.run.dir=" + str(tmp_path / "hydra")]
    one = _run(
        [sys.executable, os.path.join(ROOT, "pretrain.py"), *args, f"checkpoint_path={tmp_path / 'one'}"],
        cwd=str(tmp_path),
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            os.path.join(ROOT, "pretrain.py"),
            *args,
            f"checkpoint_path={tmp_path / 'two'}",
        ],
        cwd=str(tmp_path),
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world size 2" in two.stdout + two.stderr
    a = torch.load(tmp_path / "one" / "step_12.pt", weights_only=False)
    b = torch.load(tmp_path / "two" / "step_12.pt", weights_only=False)
    assert len(a["per_rank"]) == 1 and len(b["per_rank"]) == 2
    for k in a["model"]:
        assert torch.allclose(a["model"][k].float(), b["model"][k].float(), atol=1e-5, rtol=0), k
    sa, sb = a["summary"]["final"], b["summary"]["final"]
    for k in ("train/lm_loss", "train/accuracy", "train/count", "eval/all.lm_loss", "eval/num_examples"):
        assert sa[k] == pytest.approx(sb[k], abs=1e-5), k
    assert b["examples_seen"] == a["examples_seen"]


@pytest.mark.slow
def test_multirun_sweep_writes_one_run_per_value(toy, tmp_path):
    args = [a for a in TINY if not a.startswith("lr=")] + [
        f"data_paths=[{toy}]",
        "epochs=1",
        "eval_at_end=false",
        "hydra.sweep.dir=" + str(tmp_path / "sweep"),
    ]
    p = _run(
        [sys.executable, os.path.join(ROOT, "pretrain.py"), "--multirun", "lr=1e-3,2e-3", *args], cwd=str(tmp_path)
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summaries = sorted(glob.glob(str(tmp_path / "checkpoints" / "t" / "*" / "summary.json")))
    assert len(summaries) == 2, p.stdout[-3000:] + p.stderr[-3000:]
    lrs = sorted(json.load(open(s))["final"]["train/lr"] for s in summaries)
    assert lrs == [1e-3, 2e-3]


def test_a_failing_sweep_point_does_not_stop_the_sweep(toy, tmp_path):
    """--multirun lr=-1,1e-3: the bad point is reported (one line) and the next point still trains; the process
    exits 1 naming the failed point."""
    args = [a for a in TINY if not a.startswith("lr=")] + [
        f"data_paths=[{toy}]",
        "epochs=1",
        "eval_at_end=false",
        "hydra.sweep.dir=" + str(tmp_path / "sweep"),
    ]
    p = _run([sys.executable, os.path.join(ROOT, "pretrain.py"), "--multirun", "lr=-1,1e-3", *args], cwd=str(tmp_path))
    assert p.returncode == 1, p.stderr[-3000:]
    assert "lr=-1: " in p.stderr and "[sweep] point failed, continuing: lr=-1" in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1].startswith("error: 1 sweep point(s) failed (the others ran): lr=-1")
    summaries = glob.glob(str(tmp_path / "checkpoints" / "t" / "*" / "summary.json"))
    assert len(summaries) == 1 and json.load(open(summaries[0]))["final"]["train/lr"] == 1e-3


def test_cli_exit_codes(toy, tmp_path, monkeypatch):
    """Config errors exit 1 naming the key; the summary's exit_status (2 non-finite, 3 early stop) is the
    process exit status."""
    import pretrain

    base = [
        "pretrain.py",
        f"data_paths=[{toy}]",
        "hydra.run.dir=" + str(tmp_path / "h"),
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
    ]
    monkeypatch.setattr(sys, "argv", base + ["+lrr=1"])
    with pytest.raises(SystemExit) as e:
        pretrain.main()
    assert e.value.code == 1
    for status in (2, 3):
        monkeypatch.setattr(pretrain, "train", lambda cfg, config_path=None, s=status: {"exit_status": s})
        monkeypatch.setattr(sys, "argv", base)
        with pytest.raises(SystemExit) as e:
            pretrain.main()
        assert e.value.code == status

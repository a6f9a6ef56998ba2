"""What a run leaves for a researcher to read and trust: the resolved config.yaml, the run's name kept on resume,
pace (s/step, elapsed, ETA) in every train line, schedule warnings, nothing behind a refused config, one line for a
checkpoint that cannot be written (disk full, a file-size limit) or a file that is not a torch checkpoint."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.toy_data import toy_train_config
from training import checkpoint as ckpt
from training.config import config_from_dict, config_from_hydra
from training.logging import Pace, train_line
from training.loop import train
from training.summary import read_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, cwd: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    return subprocess.run(
        [sys.executable, *args] if not code else [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_config_yaml_is_the_resolved_config_and_its_path_is_printed(toy, tmp_path, capsys):
    run = str(tmp_path / "r")
    cfg = toy_train_config(toy, run, epochs=1)
    s = train(cfg)
    path = os.path.join(run, "config.yaml")
    assert s["config_path"] == path and f"[train] config: {path}" in capsys.readouterr().err
    want = config_from_dict(cfg).model_dump(mode="json")
    want["wandb"]["group"] = "toy"  # the effective group, as stored with the checkpoint
    assert OmegaConf.to_container(OmegaConf.load(path)) == want
    with initialize_config_dir(config_dir=run, version_base=None):  # Hydra composes it again, as the run had it
        assert config_from_hydra(compose(config_name="config")).model_dump(mode="json") == want


def test_a_resume_without_run_name_keeps_the_runs_name_and_group(toy, tmp_path):
    """checkpoint_path=DIR resume=true without +run_name: the run's name (and so its W&B group) comes from the run
    itself, not a newly generated one that summary.json and W&B would disagree on."""
    run = str(tmp_path / "r")
    first = train(toy_train_config(toy, run, epochs=1, run_name=None, project_name=None))
    assert first["run_name"].startswith("trm-")
    again = train(toy_train_config(toy, run, epochs=2, run_name=None, project_name=None, resume=True))
    assert (again["run_name"], again["project_name"]) == (first["run_name"], first["project_name"])
    stored = ckpt.read_checkpoint(ckpt.find_latest_checkpoint(run))["config"]
    assert stored["wandb"]["group"] == first["run_name"] and again["steps"] > first["steps"]


def test_a_resume_by_folder_records_no_false_changes_and_keeps_its_names(toy, tmp_path, monkeypatch):
    """checkpoint_path=DIR resume=true without the names: summary.json's warnings name only what the resume really
    changed (epochs), config.yaml keeps the run's names and group, and compare_runs lists only epochs as a
    differing key (run-time keys such as resume left out)."""
    from training.compare_runs import config_differences, load_runs

    monkeypatch.delenv("TRM_JOB_ID", raising=False)
    run, before = str(tmp_path / "runB"), str(tmp_path / "runB-before")
    first = train(toy_train_config(toy, run, epochs=1, run_name="runB", project_name="P"))
    import shutil

    shutil.copytree(run, before)
    again = train(toy_train_config(toy, run, epochs=2, run_name=None, project_name=None, resume=True))
    assert (again["run_name"], again["project_name"]) == ("runB", "P") and again["steps"] > first["steps"]
    assert [w for w in again["warnings"] if w.startswith("resume:")] == [
        "resume: config changed since the checkpoint: epochs: 1 -> 2"
    ]
    saved = OmegaConf.to_container(OmegaConf.load(os.path.join(run, "config.yaml")))
    assert (saved["run_name"], saved["project_name"], saved["wandb"]["group"]) == ("runB", "P", "runB")
    differ, _ = config_differences(load_runs([before, run]))
    assert differ == ["epochs"]


@pytest.mark.parametrize("summary", ["missing", "corrupt"])
def test_a_resume_without_a_readable_summary_takes_names_and_group_from_the_checkpoint(
    toy, tmp_path, monkeypatch, summary
):
    """summary.json missing or corrupt: the resumed run still has its own name, project and W&B group (the queue
    line's id here), read from the checkpoint, not newly generated ones."""
    monkeypatch.setenv("TRM_JOB_ID", "overfit-32")
    run = str(tmp_path / "r")
    first = train(toy_train_config(toy, run, epochs=1, run_name=None, project_name=None))
    path = os.path.join(run, "summary.json")
    if summary == "missing":
        os.remove(path)
    else:
        with open(path, "w") as f:
            f.write('{"run_name": ')
    monkeypatch.delenv("TRM_JOB_ID")  # resumed by hand, outside the queue
    again = train(toy_train_config(toy, run, epochs=2, run_name=None, project_name=None, resume=True))
    assert (again["run_name"], again["project_name"]) == (first["run_name"], first["project_name"])
    assert again["steps"] > first["steps"] and not [w for w in again["warnings"] if "run_name" in w]
    stored = ckpt.read_checkpoint(ckpt.find_latest_checkpoint(run))["config"]
    assert stored["wandb"]["group"] == "overfit-32" and stored["run_name"] == first["run_name"]


def test_pace_reports_window_seconds_per_step_elapsed_and_eta():
    now = [100.0]
    pace = Pace(total_steps=100, initial_step=10, clock=lambda: now[0])
    now[0] = 120.0
    assert pace.tick(20) == "2 s/step, elapsed 0:00:20, ETA 0:02:40"  # 80 steps left at the mean 2 s/step
    now[0] = 125.0
    assert pace.tick(30) == "0.5 s/step, elapsed 0:00:25, ETA 0:01:28"  # window 0.5; mean 25/20 -> 70 * 1.25
    line = train_line(30, 100, {"train/loss": 1.5, "train/lr": 1e-3}, "0.5 s/step, elapsed 0:00:25, ETA 0:01:27")
    assert line == "[train] step 30/100 loss 1.5 lr 0.001 | 0.5 s/step, elapsed 0:00:25, ETA 0:01:27"


def test_every_piped_train_line_has_pace(toy, tmp_path, capsys):
    train(toy_train_config(toy, str(tmp_path / "r"), epochs=2, log_interval=2, progress=False))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[train] step ")]
    assert len(lines) == 4 and all(" s/step, elapsed " in ln and ", ETA " in ln for ln in lines)
    assert lines[-1].endswith("ETA 0:00:00")


def test_schedule_warnings_when_max_steps_is_not_reached_or_the_run_ends_in_warmup(toy, tmp_path):
    s = train(toy_train_config(toy, str(tmp_path / "a"), epochs=2, max_steps=50, lr_warmup_steps=2))
    assert s["steps"] == 8
    assert s["warnings"] == [
        "max_steps=50 is not reached: epochs=2 ends the run first, at step 8 (raise epochs= to train longer)"
    ]
    s = train(toy_train_config(toy, str(tmp_path / "b"), epochs=5, max_steps=6, lr_warmup_steps=6))
    assert len(s["warnings"]) == 1 and s["warnings"][0].startswith(
        "the run ends inside its lr warmup (6 steps <= lr_warmup_steps=6)"
    )
    s = train(toy_train_config(toy, str(tmp_path / "c"), epochs=5, max_steps=6, lr_warmup_steps=5))
    assert s["warnings"] == []


@pytest.mark.parametrize("entry, bad", [("pretrain.py", "lr=abc"), ("evaluate.py", "batch_size=abc")])
def test_a_refused_config_leaves_nothing_behind(tmp_path, entry, bad):
    """No Hydra output dir (outputs/<date>/<time>/.hydra) or log file is left where the command ran."""
    extra = ["checkpoint=x.pt", "data_path=d"] if entry == "evaluate.py" else []
    r = _python("", str(tmp_path), os.path.join(ROOT, entry), bad, *extra)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("error: "), r.stderr
    assert "abc" in r.stderr and os.listdir(tmp_path) == []


def test_a_write_error_inside_torch_save_is_the_os_error_naming_the_file(tmp_path):
    """torch.save's zip writer hides a failed write behind `RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos`; the checkpoint writer raises the OSError itself (here EFBIG under a file-size limit, as ENOSPC
    on a full disk), naming the file, and leaves nothing half-written."""
    code = textwrap.dedent("""
        import errno, os, resource, sys, torch
        from training import checkpoint as ckpt
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            ckpt.save_checkpoint_atomic({"w": torch.zeros(100_000)}, os.path.join(sys.argv[1], "step_4.pt"))
        except OSError as e:
            print(errno.errorcode[e.errno], e.filename)
        """)
    r = _python(code, str(tmp_path), str(tmp_path))
    assert r.stdout.split() == ["EFBIG", str(tmp_path / "step_4.pt")], r.stderr
    assert os.listdir(tmp_path) == []


def test_a_run_that_cannot_write_its_checkpoint_stops_with_one_line(toy, tmp_path):
    """The real write path (no monkeypatching): a file-size limit below the checkpoint's size; the run exits 1 with
    the documented `saving step N failed: <file>: File too large (...)` line, also in the queue's error file (so the
    queue does not retry it), and summary.json says failed."""
    run, err = str(tmp_path / "r"), str(tmp_path / "job.err")
    code = textwrap.dedent(f"""
        import resource
        from core.errors import user_errors
        from training.loop import train
        from tests.toy_data import toy_train_config
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, resource.RLIM_INFINITY))
        with user_errors():
            train(toy_train_config({toy!r}, {run!r}, epochs=1, checkpoint_every=2))
        """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", TRM_JOB_ERROR_FILE=err),
    )
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and line == (
        f"error: saving step 2 failed: {run}/step_2.pt: File too large (no earlier checkpoint)"
    ), r.stderr[-2000:]
    assert open(err).read().strip() == line[len("error: ") :]
    s = read_summary(run)
    assert s["status"] == "failed" and "File too large" in s["message"]
    assert ckpt.list_checkpoints(run) == []


def test_convert_refuses_files_that_are_not_torch_checkpoints(tmp_path, capsys):
    raw, legacy, other = str(tmp_path / "raw.pkl"), str(tmp_path / "legacy.pt"), str(tmp_path / "other.zip")
    with open(raw, "wb") as f:
        pickle.dump({"format": ckpt.FORMAT}, f)
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("a.txt", "not a checkpoint")
    for path in (raw, legacy, other):
        assert ckpt.main(["convert", path]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {path}: not a torch checkpoint") and "refused" in line
    assert json.loads(json.dumps(pickle.load(open(raw, "rb")))) == {"format": ckpt.FORMAT}  # untouched

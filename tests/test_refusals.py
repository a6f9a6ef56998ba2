"""Refused in one line at once instead of failing late or being retried (issue 43, item 8): non-finite float
settings (evaluate.py ``ttt_lr=inf``, pretrain ``lr=inf``), a resume from a checkpoint whose state does not fit
the model, and ``python -m training.checkpoint convert`` on files already in the current format."""

from __future__ import annotations

import io
import os
import sys

import pytest
import torch
from omegaconf import OmegaConf

from core.errors import PlatformError, user_error_message
from evaluate import config_from_hydra
from experiments.queue.jobfile import FAILED, JobFile
from experiments.queue.runner import Runner, RunnerConfig
from tests.toy_data import toy_train_config
from training import checkpoint as ckpt
from training.config import ConfigError, config_from_dict
from training.evaluate_config import EvaluateError
from training.loop import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------- non-finite
@pytest.mark.parametrize("key", ["ttt_lr", "ttt_weight_lr", "latent_search_lr"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_evaluate_refuses_a_non_finite_rate_at_validation(key, value):
    """``evaluate.py ttt_lr=inf`` ran the whole evaluation, then failed writing its records (no metrics left):
    refused when the config is validated, one line naming the key."""
    hcfg = OmegaConf.create({"checkpoint": "c", "data_path": "d", "ttt_steps": 2, key: value})
    with pytest.raises(EvaluateError) as e:
        config_from_hydra(hcfg)
    assert str(e.value) == f"config/cfg_evaluate.yaml: {key}='{value}': Input should be a finite number"
    assert config_from_hydra(OmegaConf.create({"checkpoint": "c", "data_path": "d", key: "1e-3"})).model_dump()[
        key
    ] == pytest.approx(1e-3)


@pytest.mark.parametrize("key", ["lr", "puzzle_emb_lr", "weight_decay", "grad_clip", "encoder_lr", "beta2"])
def test_training_refuses_non_finite_float_settings(key):
    for value in (float("inf"), float("nan")):
        with pytest.raises(ConfigError) as e:
            config_from_dict(toy_train_config("data/x", "ck/x", **{key: value}))
        assert str(e.value) == f"invalid training config (config): {key}={value!r}: Input should be a finite number"
    assert getattr(config_from_dict(toy_train_config("data/x", "ck/x", **{key: 0.5})), key) == 0.5


# ---------------------------------------------------------------------------------------------- resume
def _edit_newest(run: str, fn) -> str:
    path = ckpt.find_latest_checkpoint(run)
    state = ckpt.read_checkpoint(path)
    state.pop("_path")
    fn(state)
    ckpt.save_checkpoint_atomic(state, path)
    return path


def _extra(st):
    st["model"]["inner.extra_gate"] = torch.zeros(3)


def _missing(st):
    del st["model"]["inner.lm_head.weight"]


def _shape(st):
    st["model"]["inner.lm_head.weight"] = torch.zeros(5, 32)


def _ema(st):
    st["ema"]["shadow"].pop("inner.lm_head.weight")


@pytest.mark.parametrize(
    "edit, problem",
    [
        (_extra, "'model' state does not fit this run (unexpected keys inner.extra_gate)"),
        (_missing, "'model' state does not fit this run (missing keys inner.lm_head.weight)"),
        (_shape, "'model' state does not fit this run (other shapes inner.lm_head.weight (5, 32) vs (12, 32))"),
        (_ema, "'ema' state does not fit this run (KeyError: EMA state does not match the model; differing parameters"),
    ],
    ids=["extra key", "missing key", "other shape", "ema"],
)
def test_resume_from_a_checkpoint_that_does_not_fit_is_refused_in_one_line(toy, tmp_path, edit, problem):
    """A checkpoint whose state_dict has an extra or missing key (or another shape) crashed the resume with a
    RuntimeError traceback, which the job queue retried: a CheckpointError (a PlatformError: the entry point
    prints one line and the queue fails the job without retrying), naming the file, the component and the keys."""
    run = str(tmp_path / "r")
    train(toy_train_config(toy, run, epochs=1, max_steps=2, ema=True))
    path = _edit_newest(run, edit)
    before = open(path, "rb").read()
    with pytest.raises(ckpt.CheckpointError) as e:
        train(toy_train_config(toy, run, epochs=1, max_steps=3, ema=True, resume=True))
    assert isinstance(e.value, PlatformError)
    msg = user_error_message(e.value)
    assert msg is not None and "\n" not in msg and msg.startswith(f"{path}: its {problem}"), msg
    assert msg.endswith("resume with the code that wrote it, or start a new run")
    assert open(path, "rb").read() == before and ckpt.list_checkpoints(run) == [(2, path)]  # nothing written


def test_the_queue_fails_such_a_resume_at_once_instead_of_retrying_it(toy, tmp_path, monkeypatch):
    """The real command under run_jobs.py (``pretrain.py --config-path <run> --config-name config resume=true``,
    retries=2): one attempt, the line failed with the one-line reason."""
    run = str(tmp_path / "r")
    train(toy_train_config(toy, run, epochs=1, max_steps=2))
    _edit_newest(run, _extra)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "jobs.txt").write_text(
        f"[ ] {sys.executable} {os.path.join(ROOT, 'pretrain.py')} --config-path {run} --config-name config "
        "resume=true max_steps=3 hydra.run.dir=h  # id=resume retries=2\n"
    )
    out = io.StringIO()
    rc = Runner(
        RunnerConfig(jobs_path=str(tmp_path / "jobs.txt"), workdir=str(tmp_path), poll_interval=0.05), out
    ).run()
    (job,) = JobFile.read(str(tmp_path / "jobs.txt")).jobs
    assert rc == 1 and job.mark == FAILED and "rerunning" not in out.getvalue()
    assert (
        "not retried; bad input: " in job.note
        and "its 'model' state does not fit this run (unexpected keys inner.extra_gate)" in job.note
    ), job.note
    log = (tmp_path / "logs" / "resume.log").read_text()
    assert log.count("=== $ ") == 1 and "Traceback" not in log


# ---------------------------------------------------------------------------------------------- convert
def test_convert_skips_current_checkpoints_and_goes_on_with_the_folder(toy, tmp_path, capsys):
    """``convert`` on a run folder whose files are partly in the current format crashed (TypeError on
    ``__trm_plain__``) and stopped before the rest: current files are skipped as current, legacy ones converted,
    an unreadable one is an error line that does not stop the others."""
    run = str(tmp_path / "r")
    train(toy_train_config(toy, run, epochs=2, max_steps=4, checkpoint_every=2, checkpoint_keep=None))
    current, legacy = os.path.join(run, "step_2.pt"), os.path.join(run, "step_4.pt")
    decoded = ckpt.read_checkpoint(legacy)
    decoded.pop("_path")
    torch.save(decoded, legacy)  # the older format: numpy RNG state and the carry dataclass pickled as objects
    garbage = os.path.join(run, "step_1.pt")
    with open(garbage, "wb") as f:
        f.write(b"not a checkpoint")
    before = open(current, "rb").read()
    capsys.readouterr()
    assert ckpt.main(["convert", run]) == 1  # one file failed; the others were done
    out, err = capsys.readouterr()
    assert out == f"skipped {current}: already in the current format\nconverted {legacy}\n"
    assert err.count("\n") == 1 and err.startswith(f"error: {garbage}: not a torch checkpoint")
    assert open(current, "rb").read() == before  # left as it was
    assert ckpt.read_checkpoint(legacy)["step"] == 4
    os.unlink(garbage)
    assert ckpt.main(["convert", run]) == 0  # run again: everything is current
    assert capsys.readouterr().out == "".join(
        f"skipped {p}: already in the current format\n" for p in (current, legacy)
    )

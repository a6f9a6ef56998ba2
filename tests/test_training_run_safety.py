"""Run directories that never mix, checkpoints that never execute code or go missing, metric lines off a TTY
(issue 9 items 2, 4 and 7). Tiny toy runs on CPU (a second or two each)."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from tests.toy_data import toy_train_config
from training import checkpoint as ckpt
from training.build import load_model_for_inference
from training.config import ConfigError, config_from_dict
from training.loop import Trainer, train
from training.summary import read_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files(d):
    return {f: os.path.getmtime(os.path.join(d, f)) for f in sorted(os.listdir(d)) if not f.startswith(".")}


# ---------------------------------------------------------------------------------------------- item 2
def test_run_dir_of_another_run_is_refused_unless_resume(toy, tmp_path):
    run = str(tmp_path / "r")
    train(toy_train_config(toy, run, epochs=1, max_steps=2))
    before = _files(run)
    assert "step_2.pt" in before and "summary.json" in before
    with pytest.raises(ConfigError) as e:
        train(toy_train_config(toy, run, epochs=1, max_steps=3))
    msg = str(e.value)
    assert "\n" not in msg and run in msg and "step_2.pt" in msg and "summary.json" in msg
    assert "resume=true" in msg and "run_name" in msg
    assert _files(run) == before  # nothing written
    s = train(toy_train_config(toy, run, epochs=1, max_steps=3, resume=True))
    assert s["steps"] == 3 and s["stop_reason"] == "max_steps"
    # a failed set-up in a new directory leaves nothing behind
    fresh = tmp_path / "new"
    with pytest.raises(ckpt.CheckpointError, match="checkpoint file not found"):
        train(toy_train_config(toy, str(fresh), epochs=1, load_checkpoint=str(tmp_path / "missing.pt")))
    assert not fresh.exists()


def test_second_concurrent_run_is_refused_and_the_lock_dies_with_its_process(toy, tmp_path):
    run = str(tmp_path / "busy")
    first = Trainer(config_from_dict(_cfg(toy, run)), _info())  # holds the directory until it ends / closes
    with pytest.raises(ConfigError, match="another run is using this run directory"):
        Trainer(config_from_dict(_cfg(toy, run, resume=True)), _info())
    first.close()
    del first

    # another process holds the directory mid-run: we are refused; once it is killed (SIGKILL) its lock is gone
    marker = tmp_path / "started"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from training import loop
        def slow(self, batch):
            open({str(marker)!r}, "w").close()
            time.sleep(120)
        loop.Trainer.train_step = slow
        loop.train({_cfg(toy, run, resume=True)!r})
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 90
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline
            time.sleep(0.1)
        with pytest.raises(ConfigError, match="another run is using this run directory"):
            train(_cfg(toy, run, resume=True))
    finally:
        proc.kill()
        proc.wait()
    s = train(_cfg(toy, run, resume=True))  # the killed process's OS lock is gone: no stale lock
    assert s["stop_reason"] == "max_steps" and s["steps"] == 2


def _cfg(toy, run, **kw):
    return toy_train_config(toy, run, epochs=1, max_steps=2, **kw)


def _info():
    from training.distributed import DistInfo

    return DistInfo()


def test_pruning_never_deletes_the_file_just_written(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    for s in (2, 4, 12):
        (d / f"step_{s}.pt").write_bytes(b"x")
    # the run resumed from an older checkpoint and just wrote step_4: a leftover step_12 sorts newer
    deleted = ckpt.prune_checkpoints(str(d), 1, protect=(str(d / "step_4.pt"),))
    assert [os.path.basename(p) for p in deleted] == ["step_2.pt"]
    assert sorted(os.listdir(d)) == ["step_12.pt", "step_4.pt"]
    assert ckpt.prune_checkpoints(str(d), None) == []


def test_last_checkpoint_is_set_only_after_a_successful_write(toy, tmp_path, monkeypatch):
    run = str(tmp_path / "full")
    orig = ckpt.save_checkpoint_atomic

    def disk_full_at_step_4(state, path):
        if state["step"] == 4:
            raise OSError(28, "No space left on device")
        return orig(state, path)

    monkeypatch.setattr(ckpt, "save_checkpoint_atomic", disk_full_at_step_4)
    with pytest.raises(ckpt.CheckpointError, match="saving step 4 failed"):  # one line (bad input class), not OSError
        train(toy_train_config(toy, run, epochs=2, checkpoint_every=2))
    d = read_summary(run)
    assert d["status"] == "failed" and d["steps"] == 4
    assert d["last_checkpoint"] is not None and d["last_checkpoint"].endswith("step_2.pt")
    assert os.path.isfile(d["last_checkpoint"]) and not os.path.exists(os.path.join(run, "step_4.pt"))
    # the failed run released its directory (its exception still holds the Trainer alive): resume continues
    monkeypatch.setattr(ckpt, "save_checkpoint_atomic", orig)
    s = train(toy_train_config(toy, run, epochs=2, checkpoint_every=2, resume=True))
    assert s["steps"] == 8 and s["last_checkpoint"].endswith("step_8.pt")


# ---------------------------------------------------------------------------------------------- item 4
def test_truncated_newest_checkpoint_falls_back_loudly(toy, tmp_path, capsys):
    run = str(tmp_path / "t")
    train(toy_train_config(toy, run, epochs=3, max_steps=8, checkpoint_every=4, checkpoint_keep=None))
    newest = os.path.join(run, "step_8.pt")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    capsys.readouterr()
    # evaluation / inference loading of the run dir: the newest intact file, with a warning naming the bad one
    st = ckpt.load_checkpoint_file(run)
    assert st["step"] == 4 and st["_path"].endswith("step_4.pt")
    err = capsys.readouterr().err
    assert "WARNING" in err and "step_8.pt" in err and "truncated or corrupt" in err
    with pytest.raises(ckpt.CheckpointError, match=r"step_8\.pt: unreadable checkpoint, truncated or corrupt"):
        ckpt.load_checkpoint_file(newest)

    s = train(toy_train_config(toy, run, epochs=3, max_steps=8, checkpoint_every=4, checkpoint_keep=None, resume=True))
    cap = capsys.readouterr()
    assert "step_8.pt" in cap.err and "falling back" in cap.err and "Traceback" not in cap.err + cap.out
    assert "resumed from" in cap.out and "step_4.pt at step 4" in cap.out
    assert s["steps"] == 8 and s["stop_reason"] == "max_steps"
    assert os.path.isfile(newest + ".corrupt")  # moved aside: never loaded, listed or pruned again
    assert ckpt.read_checkpoint(newest)["step"] == 8  # re-written by the resumed run


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_crafted_pickle_is_refused_without_executing_it(toy, tmp_path, capsys):
    run = str(tmp_path / "c")
    train(toy_train_config(toy, run, epochs=1, max_steps=2, checkpoint_keep=None))
    marker = str(tmp_path / "pwned")
    evil = os.path.join(run, "step_3.pt")
    torch.save({"format": ckpt.FORMAT, "step": 3, "x": _Payload(marker)}, evil)
    for load in (ckpt.load_checkpoint_file, load_model_for_inference):
        with pytest.raises(
            ckpt.CheckpointError,
            match=r"step_3\.pt: refused: the file holds objects other than "
            r"plain data.*nothing in it was executed",
        ):
            load(evil)
    assert not os.path.exists(marker)
    capsys.readouterr()
    # as the newest file of a run being resumed: skipped (loudly), never executed
    s = train(toy_train_config(toy, run, epochs=1, max_steps=3, checkpoint_keep=None, resume=True))
    assert s["steps"] == 3 and not os.path.exists(marker)
    assert "step_3.pt: refused" in capsys.readouterr().err
    # evaluate.py's checkpoint load and models/compat.py's original-TRM loader are weights-only too
    from models.compat import load_original_trm_checkpoint
    from training import evaluation

    torch.save({"format": ckpt.FORMAT, "config": {"global_batch_size": 8}, "x": _Payload(marker)}, evil)
    with pytest.raises(evaluation.EvaluateError):
        evaluation._load_checkpoint_state(evil)
    torch.save({"inner.w": _Payload(marker)}, evil)
    model, _, _ = load_model_for_inference(os.path.join(run, "step_2.pt"))
    with pytest.raises(Exception, match="Weights only load failed"):
        load_original_trm_checkpoint(model, evil)
    assert not os.path.exists(marker)


def test_plain_encoding_round_trips_carries_and_rng_states():
    import random

    from models.etrm import ETRMCarry
    from models.trm import TRMInnerCarry

    random.seed(3)
    np.random.seed(3)
    carry = ETRMCarry(
        inner_carry=TRMInnerCarry(z_H=torch.randn(2, 3), z_L=torch.randn(2, 3)),
        steps=torch.tensor([1, 2], dtype=torch.int32),
        halted=torch.tensor([True, False]),
        current_data={"inputs": torch.arange(4)},
        z_E=torch.ones(2),
        cached_context=None,
    )
    state = {"carry": carry, "rng": ckpt.get_rng_state(), "n": np.int64(7), "sizes": torch.Size([2, 3])}
    plain = ckpt.to_plain(state)
    import io

    buf = io.BytesIO()
    torch.save(plain, buf)
    buf.seek(0)
    back = ckpt.from_plain(torch.load(buf, weights_only=True))
    c = back["carry"]
    assert type(c) is ETRMCarry and type(c.inner_carry) is TRMInnerCarry and c.cached_context is None
    assert torch.equal(c.inner_carry.z_L, carry.inner_carry.z_L) and torch.equal(c.z_E, carry.z_E)
    assert c.steps.dtype == torch.int32 and torch.equal(c.current_data["inputs"], torch.arange(4))
    assert back["n"] == 7 and back["sizes"] == torch.Size([2, 3])
    expect = (random.random(), np.random.rand(3))
    ckpt.set_rng_state(back["rng"])
    got = (random.random(), np.random.rand(3))
    assert got[0] == expect[0] and np.array_equal(got[1], expect[1])
    # a tagged dataclass outside this project's packages is never rebuilt
    with pytest.raises(ckpt.CheckpointError, match="not a class of this project"):
        ckpt.from_plain({"__trm_plain__": "dataclass", "class": "subprocess:CompletedProcess", "fields": {}})
    with pytest.raises(TypeError, match=r"state\['bad'\]: .*cannot be stored"):
        ckpt.to_plain({"bad": object()})


# ---------------------------------------------------------------------------------------------- item 7
def test_metric_lines_when_stdout_is_not_a_tty(toy, tmp_path, capsys):
    run = str(tmp_path / "lines")
    s = train(
        toy_train_config(toy, run, epochs=3, log_interval=4, eval_interval_steps=6, eval_at_end=True, progress=True)
    )
    cap = capsys.readouterr()
    out = cap.out
    start = [ln for ln in cap.err.splitlines() if ln.startswith("[train] run ")]  # the start line (stderr)
    assert len(start) == 1 and "optimizer AdamATan2 (torch) + SignSGDSparse, " in start[0]  # the implementation
    train_lines = [ln for ln in out.splitlines() if ln.startswith("[train] step ")]
    assert [ln.split()[2] for ln in train_lines] == ["4/12", "8/12", "12/12"]
    last = dict(zip(train_lines[-1].split()[3::2], train_lines[-1].split()[4::2]))
    f = s["final"]
    assert float(last["loss"]) == pytest.approx(f["train/loss"], rel=1e-3)
    assert float(last["exact"]) == pytest.approx(f["train/exact_accuracy"], rel=1e-3, abs=1e-4)
    assert float(last["lr"]) == pytest.approx(f["train/lr"], rel=1e-3)
    eval_lines = [ln for ln in out.splitlines() if ln.startswith("[eval] step ")]
    assert [ln.split()[2] for ln in eval_lines] == ["6:", "12:"]
    assert f"all.exact_accuracy {f['eval/all.exact_accuracy']:.4g}" in eval_lines[-1]
    assert f"num_examples {f['eval/num_examples']:.4g}" in eval_lines[-1]


def test_legacy_pickled_checkpoint_is_refused_then_converted(toy, tmp_path, capsys):
    """A checkpoint of the previous format (numpy RNG state and the carry dataclass pickled as objects) is refused
    with the conversion command in the message; ``python -m training.checkpoint convert`` makes it loadable."""
    run = str(tmp_path / "legacy")
    train(toy_train_config(toy, run, epochs=1, max_steps=2))
    f = os.path.join(run, "step_2.pt")
    decoded = ckpt.read_checkpoint(f)
    decoded.pop("_path")
    assert type(decoded["per_rank"][0]["carry"]).__name__ == "ACTCarry"
    torch.save(decoded, f)  # what the old code wrote
    with pytest.raises(ckpt.CheckpointError, match=r"refused.*numpy.*python -m training.checkpoint convert"):
        ckpt.read_checkpoint(f)
    assert ckpt.main(["convert", run]) == 0
    again = ckpt.read_checkpoint(f)
    assert torch.equal(again["per_rank"][0]["carry"].inner_carry.z_H, decoded["per_rank"][0]["carry"].inner_carry.z_H)
    assert again["rng"][0]["numpy"][0] == "MT19937"
    s = train(toy_train_config(toy, run, epochs=1, max_steps=3, resume=True))
    assert s["steps"] == 3


def test_converting_a_crafted_legacy_file_never_executes_it(toy, tmp_path, capsys):
    """``convert`` unpickles with an allow-list (numpy arrays / scalars / dtypes, this project's dataclasses): a file
    whose pickle would call os.mkdir is refused, one line naming the global, and the payload never runs."""
    marker = str(tmp_path / "pwned")
    evil = str(tmp_path / "step_1.pt")
    torch.save({"format": ckpt.FORMAT, "rng": np.random.get_state(), "x": _Payload(marker)}, evil)
    assert ckpt.main(["convert", evil]) == 1
    err = capsys.readouterr().err.strip()
    assert not os.path.exists(marker)
    assert err.count("\n") == 0 and "refused: it needs posix.mkdir" in err and "nothing in it was executed" in err
    with pytest.raises(ckpt.CheckpointError, match="refused"):  # still refused afterwards, never rewritten
        ckpt.read_checkpoint(evil)
    assert not os.path.exists(marker)


def test_checkpoint_path_at_a_built_dataset_is_refused_and_nothing_is_written(toy, tmp_path):
    """checkpoint_path pointing at a dataset directory (here the training data itself): refused with one line
    naming it, before anything is written; a clean run leaves no .run.lock behind."""
    before = sorted(os.listdir(toy))
    with pytest.raises(ConfigError, match="is a built dataset directory"):
        train(_cfg(toy, toy))
    assert sorted(os.listdir(toy)) == before
    run = str(tmp_path / "ok")
    train(_cfg(toy, run))
    assert not os.path.exists(os.path.join(run, ".run.lock")) and os.path.isfile(os.path.join(run, "summary.json"))


def test_resume_records_changed_keys_and_refuses_other_data(toy, tmp_path):
    """A resume that changes ema_rate / lr_warmup_steps / epochs is recorded (printed and in summary.json
    warnings); other training data of the same shape is refused unless resume_allow_data_change=true."""
    from tests.toy_data import write_toy_dataset

    run = str(tmp_path / "r")
    train(toy_train_config(toy, run, epochs=2, max_steps=2, ema=True))
    s = train(
        toy_train_config(toy, run, epochs=3, max_steps=3, ema=True, ema_rate=0.99, lr_warmup_steps=5, resume=True)
    )
    w = "\n".join(s["warnings"])
    for change in ("ema_rate: 0.999 -> 0.99", "lr_warmup_steps: 10 -> 5", "epochs: 2 -> 3", "max_steps: 2 -> 3"):
        assert f"resume: config changed since the checkpoint: {change}" in w, w
    assert "resume:" not in w.replace("resume: config changed", "")  # nothing else (resume itself is expected)
    other = write_toy_dataset(str(tmp_path / "other"), seed=7)  # same shapes, other content
    cfg = toy_train_config(other, run, epochs=3, max_steps=4, ema=True, ema_rate=0.99, lr_warmup_steps=5, resume=True)
    with pytest.raises(ckpt.CheckpointError, match="differs from the data this run was trained on"):
        train(cfg)
    s = train(dict(cfg, resume_allow_data_change=True))
    assert s["steps"] == 4 and any("training data differs" in x for x in s["warnings"])


def test_disk_full_while_saving_is_one_line_and_keeps_the_last_checkpoint(toy, tmp_path, monkeypatch, capsys):
    """ENOSPC while writing step N: the run stops with `saving step N failed: …: No space left on device (the
    last complete checkpoint step_M.pt is intact)`, summary.json says so, the queue's error file gets that line
    (a deterministic failure: not retried), and step_M.pt still loads."""
    import errno

    from core.errors import ERROR_FILE_ENV, user_errors

    run = str(tmp_path / "full")
    orig = ckpt.save_checkpoint_atomic

    def full_at_4(state, path):
        if state["step"] == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return orig(state, path)

    monkeypatch.setattr(ckpt, "save_checkpoint_atomic", full_at_4)
    err_file = tmp_path / "job.err"
    monkeypatch.setenv(ERROR_FILE_ENV, str(err_file))
    with pytest.raises(SystemExit) as e, user_errors():
        train(toy_train_config(toy, run, epochs=3, checkpoint_every=2))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 1 and line.startswith("error: saving step 4 failed:") and "No space left on device" in line
    assert line.endswith("(the last complete checkpoint step_2.pt is intact)")
    assert err_file.read_text().strip() == line[len("error: ") :]
    s = read_summary(run)
    assert s["status"] == "failed" and "No space left on device" in s["message"]
    assert ckpt.read_checkpoint(os.path.join(run, "step_2.pt"))["step"] == 2


def _save_fails_on_rank0_worker(rank: int, world: int, init_file: str, toy: str, run: str, out_dir: str) -> None:
    import errno

    import torch.distributed as dist

    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    orig = ckpt.save_checkpoint_atomic

    def full_at_4(state, path):
        if state["step"] == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return orig(state, path)

    ckpt.save_checkpoint_atomic = full_at_4
    try:
        train(toy_train_config(toy, run, epochs=3, checkpoint_every=2, global_batch_size=8))
        msg = "no error"
    except Exception as e:  # noqa: BLE001 - recorded for the parent
        msg = f"{type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(msg)


def test_a_rank0_save_failure_stops_every_rank_with_the_same_error(toy, tmp_path):
    """torchrun: only rank 0 writes checkpoints; when that fails the other ranks must not wait in the barrier
    forever: every rank raises the same one-line error, promptly."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _save_fails_on_rank0_worker,
        nprocs=2,
        join=False,
        start_method="fork",
        args=(2, str(tmp_path / "init"), toy, str(tmp_path / "run"), str(tmp_path)),
    )
    deadline = time.time() + 120
    while not ctx.join(timeout=5):
        assert time.time() < deadline, "a rank hangs after rank 0's save failed"
    msgs = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert msgs[0] == msgs[1] and msgs[0].startswith("CheckpointSaveError: saving step 4 failed:"), msgs

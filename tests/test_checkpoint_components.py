"""training.state: a checkpoint is made of named components; the file format is the one earlier code wrote.

The fixture ``tests/fixtures/checkpoint_format1_step_4.pt`` (163 KB) is step 4 of an 8-step toy run written by the
CheckpointManager of commit 0b65cd7 (16 arguments, one line per component): model, EMA, the two optimizers, the LR
schedules, the health monitor, the data stream's position, the ACT carry, the open log window. Its data is
``write_toy_dataset`` with the default seed (the content fingerprint matches a fresh copy)."""

import math
import os
import shutil

import pytest
import torch

from models import parse_arch_config
from tests.toy_data import toy_train_config, write_toy_dataset
from training import checkpoint as ckpt
from training.config import config_from_dict
from training.distributed import DistInfo
from training.loop import Trainer, train
from training.state import CheckpointManager, Progress
from training.summary import read_summary

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "checkpoint_format1_step_4.pt")


def _cfg(data, run, **kw):
    """The fixture run's config (8 steps, checkpoints at 4 and 8)."""
    return toy_train_config(
        data,
        run,
        epochs=2,
        ema=True,
        ema_rate=0.9,
        checkpoint_every=4,
        checkpoint_keep=None,
        lr_warmup_steps=3,
        lr_min_ratio=0.1,
        log_interval=3,
        health={"stuck_steps": 50},
        arch={"halt_exploration_prob": 0.5, "hidden_size": 8, "num_heads": 2, "expansion": 2, "puzzle_emb_ndim": 8},
        **kw,
    )


def _leaves(obj, prefix=""):
    """Every leaf of a (plain) checkpoint dict by its dotted path."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _leaves(val, f"{prefix}{key}.").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, val in enumerate(obj) for k, v in _leaves(val, f"{prefix}{i}.").items()}
    return {prefix[:-1]: obj}


def _same_tensors(a: dict, b: dict, tol: float = 1e-6, rtol: float = 1e-5) -> list[str]:
    """Keys whose tensors differ beyond float32 rounding: max |a - b| over ``tol + rtol * max |b|``. The relative
    term: the fixture was written on another CPU, and the ACT carry's states (|z| up to ~2.5 after 4 recursive steps)
    differ there by the rounding of other kernels (3.5e-6 on z_L, measured on an Intel Xeon here); a changed format
    differs by far more."""
    out = []
    for k, v in a.items():
        if torch.is_tensor(v):
            x, y = v.float(), b[k].float()
            if x.shape != y.shape:
                out.append(k)
            elif x.numel() and (x - y).abs().max() > tol + rtol * y.abs().max():
                out.append(k)
    return out


def _same_value(x, y) -> bool:
    """Equal, or floats within float32 rounding (the summary's logged losses and norms, see :func:`_same_tensors`)."""
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6)
    return x == y


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The fixture's 8-step run, uninterrupted, by the current code."""
    root = tmp_path_factory.mktemp("format")
    data = write_toy_dataset(str(root / "toy"))
    summary = train(_cfg(data, str(root / "straight")))
    assert summary["steps"] == 8
    return data, str(root / "straight")


def test_the_current_code_writes_the_format_of_the_fixture(straight):
    """Same keys at every depth (plain data as stored: tagged numpy arrays and carry dataclasses included), same
    values apart from paths and wall times: the file format did not change."""
    old_state = torch.load(FIXTURE, weights_only=True)
    new_state = torch.load(os.path.join(straight[1], "step_4.pt"), weights_only=True)
    # the architecture section is what the arch config of that version held: it reads as today's (models.legacy)
    assert parse_arch_config(old_state["arch"]).model_dump(mode="json") == new_state["arch"]
    assert parse_arch_config(old_state["config"]["arch"]).model_dump(mode="json") == new_state["config"]["arch"]
    outside_arch = lambda d: {k: v for k, v in d.items() if not k.startswith(("arch.", "config.arch."))}  # noqa: E731
    old, new = outside_arch(_leaves(old_state)), outside_arch(_leaves(new_state))
    assert old.keys() == new.keys()
    assert not _same_tensors(old, new)
    differ = {k for k in old if not torch.is_tensor(old[k]) and not _same_value(old[k], new[k])}
    assert all(
        "path" in k or k.startswith("summary.") and ("dir" in k or "wall" in k or "last_checkpoint" in k)
        for k in differ
    ), differ


@pytest.mark.parametrize("older", [False, True], ids=["fixture", "without-schedulers"])
def test_a_checkpoint_of_the_earlier_code_resumes_exactly(straight, tmp_path, older):
    """Resuming the fixture ends where the uninterrupted run does: weights, EMA, optimizer moments, data position,
    examples seen, and the summary's final / best numbers (the log window was open across the checkpoint). A file
    from before the LR schedules were saved (no ``schedulers`` key) resumes exactly too: their position is the
    step."""
    data, straight_run = straight
    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(FIXTURE, run / "step_4.pt")
    if older:
        state = torch.load(FIXTURE, weights_only=True)
        del state["schedulers"]
        torch.save(state, run / "step_4.pt")
    summary = train(_cfg(data, str(run), resume=True))
    assert summary["steps"] == 8 and summary["stop_reason"] == "completed"
    a = ckpt.read_checkpoint(os.path.join(straight_run, "step_8.pt"))
    b = ckpt.read_checkpoint(str(run / "step_8.pt"))
    for key in ("model", "ema", "optimizers", "schedulers", "health"):
        la, lb = _leaves(a[key]), _leaves(b[key])
        assert la.keys() == lb.keys() and not _same_tensors(la, lb), key
        # (LambdaLR's _step_count only feeds a warning: a schedule rebuilt from the step counts from the resume)
        assert {k: v for k, v in la.items() if not torch.is_tensor(v) and not (older and "_step_count" in k)} == {
            k: v for k, v in lb.items() if not torch.is_tensor(v) and not (older and "_step_count" in k)
        }, key
    assert a["examples_seen"] == b["examples_seen"] and a["data_state"] == b["data_state"]
    x, y = read_summary(straight_run), read_summary(str(run))
    for key in ("final", "best"):
        assert x[key].keys() == y[key].keys()
        for k in x[key]:
            if "second" not in k:  # eval timing (wall clock)
                assert y[key][k] == pytest.approx(x[key][k], rel=1e-6, abs=1e-7), f"{key}[{k}]"
    assert x["best_step"] == y["best_step"] and x["examples_seen"] == y["examples_seen"]


class _Counter:
    """A component of a run that is not one of the training loop's: saved under its name, restored from it."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_a_new_component_is_saved_under_its_name_and_an_older_file_leaves_it_as_built(straight, tmp_path):
    """Adding a component = one more entry of the components dict; a file without its key (the fixture) restores
    everything else and leaves it as built; a component may not take a key the manager writes itself."""
    data, _ = straight
    run = str(tmp_path / "r")
    t = Trainer(config_from_dict(_cfg(data, run, max_steps=2)), DistInfo())
    try:
        extra = _Counter()
        manager = t.checkpoints
        mgr = CheckpointManager(
            run,
            manager.info,
            manager.record,
            {**manager.components, "counter": extra},
            per_rank=manager.per_rank,
            summary=manager.summary,
            epochs_done=lambda: 0.0,
        )
        extra.n = 7
        path = mgr.save(Progress(step=3))
        assert ckpt.read_checkpoint(path)["counter"] == {"n": 7}
        fresh = _Counter()
        mgr.components["counter"] = fresh
        mgr.restore(ckpt.read_checkpoint(path), Progress(), say=lambda m: None)
        assert fresh.n == 7
        older = _Counter()  # the fixture has no "counter" key: the component keeps its state
        older.n = 5
        mgr.components["counter"] = older
        shutil.copy(FIXTURE, os.path.join(run, "step_4.pt"))
        p = Progress()
        mgr.restore(ckpt.read_checkpoint(os.path.join(run, "step_4.pt")), p, say=lambda m: None)
        assert older.n == 5 and p.step == 4 and p.carry is not None
        with pytest.raises(ValueError, match="manager's own"):
            CheckpointManager(
                run,
                manager.info,
                manager.record,
                {"step": extra},
                per_rank={},
                summary=manager.summary,
                epochs_done=lambda: 0.0,
            )
    finally:
        t.close()


def test_max_steps_0_writes_the_initial_weights_as_step_0_and_trains_nothing(straight, tmp_path):
    """A from-scratch start (test-time training of an untrained model): the run's one checkpoint is step_0, holding
    exactly the weights the run was built with; a negative cap is refused."""
    data, _ = straight
    run = str(tmp_path / "zero")
    built = Trainer(config_from_dict(_cfg(data, str(tmp_path / "built"), seed=5)), DistInfo())
    try:
        init = {k: v.clone() for k, v in built.model.state_dict().items()}
    finally:
        built.close()
    summary = train(_cfg(data, run, max_steps=0, seed=5))
    assert summary["status"] == "finished" and summary["steps"] == 0
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [0]
    saved = ckpt.read_checkpoint(os.path.join(run, "step_0.pt"))["model"]
    assert set(saved) == set(init) and all(torch.equal(saved[k], init[k]) for k in init)
    with pytest.raises(ValueError, match="max_steps must be > 0 or null, got -1 \\(or 0\\)"):
        config_from_dict(_cfg(data, str(tmp_path / "neg"), max_steps=-1))

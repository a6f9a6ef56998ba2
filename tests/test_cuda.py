"""The training step on CUDA against the CPU step (skipped without a GPU; run on a lent one by
scripts/device_check.sh): from the same weights and batches, the real ``Trainer.train_step`` of the science
config (ETRM: standard encoder + TRM core) and of the TRM demo config (sparse puzzle embedding, sign-SGD, EMA)
gives the CPU's losses and parameter updates in fp32, and stays close in bf16 autocast (the CUDA default, pitfall
24), eager and compiled."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from benchmarks.trainer_step import make_data, make_trainer
from training import distributed as D

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
STEPS = 5
DETERMINISTIC = ("arch.halt_exploration_prob=0.0",)  # exploration draws from the device's own RNG stream


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cuda"))


def _steps(config, data, run_dir, device, compiled, state, batches, overrides=()):
    """Losses of ``batches`` and the parameters after them, from ``state``."""
    tr = make_trainer(config, data, run_dir, compiled, device, [*DETERMINISTIC, *overrides])
    try:
        tr.model.load_state_dict(state)
        losses = [tr.train_step({k: v.to(tr.device) for k, v in b.items()})["loss"] for b in batches]
        params = {
            n: t.detach().float().cpu().clone() for n, t in tr.model.state_dict().items() if t.is_floating_point()
        }
    finally:
        tr.close()
    return losses, params


def _update_error(params, ref, init):
    """||(p - p0) - (ref - p0)|| / ||ref - p0|| over every floating tensor that the CPU steps changed."""
    num = den = 0.0
    for n, r in ref.items():
        d_ref = r - init[n]
        if d_ref.abs().max() == 0:
            continue
        num += float(((params[n] - init[n]) - d_ref).pow(2).sum())
        den += float(d_ref.pow(2).sum())
    assert den > 0
    return (num / den) ** 0.5


@pytest.mark.parametrize("config", ["science", "science-memory", "science-pooled", "trm-tiny"])
def test_training_steps_on_cuda_follow_the_cpu(config, root, monkeypatch):
    data = make_data(config, root)
    cpu = make_trainer(config, data, os.path.join(root, f"{config}-init"), False, "cpu", DETERMINISTIC)
    try:
        state = copy.deepcopy(cpu.model.state_dict())
        it = iter(cpu.data.train_loader)
        batches = [next(it)[1] for _ in range(STEPS)]
    finally:
        cpu.close()
    init = {n: t.float().clone() for n, t in state.items() if t.is_floating_point()}
    ref_losses, ref = _steps(config, data, os.path.join(root, f"{config}-cpu"), "cpu", False, state, batches)
    assert all(x > 0 for x in ref_losses)

    with monkeypatch.context() as m:  # fp32 on CUDA (no autocast, fp32 forward): the same numbers up to rounding
        m.setattr(D, "autocast_dtype", lambda device: None)
        losses, params = _steps(
            config,
            data,
            os.path.join(root, f"{config}-fp32"),
            "cuda",
            False,
            state,
            batches,
            ["arch.forward_dtype=float32"],
        )
    print(
        f"[cuda] {config} fp32: losses {losses} vs cpu {ref_losses}, "
        f"update error {_update_error(params, ref, init):.2e}"
    )
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert _update_error(params, ref, init) < 1e-2

    for compiled in (False, True):  # bf16 (autocast; trm-tiny's forward_dtype auto = bf16), eager and compiled
        losses, params = _steps(
            config, data, os.path.join(root, f"{config}-bf16-{compiled}"), "cuda", compiled, state, batches
        )
        print(
            f"[cuda] {config} bf16 compiled={compiled}: losses {losses}, update error "
            f"{_update_error(params, ref, init):.2e}"
        )
        assert losses == pytest.approx(ref_losses, rel=2e-2), compiled
        assert _update_error(params, ref, init) < 0.25, compiled

"""benchmarks/eval_throughput.py on a tiny model (arithmetic of the projection; CPU only)."""

from __future__ import annotations

import pytest

from benchmarks.eval_throughput import ARC1_EVAL_TEST_INPUTS, measure_eval_throughput, measure_evaluator_cost

TINY = dict(hidden_size=32, num_heads=2, H_cycles=1, L_cycles=1, L_layers=1, puzzle_emb_ndim=32, puzzle_emb_len=2)


def test_projection_arithmetic_and_step_extrapolation():
    r = measure_eval_throughput(
        device="cpu",
        batch_size=4,
        num_batches=1,
        measure_steps=2,
        halt_max_steps=8,
        arch_overrides=TINY,
        seq_len=64,
        include_evaluator_cost=False,
    )
    assert r["total_copies"] == ARC1_EVAL_TEST_INPUTS * 1001 == 419419
    assert r["measure_steps"] == 2 and r["halt_max_steps"] == 8
    # 2 of 8 steps measured on 4 copies -> per-copy time scaled by 4
    assert r["model_seconds_per_copy"] == pytest.approx(r["measured_seconds"] / 4 * 4)
    assert r["projected_seconds"] == pytest.approx(r["total_copies"] / r["copies_per_second"])
    assert r["projected_hours"] == pytest.approx(r["projected_seconds"] / 3600)


def test_evaluator_cost_is_measured():
    per = measure_evaluator_cost(64)
    assert 0 < per < 0.05

"""scripts/device_arc.sh (the two criteria of the research plan on a lent GPU) on the CPU with a tiny model and
generated ARC-layout tasks: every stage runs and writes its figures into OUT."""

import json
import os
import subprocess
import sys

import pytest

from tests.test_experiments_arc import SIZES, write_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_device_arc_stage_runs_every_part_on_cpu(tmp_path):
    prefix = write_tasks(str(tmp_path / "src"), SIZES)
    work = tmp_path / "work"
    work.mkdir()
    for name in os.listdir(ROOT):  # the scripts run from the repository root: a copy of its code, data made here
        if name not in (".git", "data", "runs", ".venv", "device-out") and not name.startswith("."):
            os.symlink(os.path.join(ROOT, name), work / name)
    env = dict(
        os.environ,
        DEVICE="cpu",
        PYTHON=sys.executable,
        ARC_PREFIX=prefix,
        OUT=str(tmp_path / "out"),
        C1_STEPS="3",
        C2_STEPS="2",
        TTT_STEPS="1",
        NUM_AUG="1",
        C1_BATCH="4",
        C2_BATCH="4",
        MAX_SIDE="6",
        TINY="arch.hidden_size=16 encoder.hidden_size=16 arch.H_cycles=1 arch.L_cycles=1",
    )
    r = subprocess.run(["bash", "scripts/device_arc.sh", "400"], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = tmp_path / "out"
    c1 = json.load(open(out / "criterion1.json"))
    assert set(c1) == {"c1-halt16", "c1-halt8"}
    for run in c1.values():
        steps = [p["step"] for p in run["points"]]
        assert steps == sorted(steps) and len(steps) >= 2, run
        assert all(0.0 <= p["train_exact"] <= 1.0 and p["encoder_grad_share"] is not None for p in run["points"])
        assert any(p["cross_sample_var"] is not None for p in run["points"])
    arc = json.load(open(out / "arc.json"))
    assert set(arc["protocols"]) == {"standard", "control", "program", "trm"}, arc["protocols"]
    assert all(p["status"] == "ok" for p in arc["protocols"].values()), arc["protocols"]
    assert arc["counts"]["evaluation"]["tasks"] == 4  # every generated task fits 6 x 6
    ttt = json.load(open(out / "ttt.json"))
    assert ttt["metrics"]["ttt/steps"] == 1 and "ARC/pass@2" in ttt["metrics"]

"""The science floors command (experiments/science/floors.py): the learning-threshold claims run as their own
command, so a unit-test failure and a science regression read apart. Here: the runner (parts in worker processes,
a failed claim or a crashed part fails its floor and the command, the closing line) on fake floors, and each real
floor's claims against figures measured on the record and against a broken model's."""

import json
import os

import pytest

from experiments.science import floors as fl
from experiments.science.floors import FLOORS, Floor, main, run_floors


def _part(value):
    def run(out: str) -> dict:
        if value is None:
            raise RuntimeError("this part broke")
        os.makedirs(out, exist_ok=True)
        return {"value": value, "pid": os.getpid()}

    return run


def _at_least(x: float):
    return lambda parts: [f"{p} < {x}" for p, f in parts.items() if f["value"] < x]


FAKE = {
    "holds": Floor("a claim that holds", "-", {"a": _part(1.0), "b": _part(2.0)}, _at_least(0.5)),
    "fails": Floor("a claim that fails", "-", {"a": _part(0.1)}, _at_least(0.5)),
    "crashes": Floor("a part that crashes", "-", {"a": _part(None)}, _at_least(0.5)),
}


def test_runner_fails_a_floor_whose_claim_fails_or_whose_part_crashes(tmp_path):
    lines = []
    res = run_floors(str(tmp_path), list(FAKE), jobs=2, registry=f"{__name__}:FAKE", say=lines.append)
    assert res["holds"]["ok"] and res["holds"]["failed"] == []
    assert res["holds"]["figures"]["a"]["value"] == 1.0 and res["holds"]["figures"]["b"]["value"] == 2.0
    # parts ran in worker processes, not in this one
    assert os.getpid() not in {res["holds"]["figures"][p]["pid"] for p in ("a", "b")}
    assert not res["fails"]["ok"] and res["fails"]["failed"] == ["a < 0.5"]
    assert not res["crashes"]["ok"] and "this part broke" in res["crashes"]["errors"]["a"]
    assert lines[-1] == "floors: 1 passed, 2 failed"
    assert json.load(open(tmp_path / "floors.json")) == json.loads(json.dumps(res))


def test_command_exit_status_follows_the_floors(tmp_path, monkeypatch):
    monkeypatch.setattr(fl, "FLOORS", FAKE)
    real = fl.run_floors
    monkeypatch.setattr(fl, "run_floors", lambda out, names, jobs: real(out, names, jobs, f"{__name__}:FAKE"))
    assert main(["--out", str(tmp_path / "ok"), "--only", "holds"]) == 0
    assert main(["--out", str(tmp_path / "bad"), "--only", "holds", "fails"]) == 1
    assert main([]) == 2  # --out missing


RECOLOUR_OK = {  # seeds 0 / 1 at 500 steps, one thread (289a2b8): 0.43 / 0.48, fits 0.83 / 0.99, control 0.00
    "seed0": {"exit_status": 0, "heldout_count": 60, "heldout": 0.43, "fit": 0.83, "control_exit_status": 0,
              "control": 0.0},
    "seed1": {"exit_status": 0, "heldout_count": 60, "heldout": 0.48, "fit": 0.99},
}  # fmt: skip
FAMILY_OK = {
    "run": {"count": 12, "all_ok": True, "heldout": 0.33, "fit": 0.72},
    "control": {"count": 12, "all_ok": True, "heldout": 0.0},
}


def _with(parts: dict, part: str, **changes) -> dict:
    return {**parts, part: {**parts[part], **changes}}


@pytest.mark.parametrize(
    "floor, parts, failed",
    [
        ("recolour", RECOLOUR_OK, 0),
        # a broken encoder answers at the control's level
        ("recolour", _with(_with(RECOLOUR_OK, "seed0", heldout=0.02), "seed1", heldout=0.03), 2),
        ("recolour", _with(RECOLOUR_OK, "seed1", heldout=0.05), 1),  # one seed at the control's level
        ("recolour", _with(RECOLOUR_OK, "seed0", control=0.2), 1),  # the control reads the rule: demos leak
        ("recolour", _with(RECOLOUR_OK, "seed0", heldout_count=59), 1),  # a dropped query
        ("recolour", _with(RECOLOUR_OK, "seed1", fit=0.5), 1),
        ("roll", FAMILY_OK, 0),
        ("roll", _with(FAMILY_OK, "run", heldout=0.0), 1),
        ("roll", _with(FAMILY_OK, "run", fit=0.2, all_ok=False), 2),
        ("roll", _with(FAMILY_OK, "control", heldout=0.25), 1),  # the control answers: the demos leak
        ("recolour_by_size", _with(FAMILY_OK, "run", fit=0.92), 0),
        ("recolour_by_size", _with(FAMILY_OK, "run", fit=0.55), 1),  # fits roll's floor (0.4), not this one (0.6)
        ("recolour_by_size", _with(_with(FAMILY_OK, "run", fit=0.5), "control", heldout=0.25), 2),
        ("recolour_by_size", _with(FAMILY_OK, "control", count=11), 1),  # a dropped puzzle
    ],
)
def test_each_floor_holds_on_the_recorded_figures_and_fails_on_broken_ones(floor, parts, failed):
    got = FLOORS[floor].check(parts)
    assert len(got) == failed, got

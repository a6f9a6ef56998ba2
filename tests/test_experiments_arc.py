"""``python -m experiments.arc``: the small-grid subset (every grid of a task within --max-side, kaggle layout
written back exactly), and the whole command end to end on generated tasks with a tiny model (ETRM + zero-demo
control trained on the training tasks only, scored on the evaluation tasks, arc.json / arc.md, pictures)."""

import json
import os

import numpy as np
import pytest

from core.errors import PlatformError
from dataset.arc_sources import load_puzzles
from experiments.arc import draw_pictures, main, ttt_overrides, write_subset


def _task(rng, side_in, side_out=None, demos=3):
    side_out = side_out or side_in
    pairs = [
        {
            "input": rng.integers(0, 10, (side_in, side_in)).tolist(),
            "output": rng.integers(0, 10, (side_out, side_out)).tolist(),
        }
        for _ in range(demos + 1)
    ]
    return pairs[:demos], pairs[demos:]


def write_tasks(d, sizes: dict) -> str:
    """Kaggle-layout files P_{training,evaluation}_{challenges,solutions}.json; ``sizes``: subset -> list of
    (input side, output side) per task (test outputs in the solutions file)."""
    rng = np.random.default_rng(0)
    os.makedirs(d, exist_ok=True)
    prefix = os.path.join(d, "arc-agi")
    for subset, tasks in sizes.items():
        ch, so = {}, {}
        for i, (si, sout) in enumerate(tasks):
            train, test = _task(rng, si, sout)
            name = f"{subset[:2]}{i:03d}"
            ch[name] = {"train": train, "test": [{"input": t["input"]} for t in test]}
            so[name] = [t["output"] for t in test]
        for kind, obj in (("challenges", ch), ("solutions", so)):
            with open(f"{prefix}_{subset}_{kind}.json", "w") as f:
                json.dump(obj, f)
    return prefix


SIZES = {"training": [(3, 3)] * 6 + [(3, 5), (6, 2)], "evaluation": [(2, 2), (3, 3), (4, 3), (3, 2)]}


def test_subset_keeps_tasks_whose_every_grid_fits_and_writes_them_back_exactly(tmp_path):
    prefix = write_tasks(str(tmp_path / "src"), SIZES)
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", prefix)
    sub = write_subset(str(tmp_path / "out"), puzzles, max_side=3)
    # (3, 5) and (6, 2) do not fit 3 in training; (4, 3) does not in evaluation
    assert sub["counts"] == {
        "training": {"tasks": 6, "of": 8, "test_outputs": 6},
        "evaluation": {"tasks": 3, "of": 4, "test_outputs": 3},
    }
    again = load_puzzles(["training", "evaluation"], "evaluation", sub["prefix"])
    kept = {p.name: p for p in puzzles if max(g.shape[0] for pr in p.train + p.test for g in pr) <= 3}
    assert sorted(p.name for p in again) == sorted(kept)
    for p in again:
        q = kept[p.name]
        assert p.subset == q.subset
        assert all((a == c).all() and (b == d).all() for (a, b), (c, d) in zip(p.train + p.test, q.train + q.test))
    groups = json.load(open(sub["groups"]))
    assert set(groups) == set(kept) and set(groups.values()) == {"arc"}
    with pytest.raises(PlatformError, match=r"--max-side 1: no training task fits \(of 8\)"):
        write_subset(str(tmp_path / "none"), puzzles, max_side=1)
    assert not (tmp_path / "none").exists()  # refused before anything was written


def _tiny_args(tmp_path, out, steps: int, more: list) -> list:
    """The command on the SIZES tasks (max side 3), a 16-wide model, ``steps`` steps, one copy per task."""
    prefix = write_tasks(str(tmp_path / "src"), SIZES)
    args = ["--out", str(out), "--input-file-prefix", prefix, "--max-side", "3", "--steps", str(steps)]
    tiny = ["arch.hidden_size=16", "encoder.hidden_size=16", "global_batch_size=4"] + more
    return args + ["--num-aug", "1"] + [a for o in tiny for a in ("--override", o)]


def test_ttt_copies_pick_the_original_and_the_first_copies_and_bad_counts_are_refused(tmp_path, capsys):
    assert ttt_overrides(100, 1e-2, 1e-3, copies=3)[-1] == "ttt_augment=2"  # the original + 2 copies
    assert not any(o.startswith("ttt_augment") for o in ttt_overrides(100, 1e-2, 1e-3))  # every copy
    for flag, value in (("--ttt-copies", "0"), ("--ttt-steps", "0"), ("--scratch-steps", "-1")):
        with pytest.raises(SystemExit) as e:
            main(["--out", str(tmp_path / "o"), flag, value])
        assert e.value.code == 2 and f"{flag} {value}: must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.slow
def test_the_command_trains_on_training_tasks_and_scores_the_evaluation_tasks(tmp_path):
    out = tmp_path / "arc"
    res = main(_tiny_args(tmp_path, out, 2, ["checkpoint_every=2"]))
    assert res["counts"]["evaluation"]["tasks"] == 3 and res["counts"]["training"]["tasks"] == 6
    assert set(res["protocols"]) == {"standard", "control", "program"}  # the no-weights program beside them
    assert res["protocols"]["program"]["protocol"].startswith("no-weights program")
    for row in res["protocols"].values():
        assert row["status"] == "ok" and 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0
    # ETRM mode: no evaluation task in the training split
    built = out / "runs" / "data" / "built"
    ids = json.load(open(built / "identifiers.json"))
    trained = {ids[i].split("|||")[0] for i in np.load(built / "train" / "all__puzzle_identifiers.npy")}
    tested = {ids[i].split("|||")[0] for i in np.load(built / "test" / "all__puzzle_identifiers.npy")}
    assert trained == {f"tr{i:03d}" for i in range(6)} and tested - {"<blank>"} == {"ev000", "ev001", "ev003"}
    assert json.load(open(out / "arc.json")) == json.loads(json.dumps(res))
    text = (out / "arc.md").read_text()
    assert "evaluation 3 of 4" in text and "zero-demo control" in text
    pics = res["pictures"]["solved"] + res["pictures"]["failed"]
    assert len(pics) == 3 and all(os.path.getsize(p) > 1000 for p in pics)  # 3 evaluation tasks, each drawn once
    # the test-time rows on the same --out: ETRM's checkpoint fitted per task, and an untrained core fitted alone
    ck = out / "runs" / "runs" / "standard" / "checkpoint"
    trained_at = {p: os.path.getmtime(ck / p) for p in os.listdir(ck) if p.endswith(".pt")}
    more = ["--protocols", "etrm", "ttt", "scratch", "--ttt-steps", "1", "--scratch-steps", "2"]
    res = main(_tiny_args(tmp_path, out, 2, ["checkpoint_every=2"]) + more)
    assert {p: os.path.getmtime(ck / p) for p in trained_at} == trained_at  # ETRM reused, not trained again
    for name in ("ttt", "scratch"):
        row = res["protocols"][name]
        assert row["status"] == "ok" and 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0, row
        assert 0.0 <= row["demo_fit_before"] <= 1.0 and 0.0 <= row["demo_fit_after"] <= 1.0
    made = json.load(open(out / "runs" / "runs" / "standard" / "eval-ttt" / "metrics.json"))
    assert made["metrics"]["ttt/steps"] == 1 and made["config"]["ttt_pool"] and made["config"]["ttt_params"] == "all"
    # --ttt-copies 3 (the default) is capped at the data's 2 copies (--num-aug 1): the original + 1 fitted and voted
    assert made["config"]["ttt_augment"] == 1 and res["protocols"]["ttt"]["copies"] == 2
    assert made["metrics"]["ttt/num_puzzles"] == 2 * 3  # 3 evaluation tasks x 2 copies
    scratch = out / "scratch" / "checkpoint"
    assert (
        sorted(os.listdir(scratch)).count("step_0.pt") == 1 and "max_steps: 0" in (scratch / "config.yaml").read_text()
    )
    assert json.load(open(out / "scratch" / "eval" / "metrics.json"))["metrics"]["ttt/steps"] == 2
    assert "from scratch" in (out / "arc.md").read_text()
    for name in ("ttt", "scratch"):  # each test-time row's own answers drawn: 3 evaluation tasks, each once
        pics = res["protocols"][name]["pictures"]
        assert len(pics["solved"] + pics["failed"]) == 3 and "eval_dir" not in res["protocols"][name]
        assert all(os.path.dirname(p) == str(out / "pictures" / name) for p in pics["solved"] + pics["failed"])


@pytest.mark.slow
def test_the_trm_protocol_trains_with_the_evaluation_demos_and_scores_their_tests(tmp_path):
    out = tmp_path / "arc"
    args = _tiny_args(tmp_path, out, 3, []) + ["--protocols", "trm"]  # puzzle_emb_ndim follows arch.hidden_size
    res = main(args)
    row = res["protocols"]["trm"]
    assert set(res["protocols"]) == {"trm"} and row["status"] == "ok", row
    assert 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0 and row["train_fit_pass@1"] is not None
    built = out / "trm" / "data"
    ids = json.load(open(built / "identifiers.json"))
    trained = {ids[i].split("|||")[0] for i in np.load(built / "train" / "all__puzzle_identifiers.npy")}
    # the paper's protocol: the evaluation tasks' demos are training examples (their embeddings are learned)
    assert {"ev000", "ev001", "ev003", "tr000"} <= trained
    config = (out / "trm" / "checkpoint" / "config.yaml").read_text()
    assert "name: trm\n" in config and "puzzle_emb_ndim: 16" in config and "max_steps: 3" in config
    # a second call reuses the data, the finished run and its evaluation
    again = main(args)
    assert again["protocols"]["trm"]["pass@1"] == row["pass@1"]
    assert (out / "trm" / "train.log").read_text().count("$ ") == 1  # trained once


def test_pictures_sort_tasks_by_the_evaluator_s_one_based_rank(tmp_path):
    """predictions.json's ``correct_rank`` is 1-based (None: the truth is not among the candidates): a task is
    solved when every test output ranks 1 or 2."""
    prefix = write_tasks(str(tmp_path / "src"), {"training": [(2, 2)], "evaluation": [(2, 2)] * 4})
    ev = tmp_path / "eval"
    ev.mkdir()
    grid = [[1, 2], [3, 4]]
    cand = {"grid": grid, "votes": 1, "mean_q": 0.5}
    ranks = {"ev000": 1, "ev001": 2, "ev002": 3, "ev003": None}
    preds = {n: [{"test_index": 0, "correct_rank": r, "candidates": [cand]}] for n, r in ranks.items()}
    (ev / "predictions.json").write_text(json.dumps(preds))
    drawn = draw_pictures(str(tmp_path / "out" / "pictures"), prefix, str(ev), per_kind=3)
    names = {k: [os.path.basename(p) for p in v] for k, v in drawn.items()}
    assert names == {
        "solved": ["solved_ev000.png", "solved_ev001.png"],
        "failed": ["failed_ev002.png", "failed_ev003.png"],
    }
    assert draw_pictures(str(tmp_path / "out2" / "pictures"), prefix, str(ev), per_kind=1)["failed"] == [
        str(tmp_path / "out2" / "pictures" / "failed_ev002.png")
    ]

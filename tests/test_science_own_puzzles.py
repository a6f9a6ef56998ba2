"""The science command on your own puzzles (``--input-file-prefix P``), its train-fit columns, and cut-short runs.

Your kaggle-layout files go through the same builder -> pretrain_encoder.py -> evaluate.py -> table pipeline as the
synthetic families, with the zero-demo control; the table is per group (a ``--groups`` file, else the id prefix);
no augmentation unless asked for. A run cut short (summary.json not finished, a checkpoint present) is evaluated at
its last checkpoint and flagged, ``--no-train`` evaluates without training, and a plain re-run resumes it."""

import json
import os
import shutil

import pytest

from dataset.build_synthetic_dataset import generate_synthetic_arc
from experiments.science import run as science_run
from experiments.science.cli import main
from experiments.science.common import CONTROL, ScienceError
from experiments.science.data import id_prefix, load_groups
from experiments.science.report import family_table, render_markdown
from tests.toy_data import TINY_ETRM
from training.checkpoint import read_checkpoint

FAMS = ["colour_map", "flip_rotate"]
SHORT = {"colour_map": "cmap-", "flip_rotate": "flip_"}  # ids "cmap-003", "flip_004": both separators
STEPS = 4
TINY = [
    *TINY_ETRM,
    "checkpoint_every=2",
    "checkpoint_keep=2",
]  # step_2.pt stays next to the final step_4.pt
ARGS = ["--steps", str(STEPS), "--train-fit-puzzles", "6"] + [a for o in TINY for a in ("--override", o)]


def write_own_puzzles(d: str, *, num_train: int = 12, num_test: int = 6) -> tuple[str, str, dict]:
    """Kaggle-layout files ``<d>/mine_{training,evaluation}_{challenges,solutions}.json`` of two rule families with
    ids ``cmap-NNN`` / ``flip_NNN`` (made by the synthetic builder, held-out instances never in training) and a
    groups file (id -> family). Returns (prefix, groups file, groups)."""
    paths = generate_synthetic_arc(
        os.path.join(d, "gen"),
        "g",
        num_train=num_train,
        num_test=num_test,
        families=FAMS,
        canvas_size=6,
        max_grid=4,
        num_aug=0,
        progress=False,
    )
    with open(paths["rules"]) as f:
        rules = json.load(f)
    rename = {old: f"{SHORT[r['family']]}{i:03d}" for i, (old, r) in enumerate(sorted(rules.items()))}
    for sub in ("training", "evaluation"):
        for kind in ("challenges", "solutions"):
            with open(paths[f"{sub}_{kind}"]) as f:
                obj = json.load(f)
            with open(os.path.join(d, f"mine_{sub}_{kind}.json"), "w") as f:
                json.dump({rename[k]: v for k, v in obj.items()}, f)
    groups = {rename[k]: r["family"] for k, r in rules.items()}
    with open(os.path.join(d, "groups.json"), "w") as f:
        json.dump(groups, f)
    return os.path.join(d, "mine"), os.path.join(d, "groups.json"), groups


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    return write_own_puzzles(str(tmp_path_factory.mktemp("own files")))


def _heldout_ids(prefix: str) -> list[str]:
    with open(prefix + "_evaluation_challenges.json") as f:
        return sorted(json.load(f))


# ---------------------------------------------------------------------------------------------------------------
# Grouping, the table, bad input (no training)
# ---------------------------------------------------------------------------------------------------------------
def test_id_prefix_is_the_part_before_the_first_separator():
    assert [id_prefix(i) for i in ("flip_003", "recol-12-b", "a_b-c", "007bbfb7", "_odd", "x-")] == [
        "flip",
        "recol",
        "a",
        "007bbfb7",
        "_odd",
        "x",
    ]


def test_groups_file_accepts_names_or_rules_objects(tmp_path):
    ids = {"training": ["t1"], "evaluation": ["e1", "e2"]}
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"t1": "a", "e1": {"family": "b", "params": {}}, "e2": {"group": "c"}, "other": "x"}))
    assert load_groups(str(p), ids) == {"t1": "a", "e1": "b", "e2": "c"}  # ids beyond the data are ignored


def test_family_table_with_train_fit_and_a_cut_short_run():
    rules = {
        "a1": {"subset": "evaluation", "family": "fa"},
        "b1": {"subset": "evaluation", "family": "fb"},
        "t1": {"subset": "training", "family": "fa"},
        "t2": {"subset": "training", "family": "fa"},
        "t3": {"subset": "training", "family": "fb"},
    }

    def row(*ranks):
        return [{"test_index": i, "correct_rank": r} for i, r in enumerate(ranks)]

    pred = {"standard": {"a1": row(1), "b1": row(None)}, CONTROL: {"a1": row(None), "b1": row(None)}}
    fit = {
        "standard": {"t1": row(1), "t2": row(2), "t3": row(None)},
        CONTROL: {"t1": row(None), "t2": row(None), "t3": row(None)},
    }
    t = family_table(rules, pred, train_fit=(["t1", "t2", "t3"], fit))
    assert [t[f]["train_count"] for f in ("fa", "fb", "all")] == [2, 1, 3]
    assert t["fa"]["train_runs"]["standard"] == {"pass@1": 0.5, "pass@2": 1.0}
    assert t["fb"]["train_runs"]["standard"] == {"pass@1": 0.0, "pass@2": 0.0}
    assert t["fa"]["runs"]["standard"] == {"pass@1": 1.0, "pass@2": 1.0}  # held-out as before
    with pytest.raises(ScienceError, match="not training puzzles"):
        family_table(rules, pred, train_fit=(["a1"], {}))
    with pytest.raises(ScienceError, match="exactly the train-fit set"):
        family_table(rules, pred, train_fit=(["t1", "t2", "t3"], {"standard": {"t1": row(1)}}))
    result = {
        "command": "c",
        "wall_seconds": 1.0,
        "families": t,
        "settings": {
            "data": {"files": {}, "num_train": 3, "num_test": 2, "canvas_size": 5, "seed": 0, "num_aug": 0},
            "input_file_prefix": "/p/mine",
            "grouping": "id prefix",
            "config": "cfg_science",
            "overrides": [],
            "steps": 4,
            "train_fit_puzzles": 3,
        },
        "runs": {
            "standard": {
                "status": "cut_short",
                "steps": 2,
                "total_steps": 4,
                "train_exact": None,
                "cut_short": {"step": 2, "message": "killed, last checkpoint step 2"},
            },
            CONTROL: {"status": "ok", "steps": 4, "train_exact": 0.0},
        },
    }
    md = render_markdown(result)
    assert "| group | n | n train | standard (cut short, step 2) | standard: train | control | control: train |" in md
    assert "| fa | 1 | 2 | 1.00 / 1.00 | 0.50 / 1.00 | 0.00 / 0.00 | 0.00 / 0.00 |" in md
    assert "| standard | cut short at step 2 of 4 | 2 |" in md and "**Cut short** (training did not finish)" in md
    assert "**Not fitted per group** (train pass@1 under 0.5 on the train-fit set): standard: fb." in md
    assert "Augmentation: none (--num-aug 0, the default for your own puzzles)" in md


def _edit(src_prefix: str, dst: str, subset: str, kind: str, fn) -> str:
    """A copy of the four files under ``dst`` with ``fn`` applied to one of them; returns the new prefix."""
    os.makedirs(dst, exist_ok=True)
    for sub in ("training", "evaluation"):
        for k in ("challenges", "solutions"):
            with open(f"{src_prefix}_{sub}_{k}.json") as f:
                obj = json.load(f)
            if (sub, k) == (subset, kind):
                obj = fn(obj)
                if obj is None:
                    continue
            with open(os.path.join(dst, f"mine_{sub}_{k}.json"), "w") as f:
                json.dump(obj, f)
    return os.path.join(dst, "mine")


BAD = [  # (extra arguments, message); "{P}": the prefix of the files, "{G}": the groups file, "{T}": tmp_path
    (
        ["--input-file-prefix", "{P}", "--families", "gravity"],
        "--input-file-prefix and --families are mutually exclusive",
    ),
    (["--input-file-prefix", "{P}", "--num-test", "5"], "--input-file-prefix and --num-test are mutually exclusive"),
    (
        ["--input-file-prefix", "{P}", "--holdout-families", "gravity"],
        "--input-file-prefix and --holdout-families are mutually exclusive",
    ),
    (["--input-file-prefix", "{P}", "--recolour"], "--recolour and --input-file-prefix are mutually exclusive"),
    (["--groups", "{G}"], "--groups needs --input-file-prefix"),
    (["--input-file-prefix", "{T}/nope"], "nope_training_challenges.json: no such file"),
    (["--input-file-prefix", "{P}", "--groups", "{T}/nope.json"], "--groups {T}/nope.json: no such file"),
    (["--input-file-prefix", "{P}", "--canvas-size", "3"], "does not fit --canvas-size 3"),
    (["--input-file-prefix", "{P}", "--num-aug", "-1"], "--num-aug must be >= 0, got -1"),
    (["--out", "{T}/out", "--input-file-prefix", "{P}", "--no-train"], "--no-train: {T}/out holds no science data"),
]


@pytest.mark.parametrize("args, message", BAD)
def test_bad_input_fails_at_once_and_writes_nothing(own_files, tmp_path, capsys, args, message):
    prefix, groups, _ = own_files

    def fill(a):
        return a.replace("{P}", prefix).replace("{G}", groups).replace("{T}", str(tmp_path))

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "out")] + [fill(a) for a in args] + ARGS)
    err = capsys.readouterr().err
    assert e.value.code == 2 and fill(message) in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "case, message",
    [
        ("groups_missing", "--groups {G2}: 1 of the 12 training puzzles have no group, e.g. '{MISSING}'"),
        ("groups_value", "the group must be a non-empty string (or an object with a 'group' / 'family' string), got 3"),
        ("groups_all", "group name 'all' is reserved"),
        ("no_solutions", "mine_evaluation_solutions.json: no such file"),
        ("overlap", "is in both mine_training_challenges.json and _evaluation_challenges.json"),
        ("bad_grid", "field train[0].input"),
    ],
)
def test_bad_files_fail_at_once_naming_file_and_field(own_files, tmp_path, capsys, case, message):
    prefix, _, groups = own_files
    train_ids = sorted(i for i in groups if i not in _heldout_ids(prefix))
    g2 = tmp_path / "groups2.json"
    args = ["--input-file-prefix", prefix]
    if case.startswith("groups"):
        edited = dict(groups)
        if case == "groups_missing":
            del edited[train_ids[0]]
        else:
            edited[train_ids[0]] = 3 if case == "groups_value" else "all"
        g2.write_text(json.dumps(edited))
        args += ["--groups", str(g2)]
    elif case == "no_solutions":
        args = ["--input-file-prefix", _edit(prefix, str(tmp_path / "f"), "evaluation", "solutions", lambda o: None)]
    elif case == "overlap":  # a held-out puzzle also in the training files (challenges and solutions)
        heldout = _heldout_ids(prefix)[0]
        with open(prefix + "_evaluation_challenges.json") as f:
            chal = json.load(f)[heldout]
        with open(prefix + "_evaluation_solutions.json") as f:
            sol = json.load(f)[heldout]
        p2 = _edit(prefix, str(tmp_path / "f"), "training", "challenges", lambda o: dict(o, **{heldout: chal}))
        p2 = _edit(p2, str(tmp_path / "f"), "training", "solutions", lambda o: dict(o, **{heldout: sol}))
        args = ["--input-file-prefix", p2]
    else:

        def bad_grid(obj):
            obj[train_ids[1]]["train"][0]["input"] = [[1, 2], [3]]  # ragged
            return obj

        args = ["--input-file-prefix", _edit(prefix, str(tmp_path / "f"), "training", "challenges", bad_grid)]
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "out")] + args + ARGS)  # ARGS: tiny, should the validation not fail
    err = capsys.readouterr().err
    want = message.replace("{G2}", str(g2)).replace("{MISSING}", train_ids[0])
    assert e.value.code == 2 and want in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# End to end: builder -> pretrain_encoder.py -> evaluate.py -> per-group table
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def own_out(own_files, tmp_path_factory):
    prefix, groups, _ = own_files
    out = str(tmp_path_factory.mktemp("own out"))
    res = main(["--out", out, "--input-file-prefix", prefix, "--groups", groups] + ARGS)
    return out, res


def _read(path):
    with open(path) as f:
        return f.read()


@pytest.mark.slow
def test_own_puzzles_end_to_end_with_groups_then_by_id_prefix(own_files, own_out, tmp_path, capsys):
    prefix, _, groups = own_files
    out, res = own_out
    md = _read(os.path.join(out, "science.md"))
    heldout = _heldout_ids(prefix)
    # the user's files went through the ARC builder, no augmentation by default (stated in the report)
    assert "dataset.build_arc_dataset --input-file-prefix " + prefix in _read(os.path.join(out, "data", "build.log"))
    assert res["settings"]["data"]["num_aug"] == 0 and res["settings"]["input_file_prefix"] == prefix
    assert "Augmentation: none (--num-aug 0, the default for your own puzzles)" in md
    # one row per group of the groups file; counts from the groups of the held-out ids
    t = res["families"]
    assert sorted(t) == sorted(FAMS + ["all"]) and t["all"]["count"] == len(heldout) == 6
    for f in FAMS:
        assert t[f]["count"] == sum(groups[p] == f for p in heldout)
    assert sum(t[f]["train_count"] for f in FAMS) == t["all"]["train_count"] == 6
    assert "| group | n | n train | standard | standard: train | control | control: train |" in md
    # both runs trained, the control with zero demos, evaluated on the held-out puzzles and the train-fit set
    for run in ("standard", CONTROL):
        r = res["runs"][run]
        assert r["status"] == "ok" and r["steps"] == STEPS and r["evaluated_step"] == STEPS
        assert r["zero_demos"] == (run == CONTROL) and r["metrics"]["ARC/num_puzzles"] == 6
        assert r["train_fit_metrics"]["ARC/num_puzzles"] == 6
        assert t["all"]["train_runs"][run]["pass@1"] == pytest.approx(r["train_fit_metrics"]["ARC/pass@1"])
        log = _read(os.path.join(out, "runs", run, "train.log"))
        assert "pretrain_encoder.py --config-name cfg_science" in log
        assert ("encoder.zero_demos=true" in log) == (run == CONTROL)
        pred = json.loads(_read(os.path.join(out, "runs", run, "eval", "predictions.json")))
        assert sorted(pred) == heldout
    # the same --out without --groups: nothing trained or evaluated again, rows by id prefix
    capsys.readouterr()
    again = main(["--out", out, "--input-file-prefix", prefix] + ARGS)
    text = capsys.readouterr().out
    assert text.count("training finished earlier") == 2 and text.count("exists, reused") == 6  # 3 evaluations each
    assert sorted(again["families"]) == ["all", "cmap", "flip"]
    assert again["families"]["all"]["runs"] == t["all"]["runs"]
    assert again["families"]["cmap"]["count"] == t["colour_map"]["count"]
    assert "id prefix (the part of the puzzle id before its first '_' or '-')" in _read(os.path.join(out, "science.md"))
    # other settings in the same --out are refused: augmentation, edited files, the synthetic families
    for args, message in (
        (["--input-file-prefix", prefix, "--num-aug", "2"], "num_aug=0"),
        (
            [
                "--input-file-prefix",
                _edit(
                    prefix,
                    str(tmp_path / "edited"),
                    "evaluation",
                    "solutions",
                    lambda o: {k: [[[0]] for _ in v] for k, v in o.items()},
                ),
            ],
            "the data was made with files.mine_evaluation_solutions.json=",
        ),
        ([], "holds data of your files (--input-file-prefix), this command asks for the synthetic"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["--out", out] + args + ARGS)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err, err


def _cut_short(out: str, run: str, step: int) -> None:
    """What a run killed after its step-``step`` checkpoint leaves: that checkpoint, no later one, summary.json as
    written with it (status running), no evaluation."""
    ck = os.path.join(out, "runs", run, "checkpoint")
    state = read_checkpoint(os.path.join(ck, f"step_{step}.pt"))
    for name in os.listdir(ck):
        if name.startswith("step_") and name != f"step_{step}.pt":
            os.remove(os.path.join(ck, name))
    with open(os.path.join(ck, "summary.json"), "w") as f:
        json.dump(state["summary"], f)
    assert state["summary"]["status"] == "running"
    for sub in ("eval", "eval-train"):
        shutil.rmtree(os.path.join(out, "runs", run, sub))


@pytest.mark.slow
def test_cut_short_run_is_evaluated_flagged_and_resumed(own_files, own_out, tmp_path, capsys, monkeypatch):
    prefix, groups, _ = own_files
    out = str(tmp_path / "out")
    shutil.copytree(own_out[0], out)
    _cut_short(out, "standard", 2)
    args = ["--out", out, "--input-file-prefix", prefix, "--groups", groups] + ARGS
    train_log = os.path.join(out, "runs", "standard", "train.log")
    before = _read(train_log)

    # --no-train: the last checkpoint is evaluated and flagged; nothing trains; exit 0
    capsys.readouterr()
    res = main(args + ["--no-train"])
    text = capsys.readouterr().out
    r = res["runs"]["standard"]
    assert r["status"] == "cut_short" and r["steps"] == 2 and r["evaluated_step"] == 2 and r["total_steps"] == STEPS
    assert r["cut_short"]["step"] == 2 and "not resumed (--no-train)" in r["cut_short"]["message"]
    assert res["runs"][CONTROL]["status"] == "ok" and "control: training finished earlier" in text
    assert res["families"]["all"]["runs"]["standard"]["pass@1"] == r["metrics"]["ARC/pass@1"]
    md = _read(os.path.join(out, "science.md"))
    assert "| standard | cut short at step 2 of 4 | 2 |" in md and "standard (cut short, step 2)" in md
    assert _read(train_log) == before

    # training killed again at once: the pipeline evaluates the checkpoint (reused) and exits 1 naming the run
    real = science_run.run_logged

    def killed_training(cmd, log, append=False):
        if "pretrain_encoder.py" in cmd:
            return -9, 0.1, "Killed"
        return real(cmd, log, append=append)

    monkeypatch.setattr(science_run, "run_logged", killed_training)
    with pytest.raises(SystemExit) as e:
        main(args)
    out_err = capsys.readouterr()
    assert e.value.code == 1 and "cut short: standard" in out_err.err
    assert "standard: evaluation of the held-out puzzles exists, reused" in out_err.out
    saved = json.loads(_read(os.path.join(out, "science.json")))["runs"]["standard"]
    assert saved["status"] == "cut_short" and "exited with status -9" in saved["cut_short"]["message"]
    monkeypatch.setattr(science_run, "run_logged", real)

    # a plain re-run resumes from the checkpoint (not from zero), finishes and evaluates the final one
    res = main(args)
    r = res["runs"]["standard"]
    assert r["status"] == "ok" and r["steps"] == STEPS and r["evaluated_step"] == STEPS
    log = _read(train_log)
    assert log.startswith(before) and "resumed from" in log and "step_2.pt at step 2" in log
    assert "cut short" not in _read(os.path.join(out, "science.md"))


@pytest.mark.slow
def test_curve_evaluates_every_kept_checkpoint_and_plots_them(own_files, own_out, tmp_path, capsys):
    """--curve: every kept checkpoint (here step 2 and step 4) of every run is evaluated on the held-out puzzles
    and the train-fit set; the last point is the report's own evaluation; curve.md / curve.png are written, a
    re-run reuses the evaluations, and experiments.science.curve draws several --out dirs in one figure."""
    from experiments.science import curve

    prefix, groups, _ = own_files
    out = str(tmp_path / "out")
    shutil.copytree(own_out[0], out)
    args = ["--out", out, "--input-file-prefix", prefix, "--groups", groups, "--no-train", "--curve"] + ARGS
    res = main(args)
    c = json.loads(_read(os.path.join(out, "curve.json")))
    assert sorted(c["runs"]) == sorted(["standard", CONTROL]) and "arch.hidden_size=32" in c["title"]
    assert "checkpoint_every" not in c["title"]  # checkpoint keys do not change what is learned: not a label
    for run, points in c["runs"].items():
        assert [p["step"] for p in points] == [2, STEPS]
        last = points[-1]
        assert sorted(last["heldout"]) == sorted(FAMS + ["all"])
        assert last["heldout"]["all"] == pytest.approx(res["runs"][run]["metrics"]["ARC/pass@1"])
        assert last["fit"]["all"] == pytest.approx(res["runs"][run]["train_fit_metrics"]["ARC/pass@1"])
        step2 = json.loads(_read(os.path.join(out, "runs", run, "curve", "step_2", "heldout", "metrics.json")))
        assert step2["checkpoint_step"] == 2 and points[0]["heldout"]["all"] == pytest.approx(
            step2["metrics"]["ARC/pass@1"]
        )
    md = _read(os.path.join(out, "curve.md"))
    assert "| step | all | colour_map | flip_rotate |" in md and md.count("\n| 2 | ") == 2
    with open(os.path.join(out, "curve.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    main(args)
    assert (
        capsys.readouterr().out.count("exists, reused") == 6 + 8
    )  # the report's 4, the curve's 8 (4 of them the report's)
    fig = curve.main([out, out, "--out", str(tmp_path / "both.png")])
    assert os.path.getsize(fig) > 10_000


def test_the_report_flags_a_run_that_halts_before_the_step_it_is_scored_on():
    """A run whose training samples halt at ~1 of 2 ACT steps is scored (evaluate.py's default) on the step
    training no longer supervises: the report says so and names the halting-step evaluation; a run that uses every
    step, or one already evaluated with halt_early=true, gets no note."""
    from experiments.science.report import _run_lines  # noqa: PLC0415 - test-only import

    def lines(steps, eval_overrides=()):
        result = {
            "settings": {"eval_overrides": list(eval_overrides)},
            "runs": {
                "standard": {
                    "status": "ok",
                    "steps": 10,
                    "train_exact": 0.99,
                    "train_steps": steps,
                    "halt_max_steps": 2,
                    "run_dir": "/o/runs/standard",
                }
            },
        }
        return "\n".join(_run_lines(result))

    md = lines(1.02)
    assert "**Halts early**: standard halts its training samples after 1.02 of 2 ACT steps" in md
    assert "checkpoint=/o/runs/standard/checkpoint data_path=<out>/data/built halt_early=true" in md
    assert "Halts early" not in lines(1.95) and "Halts early" not in lines(None)
    assert "Halts early" not in lines(1.0, ["halt_early=true"]) and "Halts early" not in lines(1.0, ["halt_early=True"])

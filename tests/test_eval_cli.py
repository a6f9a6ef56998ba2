"""evaluate.py: our checkpoints, the original TRM layout, strict config, and parity with the training hook."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pydantic
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, arc_kaggle_dir):
    """6 real ARC evaluation puzzles x 4 copies, and a tiny TRM trained for 2 steps on them (with the
    training loop's own eval hook running at the end)."""
    from tests.toy_data import built_arc_evaluation, toy_train_config
    from training.loop import train

    root = tmp_path_factory.mktemp("evalcli")
    data, puzzles = built_arc_evaluation(arc_kaggle_dir, root / "data", count=6, num_aug=3)
    cfg = toy_train_config(
        data,
        str(root / "ck"),
        max_steps=2,
        epochs=1,
        global_batch_size=8,
        evaluators=[{"name": "arc", "kwargs": {"num_pictures": 0}}],
    )
    summary = train(cfg)
    n_inputs = sum(len(p.test) for p in puzzles)
    return data, summary["last_checkpoint"], summary, n_inputs, root


def _cfg(**kw):
    from evaluate import EvaluateConfig

    base = dict(device="cpu", progress=False, num_pictures=1, batch_size=8)
    base.update(kw)
    return EvaluateConfig(**base)


def test_evaluate_our_checkpoint_writes_outputs_and_matches_training_hook(trained):
    import evaluate

    data, ck, summary, n_inputs, root = trained
    out = str(root / "out_full")
    m = evaluate.run(_cfg(checkpoint=ck, data_path=data, output_dir=out, use_ema=False))
    assert m["ARC/num_puzzles"] == 6 and m["ARC/num_examples"] == 4 * n_inputs
    # one evaluator, two callers: the training loop's eval hook saw the same model and data
    final = summary["final"]
    for k in ("all.accuracy", "all.lm_loss", "all.exact_accuracy", "all.steps"):
        assert m[k] == pytest.approx(final[f"eval/{k}"], rel=1e-5), k
    assert m["ARC/pass@1"] == pytest.approx(final["ARC/pass@1"])
    files = set(os.listdir(out))
    assert {"metrics.json", "submission.json", "predictions.json", "pictures"} <= files
    saved = json.load(open(os.path.join(out, "metrics.json")))
    assert saved["metrics"]["ARC/num_examples"] == 4 * n_inputs and saved["config"]["checkpoint"] == ck
    sub = json.load(open(os.path.join(out, "submission.json")))
    assert len(sub) == 6 and all(set(e) == {"attempt_1", "attempt_2"} for v in sub.values() for e in v)
    assert len(os.listdir(os.path.join(out, "pictures"))) == 1


def test_evaluate_subset_of_augmentations(trained):
    import evaluate

    data, ck, _, n_inputs, root = trained
    # run directory + batch size from the checkpoint's config
    m = evaluate.run(
        _cfg(
            checkpoint=os.path.dirname(ck),
            data_path=data,
            output_dir=str(root / "out_sub"),
            num_augmentations=1,
            num_pictures=0,
            halt_early=True,
            batch_size=None,
        )
    )
    assert m["ARC/num_examples"] == n_inputs and m["ARC/num_puzzles"] == 6
    saved = json.load(open(root / "out_sub" / "metrics.json"))
    assert saved["checkpoint_info"]["global_batch_size"] == 8
    # the recorded architecture is the checkpoint's, not the evaluation config's (unused) default arch
    state = torch.load(ck, map_location="cpu", weights_only=True)
    assert saved["checkpoint_info"]["arch"] == json.loads(json.dumps(dict(state["config"]["arch"])))
    assert saved["config"]["arch"] is None


def test_original_trm_layout_gives_the_same_numbers(trained):
    """Our weights re-saved in the original TRM state-dict layout (``_orig_mod.model.inner.*``) evaluate to
    the same metrics with original_trm_checkpoint=true and the arch passed explicitly."""
    import evaluate

    data, ck, _, _, root = trained
    state = torch.load(ck, map_location="cpu", weights_only=False)
    orig = {f"_orig_mod.model.{k}": v for k, v in state["model"].items()}
    path = str(root / "orig.pt")
    torch.save(orig, path)
    arch = dict(state["config"]["arch"])
    ours = evaluate.run(_cfg(checkpoint=ck, data_path=data, output_dir=str(root / "o1"), use_ema=False, num_pictures=0))
    theirs = evaluate.run(
        _cfg(
            checkpoint=path,
            data_path=data,
            output_dir=str(root / "o2"),
            num_pictures=0,
            original_trm_checkpoint=True,
            arch=arch,
        )
    )
    for k in ("all.accuracy", "all.lm_loss", "ARC/pass@1", "ARC/num_examples"):
        assert theirs[k] == pytest.approx(ours[k], rel=1e-5), k
    # a structurally different arch is refused, naming the shapes
    bad = dict(arch, hidden_size=arch["hidden_size"] * 2, puzzle_emb_ndim=arch["hidden_size"] * 2)
    with pytest.raises(Exception, match="does not fit|hidden_size"):
        evaluate.run(
            _cfg(
                checkpoint=path,
                data_path=data,
                output_dir=str(root / "o3"),
                num_pictures=0,
                original_trm_checkpoint=True,
                arch=bad,
            )
        )


def test_strict_config_and_clear_errors(trained):
    import evaluate

    data, ck, _, _, root = trained
    with pytest.raises(pydantic.ValidationError, match="bogus"):
        _cfg(checkpoint=ck, data_path=data, bogus=1)
    with pytest.raises(evaluate.EvaluateError, match="no such file"):
        evaluate.run(_cfg(checkpoint=str(root / "nope.pt"), data_path=data))
    with pytest.raises(evaluate.EvaluateError, match="needs an arch"):
        evaluate.run(_cfg(checkpoint=ck, data_path=data, original_trm_checkpoint=True))


def test_arch_is_the_validated_arch_config():
    """EvaluateConfig.arch is the config class of the arch registry (models.parse_arch_config): the defaults filled
    in, dumped with every field; an unknown key is refused naming arch.<key>, in the composed Hydra config too."""
    from omegaconf import OmegaConf

    import evaluate
    from models import ArchConfigError
    from models.trm import TRMConfig

    cfg = evaluate.EvaluateConfig(
        checkpoint="c.pt", data_path="d", original_trm_checkpoint=True, arch={"name": "trm", "L_cycles": 4}
    )
    assert isinstance(cfg.arch, TRMConfig) and cfg.arch.L_cycles == 4 and cfg.arch.H_cycles == TRMConfig().H_cycles
    assert cfg.model_dump()["arch"] == cfg.arch.model_dump()
    assert evaluate.EvaluateConfig(checkpoint="c.pt", data_path="d").arch is None
    with pytest.raises(pydantic.ValidationError, match="arch.bogus"):
        evaluate.EvaluateConfig(checkpoint="c.pt", data_path="d", arch={"name": "trm", "bogus": 1})
    composed = OmegaConf.create(
        {
            **evaluate.evaluate_defaults(),
            "checkpoint": "c.pt",
            "data_path": "d",
            "original_trm_checkpoint": True,
            "arch": {"name": "trm", "bogus": 1},
        }
    )
    with pytest.raises(ArchConfigError, match="unknown key 'arch.bogus'"):
        evaluate.check_config(composed, ["+arch.bogus=1"])


@pytest.mark.slow
def test_cli_end_to_end_and_unknown_key(trained):
    data, ck, _, n_inputs, root = trained
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    out = str(root / "cli_out")
    r = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            f"checkpoint={ck}",
            f"data_path={data}",
            "device=cpu",
            "num_augmentations=2",
            "batch_size=8",
            f"output_dir={out}",
            "progress=false",
            "num_pictures=0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    printed = json.loads(r.stdout[r.stdout.index("{") :])
    assert printed["ARC/num_puzzles"] == 6.0
    assert json.load(open(os.path.join(out, "metrics.json")))["metrics"]["ARC/num_examples"] == 2 * n_inputs
    r = subprocess.run(
        [sys.executable, "evaluate.py", f"checkpoint={ck}", f"data_path={data}", "bogus_key=1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0 and "bogus_key" in r.stderr
    r = subprocess.run(
        [sys.executable, "evaluate.py", f"checkpoint={ck}", f"data_path={data}", "arch.L_cycles=6", "device=cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "original_trm_checkpoint" in r.stderr


def test_max_groups_picks_the_groups_of_the_runs_eval_hook(trained):
    """evaluate.py max_groups=N must evaluate the puzzles the run's own max_eval_groups=N hook evaluated: the
    seeded group choice uses the checkpoint's training seed (it used 0 whatever the run's seed was)."""
    import evaluate
    from dataset.augment import Augmentation
    from dataset.loader import PuzzleDataset, PuzzleDatasetConfig

    data, ck, _, _, root = trained
    state = torch.load(ck, map_location="cpu", weights_only=False)
    state["config"]["seed"] = 5
    ck5 = str(root / "seed5.pt")
    torch.save(state, ck5)
    ids = json.load(open(os.path.join(data, "identifiers.json")))

    def hook_names(seed):  # what the training loop's eval loader (seed=cfg.seed) would serve
        ds = PuzzleDataset(
            PuzzleDatasetConfig(data_paths=[data], global_batch_size=8, seed=seed, test_mode=True, max_groups=2), "test"
        )
        return {
            Augmentation.parse_name(ids[int(p)])[0]
            for _, b, _ in ds
            for p, e in zip(b["puzzle_identifiers"], b["example_index"])
            if e >= 0
        }

    assert hook_names(5) != hook_names(0)  # the check below can tell the seeds apart
    out = str(root / "out_groups")
    m = evaluate.run(_cfg(checkpoint=ck5, data_path=data, output_dir=out, use_ema=False, max_groups=2, num_pictures=0))
    assert m["ARC/num_puzzles"] == 2
    assert set(json.load(open(os.path.join(out, "submission.json")))) == hook_names(5)


@pytest.fixture(scope="module")
def sudoku_run(tmp_path_factory):
    """A generated 4x4 Sudoku build (8 test puzzles, no test_puzzles.json) and a tiny TRM trained 4 steps on it."""
    from dataset.build_sudoku_dataset import main as build_sudoku
    from training.loop import train

    root = tmp_path_factory.mktemp("sudoku")
    data = str(root / "sud")
    build_sudoku(
        [
            "--output-dir",
            data,
            "--generate-train",
            "64",
            "--generate-test",
            "8",
            "--size",
            "4",
            "--num-aug",
            "1",
            "--no-progress",
        ]
    )
    run = str(root / "run")
    arch = dict(
        name="trm",
        hidden_size=32,
        num_heads=2,
        expansion=2,
        puzzle_emb_ndim=32,
        puzzle_emb_len=1,
        H_cycles=1,
        L_cycles=1,
        L_layers=1,
        halt_max_steps=2,
        loss={"loss_type": "softmax_cross_entropy"},
    )
    s = train(
        dict(
            arch=arch,
            data_paths=[data],
            global_batch_size=16,
            epochs=1,
            max_steps=4,
            eval_interval=None,
            eval_at_end=False,
            evaluators=[],
            checkpoint_path=run,
            progress=False,
            wandb={"mode": "disabled"},
        )
    )
    assert s["exit_status"] == 0
    return data, run, root


def test_evaluate_a_sudoku_checkpoint_and_a_failed_call_leaves_no_output_dir(sudoku_run, tmp_path):
    """evaluate.py is not ARC-only: a Sudoku build is scored by exact / token accuracy and halting steps (no ARC
    voting, no test_puzzles.json needed); a failed call does not leave an empty evaluate/latest behind."""
    import evaluate

    data, run, _ = sudoku_run
    m = evaluate.run(evaluate.EvaluateConfig(checkpoint=run, data_path=data, device="cpu", progress=False))
    assert m["eval/num_examples"] == 8 and 0.0 <= m["all.exact_accuracy"] <= 1.0 and m["all.steps"] == 2.0
    assert not any(k.startswith("ARC/") for k in m)
    with open(os.path.join(run, "evaluate", "latest", "metrics.json")) as f:
        assert json.load(f)["metrics"]["all.accuracy"] == pytest.approx(m["all.accuracy"])
    # a call that fails after the output dir was made (here: a broken test_puzzles.json makes the data ARC-like and
    # the ARC evaluator refuses it) removes the directories it created
    import shutil

    broken = str(tmp_path / "broken")
    shutil.copytree(data, broken)
    with open(os.path.join(broken, "test_puzzles.json"), "w") as f:
        f.write("[]")
    with open(os.path.join(broken, "test", "dataset.json")) as f:
        meta = json.load(f)
    with open(os.path.join(broken, "test", "dataset.json"), "w") as f:
        json.dump(dict(meta, kind=None), f)
    bad_out = tmp_path / "fresh" / "evaluate" / "latest"
    from evaluators import EvaluatorError

    with pytest.raises(EvaluatorError, match="test_puzzles.json: expected"):
        evaluate.run(
            evaluate.EvaluateConfig(
                checkpoint=run, data_path=broken, device="cpu", output_dir=str(bad_out), progress=False
            )
        )
    assert not (tmp_path / "fresh").exists()


def test_arc_voting_can_be_turned_off_and_is_refused_on_non_arc_data(trained, sudoku_run, tmp_path):
    """arc_voting=false scores ARC data per copy (the same per-copy numbers, no pass@K): the way to score probe
    data whose puzzle ids were replaced by rule ids; arc_voting=true on Sudoku data is refused by name."""
    import evaluate

    data, ck, _, n_inputs, root = trained
    voted = evaluate.run(
        _cfg(checkpoint=ck, data_path=data, output_dir=str(root / "out_voted"), use_ema=False, num_pictures=0)
    )
    plain = evaluate.run(
        _cfg(checkpoint=ck, data_path=data, output_dir=str(root / "out_plain"), use_ema=False, arc_voting=False)
    )
    assert any(k.startswith("ARC/") for k in voted) and not any(k.startswith("ARC/") for k in plain)
    for k in ("all.accuracy", "all.exact_accuracy", "all.steps"):
        assert plain[k] == pytest.approx(voted[k]), k
    assert plain["eval/num_examples"] == 4 * n_inputs
    s_data, run, _ = sudoku_run
    with pytest.raises(evaluate.EvaluateError, match="arc_voting=true: .* is not ARC-format data"):
        evaluate.run(
            evaluate.EvaluateConfig(
                checkpoint=run,
                data_path=s_data,
                device="cpu",
                progress=False,
                arc_voting=True,
                output_dir=str(tmp_path / "none" / "out"),
            )
        )
    assert not (tmp_path / "none").exists()


def test_a_failed_call_leaves_no_empty_evaluate_latest_in_the_run_dir(sudoku_run, tmp_path):
    """The default output dir <run>/evaluate/latest: ARC-kind data without its test_puzzles.json fails (one line
    naming the file) after the directory was made; the run dir is left as it was."""
    import shutil

    import evaluate
    from evaluators import EvaluatorError

    data, run, _ = sudoku_run
    arc_like = str(tmp_path / "arc_like")
    shutil.copytree(data, arc_like)
    with open(os.path.join(arc_like, "test", "dataset.json")) as f:
        meta = json.load(f)
    with open(os.path.join(arc_like, "test", "dataset.json"), "w") as f:
        json.dump(dict(meta, kind="arc"), f)
    fresh_run = str(tmp_path / "run")
    shutil.copytree(run, fresh_run, ignore=shutil.ignore_patterns("evaluate"))
    before = sorted(os.listdir(fresh_run))
    with pytest.raises(EvaluatorError, match="test_puzzles.json: missing"):
        evaluate.run(evaluate.EvaluateConfig(checkpoint=fresh_run, data_path=arc_like, device="cpu", progress=False))
    assert sorted(os.listdir(fresh_run)) == before and "evaluate" not in before


def test_arc_voting_is_chosen_from_the_datasets_kind(tmp_path):
    """dataset.json kind decides: arc -> voting; sudoku / maze -> per-copy metrics only (even with stray ARC files);
    no kind (the published TRM layout) -> voting only when test_puzzles.json and identifiers.json are both there."""
    from types import SimpleNamespace

    from evaluate import uses_arc_voting

    both, ids_only = tmp_path / "both", tmp_path / "ids_only"
    for d, files in ((both, ("test_puzzles.json", "identifiers.json")), (ids_only, ("identifiers.json",))):
        d.mkdir()
        for name in files:
            (d / name).write_text("{}")

    def kind(k):
        return SimpleNamespace(kind=k)

    assert uses_arc_voting(str(both), kind("arc")) and uses_arc_voting(str(ids_only), kind("arc"))
    assert not uses_arc_voting(str(both), kind("sudoku")) and not uses_arc_voting(str(both), kind("maze"))
    assert uses_arc_voting(str(both), kind(None)) and not uses_arc_voting(str(ids_only), kind(None))


def test_printed_metrics_are_the_headline_ones():
    from evaluate import printed_metrics

    m = {
        "all.accuracy": 0.5,
        "all.exact_accuracy": 0.25,
        "all.steps": 3.0,
        "all.lm_loss": 1.0,
        "all.q_halt_accuracy": 0.9,
        "eval/num_examples": 8.0,
        "eval/seconds": 1.0,
        "eval/examples_per_second": 8.0,
    }
    assert list(printed_metrics(m)) == [
        "all.accuracy",
        "all.exact_accuracy",
        "all.steps",
        "eval/num_examples",
        "eval/seconds",
    ]
    arc = dict(
        m,
        **{
            "ARC/pass@1": 0.1,
            "ARC/pass@2": 0.2,
            "ARC/num_puzzles": 6.0,
            "ARC/num_test_inputs": 7.0,
            "ARC/malformed_frac": 0.0,
            "hard.exact_accuracy": 0.0,
        },
    )
    assert list(printed_metrics(arc))[:5] == [
        "ARC/pass@1",
        "ARC/pass@2",
        "ARC/num_puzzles",
        "ARC/num_test_inputs",
        "all.accuracy",
    ]
    assert "hard.exact_accuracy" in printed_metrics(arc) and "ARC/malformed_frac" not in printed_metrics(arc)


@pytest.mark.slow
def test_cli_evaluates_a_sudoku_checkpoint(sudoku_run):
    """The README demo's case through the CLI: `python evaluate.py checkpoint=<run> data_path=<sudoku build>`
    prints exact / token accuracy and halting steps, records every per-copy metric in metrics.json, writes no ARC
    outputs, and (stderr not a terminal) no progress-bar carriage returns."""
    data, run, root = sudoku_run
    out = str(root / "cli_out")
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    r = subprocess.run(
        [sys.executable, "evaluate.py", f"checkpoint={run}", f"data_path={data}", "device=cpu", f"output_dir={out}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    printed = json.loads(r.stdout[r.stdout.index("{") :])
    assert set(printed) == {"all.exact_accuracy", "all.accuracy", "all.steps", "eval/num_examples", "eval/seconds"}
    assert printed["eval/num_examples"] == 8.0 and printed["all.steps"] == 2.0
    assert "\r" not in r.stderr and "no ARC voting" in r.stdout  # Hydra logs to stdout
    assert os.listdir(out) == ["metrics.json"]
    saved = json.load(open(os.path.join(out, "metrics.json")))["metrics"]
    assert {f"all.{k}" for k in ("accuracy", "exact_accuracy", "lm_loss", "q_halt_accuracy", "steps")} <= set(saved)
    assert saved["all.exact_accuracy"] == printed["all.exact_accuracy"]


def test_grid_offsets_are_wired_from_config_to_checkpoint_to_evaluate(tmp_path, arc_kaggle_dir):
    """arch=trm_grid: the config builds the grid-offset embedding, the checkpoint records it, evaluate.py rebuilds
    the same model (same numbers as the training hook), and it matters (a zeroed grid-offset table differs)."""
    import evaluate
    from tests.toy_data import built_arc_evaluation, toy_train_config
    from training.build import load_model_for_inference
    from training.checkpoint import load_checkpoint_file, read_checkpoint, save_checkpoint_atomic
    from training.loop import train

    data, puzzles = built_arc_evaluation(arc_kaggle_dir, tmp_path / "data", count=3, num_aug=1)
    cfg = toy_train_config(
        data,
        str(tmp_path / "ck"),
        max_steps=3,
        epochs=1,
        global_batch_size=8,
        arch={"name": "trm_grid", "hidden_size": 32, "num_heads": 2},
    )
    summary = train(cfg)
    state = load_checkpoint_file(summary["last_checkpoint"])
    assert state["config"]["arch"]["name"] == "trm_grid"
    model, _, meta = load_model_for_inference(state)
    inner = model.model.inner if hasattr(model, "model") else model.inner
    side = math.isqrt(meta.seq_len)
    assert inner.embed_grid.embedding_weight.shape == (4, 2 * side + 1, 32)
    m = evaluate.run(
        _cfg(
            checkpoint=summary["last_checkpoint"],
            data_path=data,
            output_dir=str(tmp_path / "o2d"),
            use_ema=False,
            num_pictures=0,
        )
    )
    for k in ("all.accuracy", "all.lm_loss"):
        assert m[k] == pytest.approx(summary["final"][f"eval/{k}"], rel=1e-5), k
    raw = read_checkpoint(summary["last_checkpoint"])
    key = next(k for k in raw["model"] if k.endswith("embed_grid.embedding_weight"))
    raw["model"][key] = torch.zeros_like(raw["model"][key])  # same weights, no grid offsets
    save_checkpoint_atomic(raw, str(tmp_path / "no_grid.pt"))
    m0 = evaluate.run(
        _cfg(
            checkpoint=str(tmp_path / "no_grid.pt"),
            data_path=data,
            output_dir=str(tmp_path / "o0"),
            use_ema=False,
            num_pictures=0,
        )
    )
    assert m0["all.lm_loss"] != pytest.approx(m["all.lm_loss"], rel=1e-4)


def test_evaluate_logs_to_the_training_runs_project_by_default(toy, tmp_path, monkeypatch):
    """No wandb_project=: the evaluation's W&B run goes to the checkpoint's project, in the mode the training run
    had (offline here; WANDB_MODE=disabled, or a run trained with W&B disabled: no W&B run); wandb_project= still
    names another project."""
    import wandb

    import evaluate
    from tests.toy_data import toy_train_config
    from training.loop import train

    class Run:
        def __init__(self, **kw):
            self.kw, self.summary, self.id, self.dir = kw, {}, "fake", None

        def log(self, *a, **k):
            pass

        def log_code(self, *a, **k):
            pass

        def finish(self, *a, **k):
            pass

    runs = []
    monkeypatch.setattr(wandb, "init", lambda **kw: runs.append(Run(**kw)) or runs[-1])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("TRM_JOB_ID", raising=False)
    ck = str(tmp_path / "offline")
    train(toy_train_config(toy, ck, epochs=1, project_name="proj", wandb={"mode": "offline", "save_code": False}))
    assert [r.kw["job_type"] for r in runs] == ["train"]

    def ev(**kw):
        evaluate.run(evaluate.EvaluateConfig(checkpoint=ck, data_path=toy, device="cpu", progress=False, **kw))

    ev()
    assert len(runs) == 2 and (runs[1].kw["project"], runs[1].kw["mode"], runs[1].kw["job_type"]) == (
        "proj",
        "offline",
        "eval",
    )
    ev(wandb_project="other")
    assert (runs[2].kw["project"], runs[2].kw["group"]) == ("other", "toy")
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the tests' environment: no W&B run
    ev()
    assert len(runs) == 3
    monkeypatch.delenv("WANDB_MODE")
    quiet = str(tmp_path / "disabled")
    train(toy_train_config(toy, quiet, epochs=1))  # wandb.mode disabled
    evaluate.run(evaluate.EvaluateConfig(checkpoint=quiet, data_path=toy, device="cpu", progress=False))
    assert len(runs) == 3

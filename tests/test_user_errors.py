"""Bad input at every entry point ends with ONE line naming the key / file, exit 1 (builders: 2), no traceback
(core.errors); --overwrite refuses a directory that is not a dataset; evaluate.py records the checkpoint it
evaluated and refuses data whose identifiers.json is not the training data's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from core.errors import one_line, run_hydra_main
from tests.toy_data import TINY_TRM, built_synthetic_arc, toy_train_config, write_toy_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [*TINY_TRM, "epochs=1"]


def _synthetic_arc(root, seed: int) -> str:
    return built_synthetic_arc(root, num_train=4, num_test=3, num_aug=2, seed=seed, canvas=30, build_seed=seed)[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two synthetic ARC datasets of the same size (same number of puzzle ids, different identifiers.json), a toy
    dataset, and a tiny TRM trained 2 steps on the first ARC dataset."""
    from training.loop import train

    root = tmp_path_factory.mktemp("usererr")
    arc, other = _synthetic_arc(root / "arc", 0), _synthetic_arc(root / "other", 1)
    toy = write_toy_dataset(str(root / "toy"), seq_len=8)
    summary = train(toy_train_config(arc, str(root / "ck"), max_steps=2, epochs=1, global_batch_size=8))
    return {"root": root, "arc": arc, "other": other, "toy": toy, "ckpt": summary["last_checkpoint"]}


@pytest.fixture()
def unwritable(tmp_path):
    """A directory path that cannot be created: under a read-only directory, or (as root, who ignores
    permissions) under a regular file."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        yield str(ro / "out")
        ro.chmod(0o755)
    else:
        (tmp_path / "file").write_text("x")
        yield str(tmp_path / "file" / "out")


def _one_error_line(err: str, *needles: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _hydra_cli(monkeypatch, capsys, main, argv, tmp_path, code=1):
    """Run a @hydra.main entry point in-process as `python <script> argv` would."""
    monkeypatch.setattr(
        sys,
        "argv",
        [
            argv[0],
            *argv[1:],
            f"hydra.run.dir={tmp_path / 'hydra'}",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ],
    )
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_hydra_main(main)
    out = capsys.readouterr()
    assert e.value.code == code, out.err[-3000:]
    return out.err


# ---------------------------------------------------------------- training entry points
def test_unknown_evaluator_is_one_line(world, monkeypatch, capsys, tmp_path):
    import pretrain

    err = _hydra_cli(
        monkeypatch,
        capsys,
        pretrain.main,
        [
            "pretrain.py",
            *TINY,
            f"data_paths=[{world['toy']}]",
            "evaluators=[{name: bogus}]",
            f"checkpoint_path={tmp_path / 'ck'}",
        ],
        tmp_path,
    )
    _one_error_line(err, "unknown evaluator 'bogus'", "arc")


def test_encoder_key_typo_is_one_line_naming_the_key(world, monkeypatch, capsys, tmp_path):
    import pretrain_encoder

    base = [
        "pretrain_encoder.py",
        "encoder=standard",
        f"data_paths=[{world['arc']}]",
        "allow_test_demos_in_train=true",
        "evaluators=[]",
        "wandb.mode=disabled",
        f"checkpoint_path={tmp_path / 'ck'}",
    ]
    # Hydra refuses the key (the encoder group is a struct) ...
    err = _hydra_cli(monkeypatch, capsys, pretrain_encoder.main, base + ["encoder.hiden_size=32"], tmp_path)
    _one_error_line(err, "encoder.hiden_size")
    # ... and with '+' it reaches the encoder's strict config, which names it and lists the real keys
    err = _hydra_cli(monkeypatch, capsys, pretrain_encoder.main, base + ["+encoder.hiden_size=32"], tmp_path)
    _one_error_line(err, "encoder.hiden_size", "unknown key", "hidden_size")


def test_unwritable_checkpoint_dir_is_one_line(world, monkeypatch, capsys, tmp_path, unwritable):
    import pretrain

    err = _hydra_cli(
        monkeypatch,
        capsys,
        pretrain.main,
        ["pretrain.py", *TINY, f"data_paths=[{world['toy']}]", f"checkpoint_path={unwritable}"],
        tmp_path,
    )
    _one_error_line(err, unwritable)


def test_pretrained_decoder_arch_mismatch_is_one_line(world, monkeypatch, capsys, tmp_path):
    import pretrain_encoder

    err = _hydra_cli(
        monkeypatch,
        capsys,
        pretrain_encoder.main,
        [
            "pretrain_encoder.py",
            "encoder=standard",
            f"data_paths=[{world['arc']}]",
            "allow_test_demos_in_train=true",
            "evaluators=[]",
            "wandb.mode=disabled",
            f"checkpoint_path={tmp_path / 'ck'}",
            f"load_pretrained_decoder={os.path.dirname(world['ckpt'])}",
            "arch.hidden_size=32",
            "arch.num_heads=2",
            "arch.L_layers=1",
            "arch.H_cycles=1",
            "arch.L_cycles=2",
            "encoder.hidden_size=32",
            "encoder.num_heads=2",
        ],
        tmp_path,
    )
    _one_error_line(err, world["ckpt"], "L_cycles", "has 1", "has 2")


@pytest.mark.slow
def test_hydra_override_typo_as_a_real_command_prints_one_line():
    """The same path as a real process (Hydra's own report would be 5 lines plus a hint)."""
    r = subprocess.run(
        [sys.executable, "pretrain_encoder.py", "encoder=standard", "encoder.hiden_size=32"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr
    _one_error_line(r.stderr, "encoder.hiden_size")
    assert r.stderr.strip().endswith("did you mean encoder.hidden_size?")  # the closest known key


def test_refused_override_names_the_closest_known_key():
    """Hydra's own advice for a misspelt key (`+lrr=1`) leads into a second error (the strict config refuses the
    added key): both refusals end with the closest known key instead."""
    from core.errors import closest_key
    from training.config import known_keys

    keys = known_keys()
    assert {"lr", "wandb.mode", "health.collapse_threshold", "arch.L_cycles", "encoder.kl_weight"} <= set(keys)
    assert closest_key("Could not override 'lrr'. To append to your config use +lrr=1", keys) == "lr"
    assert closest_key("unknown config key 'ema_rat' (value 0.9)", keys) == "ema_rate"
    assert closest_key("Could not override 'arch.L_cycle'", keys) == "arch.L_cycles"
    assert closest_key("unknown config key 'zzzzzz'", keys) is None and closest_key("other error", keys) is None
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"OMP_NUM_THREADS": "1"}
    for override, said in (("lrr=1", "Could not override 'lrr'"), ("+lrr=1", "unknown key 'lrr'")):
        r = subprocess.run(
            [sys.executable, "pretrain.py", override], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
        )
        err = r.stderr.strip()
        assert r.returncode == 1 and err.count("\n") == 0 and said in err, err
        assert err.endswith("did you mean lr?") and "+lrr" not in err.replace(override, ""), err
    r = subprocess.run(
        [sys.executable, "evaluate.py", "chekpoint=x"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )  # evaluate.py: its own keys
    err = r.stderr.strip()
    assert r.returncode == 1 and err.count("\n") == 0 and err.endswith("did you mean checkpoint?"), err


# ---------------------------------------------------------------- evaluate.py
def _evaluate(monkeypatch, capsys, tmp_path, *args):
    import evaluate

    monkeypatch.setattr(
        sys,
        "argv",
        [
            "evaluate.py",
            *args,
            "device=cpu",
            "progress=false",
            "num_pictures=0",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ],
    )
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        evaluate._main()
    return e.value.code, capsys.readouterr().err


def test_evaluate_records_checkpoint_and_refuses_other_identifiers(world, monkeypatch, capsys, tmp_path):
    import evaluate

    ck, arc = world["ckpt"], world["arc"]
    state = torch.load(ck, map_location="cpu", weights_only=False)
    assert state["identifiers_sha256"] == state["metadata"]["identifiers_sha256"] is not None
    # a run directory: the newest step file and its step are recorded
    out = str(tmp_path / "out")
    m = evaluate.run(
        evaluate.EvaluateConfig(
            checkpoint=os.path.dirname(ck), data_path=arc, output_dir=out, device="cpu", progress=False, num_pictures=0
        )
    )
    saved = json.load(open(os.path.join(out, "metrics.json")))
    assert saved["checkpoint_file"] == os.path.abspath(ck) and saved["checkpoint_step"] == state["step"] == 2
    assert saved["metrics"]["ARC/num_puzzles"] == m["ARC/num_puzzles"] == 3
    # a truncated newer checkpoint in the run directory: evaluation falls back to step 2, loudly, and records the
    # file it actually evaluated (not the newest name)
    run_copy = tmp_path / "run_copy"
    shutil.copytree(os.path.dirname(ck), run_copy)
    with open(ck, "rb") as f:
        (run_copy / "step_9.pt").write_bytes(f.read()[:1000])
    capsys.readouterr()
    evaluate.run(
        evaluate.EvaluateConfig(
            checkpoint=str(run_copy),
            data_path=arc,
            output_dir=str(tmp_path / "o4"),
            device="cpu",
            progress=False,
            num_pictures=0,
        )
    )
    saved = json.load(open(tmp_path / "o4" / "metrics.json"))
    assert saved["checkpoint_file"] == str(run_copy / "step_2.pt") and saved["checkpoint_step"] == 2
    assert "step_9.pt" in capsys.readouterr().err
    # the same number of puzzle ids but another identifiers.json: refused, one line naming data_path
    code, err = _evaluate(
        monkeypatch,
        capsys,
        tmp_path,
        f"checkpoint={ck}",
        f"data_path={world['other']}",
        f"output_dir={tmp_path / 'o2'}",
    )
    assert code == 1
    _one_error_line(err, "data_path=", world["other"], "identifiers.json")
    assert not os.path.exists(tmp_path / "o2" / "metrics.json")
    # a checkpoint from before the hash: a warning, not a refusal
    del state["identifiers_sha256"], state["metadata"]["identifiers_sha256"]
    os.makedirs(tmp_path / "old")
    old = str(tmp_path / "old" / "step_2.pt")
    torch.save(state, old)
    evaluate.run(
        evaluate.EvaluateConfig(
            checkpoint=old,
            data_path=world["other"],
            output_dir=str(tmp_path / "o3"),
            device="cpu",
            progress=False,
            num_pictures=0,
        )
    )
    assert json.load(open(tmp_path / "o3" / "metrics.json"))["checkpoint_step"] == 2


def test_evaluate_runtime_error_and_unwritable_output_are_one_line(world, monkeypatch, capsys, tmp_path, unwritable):
    ck = world["ckpt"]
    # weights that do not fit the model the checkpoint's config builds: torch's multi-line RuntimeError
    state = torch.load(ck, map_location="cpu", weights_only=False)
    state["config"]["arch"].update(hidden_size=64, puzzle_emb_ndim=64)
    bad = str(tmp_path / "bad.pt")
    torch.save(state, bad)
    code, err = _evaluate(
        monkeypatch, capsys, tmp_path, f"checkpoint={bad}", f"data_path={world['arc']}", f"output_dir={tmp_path / 'o'}"
    )
    assert code == 1
    _one_error_line(err, bad, "size mismatch")
    code, err = _evaluate(
        monkeypatch, capsys, tmp_path, f"checkpoint={ck}", f"data_path={world['arc']}", f"output_dir={unwritable}"
    )
    assert code == 1
    _one_error_line(err, "output_dir=", unwritable)


# ---------------------------------------------------------------- dataset builders
def test_builder_unwritable_output_dir_is_one_line(capsys, unwritable):
    from dataset.build_sudoku_dataset import main

    with pytest.raises(SystemExit) as e:
        main(["--output-dir", unwritable, "--generate-train", "2", "--generate-test", "1", "--no-progress"])
    assert e.value.code == 2
    _one_error_line(capsys.readouterr().err, unwritable)


def test_overwrite_refuses_a_directory_that_is_not_a_dataset(tmp_path, capsys):
    from dataset.build_sudoku_dataset import main

    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    args = ["--generate-train", "2", "--generate-test", "1", "--no-progress", "--overwrite"]
    with pytest.raises(SystemExit) as e:
        main(["--output-dir", str(precious), *args])
    assert e.value.code == 2
    _one_error_line(capsys.readouterr().err, str(precious), "not a dataset")
    assert (precious / "notes.txt").read_text() == "keep me"
    # a built dataset is replaced
    built = str(tmp_path / "sudoku")
    main(["--output-dir", built, *args])
    before = os.path.getmtime(os.path.join(built, "train", "dataset.json"))
    main(["--output-dir", built, *args])
    assert os.path.isfile(os.path.join(built, "identifiers.json"))
    assert os.path.getmtime(os.path.join(built, "train", "dataset.json")) >= before


def test_one_line_formatting():
    assert (
        one_line("Could not override 'a.b'.\nTo append use +a.b=1\nKey 'b' is not in struct\n    full_key: a.b")
        == "Could not override 'a.b'. To append use +a.b=1; Key 'b' is not in struct"
    )
    assert (
        one_line("Available options in 'encoder':\n\tlpn\n\tstandard\nConfig search path:\n\tx")
        == "Available options in 'encoder': lpn, standard"
    )


def test_only_platform_errors_are_one_line_a_bug_keeps_its_traceback(monkeypatch, capsys, tmp_path):
    """core.errors: a PlatformError subclass is bad input (one line, exit 1); a ValueError / KeyError /
    RuntimeError raised by the code is a crash and propagates with its traceback (the queue then retries it)."""
    import evaluate
    from core.errors import PlatformError, user_error_message

    class CustomInputError(PlatformError):
        pass

    assert user_error_message(CustomInputError("x.yaml: key 'a' = 3: bad")) == "x.yaml: key 'a' = 3: bad"
    for bug in (ValueError("shapes"), KeyError("k"), RuntimeError("size mismatch"), IndexError("i")):
        assert user_error_message(bug) is None
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "evaluate.py",
            "checkpoint=c",
            "data_path=d",
            f"hydra.run.dir={tmp_path / 'h'}",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ],
    )

    def buggy(cfg):
        raise RuntimeError("an internal bug")

    monkeypatch.setattr(evaluate, "run", buggy)
    with pytest.raises(RuntimeError, match="an internal bug"):
        evaluate._main()
    capsys.readouterr()
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "evaluate.py",
            f"hydra.run.dir={tmp_path / 'h'}",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ],
    )
    with pytest.raises(SystemExit) as e:  # a missing required key is bad input: one line naming it
        evaluate._main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and err.startswith("error: checkpoint= and data_path= required") and "\n" not in err


def test_the_demo_and_the_science_command_name_the_closest_key_of_a_misspelt_override(capsys):
    """`python -m training.demo lrr=…` (the README's first command takes overrides) and `experiments.science
    --override lrr=…` end with the closest known key, as pretrain.py does."""
    from experiments.science.common import ScienceError
    from experiments.science.recipe import resolve_recipe
    from training import demo

    with pytest.raises(SystemExit) as e:
        demo.main(["lrr=1e-3"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and err.count("\n") == 0, err
    assert err.endswith("did you mean lr?") and "+lrr" not in err, err
    with pytest.raises(ScienceError, match=r"Could not override 'lrr'.*did you mean lr\?$"):
        resolve_recipe("cfg_science", "standard", None, ["lrr=1e-3"])

"""Input files that are not UTF-8 text, malformed YAML, and metrics.jsonl lines with a non-finite step (issue 43,
item 8): each is one line naming the file (a PlatformError, so entry points print ``error: ...``), or, for a bad
metrics line, skipped with a warning -- never a UnicodeDecodeError / PyYAML / OverflowError traceback."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from core.errors import PlatformError, user_error_message
from core.io import InputFileError, read_json, read_omegaconf_yaml, read_text, read_yaml
from dataset.arc_sources import load_kaggle_subset
from dataset.build_arc_dataset import main as build_main
from dataset.errors import DatasetError
from dataset.metadata import load_metadata
from dataset.rule_labels import rule_label_table
from experiments.science.cli import main as science_main
from training import compare_runs, plot_run
from training.logging import _truncate_after
from training.runs import RunFilesError, read_metrics, read_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = b'{"p1": "caf\xe9"}'  # latin-1, not UTF-8: byte 0xe9 at offset 11
PUZZLE = {"train": [{"input": [[1, 0], [0, 1]], "output": [[2, 0], [0, 2]]}], "test": [{"input": [[1, 1], [0, 0]]}]}
SOLUTION = [[[2, 2], [0, 0]]]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------- the readers
def test_the_readers_name_the_file_and_the_byte(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(BAD)
    for read in (read_text, read_json, read_yaml, read_omegaconf_yaml):
        with pytest.raises(InputFileError) as e:
            read(str(p))
        assert str(e.value) == f"{p}: not UTF-8 text (byte 0xe9 at offset 11); save it as UTF-8"
        assert isinstance(e.value, PlatformError)
    p.write_text('{"a": [1,')
    with pytest.raises(DatasetError, match=r"x\.json: malformed JSON \(Expecting value: line 1 column 10"):
        read_json(str(p), DatasetError)
    y = tmp_path / "c.yaml"
    y.write_text("arch:\n  name: trm\nlr: [unclosed\n")
    for read in (read_yaml, read_omegaconf_yaml):
        with pytest.raises(InputFileError) as e:
            read(str(y))
        assert str(e.value) == (
            f"{y}: malformed YAML at line 4, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence from line 3, column 5)"
        )
    y.write_text("lr: 1e-4\nwd: ${lr}\n")
    assert read_yaml(str(y)) == {"lr": "1e-4", "wd": "${lr}"}  # PyYAML's safe_load: as written
    assert read_omegaconf_yaml(str(y)) == {"lr": 1e-4, "wd": 1e-4}  # as OmegaConf.load reads it
    with pytest.raises(InputFileError, match=r"nope\.yaml: file not found"):
        read_yaml(str(tmp_path / "nope.yaml"))


# ---------------------------------------------------------------------------------------------- ARC files
def _kaggle(tmp_path, challenges: bytes, solutions: bytes) -> str:
    (tmp_path / "p_training_challenges.json").write_bytes(challenges)
    (tmp_path / "p_training_solutions.json").write_bytes(solutions)
    return str(tmp_path / "p")


def test_non_utf8_arc_challenges_or_solutions_fail_in_one_line_naming_the_file(tmp_path, capsys):
    good_c, good_s = json.dumps({"p1": PUZZLE}).encode(), json.dumps({"p1": SOLUTION}).encode()
    assert len(load_kaggle_subset(_kaggle(tmp_path, good_c, good_s), "training")) == 1
    for which, (c, s) in {"challenges": (BAD, good_s), "solutions": (good_c, BAD)}.items():
        prefix = _kaggle(tmp_path, c, s)
        with pytest.raises(DatasetError, match=rf"p_training_{which}\.json: not UTF-8 text \(byte 0xe9 at offset 11"):
            load_kaggle_subset(prefix, "training")
        with pytest.raises(SystemExit) as e:  # the builder's command line: exit 2, one line
            build_main(
                ["--input-file-prefix", prefix, "--subsets", "training", "--test-set-name", "none"]
                + ["--output-dir", str(tmp_path / "o")]
            )
        line = _one_line(capsys.readouterr().err)
        assert e.value.code == 2 and line.startswith("error: ") and f"p_training_{which}.json: not UTF-8" in line
        assert not (tmp_path / "o").exists()


def test_non_utf8_science_input_files_and_groups_fail_in_one_line(tmp_path, capsys):
    """``python -m experiments.science --input-file-prefix P [--groups G]``: a non-UTF-8 puzzle file or groups
    file is refused before any work, exit 2, one line naming it."""
    d = tmp_path / "mine"
    d.mkdir()
    puzzles = {"training": ["a_1", "a_2"], "evaluation": ["a_3"]}
    for sub, ids in puzzles.items():
        (d / f"m_{sub}_challenges.json").write_text(json.dumps({i: PUZZLE for i in ids}))
        (d / f"m_{sub}_solutions.json").write_text(json.dumps({i: SOLUTION for i in ids}))
    groups = d / "groups.json"
    groups.write_bytes(b'{"a_1": "r\xe9d", "a_2": "x", "a_3": "x"}')
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit) as e:
        science_main(["--out", out, "--input-file-prefix", str(d / "m"), "--groups", str(groups)])
    line = _one_line(capsys.readouterr().err)
    assert e.value.code == 2 and f"{groups}: not UTF-8 text (byte 0xe9 at offset 10)" in line, line
    (d / "m_evaluation_challenges.json").write_bytes(b"{\xff}")
    with pytest.raises(SystemExit) as e:
        science_main(["--out", out, "--input-file-prefix", str(d / "m")])
    line = _one_line(capsys.readouterr().err)
    assert e.value.code == 2 and "m_evaluation_challenges.json: not UTF-8 text (byte 0xff at offset 1)" in line
    assert not os.path.exists(out)


def test_non_utf8_dataset_json_is_a_dataset_error_naming_it(tmp_path):
    split = tmp_path / "train"
    split.mkdir()
    (split / "dataset.json").write_bytes(b'{"pad_id": 0, "source": "\xff"}')
    with pytest.raises(DatasetError) as e:
        load_metadata(str(split))
    assert str(e.value) == f"{split / 'dataset.json'}: not UTF-8 text (byte 0xff at offset 25); save it as UTF-8"
    (split / "dataset.json").write_text("[1, 2]")
    with pytest.raises(DatasetError, match="expected a JSON object of dataset fields, got list"):
        load_metadata(str(split))


def test_non_utf8_rule_labels_file_is_a_dataset_error_naming_it(tmp_path):
    rules = tmp_path / "s_rules.json"
    rules.write_bytes(BAD)
    with pytest.raises(DatasetError) as e:
        rule_label_table(str(tmp_path), str(rules))
    assert str(e.value) == f"{rules}: not UTF-8 text (byte 0xe9 at offset 11); save it as UTF-8"


# ---------------------------------------------------------------------------------------------- run folders
def _run(root, name: str, lines: list[bytes], config: bytes = b"lr: 0.001\n") -> str:
    d = root / name
    d.mkdir()
    (d / "metrics.jsonl").write_bytes(b"".join(ln + b"\n" for ln in lines))
    (d / "config.yaml").write_bytes(config)
    return str(d)


GOOD = [b'{"step": 10, "train/loss": 2.0}', b'{"step": 20, "train/loss": 1.0}']
NON_FINITE = [
    b'{"step": Infinity, "train/loss": 0.1}',
    b'{"step": -Infinity, "train/loss": 0.2}',
    b'{"step": NaN, "train/loss": 0.3}',
    b'{"step": 1e400, "train/loss": 0.4}',  # overflows to inf
]
NOT_UTF8 = [b'{"step": 15, "train/loss": "\xe9"}', b'{"step": 16, "train/\xffloss": 0.5}']


@pytest.mark.parametrize("bad", [NON_FINITE, NOT_UTF8], ids=["non-finite step", "not UTF-8"])
def test_metrics_lines_with_a_non_finite_step_or_bad_bytes_are_skipped_with_a_warning(tmp_path, caplog, bad):
    """``{"step": Infinity}`` crashed plot_run and compare_runs (OverflowError), a non-UTF-8 byte anywhere in the
    file both of them (UnicodeDecodeError): such lines are skipped with a warning, as half-written ones are."""
    run = _run(tmp_path, "r", [GOOD[0], *bad, GOOD[1]])
    with caplog.at_level(logging.WARNING, logger="training.runs"):
        series = read_metrics(run)
    assert series == {"train/loss": ([10, 20], [2.0, 1.0])}
    assert f"skipped {len(bad)} line(s) that are not a JSON object with a finite step" in caplog.text
    out = str(tmp_path / "c.png")
    assert plot_run.main([run, "--out", out]) == out and os.path.getsize(out) > 0
    other = _run(tmp_path, "o", GOOD[:1])
    md = compare_runs.main([run, other])
    assert "| `train/loss` | min | 1 / **1 @20** | 2 / 2 @10 |" in md, md
    only_bad = _run(tmp_path, "bad", bad)
    with pytest.raises(RunFilesError, match=f"none of its {len(bad)} line.s. is a JSON object with a finite step"):
        read_metrics(only_bad)


def test_a_resumed_run_drops_damaged_metrics_lines_instead_of_crashing(tmp_path):
    run = _run(tmp_path, "r", [GOOD[0], b'{"step": 12, "x": "\xff"}', b"[1]", b'{"step": "s"}', GOOD[1]])
    _truncate_after(os.path.join(run, "metrics.jsonl"), 15)
    assert (tmp_path / "r" / "metrics.jsonl").read_bytes() == GOOD[0] + b"\n"


@pytest.mark.parametrize(
    "config, message",
    [
        (b"lr: \xff\n", "config.yaml: not UTF-8 text (byte 0xff at offset 4); save it as UTF-8"),
        (
            b"lr: [unclosed\n",
            "config.yaml: malformed YAML at line 2, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence from line 1, column 5)",
        ),
    ],
)
def test_a_bad_run_config_yaml_is_one_line_naming_the_file_and_line(tmp_path, capsys, config, message):
    run = _run(tmp_path, "r", GOOD, config=config)
    with pytest.raises(RunFilesError) as e:
        read_run_config(run)
    assert str(e.value) == os.path.join(run, message)
    other = _run(tmp_path, "o", GOOD)
    with pytest.raises(SystemExit) as ex:
        compare_runs.main([run, other])
    assert ex.value.code == 1 and _one_line(capsys.readouterr().err) == f"error: {os.path.join(run, message)}"


@pytest.mark.parametrize(
    "config, message",
    [
        (b"lr: \xff\n", "config.yaml: not UTF-8 text (byte 0xff at offset 4); save it as UTF-8"),
        (b"lr: [unclosed\n", "config.yaml: malformed YAML at line 2, column 1: expected ',' or ']'"),
    ],
)
def test_pretrain_on_a_bad_run_config_is_one_line(tmp_path, config, message):
    """``python pretrain.py --config-path <run dir> --config-name config`` (docs/training.md): Hydra reads the
    file; a non-UTF-8 or malformed one is one line naming it, exit 1 (it was a 40-line PyYAML traceback)."""
    run = _run(tmp_path, "r", GOOD, config=config)
    env = dict(os.environ, PYTHONPATH=ROOT, HYDRA_FULL_ERROR="1", TRM_JOB_ERROR_FILE=str(tmp_path / "job.error"))
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "pretrain.py"), "--config-path", run, "--config-name", "config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    line = _one_line(p.stderr)
    assert p.returncode == 1 and line.startswith(f"error: {os.path.join(run, message)}"), p.stderr
    assert (tmp_path / "job.error").read_text().strip() == line[len("error: ") :]  # the queue fails, no retry


def test_yaml_errors_from_omegaconf_are_bad_input_naming_the_file(tmp_path):
    y = tmp_path / "all_config.yaml"
    y.write_text("arch:\n  L_cycles: [4\n")
    with pytest.raises(Exception) as e:
        OmegaConf.load(str(y))
    assert user_error_message(e.value) == (
        f"{y}: malformed YAML at line 3, column 1: expected ',' or ']', but got '<stream end>' (while parsing a "
        "flow sequence from line 2, column 13)"
    )


def test_a_non_utf8_jobs_file_is_one_line_naming_it(tmp_path):
    jobs = tmp_path / "jobs.txt"
    jobs.write_bytes(b"[ ] echo caf\xe9\n")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "run_jobs.py"), str(jobs)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=str(tmp_path),
        timeout=60,
    )
    assert r.returncode == 2 and _one_line(r.stderr) == (
        f"run_jobs.py: error: {jobs}: not UTF-8 text (byte 0xe9 at offset 12); save it as UTF-8"
    )

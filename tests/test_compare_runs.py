"""python -m training.compare_runs: several run folders side by side (final / best metrics, differing config keys),
and the one declaration of metric direction (training.metrics.metric_direction) it uses."""

from __future__ import annotations

import json

import pytest
import yaml

from core.table import markdown_table
from training.checkpoint import FORMAT, save_checkpoint_atomic
from training.compare_runs import config_differences, load_runs, main
from training.metrics import metric_direction
from training.runs import flatten, read_run_config


def _config(lr: float, hidden: int, run: str, encoder=None) -> dict:
    return {
        "run_name": run,
        "checkpoint_path": f"checkpoints/p/{run}",
        "lr": lr,
        "seed": 0,
        "data_paths": ["data/arc"],
        "arch": {"name": "trm", "hidden_size": hidden, "L_cycles": 6},
        "encoder": encoder,
    }


def _run(root, name: str, acc: list[float], loss: list[float], summary: bool = True) -> str:
    d = root / name
    d.mkdir(parents=True)
    rows = [
        {
            "step": 100 * (i + 1),
            "train/exact_accuracy": a,
            "train/loss": l,
            "train/lr": 1e-4,
            "train/count": 8.0,
            "grad/total_norm": 1.0 + i,
        }
        for i, (a, l) in enumerate(zip(acc, loss))
    ]
    rows.append({"step": 100 * len(acc), "eval/all.exact_accuracy": acc[-1] / 2, "ARC/pass@1": acc[-1] / 4})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "run_name": name.upper(),
                    "status": "finished",
                    "stop_reason": "completed",
                    "steps": 100 * len(acc),
                    "total_steps": 100 * len(acc),
                }
            )
        )
    return str(d)


def test_metric_direction_is_max_for_accuracies_min_for_losses_none_for_the_rest():
    for k in (
        "train/exact_accuracy",
        "train/accuracy",
        "train/q_halt_accuracy",
        "eval/all.exact_accuracy",
        "eval/arc.accuracy",
        "ARC/pass@1",
        "ARC/pass@1000",
        "train/rule_exact",
    ):
        assert metric_direction(k) == "max", k
    for k in (
        "train/loss",
        "train/lm_loss",
        "train/q_halt_loss",
        "train/q_continue_loss",
        "eval/all.lm_loss",
        "train/kl",
        "train/rule_readout",
    ):
        assert metric_direction(k) == "min", k
    for k in (
        "train/lr",
        "train/count",
        "train/epoch",
        "train/examples_seen",
        "train/steps",
        "eval/all.steps",
        "grad/total_norm",
        "grad/encoder_norm",
        "train/encoder_cross_sample_var",
        "ARC/malformed_frac",
        "num_params",
        "train/decoder_frozen",
    ):
        assert metric_direction(k) is None, k


def test_the_config_is_read_from_config_yaml_else_the_hydra_file_else_the_checkpoint(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    (a / "config.yaml").write_text(yaml.safe_dump(_config(1e-4, 512, "a")))
    hydra = tmp_path / "outputs" / ".hydra" / "config.yaml"
    hydra.parent.mkdir(parents=True)
    hydra.write_text(yaml.safe_dump(_config(2e-4, 512, "b")))
    (b / "summary.json").write_text(json.dumps({"run_name": "b", "config_path": str(hydra)}))
    save_checkpoint_atomic({"format": FORMAT, "step": 10, "config": _config(3e-4, 256, "c")}, str(c / "step_10.pt"))
    assert read_run_config(str(a)) == (_config(1e-4, 512, "a"), str(a / "config.yaml"))
    assert read_run_config(str(b)) == (_config(2e-4, 512, "b"), str(hydra))
    assert read_run_config(str(c)) == (_config(3e-4, 256, "c"), str(c / "step_10.pt"))
    assert read_run_config(str(tmp_path / "outputs")) == (None, None)
    assert flatten({"arch": {"hidden_size": 8, "loss": {}}, "lr": 1}) == {
        "arch.hidden_size": 8,
        "arch.loss": {},
        "lr": 1,
    }


def test_compare_runs_tables_final_and_best_metrics_and_the_config_keys_that_differ(tmp_path, capsys):
    a = _run(tmp_path, "base", acc=[0.1, 0.6, 0.4], loss=[2.0, 0.5, 0.9])  # best mid-run: 0.6 @200, 0.5 @200
    b = _run(tmp_path, "wide", acc=[0.2, 0.3, 0.5], loss=[1.5, 1.0, 0.7])
    (tmp_path / "base" / "config.yaml").write_text(yaml.safe_dump(_config(1e-4, 512, "base")))
    (tmp_path / "wide" / "config.yaml").write_text(
        yaml.safe_dump(_config(1e-4, 1024, "wide", encoder={"name": "standard", "num_layers": 2}))
    )
    md = main([a, b, "--out", str(tmp_path / "t.md")])
    assert capsys.readouterr().out == md == (tmp_path / "t.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "|  | BASE | WIDE |"  # the runs by summary.json's run_name
    assert "| status | finished (completed), 300 / 300 steps | finished (completed), 300 / 300 steps |" in lines
    # differing keys only, dotted; run_name / checkpoint_path (always different) left out; a section that is null in
    # one run and set in the other: key by key
    assert "| `arch.hidden_size` | 512 | 1024 |" in lines
    assert "| `encoder.name` | (encoder: null) | standard |" in lines
    assert "| `encoder.num_layers` | (encoder: null) | 2 |" in lines
    assert not any(
        ln.startswith(("| `lr`", "| `seed`", "| `run_name`", "| `checkpoint_path`", "| `arch.name`")) for ln in lines
    )
    assert (
        "Config keys that differ (5 other keys the same in every run; run_name and checkpoint_path left out):" in lines
    )
    # final / best @step; best = max for accuracies, min for losses; the best run of a row in bold
    assert "| `train/exact_accuracy` | max | 0.4 / **0.6 @200** | 0.5 / 0.5 @300 |" in lines
    assert "| `train/loss` | min | 0.9 / **0.5 @200** | 0.7 / 0.7 @300 |" in lines
    assert "| `ARC/pass@1` | max | 0.1 / 0.1 @300 | 0.125 / **0.125 @300** |" in lines
    metric_rows = [ln.split("|")[1].strip() for ln in lines if ln.startswith("| `") and "@" in ln]
    assert metric_rows == ["`ARC/pass@1`", "`eval/all.exact_accuracy`", "`train/exact_accuracy`", "`train/loss`"]
    # no best for lr, counts, gradient norms
    assert "train/lr" not in md and "grad/total_norm" not in md and "train/count" not in md
    # --metrics filters
    md = main([a, b, "--metrics", "eval/", "pass@"])
    assert "`ARC/pass@1`" in md and "`eval/all.exact_accuracy`" in md and "`train/loss`" not in md


def test_compare_runs_without_config_or_metrics_file_and_bad_folders(tmp_path, capsys):
    a = _run(tmp_path, "a", acc=[0.1], loss=[1.0])
    b = tmp_path / "old"  # a run from before metrics.jsonl: its summary.json's final / best
    b.mkdir()
    (b / "summary.json").write_text(
        json.dumps(
            {
                "run_name": "old",
                "final": {"train/loss": 0.8, "train/lr": 1e-4},
                "best": {"train/loss": 0.6},
                "best_step": {"train/loss": 50},
            }
        )
    )
    rows = load_runs([a, str(b)])
    assert [r.label for r in rows] == ["A", "old"] and config_differences(rows) == ([], 0)
    md = main([a, str(b)])
    assert "Config: 0 of the 2 runs with a config found; nothing to compare." in md
    assert "| `train/loss` | min | 1 / 1 @100 | 0.8 / **0.6 @50** |" in md and "train/lr" not in md
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([a, str(tmp_path / "missing")])
    assert e.value.code == 1 and "missing: not a run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "empty")])
    assert e.value.code == 1 and "metrics.jsonl: not found" in capsys.readouterr().err


def test_markdown_table_is_shared_by_the_comparison_commands():
    assert markdown_table(["a", "b"], [[1, "x"], [2, "y"]], right=[True]) == [
        "| a | b |",
        "|---:|---|",
        "| 1 | x |",
        "| 2 | y |",
    ]


def test_the_science_table_and_compare_runs_share_one_command_line(tmp_path, capsys):
    """experiments.science.compare is the science view through training.compare_runs.table_command: the same
    --out (written atomically, the printed text, folders made) and the same one-line refusal of an --out that is a
    directory, for both commands."""
    from experiments.science import compare as science_compare
    from training import compare_runs

    assert science_compare.table_command is compare_runs.table_command
    run = _run(tmp_path, "base", acc=[0.1, 0.6], loss=[2.0, 0.5])
    sci = tmp_path / "f8"
    sci.mkdir()
    fam = {"runs": {"standard": {"pass@1": 0.5}}, "count": 2, "train_runs": {"standard": {"pass@1": 1.0}}}
    fam["train_count"] = 2
    res = {
        "settings": {"data": {"seed": 3}, "overrides": ["lr=1e-3", "checkpoint_every=10"]},
        "families": {"colour_map": fam, "all": fam},
        "runs": {"standard": {"status": "ok", "steps": 40, "train_seconds": 12.0}},
    }
    (sci / "science.json").write_text(json.dumps(res))
    for i, (mod, args) in enumerate(((compare_runs, [run]), (science_compare, [str(sci)]))):
        out = tmp_path / f"made{i}" / "t.md"
        md = mod.main(args + ["--out", str(out)])
        assert capsys.readouterr().out == md == out.read_text()
        with pytest.raises(SystemExit) as e:
            mod.main(args + ["--out", str(tmp_path)])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 1 and err.count("\n") == 0 and err.endswith(f"-> {tmp_path}: Is a directory")
    assert "| f8: standard | (baseline) `lr=1e-3` | 3, 0 | 40 | 0.30 | **0.50 / 1.00** | 0.50 / 1.00 |" in md


def test_a_science_out_stands_for_its_runs_training_folders(tmp_path, capsys, caplog):
    """compare_runs given a science --out compares its runs' training folders (runs/<name>/checkpoint, in
    science.json's order; a run without one is left out) through the same reader as any run folder: a metrics line
    with a non-finite step is skipped with a warning there too; a science --out without a trained run is one line."""
    sci = tmp_path / "f8"
    for name, acc in (("standard", [0.2, 0.7]), ("control", [0.1, 0.3])):
        _run(sci / "runs" / name, "checkpoint", acc=acc, loss=[1.0, 0.8])
        (sci / "runs" / name / "checkpoint" / "summary.json").write_text(json.dumps({"run_name": f"science-{name}"}))
        (sci / "runs" / name / "checkpoint" / "config.yaml").write_text(
            yaml.safe_dump(dict(_config(1e-3, 64, f"science-{name}"), encoder={"zero_demos": name == "control"}))
        )
    with open(sci / "runs" / "standard" / "checkpoint" / "metrics.jsonl", "a") as f:
        f.write('{"step": Infinity, "train/exact_accuracy": 0.99}\n')
    runs = {"standard": {"status": "ok"}, "control": {"status": "ok"}, "lpn": {"status": "train_failed"}}
    (sci / "science.json").write_text(json.dumps({"settings": {}, "families": {}, "runs": runs}))
    base = _run(tmp_path, "base", acc=[0.1, 0.6], loss=[2.0, 0.5])
    with caplog.at_level("WARNING"):
        md = main([str(sci), base])
    assert "skipped 1 line(s)" in caplog.text and "0.99" not in md
    lines = md.splitlines()
    assert lines[0] == "|  | science-standard | science-control | BASE |"
    assert "| `train/exact_accuracy` | max | 0.7 / **0.7 @200** | 0.3 / 0.3 @200 | 0.6 / 0.6 @200 |" in lines
    assert "| `encoder.zero_demos` | false | true | ? |" in lines  # base: no config.yaml
    empty = tmp_path / "untrained"
    empty.mkdir()
    (empty / "science.json").write_text(json.dumps({"runs": {"standard": {"status": "train_failed"}}}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([str(empty)])
    err = capsys.readouterr().err.strip()
    assert (
        e.value.code == 1
        and err == f"error: {empty}: a science --out without a trained run (no runs/<name>/checkpoint)"
    )

"""python -m training.plot_run: training curves from a run directory's metrics.jsonl, no W&B.

The metrics.jsonl here is written by the test (the format training/logging.py appends: one JSON object per log
call, ``{"step": N, "<metric>": value, ...}``); tests/test_training_loop.py draws a real run's file."""

from __future__ import annotations

import json
import os

import pytest

from training.plot_run import PlotError, curves_figure, main, read_metrics, runs_figure


def _write_run(run_dir, extra_lines=()) -> str:
    """An ETRM-like run: train lines every 10 steps (the window at step 10 had no halted sample: train/count 0),
    evaluations at 20 and 40, encoder diagnostics at 20 and 40."""
    os.makedirs(run_dir, exist_ok=True)
    rows = [{"step": 0, "num_params": 1000.0}]
    for step in (10, 20, 30, 40):
        rows.append(
            {
                "step": step,
                "train/loss": 3.0 - step / 20,
                "train/lm_loss": 2.9 - step / 20,
                "train/q_halt_loss": 0.1,
                "train/kl": 0.5,
                "train/count": 0.0 if step == 10 else 12.0,
                "train/accuracy": 0.0 if step == 10 else 0.5 + step / 100,
                "train/exact_accuracy": 0.0 if step == 10 else step / 100,
                "train/lr": 1e-4 * step,
                "grad/total_norm": 1.0,
                "grad/encoder_norm": 0.2,
                "grad/inner_norm": 0.9,
            }
        )
    for step in (20, 40):
        rows.append(
            {
                "step": step,
                "eval/all.accuracy": 0.6,
                "eval/all.exact_accuracy": step / 200,
                "eval/all.lm_loss": 1.5,
                "eval/all.steps": 4.0,
                "eval/num_examples": 60.0,
                "ARC/pass@1": 0.1,
                "ARC/pass@2": 0.2,
                "ARC/pass@10": 0.3,
            }
        )
        rows.append(
            {
                "step": step,
                "train/encoder_cross_sample_var": 0.2,
                "train/encoder_output_std": 1.0,
                "train/encoder_context_scale": 0.9,
            }
        )
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.writelines(extra_lines)
    return path


def test_curves_have_labelled_panels_for_loss_accuracy_lr_gradients_and_encoder_health(tmp_path):
    _write_run(str(tmp_path / "run"), extra_lines=['{"step": 50, "train/lo'])  # a half-written last line
    series = read_metrics(str(tmp_path / "run"))
    assert series["train/loss"][0] == [10, 20, 30, 40] and "train/lo" not in series
    fig = curves_figure(series, "run")
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert list(panels) == ["loss", "accuracy", "learning rate", "gradient norms", "encoder health"]
    for title, ax in panels.items():
        assert ax.get_xlabel() == "optimizer step" and ax.get_ylabel(), title
    legend = {t: [x.get_text() for x in ax.get_legend().get_texts()] for t, ax in panels.items()}
    assert legend["loss"] == ["eval/all.lm_loss", "train/kl", "train/lm_loss", "train/loss", "train/q_halt_loss"]
    assert panels["loss"].get_yscale() == "log" and panels["loss"].get_ylabel() == "loss (log scale)"
    # pass@1 / pass@2 only (not pass@10)
    assert legend["accuracy"] == [
        "ARC/pass@1",
        "ARC/pass@2",
        "eval/all.accuracy",
        "eval/all.exact_accuracy",
        "train/accuracy",
        "train/exact_accuracy",
    ]
    lines = {ln.get_label(): ln for ln in panels["accuracy"].get_lines()}
    # the window without a halted sample (step 10) has no accuracy: not drawn as a dive to 0
    assert list(lines["train/accuracy"].get_xdata()) == [20, 30, 40]
    assert list(panels["learning rate"].get_lines()[0].get_ydata()) == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
    assert "grad/encoder_norm starvation threshold" in legend["gradient norms"]
    assert legend["encoder health"] == [
        "train/encoder_context_scale",
        "train/encoder_cross_sample_var",
        "train/encoder_output_std",
        "train/encoder_cross_sample_var collapse threshold",
    ]


def test_a_trm_run_has_no_encoder_panel_and_the_cli_writes_the_png(tmp_path, capsys):
    run = str(tmp_path / "trm")
    path = _write_run(run)
    with open(path) as f:  # drop the encoder metrics: a TRM run
        rows = [
            {k: v for k, v in r.items() if not k.startswith(("train/encoder", "grad/encoder"))}
            for r in map(json.loads, f)
        ]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if len(r) > 1)
    titles = [ax.get_title() for ax in curves_figure(read_metrics(run), "trm").axes if ax.get_title()]
    assert titles == ["loss", "accuracy", "learning rate", "gradient norms"]
    assert main([run]) == os.path.join(run, "curves.png")
    assert capsys.readouterr().out.strip() == os.path.join(run, "curves.png")
    out = str(tmp_path / "elsewhere.png")
    assert main([path, "--out", out]) == out  # the metrics.jsonl path works too
    for png in (os.path.join(run, "curves.png"), out):
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(png) > 10_000


def test_errors_name_the_file(tmp_path, capsys):
    with pytest.raises(PlotError, match="metrics.jsonl: not found"):
        read_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(PlotError, match="no metrics logged yet"):
        read_metrics(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "num_params": 5.0}\n')
    with pytest.raises(PlotError, match="none of its metrics"):
        curves_figure(read_metrics(str(tmp_path)), "x")
    with pytest.raises(SystemExit) as e:  # the CLI: one line, exit 1
        main([str(tmp_path / "missing")])
    assert e.value.code == 1 and "metrics.jsonl: not found" in capsys.readouterr().err


def _panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def _summary(run_dir, run_name) -> None:
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"run_name": run_name, "status": "finished"}, f)


def test_curves_on_the_same_values_stay_visible_and_the_title_is_the_run_name(tmp_path):
    """train/lm_loss equal to train/loss and an evaluation's exact accuracy equal to the train one used to be drawn
    exactly on top of each other (same solid / dashed style): every line of a panel now has its own dash pattern and
    marker, and the lines drawn first are wider. The figure is titled with summary.json's run_name, not the
    folder's name."""
    run = str(tmp_path / "folder-name")
    rows = [
        {
            "step": s,
            "train/loss": 2.0 / s,
            "train/lm_loss": 2.0 / s,
            "train/exact_accuracy": s / 100,
            "train/count": 8.0,
            "eval/all.exact_accuracy": s / 100,
        }
        for s in range(10, 210, 10)
    ]
    os.makedirs(run)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    _summary(run, "trm-seed3")
    fig, default = runs_figure([run])
    assert fig._suptitle.get_text() == "trm-seed3" and default == os.path.join(run, "curves.png")
    for title in ("loss", "accuracy"):
        lines = _panels(fig)[title].get_lines()
        assert len(lines) == 2
        looks = {(str(ln.get_linestyle()), ln.get_marker()) for ln in lines}
        assert len(looks) == 2, looks  # distinct dash pattern and marker
        assert lines[0].get_linewidth() > lines[1].get_linewidth()  # the one underneath shows around the other
        assert lines[0].get_markevery() != lines[1].get_markevery()  # markers staggered, not on top of each other
    # without summary.json: the folder's name
    os.remove(os.path.join(run, "summary.json"))
    assert runs_figure([run])[0]._suptitle.get_text() == "folder-name"


def test_several_runs_are_overlaid_with_the_run_names_in_the_legend(tmp_path, capsys):
    """python -m training.plot_run A B: one figure, the same panels, every run's curves in each panel (a colour per
    run, a dash pattern per metric), the run names in the legends; written beside the runs by default."""
    a, b = str(tmp_path / "p" / "a"), str(tmp_path / "p" / "b")
    _write_run(a)
    _write_run(b)
    _summary(a, "lr1e-4")
    _summary(b, "lr3e-4")
    fig, _ = runs_figure([a, b])
    panels = _panels(fig)
    assert list(panels) == ["loss", "accuracy", "learning rate", "gradient norms", "encoder health"]
    assert fig._suptitle.get_text() == "lr1e-4 vs lr3e-4"
    for title, ax in panels.items():
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[:2] == ["lr1e-4", "lr3e-4"], title
    acc = panels["accuracy"]
    assert len(acc.get_lines()) == 2 * 6  # 6 accuracy metrics, both runs
    assert {ln.get_color() for ln in acc.get_lines()} == {"C0", "C1"}
    assert "train/exact_accuracy" in [t.get_text() for t in acc.get_legend().get_texts()]
    # lr: the two runs' identical curves stay visible (different width / marker)
    lr = panels["learning rate"].get_lines()
    assert lr[0].get_linewidth() > lr[1].get_linewidth() and lr[0].get_marker() != lr[1].get_marker()
    out = main([a, b])
    assert out == str(tmp_path / "p" / "curves_lr1e-4_vs_lr3e-4.png") and os.path.getsize(out) > 10_000
    assert capsys.readouterr().out.strip() == out
    # two runs of the same name: the labels add the folders
    _summary(b, "lr1e-4")
    legend = [t.get_text() for t in _panels(runs_figure([a, b])[0])["loss"].get_legend().get_texts()]
    assert legend[:2] == [f"lr1e-4 ({a})", f"lr1e-4 ({b})"]

"""Held-out and train-fit pass@1 against training steps: how far a science run is from the target, and whether
more steps (or a bigger model, another --out) would close the gap.

``python -m experiments.science --out DIR --curve --override checkpoint_keep=null`` keeps every checkpoint
(``checkpoint_every`` steps apart) and, after the usual report, evaluates each one with evaluate.py on the
held-out puzzles and on the train-fit set (under ``runs/<run>/curve/step_<N>/``; an evaluation that exists is
reused), then writes DIR/curve.json, DIR/curve.md (one table per run: step x family) and DIR/curve.png.

``python -m experiments.science.curve DIR [DIR ...] --out FIG.png`` draws the curves of several --out dirs in one
figure (each labelled with its --override's, e.g. one dir per model size): the curve against model size.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional, Sequence

from core.errors import user_errors
from core.io import atomic_write, read_json, write_json_atomic
from experiments.science.common import (
    CONTROL,
    FIT_EVAL,
    HEADLINE_ROW,
    HELDOUT_EVAL,
    TOTAL_ROW,
    ScienceError,
    evaluate_checkpoint,
    say,
)
from experiments.science.data import ScienceData
from experiments.science.report import SCORED, family_table
from training.checkpoint import list_checkpoints

CURVE_DIR = "curve"


def _step_table(
    data: ScienceData,
    heldout: list[str],
    fit: Optional[tuple[str, list[str]]],
    name: str,
    run_dir: str,
    step: int,
    path: str,
    eval_overrides: list[str],
    newest: bool,
) -> Optional[dict]:
    """One checkpoint's held-out (and train-fit) pass@1 per family, or None when an evaluation failed."""
    # the newest checkpoint's evaluations are the report's own (reused); older ones go under curve/step_<N>/
    sub = os.path.join(CURVE_DIR, f"step_{step}")
    held_sub, fit_sub = (HELDOUT_EVAL, FIT_EVAL) if newest else (os.path.join(sub, "heldout"), os.path.join(sub, "fit"))
    _, failed = evaluate_checkpoint(
        name, run_dir, data.built, held_sub, heldout, step, eval_overrides, "the held-out puzzles", checkpoint=path
    )
    if failed is not None:
        return None
    fit_arg = None
    if fit is not None:
        _, failed = evaluate_checkpoint(
            name, run_dir, fit[0], fit_sub, fit[1], step, eval_overrides, "the train-fit set", checkpoint=path
        )
        if failed is None:
            fit_arg = (fit[1], {name: read_json(os.path.join(run_dir, fit_sub, "predictions.json"), ScienceError)})
    pred = read_json(os.path.join(run_dir, held_sub, "predictions.json"), ScienceError)
    table = family_table(data.rules, {name: pred}, train_fit=fit_arg, headline=data.headline)
    return {
        "step": step,
        "heldout": {f: row["runs"][name]["pass@1"] for f, row in table.items()},
        "fit": {f: row["train_runs"][name]["pass@1"] for f, row in table.items() if fit_arg is not None},
    }


def run_curve(
    out: str,
    data: ScienceData,
    fit: Optional[tuple[str, list[str]]],
    runs: dict[str, dict],
    eval_overrides: Sequence[str],
    title: str = "",
) -> dict:
    """Evaluate every kept checkpoint of every scored run (the science command's evaluate.py stage,
    :func:`experiments.science.common.evaluate_checkpoint`); write curve.json / curve.md / curve.png in ``out``."""
    curve: dict[str, Any] = {"title": title, "runs": {}}
    heldout = sorted(p for p, r in data.rules.items() if r["subset"] == "evaluation")
    for name, rec in runs.items():
        if rec.get("status") not in SCORED:
            continue
        cks = list_checkpoints(os.path.join(rec["run_dir"], "checkpoint"))
        if len(cks) < 2:
            say(
                f"curve: {name} keeps {len(cks)} checkpoint(s); pass --override checkpoint_keep=null to keep "
                "every one (checkpoint_every steps apart)"
            )
        points = [
            _step_table(
                data,
                heldout,
                fit,
                name,
                rec["run_dir"],
                step,
                path,
                list(eval_overrides),
                newest=step == rec.get("evaluated_step"),
            )
            for step, path in cks
        ]
        curve["runs"][name] = [p for p in points if p is not None]
    write_json_atomic(os.path.join(out, "curve.json"), curve)
    md = render_markdown(curve)
    atomic_write(os.path.join(out, "curve.md"), lambda f: f.write(md))
    png = plot([curve], os.path.join(out, "curve.png"))
    say(f"curve: wrote {os.path.join(out, 'curve.md')} and {png}")
    return curve


def render_markdown(curve: dict) -> str:
    lines = [f"# Held-out vs steps{': ' + curve['title'] if curve.get('title') else ''}", ""]
    for name, points in curve["runs"].items():
        if not points:
            continue
        top = [r for r in (HEADLINE_ROW, TOTAL_ROW) if r in points[0]["heldout"]]
        fams = top + sorted(f for f in points[0]["heldout"] if f not in top)
        lines += [
            f"## {name}",
            "",
            "pass@1 held-out / train fit (training puzzles)",
            "",
            "| step | " + " | ".join(fams) + " |",
            "|---" * (len(fams) + 1) + "|",
        ]
        for p in points:
            cells = [
                f"{p['heldout'][f]:.2f} / {p['fit'][f]:.2f}" if f in p["fit"] else f"{p['heldout'][f]:.2f}"
                for f in fams
            ]
            lines.append(f"| {p['step']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(curves: Sequence[dict], path: str) -> str:
    """Two panels (held-out, train fit): overall pass@1 against step, one line per run of every curve (the
    zero-demo control dashed)."""
    from matplotlib.figure import Figure  # optional dependency, only when drawing

    fig = Figure(figsize=(11, 5))
    axes = fig.subplots(1, 2, sharey=True)
    for c in curves:
        for name, points in c["runs"].items():
            if not points:
                continue
            label = f"{c['title']}: {name}" if c.get("title") else name
            style = "--" if name == CONTROL else "-"
            steps = [p["step"] for p in points]
            top = HEADLINE_ROW if HEADLINE_ROW in points[0]["heldout"] else TOTAL_ROW  # the headline figure
            axes[0].plot(steps, [p["heldout"][top] for p in points], style, marker="o", label=label)
            if all(top in p["fit"] for p in points):
                axes[1].plot(steps, [p["fit"][top] for p in points], style, marker="o", label=label)
    for ax, what in zip(axes, ("held-out puzzles (rules never seen)", "train fit (training puzzles)")):
        ax.set_title(f"pass@1, {what}")
        ax.set_xlabel("training step")
        ax.set_ylim(-0.02, 1.02)
        ax.axhline(0.9, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("pass@1 (the headline families)")
    handles, labels = axes[0].get_legend_handles_labels()
    rows = -(-len(labels) // 2)  # below both panels, two columns: long --override labels overlap no curve
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, min(0.4, 0.05 + 0.055 * rows), 1, 1))
    fig.savefig(path, dpi=110)
    return path


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.science.curve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("dirs", nargs="+", help="science --out dirs that hold curve.json (run with --curve)")
    ap.add_argument("--out", required=True, help="the figure to write (.png)")
    a = ap.parse_args(argv)
    with user_errors():
        curves = []
        for d in a.dirs:
            c = read_json(os.path.join(d, "curve.json"), ScienceError)
            if not c.get("title"):
                c["title"] = os.path.basename(os.path.normpath(d))
            curves.append(c)
        path = plot(curves, a.out)
    print(path)
    return path


if __name__ == "__main__":
    main()

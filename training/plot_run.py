"""Training curves of a run, from its own files (no W&B needed).

    python -m training.plot_run checkpoints/<project>/<run> [--out curves.png]

Reads ``<run dir>/metrics.jsonl`` (one JSON object per log call, ``{"step": N, "<metric>": value, ...}``, written
by the training loop; the path of such a file works too) and draws one panel per group against the optimizer step,
each with labelled axes; a panel whose metrics the run never logged is left out:

* loss: ``train/loss``, ``train/lm_loss``, ``train/q_halt_loss``, ``train/kl``, ... and the evaluations'
  ``eval/<set>.lm_loss`` (log scale when every value is positive);
* accuracy: train exact / token accuracy, every evaluation's ``eval/<set>.exact_accuracy`` / ``.accuracy`` and ARC
  ``pass@1`` / ``pass@2`` (evaluation curves dashed; train accuracies are over the samples that halted, so log
  windows where none did, ``train/count`` 0, are not drawn);
* learning rate: ``train/lr``;
* gradient norms: ``grad/total_norm``, ``grad/inner_norm``, ``grad/encoder_norm`` (ETRM: the 0.05
  gradient-starvation line of docs/metrics.md);
* encoder health (ETRM): ``train/encoder_cross_sample_var`` (the 0.05 collapse line), ``train/encoder_output_std``,
  ``train/encoder_token_std``, ``train/encoder_context_scale``.

Writes ``<run dir>/curves.png`` by default and prints its path.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from typing import Any, Callable, NamedTuple, Optional, Sequence

from core.errors import PlatformError, user_errors
from training.report import METRICS_FILE

log = logging.getLogger(__name__)

Series = dict[str, tuple[list[int], list[float]]]


class PlotError(PlatformError, ValueError):
    """No metrics to plot (the message names the file)."""


class Panel(NamedTuple):
    title: str
    ylabel: str
    select: Callable[[str], bool]
    log_scale: bool = False
    # (value, label) horizontal reference lines, drawn when a metric named in the label is in the panel
    thresholds: tuple[tuple[float, str], ...] = ()


_EVAL_SET_METRIC = re.compile(r"^eval/[^/]+\.(accuracy|exact_accuracy|lm_loss)$")


def _is_loss(k: str) -> bool:
    return (k.startswith("train/") and (k.endswith("_loss") or k in ("train/loss", "train/kl"))) or \
        (_EVAL_SET_METRIC.match(k) is not None and k.endswith(".lm_loss"))


def _is_accuracy(k: str) -> bool:
    return k in ("train/exact_accuracy", "train/accuracy", "ARC/pass@1", "ARC/pass@2") or \
        (_EVAL_SET_METRIC.match(k) is not None and not k.endswith(".lm_loss"))


PANELS = (
    Panel("loss", "loss", _is_loss, log_scale=True),
    Panel("accuracy", "fraction correct", _is_accuracy),
    Panel("learning rate", "learning rate", lambda k: k == "train/lr"),
    Panel("gradient norms", "L2 norm (before clipping)", lambda k: k.startswith("grad/") and k.endswith("_norm"),
          log_scale=True, thresholds=((0.05, "grad/encoder_norm starvation threshold"),)),
    Panel("encoder health", "value", lambda k: k in ("train/encoder_cross_sample_var", "train/encoder_output_std",
                                                      "train/encoder_token_std", "train/encoder_context_scale"),
          thresholds=((0.05, "train/encoder_cross_sample_var collapse threshold"),)),
)


def _metrics_path(run_dir: str) -> str:
    return run_dir if os.path.isfile(run_dir) else os.path.join(run_dir, METRICS_FILE)


def read_metrics(run_dir: str) -> Series:
    """``{metric: (steps, values)}`` from ``<run_dir>/metrics.jsonl`` (or that file's own path). Lines that are
    not a JSON object with a ``step`` (e.g. a half-written last line of a running run) are skipped with a
    warning."""
    path = _metrics_path(run_dir)
    if not os.path.isfile(path):
        raise PlotError(f"{path}: not found (is {run_dir} a run directory of this platform's training loop?)")
    series: Series = {}
    skipped = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step = int(rec["step"])
            except (ValueError, TypeError, KeyError):
                skipped += 1
                continue
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    steps, values = series.setdefault(k, ([], []))
                    steps.append(step)
                    values.append(float(v))
    if skipped:
        log.warning("%s: skipped %d line(s) that are not a JSON object with a step", path, skipped)
    if not series:
        raise PlotError(f"{path}: no metrics logged yet")
    return series


HALTED_ONLY = ("train/accuracy", "train/exact_accuracy", "train/q_halt_accuracy", "train/steps")


def drop_windows_without_halts(series: Series) -> Series:
    """The train metrics taken over halted samples (docs/metrics.md) have no value in a log window where no sample
    halted (``train/count`` 0; they are logged as 0): those points are dropped, so the curve does not dive to 0."""
    empty = {s for s, c in zip(*series.get("train/count", ([], []))) if c == 0}
    if not empty:
        return series
    out = dict(series)
    for k in HALTED_ONLY:
        if k in series:
            kept = [(s, v) for s, v in zip(*series[k]) if s not in empty]
            out[k] = ([s for s, _ in kept], [v for _, v in kept])
    return out


def _draw_panel(ax, panel: Panel, keys: list[str], series: Series) -> None:
    for k in keys:
        steps, values = series[k]
        evaluation = not k.startswith(("train/", "grad/"))
        ax.plot(steps, values, linestyle="--" if evaluation else "-",
                marker="o" if evaluation or len(steps) < 12 else None, markersize=3, label=k)
    for value, label in panel.thresholds:
        if label.split()[0] in keys:
            ax.axhline(value, color="grey", linestyle=":", linewidth=1, label=label)
    finite = [v for k in keys for v in series[k][1] if math.isfinite(v)]
    if panel.log_scale and finite and min(finite) > 0:
        ax.set_yscale("log")
        ax.set_ylabel(f"{panel.ylabel} (log scale)")
    else:
        ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title)
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def curves_figure(series: Series, title: str) -> Any:
    """The matplotlib ``Figure`` of :data:`PANELS` over ``series`` (panels without metrics left out); a plain
    Figure, outside pyplot's state (nothing to close; any backend)."""
    from matplotlib.figure import Figure  # optional dependency, only when drawing

    series = drop_windows_without_halts(series)
    panels = [(p, [k for k in sorted(series) if p.select(k)]) for p in PANELS]
    panels = [(p, keys) for p, keys in panels if keys]
    if not panels:
        raise PlotError(f"{title}: none of its metrics ({', '.join(sorted(series)[:5])}, ...) is a loss, accuracy, "
                        "learning rate, gradient norm or encoder statistic")
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(5.4 * ncols, 4.0 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (panel, keys) in zip(axes.flat, panels):
        _draw_panel(ax, panel, keys, series)
    fig.suptitle(f"{title}: training curves (metrics.jsonl)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_run(run_dir: str, out: Optional[str] = None) -> str:
    """Draw the run's curves (see the module docstring) to ``out`` (default ``<run_dir>/curves.png``); returns
    the PNG path."""
    series = read_metrics(run_dir)
    run_path = os.path.dirname(os.path.abspath(run_dir)) if os.path.isfile(run_dir) else run_dir
    fig = curves_figure(series, os.path.basename(os.path.normpath(run_path)))
    out = out or os.path.join(run_path, "curves.png")
    try:
        fig.savefig(out, dpi=90)
    except OSError as e:
        raise PlotError(f"{out}: cannot write the picture ({e.strerror or e}); choose another --out") from None
    return out


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m training.plot_run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="the run's checkpoint directory (holds metrics.jsonl), or a metrics.jsonl")
    ap.add_argument("--out", default=None, help="PNG path (default: <run_dir>/curves.png)")
    a = ap.parse_args(argv)
    with user_errors():
        path = plot_run(a.run_dir, a.out)
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])

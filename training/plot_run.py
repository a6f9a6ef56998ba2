"""Training curves of one run, or of several runs overlaid, from their own files (no W&B needed).

    python -m training.plot_run checkpoints/<project>/<run> [--out curves.png]
    python -m training.plot_run checkpoints/<project>/<run A> checkpoints/<project>/<run B> ... [--out PNG]

Reads ``<run dir>/metrics.jsonl`` (one JSON object per log call, ``{"step": N, "<metric>": value, ...}``, written
by the training loop; the path of such a file works too) and draws one panel per group against the optimizer step,
each with labelled axes; a panel whose metrics no run logged is left out:

* loss: ``train/loss``, ``train/lm_loss``, ``train/q_halt_loss``, ``train/kl``, ... and the evaluations'
  ``eval/<set>.lm_loss`` (log scale when every value is positive);
* accuracy: train exact / token accuracy, every evaluation's ``eval/<set>.exact_accuracy`` / ``.accuracy`` and ARC
  ``pass@1`` / ``pass@2`` (train accuracies are over the samples that halted, so log windows where none did,
  ``train/count`` 0, are not drawn);
* learning rate: ``train/lr``;
* gradient norms: ``grad/total_norm``, ``grad/inner_norm``, ``grad/encoder_norm`` (ETRM: the 0.05
  gradient-starvation line of docs/metrics.md);
* encoder health (ETRM): ``train/encoder_cross_sample_var`` (the 0.05 collapse line), ``train/encoder_output_std``,
  ``train/encoder_token_std``, ``train/encoder_context_scale``.

Every line of a panel has its own dash pattern and marker (hollow, staggered along the line), and the lines drawn
first are wider: curves on the same values (``train/lm_loss`` on ``train/loss`` when no other term adds to the loss,
an evaluation's exact accuracy on the train one) all stay visible. One run: a colour per metric, titled with the
run's name (summary.json's ``run_name``, else the folder's name). Several runs: a colour and a marker per run, a
dash pattern per metric, the legend naming both.

Writes ``<run dir>/curves.png`` by default (several runs: ``curves_<run A>_vs_<run B>....png`` in the folder that
holds them all) and prints its path.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

from core.errors import user_errors
from training.runs import RunFilesError, Series, read_metrics, run_folder, run_labels

__all__ = ["PlotError", "curves_figure", "main", "plot_run", "plot_runs", "read_metrics", "runs_figure"]

PlotError = RunFilesError  # no metrics to plot (the message names the file)


class Panel(NamedTuple):
    title: str
    ylabel: str
    select: Callable[[str], bool]
    log_scale: bool = False
    # (value, label) horizontal reference lines, drawn when a metric named in the label is in the panel
    thresholds: tuple[tuple[float, str], ...] = ()


_EVAL_SET_METRIC = re.compile(r"^eval/[^/]+\.(accuracy|exact_accuracy|lm_loss)$")


def _is_loss(k: str) -> bool:
    return (k.startswith("train/") and (k.endswith("_loss") or k in ("train/loss", "train/kl"))) or (
        _EVAL_SET_METRIC.match(k) is not None and k.endswith(".lm_loss")
    )


def _is_accuracy(k: str) -> bool:
    return k in ("train/exact_accuracy", "train/accuracy", "ARC/pass@1", "ARC/pass@2") or (
        _EVAL_SET_METRIC.match(k) is not None and not k.endswith(".lm_loss")
    )


PANELS = (
    Panel("loss", "loss", _is_loss, log_scale=True),
    Panel("accuracy", "fraction correct", _is_accuracy),
    Panel("learning rate", "learning rate", lambda k: k == "train/lr"),
    Panel(
        "gradient norms",
        "L2 norm (before clipping)",
        lambda k: k.startswith("grad/") and k.endswith("_norm"),
        log_scale=True,
        thresholds=((0.05, "grad/encoder_norm starvation threshold"),),
    ),
    Panel(
        "encoder health",
        "value",
        lambda k: (
            k
            in (
                "train/encoder_cross_sample_var",
                "train/encoder_output_std",
                "train/encoder_token_std",
                "train/encoder_context_scale",
            )
        ),
        thresholds=((0.05, "train/encoder_cross_sample_var collapse threshold"),),
    ),
)


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


# Line looks: the k-th line of a panel gets LINESTYLES[k] / MARKERS[k] (cycling); several runs: MARKERS per run.
LINESTYLES: tuple[Any, ...] = (
    "-",
    "--",
    "-.",
    ":",
    (0, (5, 1, 1, 1, 1, 1)),
    (0, (8, 2)),
    (0, (1, 1)),
    (0, (3, 1, 1, 1, 1, 1, 1, 1)),
)
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")


def _look(j: int, n: int, npoints: int) -> dict[str, Any]:
    """Width and marker spacing of the ``j``-th of ``n`` lines of a panel: the first drawn is widest (underneath),
    markers hollow and staggered, so lines on the same values stay visible."""
    under = (n - 1 - j) / max(n - 1, 1)
    every = max(1, npoints // 10)
    return {
        "linewidth": 1.0 + 2.0 * under,
        "markersize": 3.5 + 3.0 * under,
        "markerfacecolor": "none",
        "markevery": (j % every, every),
    }


def _draw_panel(ax, panel: Panel, keys: list[str], runs: Sequence[tuple[str, Series]]) -> None:
    from matplotlib.lines import Line2D  # optional dependency, only when drawing

    multi = len(runs) > 1
    lines = [(m, r) for m, k in enumerate(keys) for r, (_, series) in enumerate(runs) if k in series]
    for j, (m, r) in enumerate(lines):
        steps, values = runs[r][1][keys[m]]
        who = r if multi else m  # what the colour (and, for several runs, the marker) tells apart
        ax.plot(
            steps,
            values,
            color=f"C{who % 10}",
            linestyle=LINESTYLES[m % len(LINESTYLES)],
            marker=MARKERS[who % len(MARKERS)] if multi else MARKERS[m % len(MARKERS)],
            label=None if multi else keys[m],
            **_look(j, len(lines), len(steps)),
        )
    handles = []
    if multi:  # one legend entry per run (colour, marker) and per metric (dash pattern)
        shown = sorted({r for _, r in lines})
        handles = [
            Line2D(
                [], [], color=f"C{r % 10}", marker=MARKERS[r % len(MARKERS)], markerfacecolor="none", label=runs[r][0]
            )
            for r in shown
        ]
        handles += [
            Line2D([], [], color="dimgrey", linestyle=LINESTYLES[m % len(LINESTYLES)], label=k)
            for m, k in enumerate(keys)
        ]
    for value, label in panel.thresholds:
        if label.split()[0] in keys:
            handles.append(ax.axhline(value, color="grey", linestyle=":", linewidth=1, label=label))
    finite = [v for _, series in runs for k in keys if k in series for v in series[k][1] if math.isfinite(v)]
    if panel.log_scale and finite and min(finite) > 0:
        ax.set_yscale("log")
        ax.set_ylabel(f"{panel.ylabel} (log scale)")
    else:
        ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title)
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    if multi:
        ax.legend(handles=handles, fontsize=7, loc="best")
    else:
        ax.legend(fontsize=7, loc="best")


def curves_figure(runs: Union[Series, Sequence[tuple[str, Series]]], title: Optional[str] = None) -> Any:
    """The matplotlib ``Figure`` of :data:`PANELS` over one run's ``series`` or several ``(label, series)`` runs
    overlaid (panels without metrics left out); titled ``title`` (default: the runs' labels). A plain Figure,
    outside pyplot's state (nothing to close; any backend)."""
    from matplotlib.figure import Figure  # optional dependency, only when drawing

    if isinstance(runs, dict):
        runs = [(title or "run", runs)]
    runs = [(label, drop_windows_without_halts(series)) for label, series in runs]
    title = title or " vs ".join(label for label, _ in runs)
    names = sorted({k for _, series in runs for k in series})
    panels = [(p, [k for k in names if p.select(k)]) for p in PANELS]
    panels = [(p, keys) for p, keys in panels if keys]
    if not panels:
        raise PlotError(
            f"{title}: none of its metrics ({', '.join(names[:5])}, ...) is a loss, accuracy, "
            "learning rate, gradient norm or encoder statistic"
        )
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(5.4 * ncols, 4.0 * nrows + 0.4))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, (panel, keys) in zip(axes.flat, panels):
        _draw_panel(ax, panel, keys, runs)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return fig


def _default_out(folders: list[str], labels: list[str]) -> str:
    if len(folders) == 1:
        return os.path.join(folders[0], "curves.png")
    parent = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in folders])
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", "_vs_".join(labels))[:120]
    return os.path.join(parent, f"curves_{name}.png")


def runs_figure(run_dirs: Sequence[str]) -> tuple[Any, str]:
    """The figure of one run or of several overlaid (labels: :func:`training.runs.run_labels`) and its default
    PNG path."""
    folders = [run_folder(d) for d in run_dirs]
    labels = run_labels(folders)
    return curves_figure([(label, read_metrics(d)) for label, d in zip(labels, run_dirs)]), _default_out(
        folders, labels
    )


def plot_runs(run_dirs: Sequence[str], out: Optional[str] = None) -> str:
    """Draw the curves of one run or of several overlaid (see the module docstring) to ``out``; returns the PNG
    path."""
    fig, default = runs_figure(run_dirs)
    out = out or default
    try:
        fig.savefig(out, dpi=90)
    except OSError as e:
        raise PlotError(f"{out}: cannot write the picture ({e.strerror or e}); choose another --out") from None
    return out


def plot_run(run_dir: str, out: Optional[str] = None) -> str:
    """One run's curves to ``out`` (default ``<run_dir>/curves.png``); returns the PNG path."""
    return plot_runs([run_dir], out)


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(
        prog="python -m training.plot_run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "run_dirs",
        nargs="+",
        metavar="run_dir",
        help="a run's checkpoint directory (holds metrics.jsonl), or a metrics.jsonl; several: overlaid",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="PNG path (default: <run_dir>/curves.png; several runs: curves_<A>_vs_<B>.png beside the run folders)",
    )
    a = ap.parse_args(argv)
    with user_errors():
        path = plot_runs(a.run_dirs, a.out)
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])

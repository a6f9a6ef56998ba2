"""Training curves of a run, from its own files (no W&B needed).

    python -m training.plot_run checkpoints/<project>/<run> [--out curves.png]

Reads ``<run dir>/metrics.jsonl`` (every logged value, written by the training loop) and draws up to four panels
against the optimizer step: losses (train/loss, train/lm_loss, train/kl, ...), accuracies (train exact / token
accuracy and every evaluation's exact accuracy / pass@K), the learning rate, and encoder health when the run has
an encoder (train/encoder_cross_sample_var, grad/encoder_norm, grad/total_norm). Writes ``<run dir>/curves.png``
by default.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from core.errors import PlatformError, user_errors
from training.report import METRICS_FILE


class PlotError(PlatformError, ValueError):
    """No metrics to plot (the message names the file)."""


PANELS = (
    ("loss", lambda k: k.startswith("train/") and (k.endswith("loss") or k == "train/kl"), "log"),
    ("accuracy", lambda k: k in ("train/exact_accuracy", "train/accuracy") or
     (k.startswith(("eval/", "ARC/")) and ("exact_accuracy" in k or "pass@1" in k or "pass@2" in k)), "linear"),
    ("learning rate", lambda k: k == "train/lr", "linear"),
    ("gradients and encoder health", lambda k: k in ("train/encoder_cross_sample_var", "grad/encoder_norm", "grad/total_norm"),
     "log"),
)


def read_metrics(run_dir: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (steps, values)}`` from ``<run_dir>/metrics.jsonl``."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise PlotError(f"{path}: not found (is {run_dir} a run directory of this platform's training loop?)")
    series: dict[str, tuple[list[int], list[float]]] = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)):
                    steps, values = series.setdefault(k, ([], []))
                    steps.append(int(rec["step"]))
                    values.append(float(v))
    if not series:
        raise PlotError(f"{path}: no metrics logged yet")
    return series


def plot_run(run_dir: str, out: Optional[str] = None) -> str:
    """Draw the run's curves (see the module docstring); returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    series = read_metrics(run_dir)
    panels = [(t, [k for k in sorted(series) if sel(k)], scale) for t, sel, scale in PANELS]
    panels = [p for p in panels if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, (title, keys, scale) in zip(axes[0], panels):
        for k in keys:
            steps, values = series[k]
            ax.plot(steps, values, marker="o" if len(steps) < 12 else None, markersize=3, label=k)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        if scale == "log" and all(v > 0 for k in keys for v in series[k][1]):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(os.path.basename(os.path.normpath(run_dir)), fontsize=10)
    fig.tight_layout()
    out = out or os.path.join(run_dir, "curves.png")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m training.plot_run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="the run's checkpoint directory (holds metrics.jsonl)")
    ap.add_argument("--out", default=None, help="PNG path (default: <run_dir>/curves.png)")
    a = ap.parse_args(argv)
    with user_errors():
        path = plot_run(a.run_dir, a.out)
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])

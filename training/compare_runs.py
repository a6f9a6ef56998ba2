"""Several training runs side by side, from their own files (no W&B): final and best metrics, and the config keys
that differ between them.

    python -m training.compare_runs checkpoints/<project>/<run A> checkpoints/<project>/<run B> ... \\
        [--metrics eval/ ARC/pass@] [--out T.md]

Each DIR is a run folder (the training loop's ``checkpoint_path``). Prints three markdown tables, one column per
run (named by summary.json's ``run_name``):

* the runs: folder, status and steps (summary.json), where the config was read;
* the config keys that differ, as dotted keys (``arch.hidden_size``, ``lr``; the run-time keys
  :data:`RUN_TIME_KEYS` -- ``run_name``, ``checkpoint_path``, ``resume``, ``wandb.group`` ... -- name the run or
  say how it was started and are left out); the config is ``<run>/config.yaml``, else the file summary.json's
  ``config_path`` names, else the one stored in the newest checkpoint (:func:`training.runs.read_run_config`);
* every metric with a direction (:func:`training.metrics.metric_direction`: accuracies and pass@K, best = max;
  losses, best = min) as ``final / best @step``, from ``metrics.jsonl`` (a run without one: summary.json's
  ``final`` / ``best``); the run with the best ``best`` of a row is in bold. ``--metrics`` keeps the metrics whose
  name contains one of the given strings.

A science command's ``--out`` (a folder with science.json) stands for its runs' training folders
(``runs/<name>/checkpoint``, :func:`expand_run_dirs`); ``experiments.science.compare`` is the science view of the
same runs (held-out and train-fit pass@1 per family, from science.json), through this module's command line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from core.errors import user_errors
from core.io import atomic_write, read_json
from core.table import cell, markdown_table
from training.metrics import metric_direction
from training.runs import (
    RunFilesError,
    flatten,
    read_metrics,
    read_run_config,
    read_summary_if_any,
    run_folder,
    run_labels,
)

# run-time keys: they name the run or say how it was started (its folder, whether it resumed, its W&B group), never
# what it learns; left out of the differing keys
RUN_TIME_KEYS = ("run_name", "checkpoint_path", "resume", "resume_allow_data_change", "wandb.group")
UNSET = "(unset)"
SCIENCE_FILE = "science.json"  # a science command's --out (experiments.science)


@dataclass
class Best:
    final: float
    best: float
    step: Optional[int]


@dataclass
class RunRow:
    label: str
    folder: str
    summary: dict[str, Any]
    config: Optional[dict[str, Any]]  # flattened
    config_source: Optional[str]
    metrics: dict[str, Best] = field(default_factory=dict)


def final_and_best(series: dict[str, tuple[list[int], list[float]]]) -> dict[str, Best]:
    """``{metric: Best}`` for every metric of ``series`` with a direction: its last finite value and its best
    finite value (max / min, :func:`training.metrics.metric_direction`) with the step of the first best."""
    out = {}
    for k, (steps, values) in series.items():
        direction = metric_direction(k)
        pts = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
        if direction is None or not pts:
            continue
        sign = 1.0 if direction == "max" else -1.0
        step, best = max(pts, key=lambda p: sign * p[1])  # max keeps the first of equals: the first best step
        out[k] = Best(pts[-1][1], best, step)
    return out


def _summary_metrics(summary: dict[str, Any]) -> dict[str, Best]:
    final, best, steps = (summary.get(k) or {} for k in ("final", "best", "best_step"))
    return {
        k: Best(float(v), float(best.get(k, v)), steps.get(k))
        for k, v in final.items()
        if metric_direction(k) is not None
    }


def load_run(run_dir: str, label: str) -> RunRow:
    folder = run_folder(run_dir)
    summary = read_summary_if_any(folder)
    cfg, source = read_run_config(folder)
    row = RunRow(label, folder, summary, None if cfg is None else flatten(cfg), source)
    try:
        row.metrics = final_and_best(read_metrics(run_dir))
    except RunFilesError:
        if not summary.get("final"):
            raise
        row.metrics = _summary_metrics(summary)
    return row


def science_run_folders(science_dir: str) -> Optional[list[str]]:
    """The training run folders of a science command's ``--out``: ``runs/<name>/checkpoint`` of every run its
    science.json lists (in its order) that has one; None when the folder holds no science.json."""
    path = os.path.join(science_dir, SCIENCE_FILE)
    if not os.path.isfile(path):
        return None
    result = read_json(path, RunFilesError)
    runs = result.get("runs") if isinstance(result, dict) else None
    if not isinstance(runs, dict):
        raise RunFilesError(f"{path}: not a science command's result (no 'runs')")
    folders = [os.path.join(science_dir, "runs", name, "checkpoint") for name in runs]
    folders = [f for f in folders if os.path.isdir(f)]
    if not folders:
        raise RunFilesError(f"{science_dir}: a science --out without a trained run (no runs/<name>/checkpoint)")
    return folders


def expand_run_dirs(run_dirs: Sequence[str]) -> list[str]:
    """Every DIR as run folders: a science ``--out`` as its runs' (:func:`science_run_folders`), any other as
    itself."""
    out: list[str] = []
    for d in run_dirs:
        science = science_run_folders(d)
        out += [d] if science is None else science
    return out


def load_runs(run_dirs: Sequence[str]) -> list[RunRow]:
    labels = run_labels([run_folder(d) for d in run_dirs])
    return [load_run(d, label) for d, label in zip(run_dirs, labels)]


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def config_value(cfg: dict[str, Any], key: str) -> str:
    """The value of dotted ``key`` in a flattened config as text; a key under a section the config sets to a plain
    value (``encoder.name`` where ``encoder`` is null) shows that value; a key it lacks altogether: ``(unset)``."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        k = ".".join(parts[:n])
        if k in cfg:
            return _value(cfg[k]) if n == len(parts) else f"({k}: {_value(cfg[k])})"
    return UNSET


def config_differences(rows: Sequence[RunRow]) -> tuple[list[str], int]:
    """The dotted config keys whose value differs between the runs that have a config (identity keys left out; a
    section that is a plain value in one run and has keys in another is compared key by key), and how many keys
    are the same in all of them."""
    cfgs = [r.config for r in rows if r.config is not None]
    keys = {k for c in cfgs for k in c if k not in RUN_TIME_KEYS}
    keys = sorted(k for k in keys if not any(o.startswith(k + ".") for o in keys))
    differ = [k for k in keys if len({config_value(c, k) for c in cfgs}) > 1]
    return differ, len(keys) - len(differ)


def left_out_keys(rows: Sequence[RunRow]) -> str:
    """The run-time keys (:data:`RUN_TIME_KEYS`) that some run's config has, as text: ``a``, ``a and b``,
    ``a, b and c``."""
    keys = [k for k in RUN_TIME_KEYS if any(r.config is not None and k in r.config for r in rows)] or ["none"]
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]


def _metric_order(name: str) -> tuple[int, str]:
    return ({"ARC": 0, "eval": 1, "train": 2}.get(name.split("/", 1)[0], 3), name)


def _runs_table(rows: Sequence[RunRow]) -> list[str]:
    def status(r: RunRow) -> str:
        s = r.summary
        if not s:
            return "(no summary.json)"
        text = str(s.get("status") or "—") + (f" ({s['stop_reason']})" if s.get("stop_reason") else "")
        if s.get("steps") is not None:
            text += f", {s['steps']}" + (f" / {s['total_steps']}" if s.get("total_steps") else "") + " steps"
        return text

    body = [
        ["folder"] + [cell(r.folder) for r in rows],
        ["status"] + [cell(status(r)) for r in rows],
        ["config from"] + [cell(r.config_source or "(none found)") for r in rows],
    ]
    return markdown_table([""] + [cell(r.label) for r in rows], body)


def _config_table(rows: Sequence[RunRow]) -> list[str]:
    with_cfg = [r for r in rows if r.config is not None]
    if len(with_cfg) < 2:
        return [f"Config: {len(with_cfg)} of the {len(rows)} runs with a config found; nothing to compare."]
    differ, same = config_differences(rows)
    left_out = left_out_keys(rows)
    if not differ:
        return [f"Config: the same in every run ({same} keys; {left_out} left out)."]
    head = f"Config keys that differ ({same} other keys the same in every run; {left_out} left out):"
    body = [[f"`{k}`"] + [cell("?" if r.config is None else config_value(r.config, k)) for r in rows] for k in differ]
    return [head, ""] + markdown_table(["key"] + [cell(r.label) for r in rows], body)


def _metrics_table(rows: Sequence[RunRow], only: Sequence[str] = ()) -> list[str]:
    names = sorted({k for r in rows for k in r.metrics if not only or any(s in k for s in only)}, key=_metric_order)
    if not names:
        return ["Metrics: none" + (f" whose name contains {', '.join(only)}" if only else "") + "."]
    body = []
    for k in names:
        direction = metric_direction(k)
        bests = [r.metrics[k].best for r in rows if k in r.metrics]
        top = max(bests) if direction == "max" else min(bests)
        cells = []
        for r in rows:
            m = r.metrics.get(k)
            if m is None:
                cells.append("—")
                continue
            at = "" if m.step is None else f" @{m.step}"
            best = f"{m.best:.4g}{at}"
            cells.append(f"{m.final:.4g} / " + (f"**{best}**" if len(rows) > 1 and m.best == top else best))
        body.append([f"`{k}`", direction] + cells)
    head = (
        "Metrics: final / best @step (best = max for accuracies and pass@K, min for losses; bold: the best run "
        "of the row):"
    )
    return [head, ""] + markdown_table(
        ["metric", "best"] + [cell(r.label) for r in rows], body, right=[False, False] + [True] * len(rows)
    )


def render(rows: Sequence[RunRow], only: Sequence[str] = ()) -> str:
    """The three tables (runs, differing config keys, metrics) as markdown."""
    lines = _runs_table(rows) + [""] + _config_table(rows) + [""] + _metrics_table(rows, only)
    return "\n".join(lines) + "\n"


def table_command(
    argv: Optional[Sequence[str]],
    prog: str,
    doc: Optional[str],
    arguments: Callable[[argparse.ArgumentParser], None],
    tables: Callable[[argparse.Namespace], str],
    out_help: str,
) -> str:
    """The command line of the comparison commands (this one and ``experiments.science.compare``): the
    arguments ``arguments`` declares, then ``--out``; ``tables(args)`` builds the markdown (bad input: one line,
    exit 1), written to ``--out`` atomically when given, and printed. Returns the markdown."""
    ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments(ap)
    ap.add_argument("--out", help=out_help)
    a = ap.parse_args(argv)
    with user_errors():
        md = tables(a)
        if a.out:
            atomic_write(a.out, lambda f: f.write(md))
    print(md, end="")
    return md


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "run_dirs", nargs="+", metavar="run_dir", help="run folders (checkpoints/<project>/<run>) or science --out dirs"
    )
    ap.add_argument(
        "--metrics",
        nargs="+",
        default=(),
        metavar="TEXT",
        help="only metrics whose name contains one of these (e.g. eval/ ARC/pass@)",
    )


def _tables(a: argparse.Namespace) -> str:
    for d in a.run_dirs:
        if not os.path.isdir(run_folder(d)):
            raise RunFilesError(f"{d}: not a run folder (no such directory)")
    return render(load_runs(expand_run_dirs(a.run_dirs)), a.metrics)


def main(argv: Optional[Sequence[str]] = None) -> str:
    return table_command(
        argv,
        "python -m training.compare_runs",
        __doc__,
        _arguments,
        _tables,
        "also write the tables to this markdown file",
    )


if __name__ == "__main__":
    main(sys.argv[1:])

"""The science command's report: held-out pass@1 / pass@2 per rule family for every run (science.json), rendered
as markdown (science.md) with the runs' status and training fit (a run below ``UNFIT_TRAIN_EXACT`` train exact is
flagged **Not fitted**)."""
from __future__ import annotations

import os
from typing import Any, Sequence

from core.io import atomic_write, write_json_atomic
from experiments.science.common import CONTROL, UNFIT_TRAIN_EXACT, ScienceError


def puzzle_scores(rows: list[dict]) -> tuple[float, float]:
    """(pass@1, pass@2) of one puzzle from its predictions.json rows: the mean over its test inputs of whether
    the true grid is ranked first / among the first two (the evaluator's pass@K definition)."""
    if not rows:
        raise ScienceError("predictions.json: a puzzle with no test inputs")
    r = [row.get("correct_rank") for row in rows]
    return (sum(c == 1 for c in r) / len(r), sum(c is not None and c <= 2 for c in r) / len(r))


def family_table(rules: dict, predictions: dict[str, dict], holdout_families: Sequence[str] = ()) -> dict:
    """Per-family held-out pass@1 / pass@2 of every run. ``rules``: the builder's rules.json (puzzle ->
    {subset, family, ...}); ``predictions``: run -> evaluate.py's predictions.json. Every held-out puzzle
    (subset ``evaluation``) must be in every run's predictions exactly once, and nothing else."""
    heldout = {p: r["family"] for p, r in rules.items() if r.get("subset") == "evaluation"}
    # every family of the data, also one without held-out puzzles (--num-test below the number of families)
    families = sorted({r["family"] for r in rules.values()})
    table: dict[str, Any] = {f: {"count": 0, "heldout_family": f in holdout_families, "runs": {}} for f in families}
    table["all"] = {"count": len(heldout), "heldout_family": False, "runs": {}}
    for f in heldout.values():
        table[f]["count"] += 1
    for run, pred in predictions.items():
        extra, missing = sorted(set(pred) - set(heldout)), sorted(set(heldout) - set(pred))
        if extra or missing:
            raise ScienceError(f"run {run}: predictions.json does not hold exactly the held-out puzzles of rules.json "
                               f"(missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]})")
        sums = {f: [0.0, 0.0] for f in table}
        for p, fam in heldout.items():
            a, b = puzzle_scores(pred[p])
            for key in (fam, "all"):
                sums[key][0] += a
                sums[key][1] += b
        for f, (a, b) in sums.items():
            n = table[f]["count"]
            table[f]["runs"][run] = {"pass@1": a / n if n else 0.0, "pass@2": b / n if n else 0.0}
    return table


def check_against_evaluator(table: dict, runs: dict[str, dict]) -> None:
    """The table's overall numbers must be evaluate.py's (same puzzles, same definition) for every ok run."""
    for n in table["all"]["runs"]:
        for k in ("pass@1", "pass@2"):
            a, b = table["all"]["runs"][n][k], runs[n]["metrics"][f"ARC/{k}"]
            if abs(a - b) > 1e-9:
                raise ScienceError(f"run {n}: {k} over the table's puzzles {a} differs from evaluate.py's {b}")


def _settings_lines(result: dict) -> list[str]:
    s = result["settings"]
    d = s["data"]
    return ["# ETRM science: held-out pass@1 / pass@2 per rule family", "",
            f"`{result['command']}`", "",
            f"Data: {d['num_train']} training / {d['num_test']} held-out puzzles (held-out rule "
            f"instances{'; held-out families: ' + ', '.join(d['holdout_families']) if d['holdout_families'] else ''}), "
            f"canvas {d['canvas_size']}x{d['canvas_size']}, grids {d['min_grid']}-"
            f"{d['max_grid']}, {d['num_aug']} augmentations, seed {d['seed']}. Recipe: "
            f"config/{s['config']}.yaml{' + ' + ' '.join(s['overrides']) if s['overrides'] else ''}"
            f"{', ' + str(s['steps']) + ' steps' if s['steps'] else ''}. `control` = standard encoder with "
            "`encoder.zero_demos=true` (sees no demos). A held-out rule instance is not shown in training, neither by "
            "a training puzzle nor by any of its augmented copies.", ""]


def _family_lines(result: dict) -> list[str]:
    runs = [r for r in result["runs"] if result["runs"][r]["status"] == "ok"]
    if not runs:
        return []
    lines = ["| family | n | " + " | ".join(runs) + " |", "|---|---:|" + "---:|" * len(runs)]
    for fam, row in result["families"].items():
        label = f"**{fam}**" if fam == "all" else (f"{fam} (held-out family)" if row["heldout_family"] else fam)
        cells = [f"{row['runs'][r]['pass@1']:.2f} / {row['runs'][r]['pass@2']:.2f}" if row["count"] else "—"
                 for r in runs]
        lines.append(f"| {label} | {row['count']} | " + " | ".join(cells) + " |")
    return lines + [""]


def _run_lines(result: dict) -> list[str]:
    lines = ["| run | status | steps | train exact | train s | eval s |", "|---|---|---:|---:|---:|---:|"]
    unfit = []
    for name, r in result["runs"].items():
        ts, es, te = r.get("train_seconds"), r.get("eval_seconds"), r.get("train_exact")
        lines.append(f"| {name} | {r['status']} | {r.get('steps', '')} | {'' if te is None else f'{te:.2f}'} | "
                     f"{'' if ts is None else f'{ts:.0f}'} | {'' if es is None else f'{es:.0f}'} |")
        if name != CONTROL and r["status"] == "ok" and te is not None and te < UNFIT_TRAIN_EXACT:
            unfit.append(f"{name} ({te:.2f})")
    lines += ["", "train exact: exact accuracy on the training batches of the last log window."]
    if unfit:
        lines += ["", f"**Not fitted** (train exact under {UNFIT_TRAIN_EXACT}): {', '.join(unfit)}. A run that does "
                  "not solve its own training examples says nothing about generalisation to held-out ones; train "
                  "longer or on fewer families (docs/science.md). The control is expected to stay low."]
    return lines


def render_markdown(result: dict) -> str:
    """science.md: the settings, the per-family table of the ok runs, every run's status and training fit."""
    lines = _settings_lines(result) + _family_lines(result) + _run_lines(result)
    lines += ["", f"Total wall time {result['wall_seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def write_report(out: str, result: dict) -> str:
    """Write ``out``/science.json and science.md (atomically); returns the markdown."""
    write_json_atomic(os.path.join(out, "science.json"), result)
    md = render_markdown(result)
    atomic_write(os.path.join(out, "science.md"), lambda f: f.write(md))
    return md

"""Several science runs side by side: one row per run, the overall and per-family held-out / train-fit pass@1,
with what each run changed (its ``--override``s), its seeds, steps and seconds per step.

    python -m experiments.science.compare runs/f8 runs/f8-halt4 runs/f8-lr2e-3 [--runs standard] [--out T.md]

Each DIR is a science command's ``--out`` (its science.json); the first is the baseline the others are read
against, and every other row names only the overrides it adds to or changes from the baseline's. The ablation
tables of the record are written with it (e.g. docs/record/2026-11-26-schedule-ema-halt-batch.md): every row
carries the steps, the s/step and the seeds it rests on.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from core.io import read_json
from core.table import markdown_table
from experiments.science.common import HEADLINE_ROW, TOTAL_ROW, ScienceError
from experiments.science.recipe import recipe_override
from experiments.science.report import SCORED
from training.compare_runs import table_command


def _overrides(settings: dict) -> list[str]:
    """The --override's that change what a run learns (not its paths or checkpoint interval), then the
    --eval-override's that change how it is scored, as ``eval:key=value`` (e.g. ``eval:use_ema=false``)."""
    return [o for o in settings.get("overrides") or [] if recipe_override(o)] + [
        f"eval:{o}" for o in settings.get("eval_overrides") or []
    ]


def _training_seed(overrides: Sequence[str]) -> str:
    seeds = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "seed"]
    return seeds[-1] if seeds else "0"


def load_rows(dirs: Sequence[str], runs: Optional[Sequence[str]] = None) -> list[dict]:
    """One row per scored run of every DIR's science.json (only the runs named in ``runs``, when given)."""
    rows = []
    for d in dirs:
        res = read_json(os.path.join(d, "science.json"), ScienceError)
        try:
            settings, table = res["settings"], res["families"]
        except (KeyError, TypeError):
            raise ScienceError(
                f"{os.path.join(d, 'science.json')}: not a science command's result (no 'settings' / 'families')"
            ) from None
        over = _overrides(settings)
        for name, r in res.get("runs", {}).items():
            if r.get("status") not in SCORED or (runs and name not in runs):
                continue
            held = {
                f: row["runs"][name]["pass@1"]
                for f, row in table.items()
                if name in row.get("runs", {}) and row.get("count")
            }
            fit = {
                f: row["train_runs"][name]["pass@1"]
                for f, row in table.items()
                if name in row.get("train_runs", {}) and row.get("train_count")
            }
            steps, secs = r.get("steps"), r.get("train_seconds")
            rows.append(
                {
                    "dir": d,
                    "run": name,
                    "overrides": over,
                    "data_seed": settings["data"].get("seed"),
                    "seed": _training_seed(over),
                    "steps": steps,
                    "cut_short": r["status"] == "cut_short",
                    "s_per_step": secs / steps if secs and steps else None,
                    "heldout": held,
                    "fit": fit,
                }
            )
    if not rows:
        raise ScienceError(f"no scored run{' named ' + ', '.join(runs) if runs else ''} in {', '.join(dirs)}")
    return rows


def _changes(base: Sequence[str], over: Sequence[str]) -> str:
    """The overrides of ``over`` that the baseline does not have (an override the baseline has but this run drops
    is shown as ``-key``)."""
    added = [o for o in over if o not in base]
    keys = {o.split("=", 1)[0] for o in over}
    dropped = [f"-{o.split('=', 1)[0]}" for o in base if o.split("=", 1)[0] not in keys]
    return " ".join(f"`{o}`" for o in added + dropped) or "(as the baseline)"


def render(rows: list[dict]) -> str:
    """The markdown table: one row per run, the baseline (first row) with its own overrides."""
    fams = sorted({f for r in rows for f in r["heldout"] if f not in (TOTAL_ROW, HEADLINE_ROW)})
    # the headline figure: the headline row where the data has one (benchmark v2 with roll), else the total row
    headlined = any(HEADLINE_ROW in r["heldout"] for r in rows)
    base = rows[0]["overrides"]

    def cell(r: dict, f: str) -> str:
        h, t = r["heldout"].get(f), r["fit"].get(f)
        if h is None:
            return "—"
        return f"{h:.2f}" + (f" / {t:.2f}" if t is not None else "")

    body = []
    for i, r in enumerate(rows):
        change = (
            ("(baseline) " + " ".join(f"`{o}`" for o in base)).strip() if i == 0 else _changes(base, r["overrides"])
        )
        steps = f"{r['steps']}{' (cut short)' if r['cut_short'] else ''}"
        sps = "" if r["s_per_step"] is None else f"{r['s_per_step']:.2f}"
        body.append(
            [
                f"{os.path.basename(os.path.normpath(r['dir']))}: {r['run']}",
                change,
                f"{r['data_seed']}, {r['seed']}",
                steps,
                sps,
                f"**{cell(r, HEADLINE_ROW if HEADLINE_ROW in r['heldout'] else TOTAL_ROW)}**",
            ]
            + ([cell(r, TOTAL_ROW)] if headlined else [])
            + [cell(r, f) for f in fams]
        )
    header = ["run", "change", "seeds (data, training)", "steps", "s/step"]
    header += ["**headline**", "all"] if headlined else ["**all**"]
    header += fams
    lines = [
        f"Baseline: {rows[0]['dir']} ({' '.join(base) or 'the recipe'}). Cells: held-out pass@1 / train fit.",
        "",
    ] + markdown_table(header, body, right=[False, False, False, True, True])
    return "\n".join(lines) + "\n"


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dirs", nargs="+", help="science --out dirs (the first is the baseline)")
    ap.add_argument("--runs", nargs="+", help="only these runs of each dir (e.g. standard control)")


def main(argv: Optional[Sequence[str]] = None) -> str:
    return table_command(
        argv,
        "python -m experiments.science.compare",
        __doc__,
        _arguments,
        lambda a: render(load_rows(a.dirs, a.runs)),
        "also write the table to this markdown file",
    )


if __name__ == "__main__":
    main()

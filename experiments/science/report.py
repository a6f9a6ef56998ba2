"""The science command's report: held-out pass@1 / pass@2 per rule family (per group, for your own puzzles) for
every run, next to the same on the train-fit set (training puzzles: did the run fit them?), written to science.json
and rendered as markdown (science.md) with the runs' status and training fit (a run below ``UNFIT_TRAIN_EXACT``
train exact is flagged **Not fitted**, and so is every family it does not fit; a cut-short run is marked with
the step of the checkpoint that was evaluated)."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from core.io import atomic_write, write_json_atomic
from experiments.science.common import (
    CONTROL,
    GROUP_ROWS,
    HEADLINE_ROW,
    NO_WEIGHTS,
    ONE_COPY_TABLE,
    TOTAL_ROW,
    UNFIT_TRAIN_EXACT,
    ScienceError,
)
from experiments.science.readout import format_table


def puzzle_scores(rows: list[dict]) -> tuple[float, float]:
    """(pass@1, pass@2) of one puzzle from its predictions.json rows: the mean over its test inputs of whether
    the true grid is ranked first / among the first two (the evaluator's pass@K definition)."""
    if not rows:
        raise ScienceError("predictions.json: a puzzle with no test inputs")
    r = [row.get("correct_rank") for row in rows]
    return (sum(c == 1 for c in r) / len(r), sum(c is not None and c <= 2 for c in r) / len(r))


def _rows_of(table: dict, fam: str) -> tuple[str, ...]:
    """The rows a puzzle of family ``fam`` counts in: its own, every row that lists it in ``families`` (the group
    rows, the :data:`HEADLINE_ROW`) and the :data:`TOTAL_ROW`."""
    return (fam,) + tuple(k for k, row in table.items() if fam in row.get("families", ())) + (TOTAL_ROW,)


def row_puzzles(table: dict, puzzles: dict[str, str]) -> dict[str, list[str]]:
    """Per row of ``table``, the puzzles of ``puzzles`` (puzzle -> family) that count in it (:func:`_rows_of`)."""
    out: dict[str, list[str]] = {row: [] for row in table}
    for p, fam in puzzles.items():
        for k in _rows_of(table, fam):
            out[k].append(p)
    return out


def _score(table: dict, heldout: dict[str, str], pred: dict, runs_key: str, count_key: str, run: str) -> None:
    """Add ``run``'s mean pass@1 / pass@2 over the puzzles of ``heldout`` (puzzle -> family) to every row: a puzzle
    counts in its family's row, the rows that list its family and the :data:`TOTAL_ROW` (:func:`row_puzzles`)."""
    scores = {p: puzzle_scores(pred[p]) for p in heldout}  # once per puzzle, though it counts in several rows
    for f, ids in row_puzzles(table, heldout).items():
        a, b = sum(scores[p][0] for p in ids), sum(scores[p][1] for p in ids)
        n = table[f][count_key]
        table[f][runs_key][run] = {"pass@1": a / n if n else 0.0, "pass@2": b / n if n else 0.0}


def family_table(
    rules: dict,
    predictions: dict[str, dict],
    holdout_families: Sequence[str] = (),
    train_fit: Optional[tuple[Sequence[str], dict[str, dict]]] = None,
    headline: Optional[Sequence[str]] = None,
    groups: Optional[dict[str, Sequence[str]]] = None,
) -> dict:
    """Per-family (or per-group) held-out pass@1 / pass@2 of every run. ``rules``: puzzle -> {subset, family}
    (the builder's rules.json, or the groups of your own puzzles); ``predictions``: run -> evaluate.py's
    predictions.json. Every held-out puzzle (subset ``evaluation``) must be in every run's predictions exactly
    once, and nothing else. ``train_fit``: (the train-fit set's puzzle ids, run -> its predictions.json on that
    set) adds ``train_count`` and ``train_runs`` (pass@1 / pass@2 on training puzzles) to every row.
    ``headline``: the families of the headline figure (:func:`experiments.science.data.headline_families`),
    a :data:`HEADLINE_ROW` over their puzzles (its ``families`` field names them) before the :data:`TOTAL_ROW`;
    None: the total row is the headline. ``groups``: name -> families, a row each (with ``families``) before it
    (benchmark v3: covered, open)."""
    heldout = {p: r["family"] for p, r in rules.items() if r.get("subset") == "evaluation"}
    # every family of the data, also one without held-out puzzles (--num-test below the number of families)
    families = sorted({r["family"] for r in rules.values()})
    table: dict[str, Any] = {f: {"count": 0, "heldout_family": f in holdout_families, "runs": {}} for f in families}
    for g, fams in (groups or {}).items():
        gl = sorted(set(fams))
        n = sum(f in gl for f in heldout.values())
        table[g] = {"count": n, "heldout_family": False, "families": gl, "runs": {}}
    if headline:
        hl = sorted(set(headline))
        n = sum(f in hl for f in heldout.values())
        table[HEADLINE_ROW] = {"count": n, "heldout_family": False, "families": hl, "runs": {}}
    table[TOTAL_ROW] = {"count": len(heldout), "heldout_family": False, "runs": {}}
    for f in heldout.values():
        table[f]["count"] += 1
    for run, pred in predictions.items():
        extra, missing = sorted(set(pred) - set(heldout)), sorted(set(heldout) - set(pred))
        if extra or missing:
            raise ScienceError(
                f"run {run}: predictions.json does not hold exactly the held-out puzzles of rules.json "
                f"(missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]})"
            )
        _score(table, heldout, pred, "runs", "count", run)
    if train_fit is None:
        return table
    ids, fit_predictions = train_fit
    not_training = [p for p in ids if rules.get(p, {}).get("subset") != "training"]
    if not_training:
        raise ScienceError(f"train-fit set: {not_training[:3]} are not training puzzles")
    sample = {p: rules[p]["family"] for p in ids}
    for row in table.values():
        row.update(train_count=0, train_runs={})
    table[TOTAL_ROW]["train_count"] = len(sample)
    for f in sample.values():
        for k in _rows_of(table, f)[:-1]:  # the total row's count is set above
            table[k]["train_count"] += 1
    for run, pred in fit_predictions.items():
        if set(pred) != set(sample):
            raise ScienceError(
                f"run {run}: the train-fit predictions.json does not hold exactly the train-fit set's "
                f"{len(sample)} puzzles"
            )
        _score(table, sample, pred, "train_runs", "train_count", run)
    return table


def check_against_evaluator(table: dict, runs: dict[str, dict]) -> None:
    """The table's overall numbers must be evaluate.py's (same puzzles, same definition) for every scored run,
    on the held-out puzzles and on the train-fit set."""
    total = table[TOTAL_ROW]
    for runs_key, metrics_key in (("runs", "metrics"), ("train_runs", "train_fit_metrics")):
        for n in total.get(runs_key, {}):
            if n not in runs:  # not an evaluate.py run (the program row)
                continue
            for k in ("pass@1", "pass@2"):
                a, b = total[runs_key][n][k], runs[n][metrics_key][f"ARC/{k}"]
                if abs(a - b) > 1e-9:
                    raise ScienceError(
                        f"run {n}: {k} over the table's {'train-fit ' if runs_key != 'runs' else ''}"
                        f"puzzles {a} differs from evaluate.py's {b}"
                    )


SCORED = ("ok", "cut_short")  # statuses whose runs have predictions (a cut-short run: of its last checkpoint)
HALTING_TABLE = "families_at_halting_step"  # science.json: the per-family table at the Q head's halting step


def _recipe_text(s: dict) -> str:
    return (
        f"Recipe: config/{s['config']}.yaml{' + ' + ' '.join(s['overrides']) if s['overrides'] else ''}"
        f"{', ' + str(s['steps']) + ' steps' if s['steps'] else ''}. `control` = standard encoder with "
        "`encoder.zero_demos=true` (sees no demos)."
    )


def augmentation_note(num_aug: int) -> str:
    """What the report says about augmenting your own puzzles (the default is none)."""
    if num_aug == 0:
        return (
            "Augmentation: none (--num-aug 0, the default for your own puzzles): the ARC builder's colour / "
            "dihedral copies of a training puzzle can realise a held-out colour or orientation of its rule, i.e. "
            "show a held-out rule instance in training. --num-aug K opts in "
            '(docs/science_command.md, "Augmentation can leak a held-out rule instance into training").'
        )
    return (
        f"**Augmentation: {num_aug} colour / dihedral copies per puzzle (--num-aug {num_aug}, opted in).** A copy "
        "of a training puzzle can realise a held-out colour or orientation of its rule, so the held-out score may "
        "count rule instances that training showed "
        '(docs/science_command.md, "Augmentation can leak a held-out rule instance into training").'
    )


def _settings_lines(result: dict) -> list[str]:
    s = result["settings"]
    d = s["data"]
    fit = s.get("train_fit_puzzles")
    fit_text = (
        f" Columns `<run>: train`: pass@1 / pass@2 on {fit} training puzzles (a seeded sample; queries "
        "training saw, with their demos, voted over the same augmented copies): did the run fit its data?"
        if fit
        else ""
    )
    if "files" in d:  # your own puzzles
        return [
            "# ETRM science: held-out pass@1 / pass@2 per group",
            "",
            f"`{result['command']}`",
            "",
            f"Data: your puzzles {s['input_file_prefix']}_{{training,evaluation}}_*.json: {d['num_train']} "
            f"training / {d['num_test']} held-out (evaluation) puzzles, canvas {d['canvas_size']}x"
            f"{d['canvas_size']}, seed {d['seed']}. Groups: {s['grouping']}. " + _recipe_text(s) + fit_text,
            "",
            augmentation_note(d["num_aug"]),
            "",
        ]
    return [
        "# ETRM science: held-out pass@1 / pass@2 per rule family",
        "",
        f"`{result['command']}`",
        "",
        f"Data: {d['num_train']} training / {d['num_test']} held-out puzzles (held-out rule "
        f"instances{'; held-out families: ' + ', '.join(d['holdout_families']) if d['holdout_families'] else ''}), "
        f"canvas {d['canvas_size']}x{d['canvas_size']}, grids {d['min_grid']}-"
        f"{d['max_grid']}, {d['num_aug']} augmentations, seed {d['seed']}. "
        + _recipe_text(s)
        + " A held-out rule instance is not shown in training, neither by a training puzzle nor by any of its "
        "augmented copies, by key or by behaviour." + fit_text + _headline_text(result),
        "",
    ]


def _headline_text(result: dict) -> str:
    """What the headline row is, when the table has one."""
    table = result.get(ONE_COPY_TABLE) or result.get("families") or {}
    row = table.get(HEADLINE_ROW)
    if not row:
        return ""
    groups = [g for g in GROUP_ROWS if g in table]
    return (
        f" **Headline**: the held-out puzzles of {len(row['families'])} families"
        + (f" ({' + '.join(groups)}: with and without a built-in candidate in trm_views)" if groups else "")
        + "; roll (the wrapped shift: a capability of the core) is reported per family, outside it "
        '(docs/science.md, "The benchmark"). `program`: trm_views\' candidates with no learned weight '
        "(experiments.science.program); a run below it on a family has not shown it learned that family. `search`: "
        "local rules, else a pointer, fitted to each puzzle's demos (no weight, no candidate; "
        "experiments.science.pointer): a run below it has not shown more than this search."
    )


def _data_note_lines(result: dict) -> list[str]:
    """The data's parameter shifts between training and held-out puzzles (data.parameter_shift_notes)."""
    notes = result["settings"].get("data_notes") or []
    if not notes:
        return []
    return [
        "**Held-out puzzles unlike the training ones** (a rule parameter's value common in the held-out "
        "puzzles, rare in training: on benchmark v3 by design, whole structures are held out, see the data's "
        "synth_structures.json; on v1 the leak-free split caused it for translate: "
        "docs/record/2026-11-26-translate-wrap.md):",
        "",
        *(f"- {n}" for n in notes),
        "",
    ]


def _label(name: str, r: dict) -> str:
    return f"{name} (cut short, step {r['steps']})" if r["status"] == "cut_short" else name


def _cell(scores: Optional[dict], n: int) -> str:
    return "—" if not n else ("" if scores is None else f"{scores['pass@1']:.2f} / {scores['pass@2']:.2f}")


_GROUP_TEXT = {"covered": "families with a built-in candidate", "open": "families without one"}


def _row_label(table: dict, fam: str) -> str:
    """A row's label: the headline row bold (the total row bold where there is no headline row); a family outside
    the headline or held out as a whole says so."""
    headline = table.get(HEADLINE_ROW, {}).get("families")
    if fam == HEADLINE_ROW:
        return f"**{HEADLINE_ROW}** ({', '.join(headline)})" if len(headline) < 4 else f"**{HEADLINE_ROW}**"
    if fam == TOTAL_ROW:
        return f"{TOTAL_ROW} (every family)" if headline else f"**{TOTAL_ROW}**"
    if fam in GROUP_ROWS and "families" in table[fam]:
        return f"*{fam}* ({_GROUP_TEXT[fam]})"
    notes = ["held-out family"] if table[fam]["heldout_family"] else []
    if headline and fam not in headline:
        notes.append("outside the headline")
    return f"{fam} ({', '.join(notes)})" if notes else fam


def _family_lines(result: dict, key: str = "families") -> list[str]:
    table = result.get(key)
    runs = [
        r for r in result["runs"] if result["runs"][r]["status"] in SCORED and table and r in table[TOTAL_ROW]["runs"]
    ]
    runs += [n for n in NO_WEIGHTS if table and n in table[TOTAL_ROW]["runs"] and n not in runs]
    if not runs:
        return []
    fit = "train_count" in table[TOTAL_ROW]
    what = "group" if "files" in result["settings"]["data"] else "family"
    head = [f"| {what} | n |" + (" n train |" if fit else ""), "|---|---:|" + ("---:|" if fit else "")]
    for r in runs:
        label = _label(r, result["runs"][r]) if r in result["runs"] else r
        head[0] += f" {label} |" + (f" {r}: train |" if fit else "")
        head[1] += "---:|" + ("---:|" if fit else "")
    lines = list(head)
    unfit: dict[str, list[str]] = {}
    for fam, row in table.items():
        line = f"| {_row_label(table, fam)} | {row['count']} |" + (f" {row['train_count']} |" if fit else "")
        for r in runs:
            line += f" {_cell(row['runs'].get(r), row['count'])} |"
            if fit:
                tr = row["train_runs"].get(r)
                line += f" {_cell(tr, row['train_count'])} |"
                if (
                    r not in (CONTROL, *NO_WEIGHTS)
                    and fam not in (TOTAL_ROW, HEADLINE_ROW, *GROUP_ROWS)
                    and tr is not None
                    and row["train_count"]
                    and tr["pass@1"] < UNFIT_TRAIN_EXACT
                ):
                    unfit.setdefault(r, []).append(fam)
        lines.append(line)
    lines.append("")
    if unfit:
        lines += [
            f"**Not fitted per {what}** (train pass@1 under {UNFIT_TRAIN_EXACT} on the train-fit set): "
            + "; ".join(f"{r}: {', '.join(f)}" for r, f in unfit.items())
            + f". A {what} that a run does not solve in training says nothing about held-out generalisation.",
            "",
        ]
    return lines


def _run_lines(result: dict) -> list[str]:
    lines = ["| run | status | steps | train exact | train s | eval s |", "|---|---|---:|---:|---:|---:|"]
    unfit, cut, notes = [], [], []
    for name, r in result["runs"].items():
        ts, es, te = r.get("train_seconds"), r.get("eval_seconds"), r.get("train_exact")
        status = r["status"]
        if status == "cut_short":
            status = f"cut short at step {r['steps']}" + (f" of {r['total_steps']}" if r.get("total_steps") else "")
            cut.append(f"{name} ({r['cut_short']['message']})")
        steps = r.get("steps")
        lines.append(
            f"| {name} | {status} | {'' if steps is None else steps} | {'' if te is None else f'{te:.2f}'} | "
            f"{'' if ts is None else f'{ts:.0f}'} | {'' if es is None else f'{es:.0f}'} |"
        )
        if name != CONTROL and r["status"] in SCORED and te is not None and te < UNFIT_TRAIN_EXACT:
            unfit.append(f"{name} ({te:.2f})")
        if r.get("train_fit_failed"):
            notes.append(f"{name}: the train-fit evaluation failed: {r['train_fit_failed']}")
        early = _halts_early(name, r, result)
        if early:
            notes.append(early)
        ttt = _ttt_note(name, r)
        if ttt:
            notes.append(ttt)
    lines += ["", "train exact: exact accuracy on the training batches of the last log window."]
    if unfit:
        lines += [
            "",
            f"**Not fitted** (train exact under {UNFIT_TRAIN_EXACT}): {', '.join(unfit)}. A run that does "
            "not solve its own training examples says nothing about generalisation to held-out ones; train "
            'longer or on fewer families (docs/science.md, "Current results"). The control is expected to '
            "stay low.",
        ]
    if cut:
        lines += [
            "",
            (
                f"**Cut short** (training did not finish): {'; '.join(cut)}. A cut-short run's numbers are "
                "those of its last checkpoint; run the same command again to resume its training from there "
                "(--no-train evaluates without training)."
            ),
        ]
    if notes:
        lines += [""] + notes
    return lines


def _ttt_note(name: str, r: dict) -> Optional[str]:
    """``<run>: test-time training N steps on each puzzle's demos: demo fit 0.12 -> 0.85, 0.8 s per puzzle copy``
    (evaluate.py ``ttt_steps``; held-out evaluation)."""
    m = r.get("metrics") or {}
    if not m.get("ttt/steps"):
        return None
    return (
        f"{name}: test-time training {m['ttt/steps']:.0f} steps on each held-out puzzle's demos: demo fit "
        f"{m.get('ttt/fit_before', float('nan')):.2f} -> {m.get('ttt/fit_after', float('nan')):.2f}, "
        f"{m.get('ttt/seconds_per_puzzle', float('nan')):.2f} s per puzzle copy "
        f"({m.get('ttt/num_puzzles', 0):.0f} copies)"
    )


def halts_early(r: dict, eval_overrides: Sequence[str]) -> bool:
    """Whether a scored run's Q head halts its training samples half a step or more before ``halt_max_steps``
    while its evaluation scores the last ACT step (evaluate.py's default, i.e. no ``halt_early=true`` among
    ``eval_overrides``): training no longer supervises the steps after a sample halts, so that score can be far
    below the one at the halting step (0.29 against 0.98 for one map-probe checkpoint; e88a31a,
    docs/record/2026-11-25-context-size-steps-halting.md)."""
    steps, top = r.get("train_steps"), r.get("halt_max_steps")
    halting = any(o.replace(" ", "").lower() in ("halt_early=true", "halt_early=1") for o in eval_overrides or [])
    return not (steps is None or not top or steps > top - 0.5 or halting or r.get("status") not in SCORED)


def _halts_early(name: str, r: dict, result: dict) -> Optional[str]:
    """The report's note for a run that :func:`halts_early`."""
    if not halts_early(r, result.get("settings", {}).get("eval_overrides") or []):
        return None
    steps, top = r["train_steps"], r["halt_max_steps"]
    if "halting_step" in r:
        return (
            f"**Halts early**: {name} halts its training samples after {steps:.2f} of {top} ACT steps on average; "
            "the tables above count the last step, which training no longer supervises for those samples, and "
            '"At the Q head\'s halting step" scores the same checkpoint where each sample halts '
            "(evaluate.py halt_early=true)."
        )
    return (
        f"**Halts early**: {name} halts its training samples after {steps:.2f} of {top} ACT steps on average, and "
        "its scores count the last step, which training no longer supervises for those samples. Score it at "
        f"the Q head's halting step too: `python evaluate.py checkpoint={r['run_dir']}/checkpoint "
        "data_path=<out>/data/built halt_early=true` (or run the command with --eval-override halt_early=true)."
    )


def _readout_lines(result: dict) -> list[str]:
    """Per run trained with the rule readout: what its encoder's context names, per family (held-out / train)."""
    lines = []
    for name, r in result["runs"].items():
        if "rule_readout_failed" in r:
            lines += ["", f"**Rule readout, {_label(name, r)}**: failed ({r['rule_readout_failed']})."]
        if "rule_readout" in r:
            ro = r["rule_readout"]
            lines += [
                "",
                f"**Rule readout, {_label(name, r)}** (`experiments.science.readout`): how often the readout "
                "head names the rule of a sample from its context, every augmented copy a sample. Rule named "
                "but answers wrong: the core does not apply it; not named: the encoder does not read it.",
                "",
            ]
            lines += format_table(ro["heldout"], ro.get("train"))
    return lines


def render_markdown(result: dict) -> str:
    """science.md: the settings, the per-family (per-group) table of the runs that were evaluated, held-out next to
    train fit, every run's status and training fit (and, for rule-readout runs, what the context names)."""
    lines = _settings_lines(result) + _data_note_lines(result)
    one = _family_lines(result, ONE_COPY_TABLE)
    if one:
        lines += [
            "## One copy: each held-out puzzle as drawn (the headline)",
            "",
            "pass@1 / pass@2 of one prediction per test input, no vote (evaluate.py `num_augmentations=1`). "
            "Train columns: the train-fit set voted over its copies.",
            "",
            *one,
            f"## Voted over the copies ({result['settings']['data'].get('num_aug', 0)} per puzzle at most; every "
            "evaluation copy is itself a held-out rule instance)",
            "",
        ]
    lines += _family_lines(result)
    halting = _family_lines(result, HALTING_TABLE)
    if halting:
        lines += [
            "## At the Q head's halting step",
            "",
            "The same checkpoints scored where each sample's Q head halts (evaluate.py `halt_early=true`) "
            "instead of after every ACT step: the score of a run whose samples halt early (training does not "
            "supervise the steps after that).",
            "",
        ] + halting
    lines += _readout_lines(result) + _run_lines(result)
    lines += ["", f"Total wall time {result['wall_seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def write_report(out: str, result: dict) -> str:
    """Write ``out``/science.json and science.md (atomically); returns the markdown."""
    write_json_atomic(os.path.join(out, "science.json"), result)
    md = render_markdown(result)
    atomic_write(os.path.join(out, "science.md"), lambda f: f.write(md))
    return md

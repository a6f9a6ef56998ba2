"""Score any evaluate.py predictions on a science command's held-out puzzles, per family (one column each).

    python -m experiments.science.score DIR NAME=PREDICTIONS.json [NAME=PREDICTIONS.json ...] [--out T.md]

DIR is a science command's ``--out`` (its data); each PREDICTIONS.json an evaluate.py ``predictions.json`` over
exactly its held-out puzzles, e.g. the same checkpoint evaluated with test-time training::

    python evaluate.py checkpoint=DIR/runs/standard/checkpoint data_path=DIR/data/built output_dir=TTT \\
        ttt_steps=32 ttt_params=all ttt_augment=0 ...        # one copy per puzzle (the original), no vote
    python -m experiments.science.score DIR none=DIR/runs/standard/eval-one-copy/predictions.json \\
        ttt=TTT/predictions.json

Cells: pass@1 over the family's held-out puzzles, with the covered / open / headline / all rows of the command's own
table (:func:`experiments.science.report.family_table`). Which copies were voted is the evaluation's business: one
copy per puzzle (``num_augmentations=1``) is the headline's protocol. ``--one-copy`` scores a voted evaluation by the
answer of its identity copy alone (the puzzle as drawn; each candidate's ``identity`` flag in ``predictions.json``),
e.g. test-time training fitted on every copy's demos together (``ttt_pool=true``) and answered on the original.

A second table splits the headline puzzles by :func:`orbit_split`: those that a dihedral map of the whole puzzle
turns into a structure training shows (held out as drawn, not up to symmetry: what an equivariant reader or a vote
over dihedral copies answers from a trained structure) and the rest, held out beyond symmetry.

When a ``ttt.json`` lies beside a predictions file (evaluate.py's test-time training), a third table splits that
run's held-out puzzles as drawn by the fit: ``fitted`` (share whose demos the fitted model reproduces exactly, fit 1.0
after the fit), ``answered | fitted`` and ``answered | not fitted`` (share of those whose every test output is right):
whether a fitted demo set gives the test answer (:func:`fit_transfer`).

With two or more files, a last table pairs every run with the first, puzzle by puzzle (:func:`paired`): per group
row, the held-out puzzles only the first answers, those only the run answers, and the two-sided exact sign test's p
on those (:func:`sign_test`; for runs on other data seeds, add the counts and call it on the sums).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from typing import Optional, Sequence

from core.io import read_json
from core.table import markdown_table
from dataset.rule_identity import in_training_orbit
from experiments.science.common import TOTAL_ROW, ScienceError
from experiments.science.data import ScienceData, prepare_synthetic
from experiments.science.report import family_table, puzzle_scores, row_puzzles
from training.compare_runs import table_command


def load_data(out: str) -> ScienceData:
    """The synthetic science data of ``out`` as built (nothing is built here); what it says about the data goes to
    stderr, so that stdout is the table alone."""
    path = os.path.join(out, "data", "settings.json")
    if not os.path.exists(path):
        raise ScienceError(f"{out}: no science data ({path} missing; run python -m experiments.science first)")
    settings = read_json(path, ScienceError)
    if "files" in settings:
        raise ScienceError(f"{path}: built from your own puzzles (--input-file-prefix); score reads the synthetic data")
    with contextlib.redirect_stdout(sys.stderr):
        return prepare_synthetic(out, settings, no_train=True)


def score(out: str, predictions: dict[str, str]) -> dict:
    """``family_table`` of the predictions files (name -> path) on ``out``'s held-out puzzles."""
    return _table(load_data(out), _read(predictions), predictions)


def _read(predictions: dict[str, str], one_copy: bool = False) -> dict[str, dict]:
    out = {name: read_json(path, ScienceError) for name, path in predictions.items()}
    return {name: identity_answers(p, predictions[name]) for name, p in out.items()} if one_copy else out


def identity_answers(predictions: dict, path: str) -> dict:
    """``predictions`` (evaluate.py's) as if only the identity copy had voted: per test input, ``correct_rank`` 1 when
    the candidate the identity copy voted for is right, else None (a malformed identity answer has no candidate). A
    row of one vote without the flags (a one-copy evaluation written before they existed) is kept as it is; a voted
    row without them is refused."""
    out = {}
    for name, rows in predictions.items():
        out[name] = []
        for row in rows:
            cands = row.get("candidates", [])
            if any("identity" not in c for c in cands):
                if row.get("num_votes", 0) > 1:
                    raise ScienceError(f"{path}: {name!r} has candidates without 'identity' (re-run evaluate.py)")
                out[name].append(row)
                continue
            mine = [c for c in cands if c["identity"]]
            right = bool(mine) and bool(mine[0].get("correct"))
            one = dict(candidates=mine, num_candidates=len(mine), num_votes=1)  # the identity copy's one vote
            out[name].append(dict(row, correct_rank=1 if right else None, **one))
    return out


def _table(data: ScienceData, pred: dict[str, dict], paths: dict[str, str]) -> dict:
    try:
        return family_table(data.rules, pred, headline=data.headline, groups=data.groups)
    except ScienceError as e:
        raise ScienceError(f"{e} ({', '.join(f'{n}={p}' for n, p in paths.items())})") from None


def fit_transfer(data: ScienceData, table: dict, predictions: dict, ttt: dict) -> dict:
    """Per row of ``table`` (family and group rows): of its held-out puzzles as drawn, how many had their demos fitted
    (``fit_after`` 1.0 in evaluate.py's ``ttt.json``) and how many of the fitted / the others answered every test
    output (``correct_rank`` 1 in ``predictions``). ``ttt.json`` entries of augmented copies are not counted; a held-out
    puzzle without an entry of its own is refused."""
    names = read_json(os.path.join(data.built, "identifiers.json"), ScienceError)
    fit = {}
    for i, entry in enumerate(ttt.get("puzzles", [])):
        if not isinstance(entry, dict) or not {"puzzle_identifier", "fit_after"} <= set(entry):
            raise ScienceError(f"puzzles[{i}] has no puzzle_identifier / fit_after (evaluate.py's ttt.json has both)")
        pid = entry["puzzle_identifier"]
        if 0 <= pid < len(names) and names[pid] in predictions:
            fit[names[pid]] = float(entry["fit_after"]) >= 1.0
    heldout = {p: r["family"] for p, r in data.rules.items() if r.get("subset") == "evaluation"}
    missing = sorted(set(heldout) - set(fit))
    if missing:
        raise ScienceError(f"ttt.json has no entry for {len(missing)} held-out puzzles as drawn (e.g. {missing[0]!r})")
    out = {}
    for row, ids in row_puzzles(table, heldout).items():
        if not ids:
            continue
        ok = {p: all(r.get("correct_rank") == 1 for r in predictions[p]) for p in ids}
        done = [p for p in ids if fit[p]]
        rest = [p for p in ids if not fit[p]]
        out[row] = {"count": len(ids), "fitted": len(done) / len(ids)}
        out[row].update(answered_fitted=_share(ok, done), answered_not_fitted=_share(ok, rest))
    return out


ORBIT_ROWS = ("a dihedral map from a trained structure", "beyond every trained structure's dihedral maps")


def orbit_split(data: ScienceData, predictions: dict[str, dict]) -> dict:
    """``family_table`` rows of the headline families' held-out puzzles split by
    :func:`dataset.rule_identity.in_training_orbit`: those a dihedral map of the whole puzzle turns into a structure
    training shows (held out as drawn, not up to symmetry) and the rest."""
    hl = set(data.headline or {r["family"] for r in data.rules.values()})
    orbit = in_training_orbit(data.rules)
    labels = {
        p: {"family": ORBIT_ROWS[0] if orbit[p] else ORBIT_ROWS[1], "subset": "evaluation"}
        if data.rules[p]["family"] in hl
        else {"family": "not headline", "subset": "evaluation"}
        for p in orbit
    }
    table = family_table(labels, predictions)
    return {row: table[row] for row in ORBIT_ROWS if row in table}


def sign_test(only_a: int, only_b: int) -> float:
    """The two-sided exact sign test (McNemar's exact test) of paired outcomes: the probability, with each
    discordant pair equally likely to go either way, of a split at least as uneven as ``only_a`` : ``only_b``."""
    n, k = only_a + only_b, min(only_a, only_b)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0


def paired(data: ScienceData, predictions: dict[str, dict]) -> dict:
    """Every run after the first, paired with the first on the same held-out puzzles: per row of the group rows
    (covered, open), the headline and the total, ``{run: {row: (only the first, only the run, p)}}``. A puzzle
    counts for the run that scores the higher pass@1 on it (one test input: the one that answers it)."""
    heldout = {p: r["family"] for p, r in data.rules.items() if r.get("subset") == "evaluation"}
    table = family_table(data.rules, {}, headline=data.headline, groups=data.groups)  # the rows alone
    rows = {k: ids for k, ids in row_puzzles(table, heldout).items() if k == TOTAL_ROW or "families" in table[k]}
    (_, base), *rest = predictions.items()
    out = {}
    first = {p: puzzle_scores(base[p])[0] for p in heldout}
    for run, pred in rest:
        out[run] = {}
        diff_of = {p: puzzle_scores(pred[p])[0] - first[p] for p in heldout}
        for row, ids in rows.items():
            diff = [diff_of[p] for p in ids]
            a, b = sum(d < 0 for d in diff), sum(d > 0 for d in diff)
            out[run][row] = (a, b, sign_test(a, b))
    return out


def render_paired(pairs: dict, first: str) -> str:
    rows = [[run, row, str(a), str(b), f"{p:.3g}"] for run, by in pairs.items() for row, (a, b, p) in by.items()]
    header = ["run", "held-out puzzles", f"only {first}", "only the run", "sign test p"]
    return "\n".join(markdown_table(header, rows, right=[False, False, True, True, True])) + "\n"


def _share(ok: dict, ids: list) -> Optional[float]:
    return sum(ok[p] for p in ids) / len(ids) if ids else None


def render_fit(transfer: dict, name: str) -> str:
    cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rows = [
        [f"{row} ({t['count']})", cell(t["fitted"]), cell(t["answered_fitted"]), cell(t["answered_not_fitted"])]
        for row, t in transfer.items()
    ]
    header = [f"{name}: demo fit (puzzles)", "fitted", "answered | fitted", "answered | not fitted"]
    return "\n".join(markdown_table(header, rows, right=[False, True, True, True])) + "\n"


def render(table: dict, names: Sequence[str], first: str = "family (held-out puzzles)") -> str:
    rows = [
        [f"{fam} ({row['count']})"] + [f"{row['runs'][n]['pass@1']:.2f}" if n in row["runs"] else "-" for n in names]
        for fam, row in table.items()
        if row.get("count")
    ]
    header = [first] + list(names)
    return "\n".join(markdown_table(header, rows, right=[False] + [True] * len(names))) + "\n"


def _pairs(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ScienceError(f"expected NAME=PREDICTIONS.json, got {item!r}")
        if name in out:
            raise ScienceError(f"the name {name!r} is given twice")
        out[name] = path
    return out


def _arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("dir", help="a science command's --out (its data/)")
    ap.add_argument("predictions", nargs="+", help="NAME=PREDICTIONS.json (evaluate.py's), one column each")
    ap.add_argument(
        "--one-copy", action="store_true", help="score each file by its identity copy's answer alone (not the vote)"
    )


def main(argv: Optional[Sequence[str]] = None) -> str:
    def run(a):
        named = _pairs(a.predictions)
        data, pred = load_data(a.dir), _read(named, a.one_copy)
        table = _table(data, pred, named)
        text = render(table, list(named))
        text += "\n" + render(orbit_split(data, pred), list(named), "headline, held out up to symmetry (puzzles)")
        for name, path in named.items():
            ttt = os.path.join(os.path.dirname(os.path.abspath(path)), "ttt.json")
            if os.path.exists(ttt):
                fits = read_json(ttt, ScienceError)
                try:
                    text += "\n" + render_fit(fit_transfer(data, table, pred[name], fits), name)
                except ScienceError as e:
                    raise ScienceError(f"{ttt}: {e}") from None
        if len(named) > 1:
            text += "\n" + render_paired(paired(data, pred), next(iter(named)))
        return text

    return table_command(
        argv, "python -m experiments.science.score", __doc__, _arguments, run, "also write the table to this file"
    )


if __name__ == "__main__":
    main()

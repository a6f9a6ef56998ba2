"""The science command's stages: builder -> pretrain_encoder.py -> evaluate.py -> per-family table.

Each stage is a user-facing command run as a subprocess in the repository root, its log in the output dir:

1. data (:mod:`experiments.science.data`): ``python -m dataset.build_synthetic_dataset ... --mode etrm`` (the
   synthetic rule families), or ``python -m dataset.build_arc_dataset --input-file-prefix P ... --mode etrm``
   (your own kaggle-layout files); plus the train-fit set (a sample of the training puzzles as a test split);
2. training (:func:`train_and_evaluate`): ``python pretrain_encoder.py --config-name <config> encoder=<name>``
   per run (``control`` = standard with ``encoder.zero_demos=true``), checkpointing every ``checkpoint_every``
   steps (config/cfg_science.yaml);
3. evaluation: ``python evaluate.py checkpoint=... data_path=...`` on the held-out puzzles and on the train-fit
   set (voting over the augmented copies, pass@K);
4. report (:mod:`experiments.science.report`): science.json / science.md.

Resumable: data built with the same settings, a run whose summary.json says ``finished`` and an evaluation of the
same checkpoint step (metrics.json and predictions.json) are reused; a run that was cut short (killed,
interrupted, failed) resumes from its last checkpoint (``resume=true``); ``no_train`` evaluates what exists (a
cut-short run: its last checkpoint, flagged in the table). An --out built with other settings (data options,
steps, overrides, the resolved training recipe, recorded in data/settings.json and runs/<run>/run.json) is refused.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from typing import Any, Optional, Sequence

from core.io import read_json, write_json_atomic
from experiments.science.common import (
    CONTROL,
    FIT_EVAL,
    HALT_FIT_EVAL,
    HALT_HELDOUT_EVAL,
    HELDOUT_EVAL,
    NO_WEIGHTS,
    ONE_COPY_EVAL,
    ONE_COPY_TABLE,
    PROGRAM,
    SEARCH,
    ScienceError,
    check_same,
    evaluate_checkpoint,
    hydra_quote,
    read_json_or_none,
    run_logged,
    say,
    say_unreported_runs,
)
from experiments.science.curve import run_curve
from experiments.science.data import (
    ScienceData,
    files_settings,
    load_user_puzzles,
    prepare_files,
    prepare_fit,
    prepare_synthetic,
    synthetic_rules_path,
)
from experiments.science.pointer import search_scores
from experiments.science.program import program_scores
from experiments.science.readout import readout_accuracy
from experiments.science.recipe import _comparable, recipe_override, resolve_recipe, run_plan
from experiments.science.report import (
    HALTING_TABLE,
    augmentation_note,
    check_against_evaluator,
    family_table,
    halts_early,
    write_report,
)
from experiments.science.settings import ScienceSettings
from training.checkpoint import list_checkpoints


# a run's own paths and names, and how often it checkpoints: not part of its recipe (they do not change what it
# learns), so an --out keeps its runs when only these change
def _rule_readout_overrides(out: str, weight: float, input_file_prefix: Optional[str]) -> list[str]:
    """The training overrides of ``--rule-readout W``: the weight and the synthetic builder's rules.json."""
    if weight < 0:
        raise ScienceError(f"--rule-readout must be >= 0, got {weight}")
    if weight == 0:
        return []
    if input_file_prefix is not None:
        raise ScienceError(
            "--rule-readout needs the synthetic families (their builder knows each puzzle's rule); "
            "your own puzzles have no rule labels"
        )
    return [f"encoder.rule_readout={weight}", f"rule_labels={synthetic_rules_path(out)}"]


def oracle_eval_overrides(recipe: dict, overrides: Sequence[str], eval_overrides: Sequence[str]) -> list[str]:
    """evaluate.py's overrides for a run: an ``encoder.oracle_context`` run (told the true rule) also gets the
    training's ``rule_labels=`` so that its evaluation reads the evaluated puzzles' labels (evaluate.py refuses an
    oracle run without them)."""
    if not (recipe.get("encoder") or {}).get("oracle_context"):
        return list(eval_overrides)
    return list(eval_overrides) + [o for o in overrides if o.split("=", 1)[0] == "rule_labels"]


def _latest_step(ck: str) -> Optional[int]:
    """Step of the newest checkpoint file in ``ck`` (None: none)."""
    cks = list_checkpoints(ck) if os.path.isdir(ck) else []
    return cks[-1][0] if cks else None


def _train(
    name: str,
    run_dir: str,
    built: str,
    *,
    config: str,
    encoder: str,
    extra: list[str],
    steps: Optional[int],
    overrides: list[str],
    no_train: bool,
) -> dict:
    """Stage 2 for one run: pretrain_encoder.py unless its summary.json says finished (a cut-short run resumes
    from its last checkpoint). Returns {"outcome": finished | cut_short | failed | not_trained, "summary",
    "message", "exit_status"}; cut_short = not finished but a checkpoint to evaluate."""
    ck = os.path.join(run_dir, "checkpoint")
    summary = read_json_or_none(os.path.join(ck, "summary.json"))
    if summary is not None and summary.get("status") == "finished":
        say(f"{name}: training finished earlier ({summary.get('steps')} steps), reused")
        return dict(outcome="finished", summary=summary)
    before = _latest_step(ck)
    if no_train:
        if before is None:
            say(f"{name}: not trained (--no-train)")
            return dict(outcome="not_trained", summary=summary, message="no checkpoint (--no-train)")
        say(f"{name}: training did not finish; evaluating its last checkpoint (step {before}, --no-train)")
        return dict(
            outcome="cut_short",
            summary=summary,
            exit_status=None,
            message=f"{(summary or {}).get('stop_reason') or 'killed'}, last checkpoint step {before}; "
            "not resumed (--no-train)",
        )
    if before is None:  # trained from scratch: evaluations in the run dir are of other weights (same step numbers)
        for sub in (HELDOUT_EVAL, FIT_EVAL, HALT_HELDOUT_EVAL, HALT_FIT_EVAL):
            shutil.rmtree(os.path.join(run_dir, sub), ignore_errors=True)
    cmd = [
        sys.executable,
        "pretrain_encoder.py",
        "--config-name",
        config,
        f"data_paths=[{hydra_quote(built)}]",
        f"encoder={encoder}",
        f"checkpoint_path={hydra_quote(ck)}",
        "resume=true",
        f"+run_name=science-{name}",
        "+project_name=etrm-science",
    ]
    cmd += ([f"max_steps={steps}"] if steps is not None else []) + extra + list(overrides)
    log = os.path.join(run_dir, "train.log")
    if before is not None:
        say(f"{name}: resuming the cut-short run from its checkpoint at step {before}; log {log}")
    else:
        say(
            f"{name}: training (encoder={encoder}{' encoder.zero_demos=true' if extra else ''}"
            f"{', ' + str(steps) + ' steps' if steps else ''}); log {log}"
        )
    rc, secs, last = run_logged(cmd, log, append=before is not None)
    summary = read_json_or_none(os.path.join(ck, "summary.json"))
    if rc in (0, 3) and summary is not None and summary.get("status") == "finished":
        say(f"{name}: trained {summary.get('steps')} steps in {secs:.0f} s")
        return dict(outcome="finished", summary=summary)
    after = _latest_step(ck)
    if after is None:
        say(f"{name}: training FAILED (exit {rc}): {last}")
        return dict(outcome="failed", summary=summary, exit_status=rc, message=last)
    say(
        f"{name}: training stopped early (exit {rc}: {last}); evaluating its last checkpoint (step {after}); "
        "run the command again to resume it"
    )
    return dict(
        outcome="cut_short",
        summary=summary,
        exit_status=rc,
        message=f"training exited with status {rc} ({last}), last checkpoint step {after}",
    )


_METRIC_KEYS = (
    "ARC/pass@1",
    "ARC/pass@2",
    "ARC/num_puzzles",
    "ARC/num_test_inputs",
    "ARC/malformed_frac",
    "ttt/steps",
    "ttt/fit_before",
    "ttt/fit_after",
    "ttt/seconds_per_puzzle",
    "ttt/num_puzzles",
    "ttt/num_fits",
)


def _evaluate(
    name: str,
    run_dir: str,
    data: ScienceData,
    heldout: list[str],
    fit: Optional[tuple[str, list[str]]],
    step: int,
    eval_overrides: list[str],
    subs: tuple[str, str],
    what: str,
) -> tuple[dict, Optional[dict]]:
    """Stage 3 for one run: evaluate.py on the held-out puzzles and on the train-fit set (into the run dir's
    ``subs``). Returns (the record's scores: metrics and predictions paths, None) or ({}, the held-out failure);
    a train-fit failure leaves the held-out numbers and is recorded as ``train_fit_failed``."""
    m, failed = evaluate_checkpoint(
        name, run_dir, data.built, subs[0], heldout, step, eval_overrides, f"the held-out puzzles{what}"
    )
    if failed is not None:
        return {}, failed
    metrics = m["metrics"]
    rec = dict(
        eval_seconds=metrics.get("eval/wall_seconds"),
        evaluated_step=m.get("checkpoint_step"),
        predictions=os.path.join(run_dir, subs[0], "predictions.json"),
        metrics={k: metrics[k] for k in _METRIC_KEYS if k in metrics},
    )
    if fit is not None:
        m, failed = evaluate_checkpoint(
            name,
            run_dir,
            fit[0],
            subs[1],
            fit[1],
            step,
            eval_overrides,
            f"the train-fit set ({len(fit[1])} training puzzles){what}",
        )
        if failed is not None:  # the held-out numbers stand; the train-fit column stays empty
            rec["train_fit_failed"] = failed["message"]
        else:
            rec.update(
                train_fit_predictions=os.path.join(run_dir, subs[1], "predictions.json"),
                train_fit_metrics={k: m["metrics"][k] for k in _METRIC_KEYS if k in m["metrics"]},
            )
    return rec, None


def train_and_evaluate(
    settings: ScienceSettings,
    name: str,
    data: ScienceData,
    fit: Optional[tuple[str, list[str]]],
    *,
    overrides: list[str],
    recipe: dict,
) -> dict:
    """Stages 2-3 for one run: train with pretrain_encoder.py (unless its summary.json says finished; a
    cut-short run resumes), then evaluate.py on the held-out puzzles and the train-fit set -- a second time at the
    Q head's halting step (``settings.halting_step``, or a run that :func:`~experiments.science.report.halts_early`).
    ``overrides``: the training overrides in effect (the settings' and the rule readout's). Returns the run's
    record (status ok | cut_short | not_trained | train_failed | eval_failed, steps, times, metrics, paths;
    ``halting_step``: the same scores at the halting step)."""
    out, config, steps, no_train = settings.out, settings.config, settings.steps, settings.no_train
    encoder, extra = run_plan(name)
    run_dir = os.path.join(out, "runs", name)
    spec = {
        "encoder": encoder,
        "overrides": extra + list(overrides),
        "steps": steps,
        "config": config,
        "data": data.settings,
        "recipe": recipe,
    }
    spath = os.path.join(run_dir, "run.json")
    check_same(spath, _comparable(read_json_or_none(spath)), _comparable(spec), f"run {name!r}")
    rec: dict[str, Any] = {"encoder": encoder, "zero_demos": name == CONTROL, "run_dir": run_dir, "status": None}
    if not (no_train and not os.path.isdir(run_dir)):
        write_json_atomic(spath, spec)
    t = _train(
        name,
        run_dir,
        data.built,
        config=config,
        encoder=encoder,
        extra=extra,
        steps=steps,
        overrides=overrides,
        no_train=no_train,
    )
    summary = t["summary"] or {}
    if t["outcome"] in ("failed", "not_trained"):
        status = "train_failed" if t["outcome"] == "failed" else "not_trained"
        return dict(rec, status=status, exit_status=t.get("exit_status"), message=t.get("message"))
    rec.update(
        steps=summary.get("steps"),
        total_steps=summary.get("total_steps") or recipe.get("max_steps"),
        train_seconds=summary.get("wall_time_s"),
        stop_reason=summary.get("stop_reason"),
        num_params=summary.get("num_params"),
        # exact accuracy on the training batches of the last log window: did the run fit its data?
        train_exact=(summary.get("final") or {}).get("train/exact_accuracy"),
        # mean ACT steps of those batches: a run that halts early is scored on a step training skips
        train_steps=(summary.get("final") or {}).get("train/steps"),
        halt_max_steps=(recipe.get("arch") or {}).get("halt_max_steps"),
    )
    step = _latest_step(os.path.join(run_dir, "checkpoint"))
    if t["outcome"] == "cut_short":
        rec.update(steps=step, cut_short={"step": step, "message": t["message"], "exit_status": t.get("exit_status")})
    heldout = sorted(p for p, r in data.rules.items() if r["subset"] == "evaluation")
    enc = recipe.get("encoder") or {}
    eval_overrides = oracle_eval_overrides(recipe, overrides, settings.eval_overrides)
    scores, failed = _evaluate(name, run_dir, data, heldout, fit, step, eval_overrides, (HELDOUT_EVAL, FIT_EVAL), "")
    if failed is not None:
        return dict(rec, **failed)
    rec.update(scores, status="ok" if t["outcome"] == "finished" else "cut_short")
    rec.update(_one_copy(name, run_dir, data, heldout, step, eval_overrides))
    if settings.halting_step or halts_early(rec, eval_overrides):  # also where each sample's Q head halts
        scores, failed = _evaluate(
            name,
            run_dir,
            data,
            heldout,
            fit,
            step,
            eval_overrides + ["halt_early=true"],
            (HALT_HELDOUT_EVAL, HALT_FIT_EVAL),
            " at the halting step",
        )
        if failed is not None:  # the every-step numbers stand
            rec["halting_step_failed"] = failed["message"]
        else:
            rec["halting_step"] = scores
    if enc.get("rule_readout", 0) > 0 and not enc.get("oracle_context"):  # what the context names
        _add_rule_readout(rec, name, run_dir, data, synthetic_rules_path(out))
    return rec


def _one_copy(name: str, run_dir: str, data: ScienceData, heldout: list[str], step: int, overrides: list) -> dict:
    """Each held-out puzzle as drawn, one copy, no vote (the headline): the record's one_copy_predictions and
    one_copy_metrics, or one_copy_failed (the voted numbers stand)."""
    one_copy = [o for o in overrides if not o.replace(" ", "").startswith("num_augmentations=")]
    one, failed = evaluate_checkpoint(
        name, run_dir, data.built, ONE_COPY_EVAL, heldout, step, one_copy + ["num_augmentations=1"], "one copy"
    )
    if failed is not None:
        return {"one_copy_failed": failed["message"]}
    return {
        "one_copy_predictions": os.path.join(run_dir, ONE_COPY_EVAL, "predictions.json"),
        "one_copy_metrics": {k: one["metrics"][k] for k in _METRIC_KEYS if k in one["metrics"]},
    }


def _add_rule_readout(rec: dict, name: str, run_dir: str, data: ScienceData, rules: str) -> None:
    """How often the run's context names the rule of held-out / training puzzles (``rule_readout``); a failure
    leaves the table as it is (``rule_readout_failed``), as after an evaluation failure."""
    ck = os.path.join(run_dir, "checkpoint")
    try:
        rec["rule_readout"] = {
            s: readout_accuracy(ck, data.built, rules, split) for s, split in (("heldout", "test"), ("train", "train"))
        }
    except (ValueError, OSError, RuntimeError) as e:
        say(f"{name}: rule readout FAILED: {e}")
        rec["rule_readout_failed"] = str(e)


def _table(
    data: ScienceData,
    scored: dict[str, dict],
    fit: Optional[tuple[str, list[str]]],
    holdout_families: Sequence[str],
    no_weights: Optional[dict] = None,
    key: str = "predictions",
) -> dict:
    """The per-family table of the runs' evaluations (records with ``<key>`` / ``train_fit_predictions`` paths;
    ``key`` one_copy_predictions: the one-copy table), checked against evaluate.py's own pass@K, with each of
    ``no_weights`` (name -> :func:`experiments.science.program.program_scores` or
    :func:`experiments.science.pointer.search_scores`) as a row beside the runs."""
    fit_pred = {
        n: read_json(r["train_fit_predictions"], ScienceError)
        for n, r in scored.items()
        if "train_fit_predictions" in r
    }
    pred = {n: read_json(r[key], ScienceError) for n, r in scored.items() if key in r}
    for name, program in (no_weights or {}).items():
        pred[name] = program["heldout"]
        if program["train_fit"] is not None and fit:
            fit_pred[name] = program["train_fit"]
    table = family_table(
        data.rules,
        pred,
        holdout_families,
        train_fit=(fit[1], fit_pred) if fit else None,
        headline=data.headline,
        groups=data.groups,
    )
    metrics = "metrics" if key == "predictions" else key.replace("predictions", "metrics")
    check_against_evaluator(table, {n: dict(r, metrics=r.get(metrics, {})) for n, r in scored.items() if key in r})
    return table


def run_science_command(settings: ScienceSettings) -> dict:
    """The whole experiment (see the module docstring and :class:`ScienceSettings`); returns the result written to
    science.json."""
    t0 = time.time()
    s = dataclasses.replace(settings, out=os.path.abspath(settings.out))  # the stages run in the repository root
    fams, names = s.check()
    overrides = list(s.overrides) + _rule_readout_overrides(s.out, s.rule_readout, s.input_file_prefix)
    if s.no_train and not os.path.exists(os.path.join(s.out, "data", "settings.json")):
        raise ScienceError(
            f"--no-train: {s.out} holds no science data (nothing was trained there; run the command "
            "without --no-train first)"
        )
    recipes = {n: resolve_recipe(s.config, n, s.steps, overrides) for n in names}
    say_unreported_runs(s.out, names)
    user = None
    if s.input_file_prefix is not None:
        user = load_user_puzzles(s.input_file_prefix, s.groups_file)  # every file validated before any work
        data_settings = files_settings(user, canvas_size=s.canvas_size, seed=s.seed, num_aug=s.files_num_aug)
        say(augmentation_note(data_settings["num_aug"]).replace("**", ""))
    else:
        data_settings = s.synthetic_data(fams)
    os.makedirs(s.out, exist_ok=True)
    if user is not None:
        data = prepare_files(s.out, user, data_settings, no_train=s.no_train)
    else:
        data = prepare_synthetic(s.out, data_settings, no_train=s.no_train)
    fit = prepare_fit(s.out, data, s.train_fit_puzzles)
    runs = {n: train_and_evaluate(s, n, data, fit, overrides=overrides, recipe=recipes[n]) for n in names}
    scored = {n: r for n, r in runs.items() if r["status"] in ("ok", "cut_short")}
    holdout = s.holdout_families if user is None else ()
    heldout = sorted(p for p, r in data.rules.items() if r["subset"] == "evaluation")
    side = data.settings["canvas_size"]
    program = program_scores(data.training_prefix, heldout, fit[1] if fit else None, side, recipes[names[0]])
    say(f"{PROGRAM}: held-out puzzles answered by a view / the lookups: {program['answered_by']}")
    no_weights = {PROGRAM: program}
    if user is None:  # the pointer's canvas is the data's: at ARC's 30 x 30, ~200 times the 8 x 8 work per puzzle
        no_weights[SEARCH] = search_scores(data.training_prefix, heldout, fit[1] if fit else None, side)
        say(f"{SEARCH}: held-out puzzles answered by the cells / the pointer: {no_weights[SEARCH]['answered_by']}")
    tables = {
        ONE_COPY_TABLE: _table(data, scored, fit, holdout, no_weights, key="one_copy_predictions"),
        "families": _table(data, scored, fit, holdout, no_weights),
    }
    halting = {n: r["halting_step"] for n, r in scored.items() if "halting_step" in r}
    if halting:
        tables[HALTING_TABLE] = _table(data, halting, fit, holdout)
    for r in list(scored.values()) + list(halting.values()):
        for k in ("predictions", "train_fit_predictions", "one_copy_predictions"):
            r.pop(k, None)
    for name, p in no_weights.items():
        runs[name] = {"status": "ok", "program": True, "eval_seconds": p["seconds"]}
        runs[name].update({k: p[k] for k in ("answered_by", "kinds", "lookups") if k in p})
    recorded: dict[str, Any] = {
        "data": data_settings,
        "encoders": names,
        "steps": s.steps,
        "config": s.config,
        "overrides": overrides,
        "eval_overrides": list(s.eval_overrides),
        "grouping": data.grouping,
        "train_fit_puzzles": len(fit[1]) if fit else 0,
        "no_train": s.no_train,
        "halting_step": s.halting_step,
        "data_notes": data.notes,
    }
    if user is not None:
        recorded["input_file_prefix"] = user.prefix
    result = {
        "command": s.command or "python -m experiments.science --out " + s.out,
        "settings": recorded,
        "runs": runs,
        **tables,
        "wall_seconds": round(time.time() - t0, 1),
    }
    md = write_report(s.out, result)
    print(md, flush=True)
    say(f"wrote {os.path.join(s.out, 'science.json')} and science.md ({result['wall_seconds']:.0f} s)")
    if s.curve:
        run_curve(
            s.out,
            data,
            fit,
            {n: r for n, r in runs.items() if n not in NO_WEIGHTS},
            oracle_eval_overrides(recipes[names[0]], overrides, s.eval_overrides),
            title=" ".join(o for o in overrides if recipe_override(o)) or s.config,
        )
    return result

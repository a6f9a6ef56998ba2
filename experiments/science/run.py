"""The science command's stages: builder -> pretrain_encoder.py -> evaluate.py -> per-family table.

Each stage is a user-facing command run as a subprocess in the repository root, its log in the output dir:

1. data (:func:`build_science_data`): ``python -m dataset.build_synthetic_dataset ... --mode etrm``;
2. training (:func:`train_and_evaluate`): ``python pretrain_encoder.py --config-name <config> encoder=<name>``
   per run (``control`` = standard with ``encoder.zero_demos=true``);
3. evaluation: ``python evaluate.py checkpoint=... data_path=...`` (voting over the augmented copies, pass@K);
4. report (:mod:`experiments.science.report`): science.json / science.md.

Resumable: data built with the same settings, a run whose summary.json says ``finished`` and an evaluation whose
metrics.json and predictions.json exist are reused; an --out built with other settings (data options, steps,
overrides, the resolved training recipe, recorded in data/settings.json and runs/<run>/run.json) is refused.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from core.io import write_json_atomic
from dataset.build_synthetic_dataset import default_max_grid
from dataset.synthetic_rules import FAMILIES
from encoders import EncoderConfigError
from experiments.science.common import CONTROL, ENCODERS, ScienceError
from experiments.science.report import check_against_evaluator, family_table, write_report
from models import ArchConfigError
from training.config import CONFIG_DIR, ConfigError, PretrainConfig, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
DATA_PREFIX = "synth"
DEFAULT_CONFIG = "cfg_science"
# a run's own paths and names: not part of its recipe
_PER_RUN_KEYS = ("data_paths", "data_paths_test", "checkpoint_path", "run_name", "project_name", "resume")


def run_plan(name: str) -> tuple[str, list[str]]:
    """(encoder group, extra Hydra overrides) of one run of the table."""
    if name == CONTROL:
        return "standard", ["encoder.zero_demos=true"]
    if name not in ENCODERS:
        raise ScienceError(f"--encoders: unknown run {name!r} (choose from {', '.join(ENCODERS + (CONTROL,))} or all)")
    return name, []


def _hq(path: str) -> str:
    """A path as a quoted Hydra override value (spaces, commas, brackets and '=' survive)."""
    return "'" + path.replace("'", "\\'") + "'"


def _say(msg: str) -> None:
    print(f"[science] {msg}", flush=True)


def _read_json_or_none(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _first_diff(a: Any, b: Any, key: str = "") -> tuple[str, Any, Any]:
    """(dotted key, a's value, b's value) of the first difference between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_diff(a.get(k), b.get(k), f"{key}.{k}" if key else k)
    return key, a, b


def _check_same(path: str, saved: Optional[dict], wanted: dict, what: str) -> None:
    """Refuse to mix results made with other settings in one --out directory."""
    if saved is None or saved == wanted:
        return
    k, old, new = _first_diff(saved, wanted)
    raise ScienceError(f"{path}: {what} was made with {k}={old!r}, this command asks for {k}={new!r}; "
                       "use a new --out (or the same options) to keep results comparable")


def recipe_record(cfg: PretrainConfig) -> dict:
    """The JSON record of a composed training config (every key, defaults filled in, the arch / encoder / health
    sections too) without the per-run paths and names."""
    rec = cfg.model_dump(mode="json")
    for k in _PER_RUN_KEYS:
        rec.pop(k, None)
    return json.loads(json.dumps(rec))


def resolve_recipe(config: str, name: str, steps: Optional[int], overrides: Sequence[str]) -> dict:
    """The training config a run will use (composed and validated now, so a bad override fails before any
    work), without the per-run paths and names; recorded in run.json so that a changed recipe is noticed."""
    encoder, extra = run_plan(name)
    over = [f"encoder={encoder}"] + ([f"max_steps={steps}"] if steps is not None else []) + extra + list(overrides)
    try:
        # the strict checks pretrain_encoder.py makes (the arch and encoder sections too, pitfall 8), before any work
        cfg = load_config(config, over, config_dir=CONFIG_DIR)
    except (ConfigError, ArchConfigError, EncoderConfigError) as e:
        raise ScienceError(f"config/{config}.yaml with {over}: {e}") from None
    except Exception as e:  # noqa: BLE001 - Hydra's override / composition errors, one line
        raise ScienceError(f"config/{config}.yaml with {over}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    return recipe_record(cfg)


def _subprocess(cmd: list[str], log_path: str) -> tuple[int, float, str]:
    """Run ``cmd`` in the repository root, stdout+stderr to ``log_path``; (exit status, seconds, last log line)."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    with open(log_path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    return rc, time.time() - t0, (lines[-1] if lines else "")


def _build_command(settings: dict, raw: str, built: str) -> list[str]:
    cmd = [sys.executable, "-m", "dataset.build_synthetic_dataset", "--output-dir", raw, "--output-prefix", DATA_PREFIX,
           "--num-train", str(settings["num_train"]), "--num-test", str(settings["num_test"]),
           "--min-grid", str(settings["min_grid"]), "--max-grid", str(settings["max_grid"]),
           "--canvas-size", str(settings["canvas_size"]), "--seed", str(settings["seed"]),
           "--heldout-puzzles-per-instance", str(settings["heldout_puzzles_per_instance"]),
           "--families", *settings["families"]]
    if settings["holdout_families"]:
        cmd += ["--holdout-families", *settings["holdout_families"]]
    return cmd + ["--build-dir", built, "--num-aug", str(settings["num_aug"]), "--mode", "etrm", "--overwrite",
                  "--num-workers", "1", "--no-progress"]


def build_science_data(out: str, settings: dict) -> tuple[str, str]:
    """Stage 1: the synthetic rule families built by the user-facing builder (skipped when already built with the
    same settings). Returns (built dataset dir, rules.json path)."""
    data = os.path.join(out, "data")
    built, raw = os.path.join(data, "built"), os.path.join(data, "raw")
    rules = os.path.join(raw, f"{DATA_PREFIX}_rules.json")
    spath = os.path.join(data, "settings.json")
    done = os.path.exists(os.path.join(built, "test", "dataset.json")) and os.path.exists(rules)
    if done:
        _check_same(spath, _read_json_or_none(spath), settings, "the data")
        if _read_json_or_none(spath) == settings:
            _say(f"data: {built} already built, reused")
            return built, rules
    nf = len(settings["families"])
    _say(f"data: {settings['num_train']} training + {settings['num_test']} held-out puzzles, "
         f"{nf} famil{'y' if nf == 1 else 'ies'}, canvas {settings['canvas_size']} -> {built}")
    log = os.path.join(data, "build.log")
    rc, secs, last = _subprocess(_build_command(settings, raw, built), log)
    if rc != 0:
        raise ScienceError(f"data build failed (exit {rc}): {last} (log: {log})")
    write_json_atomic(spath, settings)
    _say(f"data: built in {secs:.0f} s")
    return built, rules


def _train(name: str, run_dir: str, built: str, *, config: str, encoder: str, extra: list[str],
           steps: Optional[int], overrides: list[str]) -> tuple[Optional[dict], Optional[dict]]:
    """Stage 2 for one run: pretrain_encoder.py unless its summary.json says finished. Returns (summary, None)
    or (None, the failure's fields)."""
    ck, ev = os.path.join(run_dir, "checkpoint"), os.path.join(run_dir, "eval")
    summary = _read_json_or_none(os.path.join(ck, "summary.json"))
    if summary is not None and summary.get("status") == "finished":
        _say(f"{name}: training finished earlier ({summary.get('steps')} steps), reused")
        return summary, None
    shutil.rmtree(ev, ignore_errors=True)  # outputs of an older checkpoint
    cmd = [sys.executable, "pretrain_encoder.py", "--config-name", config, f"data_paths=[{_hq(built)}]",
           f"encoder={encoder}", f"checkpoint_path={_hq(ck)}", f"hydra.run.dir={_hq(os.path.join(run_dir, 'hydra'))}",
           "resume=true", f"+run_name=science-{name}", "+project_name=etrm-science"]
    cmd += ([f"max_steps={steps}"] if steps is not None else []) + extra + list(overrides)
    _say(f"{name}: training (encoder={encoder}{' encoder.zero_demos=true' if extra else ''}"
         f"{', ' + str(steps) + ' steps' if steps else ''}); log {os.path.join(run_dir, 'train.log')}")
    rc, secs, last = _subprocess(cmd, os.path.join(run_dir, "train.log"))
    summary = _read_json_or_none(os.path.join(ck, "summary.json"))
    if rc not in (0, 3) or summary is None or summary.get("status") != "finished":
        _say(f"{name}: training FAILED (exit {rc}): {last}")
        return None, dict(status="train_failed", exit_status=rc, message=last)
    _say(f"{name}: trained {summary.get('steps')} steps in {secs:.0f} s")
    return summary, None


def _evaluate(name: str, run_dir: str, built: str, eval_overrides: list[str]) -> Optional[dict]:
    """Stage 3 for one run: evaluate.py unless its metrics.json and predictions.json exist. Returns None, or the
    failure's fields."""
    ck, ev = os.path.join(run_dir, "checkpoint"), os.path.join(run_dir, "eval")
    if os.path.exists(os.path.join(ev, "metrics.json")) and os.path.exists(os.path.join(ev, "predictions.json")):
        _say(f"{name}: evaluation exists, reused")
        return None
    cmd = [sys.executable, "evaluate.py", f"checkpoint={_hq(ck)}", f"data_path={_hq(built)}", f"output_dir={_hq(ev)}",
           f"hydra.run.dir={_hq(os.path.join(run_dir, 'hydra-eval'))}", "progress=false", "num_pictures=0",
           "pass_ks=[1,2]", *eval_overrides]
    _say(f"{name}: evaluating the held-out puzzles")
    rc, secs, last = _subprocess(cmd, os.path.join(run_dir, "eval.log"))
    if rc != 0 or not os.path.exists(os.path.join(ev, "metrics.json")):
        _say(f"{name}: evaluation FAILED (exit {rc}): {last}")
        return dict(status="eval_failed", exit_status=rc, message=last)
    _say(f"{name}: evaluated in {secs:.0f} s")
    return None


def train_and_evaluate(out: str, name: str, built: str, *, config: str, steps: Optional[int], overrides: list[str],
                       eval_overrides: list[str], data_settings: dict, recipe: dict) -> dict:
    """Stages 2-3 for one run: train with pretrain_encoder.py (unless its summary.json says finished), then
    evaluate.py (unless its outputs exist). Returns the run's record (status, times, metrics, paths)."""
    encoder, extra = run_plan(name)
    run_dir = os.path.join(out, "runs", name)
    spec = {"encoder": encoder, "overrides": extra + list(overrides), "steps": steps, "config": config,
            "data": data_settings, "recipe": recipe}
    spath = os.path.join(run_dir, "run.json")
    _check_same(spath, _read_json_or_none(spath), spec, f"run {name!r}")
    write_json_atomic(spath, spec)
    rec: dict[str, Any] = {"encoder": encoder, "zero_demos": name == CONTROL, "run_dir": run_dir, "status": None}
    summary, failed = _train(name, run_dir, built, config=config, encoder=encoder, extra=extra, steps=steps,
                             overrides=overrides)
    if failed is not None:
        return dict(rec, **failed)
    rec.update(steps=summary.get("steps"), train_seconds=summary.get("wall_time_s"),
               stop_reason=summary.get("stop_reason"), num_params=summary.get("num_params"),
               # exact accuracy on the training batches of the last log window: did the run fit its data?
               train_exact=(summary.get("final") or {}).get("train/exact_accuracy"))
    failed = _evaluate(name, run_dir, built, eval_overrides)
    if failed is not None:
        return dict(rec, **failed)
    ev = os.path.join(run_dir, "eval")
    with open(os.path.join(ev, "metrics.json")) as f:
        m = json.load(f)["metrics"]
    rec.update(status="ok", eval_seconds=m.get("eval/wall_seconds"), predictions=os.path.join(ev, "predictions.json"),
               metrics={k: m[k] for k in ("ARC/pass@1", "ARC/pass@2", "ARC/num_puzzles", "ARC/num_test_inputs",
                                          "ARC/malformed_frac") if k in m})
    return rec


def _check_inputs(encoders: Sequence[str], families: Optional[Sequence[str]], holdout_families: Sequence[str],
                  steps: Optional[int], config: str) -> tuple[list[str], list[str]]:
    """Validate the command's options before any work -> (families incl. the held-out ones, run names)."""
    fams = list(families) if families else list(FAMILIES)
    for f in list(fams) + list(holdout_families):
        if f not in FAMILIES:
            raise ScienceError(f"--families/--holdout-families: unknown family {f!r} (known: {', '.join(FAMILIES)})")
    for f in holdout_families:
        if f not in fams:
            fams.append(f)
    names = list(ENCODERS) + [CONTROL] if "all" in encoders else list(dict.fromkeys(encoders))
    if steps is not None and steps <= 0:
        raise ScienceError(f"--steps must be > 0, got {steps}")
    if not os.path.exists(os.path.join(CONFIG_DIR, f"{config}.yaml")):
        raise ScienceError(f"--config {config}: no such file config/{config}.yaml")
    return fams, names


def _load_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def run_science_command(out: str, *, encoders: Sequence[str] = ("standard", CONTROL),
                        families: Optional[Sequence[str]] = None, holdout_families: Sequence[str] = (),
                        steps: Optional[int] = None, canvas_size: int = 8, max_grid: Optional[int] = None,
                        min_grid: int = 3, num_train: int = 800, num_test: int = 160, num_aug: int = 8, seed: int = 0,
                        overrides: Sequence[str] = (), eval_overrides: Sequence[str] = (),
                        config: str = DEFAULT_CONFIG, command: str = "") -> dict:
    """The whole experiment (see the module docstring); returns the result written to science.json."""
    t0 = time.time()
    out = os.path.abspath(out)  # the stages run in the repository root
    fams, names = _check_inputs(encoders, families, holdout_families, steps, config)
    recipes = {n: resolve_recipe(config, n, steps, overrides) for n in names}
    if max_grid is None:
        max_grid = default_max_grid(canvas_size)
    data_settings = {"families": fams, "holdout_families": list(holdout_families), "canvas_size": canvas_size,
                     "min_grid": min_grid, "max_grid": max_grid,
                     "num_train": num_train, "num_test": num_test, "num_aug": num_aug, "seed": seed,
                     # the reserved held-out instances (never shown by a training puzzle or its augmented copies);
                     # data built before them lack this key, so an old --out is refused rather than mixed
                     "heldout_puzzles_per_instance": 2}
    os.makedirs(out, exist_ok=True)
    built, rules_path = build_science_data(out, data_settings)
    runs = {n: train_and_evaluate(out, n, built, config=config, steps=steps, overrides=list(overrides),
                                  eval_overrides=list(eval_overrides), data_settings=data_settings, recipe=recipes[n])
            for n in names}
    ok = {n: _load_json(r["predictions"]) for n, r in runs.items() if r["status"] == "ok"}
    table = family_table(_load_json(rules_path), ok, holdout_families)
    check_against_evaluator(table, runs)
    for r in runs.values():
        r.pop("predictions", None)
    result = {"command": command or "python -m experiments.science --out " + out,
              "settings": {"data": data_settings, "encoders": names, "steps": steps, "config": config,
                           "overrides": list(overrides), "eval_overrides": list(eval_overrides)},
              "runs": runs, "families": table, "wall_seconds": round(time.time() - t0, 1)}
    md = write_report(out, result)
    print(md, flush=True)
    _say(f"wrote {os.path.join(out, 'science.json')} and science.md ({result['wall_seconds']:.0f} s)")
    return result

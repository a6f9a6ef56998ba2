"""ETRM science: does a demonstration encoder infer a rule it never saw, from the demos alone?

``python -m encoders.science --out DIR`` runs the whole experiment through the user-facing commands, each stage a
subprocess whose log lands in DIR:

1. data: ``python -m dataset.build_synthetic_dataset ... --canvas-size N --build-dir DIR/data/built --mode etrm``
   (all 8 rule families of dataset/synthetic_rules.py; evaluation puzzles are rule instances never seen in
   training, and with ``--holdout-families`` whole families never seen in training);
2. training: ``python pretrain_encoder.py --config-name cfg_science encoder=<name> ...`` once per encoder
   (standard, variational, lpn, hybrid, recurrent) and for the zero-demo control (``control`` = standard with
   ``encoder.zero_demos=true``: the encoder sees only PAD demos, so it cannot know the rule). The recipe is
   config/cfg_science.yaml; ``--override key=value`` passes Hydra overrides through;
3. evaluation: ``python evaluate.py checkpoint=... data_path=...`` (voting over the augmented copies, pass@K);
4. report: held-out pass@1 / pass@2 per rule family (the family of each evaluated puzzle comes from the
   builder's ``<prefix>_rules.json``, its score from evaluate.py's ``predictions.json``) for every run, written to
   DIR/science.json and DIR/science.md and printed.

Resumable: a run whose summary.json says ``finished`` is not trained again, an evaluation whose metrics.json and
predictions.json exist is not repeated; a DIR built with other settings is refused (name a new --out).

    python -m encoders.science --out runs/science                        # standard + control (the quick check)
    python -m encoders.science --out runs/science-all --encoders all      # the benchmark: 5 encoders + control
    python -m encoders.science --out runs/s --holdout-families gravity --steps 2000 --override lr=3e-4

The older single-family check (``recolour``: repaint colour a as b; train and test instances disjoint), trained
in-process with ``training.loop.train``, stays available for quick encoder experiments:

    python -m encoders.science --recolour --out /tmp/etrm_recolour      # the recipe: 3000 steps, ~8 min
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from dataset.common import (COLOR_OFFSET, IGNORE_LABEL_ID, NUM_COLORS, PAD_ID, DatasetMetadata, atomic_output_dir,
                            grid_to_canvas, save_split)


def recolour_instances(num_colours: int) -> list[tuple[int, int]]:
    """All (a, b) with a in 1..num_colours-1 (never the background 0), b in 0..num_colours-1, b != a."""
    return [(a, b) for a in range(1, num_colours) for b in range(num_colours) if b != a]


def _pair(rng: np.random.Generator, a: int, b: int, grid: int, num_colours: int) -> tuple[np.ndarray, np.ndarray]:
    g = rng.integers(0, num_colours, size=(grid, grid)).astype(np.uint8)
    k = int(rng.integers(1, max(2, grid * grid // 3) + 1))  # colour a occupies 1..n/3 cells
    cells = rng.choice(grid * grid, size=k, replace=False)
    g.reshape(-1)[cells] = a
    out = g.copy()
    out[g == a] = b
    return g, out


def colour_augment_train(arrays: dict, instances: list[tuple[int, int]], heldout: list[tuple[int, int]],
                         copies: int, seed: int, consistent: bool = True) -> tuple[dict, set]:
    """Consistent colour augmentation of a recolour train split: ``copies`` copies of every puzzle (in
    ``arrays``, puzzle p of rule instance ``instances[p]``), each under its own permutation of colours 1..9 (0, the
    background, fixed like the ARC builder's augmentation) applied to the puzzle's demos AND queries alike, so the
    copy is a puzzle of instance (pi(a), pi(b)). A permutation that would make a held-out instance is redrawn:
    held-out instances stay unseen. Returns (new arrays, the set of instances the copies show).
    ``consistent=False`` is the ablation of that consistency: the queries of a copy get their own permutation
    (also never a held-out instance), so its demos show (pi(a), pi(b)) and its queries (sigma(a), sigma(b))."""
    rng = np.random.default_rng([seed, 77])
    heldout = set(map(tuple, heldout))
    pi, di = arrays["puzzle_indices"], arrays["demo_indices"]
    parts: dict[str, list] = {k: [] for k in ("inputs", "labels", "demo_inputs", "demo_labels")}
    pidx, didx, pids, seen = [0], [0], [], set()
    for _ in range(copies):
        for p, (a, b) in enumerate(instances):
            luts = []
            for _ in range(1 if consistent else 2):  # [demos and queries] or [demos, queries]
                while True:
                    perm = np.concatenate([[0], 1 + rng.permutation(NUM_COLORS - 1)])
                    if (int(perm[a]), int(perm[b])) not in heldout:
                        break
                lut = np.arange(256, dtype=np.uint8)  # token ids below COLOR_OFFSET (PAD, EOS) unchanged
                lut[COLOR_OFFSET:COLOR_OFFSET + NUM_COLORS] = COLOR_OFFSET + perm
                luts.append(lut)
                seen.add((int(perm[a]), int(perm[b])))
            for k, lo, hi in (("inputs", pi[p], pi[p + 1]), ("labels", pi[p], pi[p + 1]),
                              ("demo_inputs", di[p], di[p + 1]), ("demo_labels", di[p], di[p + 1])):
                parts[k].append(luts[-1 if k in ("inputs", "labels") else 0][arrays[k][lo:hi]])
            pidx.append(pidx[-1] + int(pi[p + 1] - pi[p]))
            didx.append(didx[-1] + int(di[p + 1] - di[p]))
            pids.append(int(arrays["puzzle_identifiers"][p]))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out.update(puzzle_identifiers=np.asarray(pids, np.int32), puzzle_indices=np.asarray(pidx, np.int32),
               group_indices=np.arange(len(pids) + 1, dtype=np.int32), demo_indices=np.asarray(didx, np.int64),
               example_demo_slot=np.full(pidx[-1], -1, np.int64))
    return out, seen


def write_recolour_dataset(path: str, *, grid: int = 3, num_colours: int = 6, num_test_instances: int = 6,
                           train_puzzles_per_instance: int = 24, test_puzzles_per_instance: int = 6,
                           num_demos: int = 3, train_queries: int = 2, colour_aug: int = 0, seed: int = 0,
                           overwrite: bool = True, colour_aug_consistent: bool = True) -> dict:
    """Write the recolour task (train/ and test/ splits with the ETRM demo store) to ``path``.
    ``colour_aug`` = K > 0: the train split is K consistently colour-permuted copies of every train puzzle
    (:func:`colour_augment_train`; held-out instances never appear in it); 0 = the puzzles as drawn.
    ``colour_aug_consistent=False``: each copy's queries are permuted independently of its demos (ablation).
    Returns {"train_instances", "test_instances", "chance"} (chance = 1 / number of instances; with colour_aug,
    train_instances lists the instances the augmented train split shows)."""
    if not 2 <= num_colours <= NUM_COLORS:
        raise ValueError(f"num_colours must be in 2..{NUM_COLORS}, got {num_colours}")
    if colour_aug < 0:
        raise ValueError(f"colour_aug must be >= 0, got {colour_aug}")
    rng = np.random.default_rng(seed)
    inst = recolour_instances(num_colours)
    order = rng.permutation(len(inst))
    if not 0 < num_test_instances < len(inst):
        raise ValueError(f"num_test_instances must be in 1..{len(inst) - 1}, got {num_test_instances}")
    test_inst = [inst[i] for i in order[:num_test_instances]]
    train_inst = [inst[i] for i in order[num_test_instances:]]
    size = grid + 1
    seq_len = size * size
    n_train_p = len(train_inst) * train_puzzles_per_instance
    n_test_p = len(test_inst) * test_puzzles_per_instance
    num_ids = n_train_p + n_test_p + 1
    names = ["<blank>"]

    def split(instances, per_instance, queries, first_id):
        ins, labs, pids, pidx, gidx = [], [], [], [0], [0]
        dins, dlabs, didx = [], [], [0]
        for a, b in instances:
            for _ in range(per_instance):
                pid = first_id + len(pids)
                names.append(f"recolour-{a}to{b}-{pid}")
                for _ in range(num_demos):
                    x, y = _pair(rng, a, b, grid, num_colours)
                    dins.append(grid_to_canvas(x, size=size))
                    dlabs.append(grid_to_canvas(y, size=size))
                didx.append(len(dins))
                for _ in range(queries):
                    x, y = _pair(rng, a, b, grid, num_colours)
                    ins.append(grid_to_canvas(x, size=size))
                    labs.append(grid_to_canvas(y, size=size))
                pids.append(pid)
                pidx.append(len(ins))
                gidx.append(len(pids))
        arrays = {"inputs": np.stack(ins), "labels": np.stack(labs),
                  "puzzle_identifiers": np.asarray(pids, np.int32), "puzzle_indices": np.asarray(pidx, np.int32),
                  "group_indices": np.asarray(gidx, np.int32), "demo_inputs": np.stack(dins),
                  "demo_labels": np.stack(dlabs), "demo_indices": np.asarray(didx, np.int64),
                  "example_demo_slot": np.full(len(ins), -1, np.int64)}
        meta = DatasetMetadata(pad_id=PAD_ID, ignore_label_id=PAD_ID, blank_identifier_id=0,
                               vocab_size=COLOR_OFFSET + NUM_COLORS, seq_len=seq_len, num_puzzle_identifiers=num_ids,
                               total_groups=len(pids), mean_puzzle_examples=float(queries), total_puzzles=len(pids),
                               sets=["all"], kind="synthetic-recolour", grid_size=size, test_demos_in_train=False,
                               has_demos=True, max_demos=num_demos, max_demos_p99=num_demos, seed=seed,
                               source="encoders.science")
        return arrays, meta

    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        tr, tr_meta = split(train_inst, train_puzzles_per_instance, train_queries, 1)
        te, te_meta = split(test_inst, test_puzzles_per_instance, 1, 1 + n_train_p)
        if colour_aug:
            tr, seen = colour_augment_train(tr, [i for i in train_inst for _ in range(train_puzzles_per_instance)],
                                            test_inst, colour_aug, seed, consistent=colour_aug_consistent)
            tr_meta = tr_meta.model_copy(update={"total_groups": len(tr["puzzle_identifiers"]),
                                                 "total_puzzles": len(tr["puzzle_identifiers"])})
            train_inst = sorted(seen)
        save_split(os.path.join(tmp, "train"), tr, tr_meta)
        save_split(os.path.join(tmp, "test"), te, te_meta)
        with open(os.path.join(tmp, "identifiers.json"), "w") as f:
            json.dump(names, f)
        info = {"train_instances": train_inst, "test_instances": test_inst, "chance": 1.0 / len(inst)}
        with open(os.path.join(tmp, "rules.json"), "w") as f:
            json.dump(info, f)
    return info


# The recolour check's recipe (docs/science.md): held-out exact 0.93 / 0.93 / 1.00 on seeds 0 / 1 / 2, control 0.00.
RECOLOUR_STEPS = 3000
RECOLOUR_DATA = {"num_colours": 6, "num_test_instances": 5, "test_puzzles_per_instance": 12,
                 "train_puzzles_per_instance": 32, "colour_aug": 4}
RECOLOUR_TRAIN = {"lr_min_ratio": 0.1}  # cosine decay of the lr to 0.1x over the run


def _encoder_trunk_defaults(name: str) -> dict:
    """The trunk options (``pair_layout``, ``aggregation``) of config/encoder/<name>.yaml: the recolour check
    uses each encoder's shipped defaults, as ``pretrain_encoder.py encoder=<name>`` does."""
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "encoder",
                        f"{name}.yaml")
    if not os.path.isfile(path):
        return {}
    raw = OmegaConf.to_container(OmegaConf.load(path))
    return {k: raw[k] for k in ("pair_layout", "aggregation") if k in raw}


def science_config(data_path: str, checkpoint_path: str, *, steps: int = RECOLOUR_STEPS, zero_demos: bool = False,
                   encoder: "str | dict" = "standard", seed: int = 0, **overrides: Any) -> dict:
    """A small ETRM training config (dict for ``training.loop.train``) for :func:`write_recolour_dataset`.
    ``encoder``: a registry name or a dict of encoder config overrides (e.g. ``{"aggregation": "mean"}``); the
    trunk options not given come from config/encoder/<name>.yaml. Defaults: the recipe of docs/science.md."""
    arch = dict(name="trm", hidden_size=64, num_heads=4, expansion=2, puzzle_emb_ndim=0, puzzle_emb_len=2,
                H_cycles=2, L_cycles=2, L_layers=1, halt_max_steps=2, halt_exploration_prob=0.0,
                pos_encodings="rope", forward_dtype="float32", loss={"loss_type": "softmax_cross_entropy"})
    arch.update(overrides.pop("arch", {}))
    enc_over = dict(encoder) if isinstance(encoder, dict) else {"name": encoder}
    enc = dict(name="standard", hidden_size=64, num_heads=4, num_layers=2, expansion=2.0, zero_demos=zero_demos)
    enc.update(_encoder_trunk_defaults(enc_over.get("name", "standard")))
    enc.update(enc_over)
    cfg = dict(arch=arch, encoder=enc, data_paths=[data_path], global_batch_size=64, epochs=100000, max_steps=steps,
               eval_interval=None, eval_at_end=False, lr=1e-3, lr_warmup_steps=50, weight_decay=0.0,
               checkpoint_path=checkpoint_path, log_interval=50, diag_interval=50, evaluators=[], ema=False,
               progress=False, wandb={"mode": "disabled"}, run_name="science", project_name="etrm-science",
               device="cpu", seed=seed, **RECOLOUR_TRAIN)
    cfg.update(overrides)
    return cfg


@torch.no_grad()
def heldout_exact_accuracy(model: torch.nn.Module, data_path: str, *, split: str = "test", batch_size: int = 64,
                           device: str = "cpu", progress: bool = False) -> dict[str, float]:
    """Exact accuracy (every supervised token right) of ``model`` (an ACT model, e.g. ETRM) on ``split``,
    running ``halt_max_steps`` ACT steps per example (eval mode). Returns {"exact_accuracy", "accuracy", "count"}."""
    from dataset.loader import create_dataloader

    loader, _ = create_dataloader(dict(data_paths=[data_path], global_batch_size=batch_size, test_mode=True,
                                       encoder_mode=True), split)
    model.eval()
    exact = tok = n = 0.0
    for _set, batch, _ in tqdm(loader, desc=f"eval {split}", disable=not progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        carry = model.initial_carry(batch)
        for _ in range(model.halt_max_steps):
            carry, out = model(carry, batch)
        preds = out["logits"].argmax(-1)
        labels = carry.current_data["labels"]
        real = carry.current_data["example_index"] >= 0
        mask = labels != IGNORE_LABEL_ID
        correct = (preds == labels) & mask
        seq_ok = correct.sum(-1) == mask.sum(-1)
        exact += float((seq_ok & real).sum())
        tok += float(((correct.sum(-1) / mask.sum(-1).clamp_min(1)) * real).sum())
        n += float(real.sum())
    return {"exact_accuracy": exact / max(n, 1), "accuracy": tok / max(n, 1), "count": n}


def run_science(out_dir: str, *, steps: int = RECOLOUR_STEPS, seed: int = 0, encoder: "str | dict" = "standard",
                data_kw: Optional[dict] = None, **cfg_overrides: Any) -> dict[str, Any]:
    """Build the data, train the ETRM and the zero-demo control with the real loop, evaluate both on the
    held-out rule instances. Returns the numbers (also written to ``<out_dir>/science.json``)."""
    from training.checkpoint import load_model_for_inference
    from training.loop import train

    data = os.path.join(out_dir, "data")
    info = write_recolour_dataset(data, seed=seed, **(RECOLOUR_DATA if data_kw is None else data_kw))
    result: dict[str, Any] = {"chance": info["chance"], "test_instances": info["test_instances"], "steps": steps}
    for label, zero in (("etrm", False), ("zero_demos", True)):
        t0 = time.time()
        ck = os.path.join(out_dir, label)
        summary = train(science_config(data, ck, steps=steps, zero_demos=zero, encoder=encoder, seed=seed,
                                       **cfg_overrides))
        model, _, _ = load_model_for_inference(ck, use_ema=False)
        res = {"train_seconds": round(time.time() - t0, 1), "exit_status": summary.get("exit_status"),
               "heldout": heldout_exact_accuracy(model, data, split="test"),
               "train": heldout_exact_accuracy(model, data, split="train")}
        result[label] = res
    with open(os.path.join(out_dir, "science.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


# ==============================================================================================================
# The science command: builder -> pretrain_encoder.py -> evaluate.py -> per-family table
# ==============================================================================================================
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODERS = ("standard", "variational", "lpn", "hybrid", "recurrent")
CONTROL = "control"  # the zero-demo control: encoder=standard encoder.zero_demos=true
DATA_PREFIX = "synth"
DEFAULT_CONFIG = "cfg_science"
UNFIT_TRAIN_EXACT = 0.5  # below this train exact a run's held-out table is flagged "not fitted"


class ScienceError(ValueError):
    """Bad science-command input (the message names the option / file and the value)."""


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


def resolve_recipe(config: str, name: str, steps: Optional[int], overrides: Sequence[str]) -> dict:
    """The training config a run will use (composed and validated now, so a bad override fails before any
    work), without the per-run paths and names; recorded in run.json so that a changed recipe is noticed."""
    from encoders.base import EncoderConfigError, parse_encoder_config
    from models import ArchConfigError, parse_arch_config
    from training.config import ConfigError, load_config

    encoder, extra = run_plan(name)
    over = [f"encoder={encoder}"] + ([f"max_steps={steps}"] if steps is not None else []) + extra + list(overrides)
    try:
        cfg = load_config(config, over, config_dir=os.path.join(ROOT, "config")).model_dump()
        parse_arch_config(cfg["arch"])  # the arch and encoder sections are strict too (pitfall 8)
        parse_encoder_config(cfg["encoder"] or {})  # the checks pretrain_encoder.py makes, before any work
    except (ConfigError, ArchConfigError, EncoderConfigError) as e:
        raise ScienceError(f"config/{config}.yaml with {over}: {e}") from None
    except Exception as e:  # noqa: BLE001 - Hydra's override / composition errors, one line
        raise ScienceError(f"config/{config}.yaml with {over}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    for k in ("data_paths", "data_paths_test", "checkpoint_path", "run_name", "project_name", "resume"):
        cfg.pop(k, None)
    return json.loads(json.dumps(cfg))


def _subprocess(cmd: list[str], log_path: str) -> tuple[int, float, str]:
    """Run ``cmd`` in the repository root, stdout+stderr to ``log_path``; (exit status, seconds, last log line)."""
    import subprocess

    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    with open(log_path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    return rc, time.time() - t0, (lines[-1] if lines else "")


def build_science_data(out: str, settings: dict) -> tuple[str, str]:
    """Stage 1: the synthetic rule families built by the user-facing builder (skipped when already built with the
    same settings). Returns (built dataset dir, rules.json path)."""
    import sys

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
    from training.summary import write_json_atomic

    cmd = [sys.executable, "-m", "dataset.build_synthetic_dataset", "--output-dir", raw, "--output-prefix", DATA_PREFIX,
           "--num-train", str(settings["num_train"]), "--num-test", str(settings["num_test"]),
           "--min-grid", str(settings["min_grid"]), "--max-grid", str(settings["max_grid"]),
           "--canvas-size", str(settings["canvas_size"]), "--seed", str(settings["seed"]),
           "--heldout-puzzles-per-instance", str(settings["heldout_puzzles_per_instance"]),
           "--families", *settings["families"]]
    if settings["holdout_families"]:
        cmd += ["--holdout-families", *settings["holdout_families"]]
    cmd += ["--build-dir", built, "--num-aug", str(settings["num_aug"]), "--mode", "etrm", "--overwrite",
            "--num-workers", "1", "--no-progress"]
    nf = len(settings["families"])
    _say(f"data: {settings['num_train']} training + {settings['num_test']} held-out puzzles, "
         f"{nf} famil{'y' if nf == 1 else 'ies'}, canvas {settings['canvas_size']} -> {built}")
    log = os.path.join(data, "build.log")
    rc, secs, last = _subprocess(cmd, log)
    if rc != 0:
        raise ScienceError(f"data build failed (exit {rc}): {last} (log: {log})")
    write_json_atomic(spath, settings)
    _say(f"data: built in {secs:.0f} s")
    return built, rules


def train_and_evaluate(out: str, name: str, built: str, *, config: str, steps: Optional[int], overrides: list[str],
                       eval_overrides: list[str], data_settings: dict, recipe: dict) -> dict:
    """Stages 2-3 for one run: train with pretrain_encoder.py (unless its summary.json says finished), then
    evaluate.py (unless its outputs exist). Returns the run's record (status, times, metrics, paths)."""
    import sys

    encoder, extra = run_plan(name)
    run_dir = os.path.join(out, "runs", name)
    ck, ev = os.path.join(run_dir, "checkpoint"), os.path.join(run_dir, "eval")
    spec = {"encoder": encoder, "overrides": extra + list(overrides), "steps": steps, "config": config,
            "data": data_settings, "recipe": recipe}
    spath = os.path.join(run_dir, "run.json")
    _check_same(spath, _read_json_or_none(spath), spec, f"run {name!r}")
    from training.summary import write_json_atomic

    write_json_atomic(spath, spec)
    rec: dict[str, Any] = {"encoder": encoder, "zero_demos": name == CONTROL, "run_dir": run_dir, "status": None}
    summary = _read_json_or_none(os.path.join(ck, "summary.json"))
    if summary is not None and summary.get("status") == "finished":
        _say(f"{name}: training finished earlier ({summary.get('steps')} steps), reused")
    else:
        import shutil

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
            return dict(rec, status="train_failed", exit_status=rc, message=last)
        _say(f"{name}: trained {summary.get('steps')} steps in {secs:.0f} s")
    rec.update(steps=summary.get("steps"), train_seconds=summary.get("wall_time_s"),
               stop_reason=summary.get("stop_reason"), num_params=summary.get("num_params"),
               # exact accuracy on the training batches of the last log window: did the run fit its data?
               train_exact=(summary.get("final") or {}).get("train/exact_accuracy"))
    metrics_path, pred_path = os.path.join(ev, "metrics.json"), os.path.join(ev, "predictions.json")
    if os.path.exists(metrics_path) and os.path.exists(pred_path):
        _say(f"{name}: evaluation exists, reused")
    else:
        cmd = [sys.executable, "evaluate.py", f"checkpoint={_hq(ck)}", f"data_path={_hq(built)}", f"output_dir={_hq(ev)}",
               f"hydra.run.dir={_hq(os.path.join(run_dir, 'hydra-eval'))}", "progress=false", "num_pictures=0",
               "pass_ks=[1,2]", *eval_overrides]
        _say(f"{name}: evaluating the held-out puzzles")
        rc, secs, last = _subprocess(cmd, os.path.join(run_dir, "eval.log"))
        if rc != 0 or not os.path.exists(metrics_path):
            _say(f"{name}: evaluation FAILED (exit {rc}): {last}")
            return dict(rec, status="eval_failed", exit_status=rc, message=last)
        _say(f"{name}: evaluated in {secs:.0f} s")
    m = json.load(open(metrics_path))["metrics"]
    rec.update(status="ok", eval_seconds=m.get("eval/wall_seconds"), predictions=pred_path,
               metrics={k: m[k] for k in ("ARC/pass@1", "ARC/pass@2", "ARC/num_puzzles", "ARC/num_test_inputs",
                                          "ARC/malformed_frac") if k in m})
    return rec


def default_max_grid(canvas_size: int) -> int:
    """Largest input side by default: two cells less than the canvas (room for the loader's translations), at
    most 10 (the builder's default)."""
    return max(1, min(10, canvas_size - 2))


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


def render_markdown(result: dict) -> str:
    runs = [r for r in result["runs"] if result["runs"][r]["status"] == "ok"]
    s = result["settings"]
    lines = ["# ETRM science: held-out pass@1 / pass@2 per rule family", "",
             f"`{result['command']}`", "",
             f"Data: {s['data']['num_train']} training / {s['data']['num_test']} held-out puzzles (held-out rule "
             f"instances{'; held-out families: ' + ', '.join(s['data']['holdout_families']) if s['data']['holdout_families'] else ''}), "
             f"canvas {s['data']['canvas_size']}x{s['data']['canvas_size']}, grids {s['data']['min_grid']}-"
             f"{s['data']['max_grid']}, {s['data']['num_aug']} augmentations, seed {s['data']['seed']}. Recipe: "
             f"config/{s['config']}.yaml{' + ' + ' '.join(s['overrides']) if s['overrides'] else ''}"
             f"{', ' + str(s['steps']) + ' steps' if s['steps'] else ''}. `control` = standard encoder with "
             "`encoder.zero_demos=true` (sees no demos). A held-out rule instance is not shown in training, neither by "
             "a training puzzle nor by any of its augmented copies.", ""]
    if runs:
        lines += ["| family | n | " + " | ".join(runs) + " |", "|---|---:|" + "---:|" * len(runs)]
        for fam, row in result["families"].items():
            label = f"**{fam}**" if fam == "all" else (f"{fam} (held-out family)" if row["heldout_family"] else fam)
            cells = [f"{row['runs'][r]['pass@1']:.2f} / {row['runs'][r]['pass@2']:.2f}" if row["count"] else "—"
                     for r in runs]
            lines.append(f"| {label} | {row['count']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| run | status | steps | train exact | train s | eval s |", "|---|---|---:|---:|---:|---:|"]
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
    lines += ["", f"Total wall time {result['wall_seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def run_science_command(out: str, *, encoders: Sequence[str] = ("standard", CONTROL),
                        families: Optional[Sequence[str]] = None, holdout_families: Sequence[str] = (),
                        steps: Optional[int] = None, canvas_size: int = 8, max_grid: Optional[int] = None,
                        min_grid: int = 3, num_train: int = 800, num_test: int = 160, num_aug: int = 8, seed: int = 0,
                        overrides: Sequence[str] = (), eval_overrides: Sequence[str] = (),
                        config: str = DEFAULT_CONFIG, command: str = "") -> dict:
    """The whole experiment (see the module docstring); returns the result written to science.json."""
    from dataset.synthetic_rules import FAMILIES
    from training.summary import atomic_write, write_json_atomic

    t0 = time.time()
    out = os.path.abspath(out)  # the stages run in the repository root
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
    if not os.path.exists(os.path.join(ROOT, "config", f"{config}.yaml")):
        raise ScienceError(f"--config {config}: no such file config/{config}.yaml")
    recipes = {n: resolve_recipe(config, n, steps, overrides) for n in names}
    data_settings = {"families": fams, "holdout_families": list(holdout_families), "canvas_size": canvas_size,
                     "min_grid": min_grid, "max_grid": max_grid if max_grid is not None else default_max_grid(canvas_size),
                     "num_train": num_train, "num_test": num_test, "num_aug": num_aug, "seed": seed,
                     # the reserved held-out instances (never shown by a training puzzle or its augmented copies);
                     # data built before them lack this key, so an old --out is refused rather than mixed
                     "heldout_puzzles_per_instance": 2}
    os.makedirs(out, exist_ok=True)
    built, rules_path = build_science_data(out, data_settings)
    runs = {}
    for n in names:
        runs[n] = train_and_evaluate(out, n, built, config=config, steps=steps, overrides=list(overrides),
                                     eval_overrides=list(eval_overrides), data_settings=data_settings,
                                     recipe=recipes[n])
    rules = json.load(open(rules_path))
    ok = {n: json.load(open(r["predictions"])) for n, r in runs.items() if r["status"] == "ok"}
    table = family_table(rules, ok, holdout_families)
    for n in ok:  # the table's overall numbers are the evaluator's (same puzzles, same definition)
        for k in ("pass@1", "pass@2"):
            a, b = table["all"]["runs"][n][k], runs[n]["metrics"][f"ARC/{k}"]
            if abs(a - b) > 1e-9:
                raise ScienceError(f"run {n}: {k} over the table's puzzles {a} differs from evaluate.py's {b}")
    for r in runs.values():
        r.pop("predictions", None)
    result = {"command": command or "python -m encoders.science --out " + out,
              "settings": {"data": data_settings, "encoders": names, "steps": steps, "config": config,
                           "overrides": list(overrides), "eval_overrides": list(eval_overrides)},
              "runs": runs, "families": table, "wall_seconds": round(time.time() - t0, 1)}
    write_json_atomic(os.path.join(out, "science.json"), result)
    md = render_markdown(result)
    atomic_write(os.path.join(out, "science.md"), lambda f: f.write(md))
    print(md, flush=True)
    _say(f"wrote {os.path.join(out, 'science.json')} and science.md ({result['wall_seconds']:.0f} s)")
    return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
    import shlex
    import sys

    from training.errors import fail, user_errors

    ap = argparse.ArgumentParser(prog="python -m encoders.science", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (data, runs, science.json, science.md)")
    ap.add_argument("--encoders", nargs="+", default=["standard", CONTROL],
                    help=f"runs: any of {', '.join(ENCODERS)}, {CONTROL} (zero-demo standard), or all")
    ap.add_argument("--families", nargs="+", default=None, help="rule families (default: all 8)")
    ap.add_argument("--holdout-families", nargs="+", default=[], help="families never seen in training")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: max_steps of the config)")
    ap.add_argument("--canvas-size", type=int, default=8)
    ap.add_argument("--max-grid", type=int, default=None, help="largest input side (default: canvas - 2, at most 10)")
    ap.add_argument("--min-grid", type=int, default=3)
    ap.add_argument("--num-train", type=int, default=800)
    ap.add_argument("--num-test", type=int, default=160)
    ap.add_argument("--num-aug", type=int, default=8, help="augmented copies per puzzle (evaluation votes over them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override for pretrain_encoder.py (repeatable), e.g. --override lr=3e-4")
    ap.add_argument("--eval-override", action="append", default=[], metavar="KEY=VALUE",
                    help="override for evaluate.py (repeatable), e.g. --eval-override batch_size=256")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="training config name under config/")
    ap.add_argument("--recolour", action="store_true", help="run the older in-process recolour check instead")
    ap.add_argument("--encoder", default="standard", help="--recolour only: the encoder")
    args = ap.parse_args(argv)
    if args.recolour:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        res = run_science(args.out, steps=args.steps or RECOLOUR_STEPS, seed=args.seed, encoder=args.encoder)
        print(json.dumps(res, indent=1))
        return res
    command = "python -m encoders.science " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    with user_errors(code=2, extra=(ScienceError,)):  # bad input: one line, exit 2 (training.errors)
        res = run_science_command(args.out, encoders=args.encoders, families=args.families,
                                  holdout_families=args.holdout_families, steps=args.steps,
                                  canvas_size=args.canvas_size, max_grid=args.max_grid, min_grid=args.min_grid,
                                  num_train=args.num_train, num_test=args.num_test, num_aug=args.num_aug,
                                  seed=args.seed, overrides=args.override, eval_overrides=args.eval_override,
                                  config=args.config, command=command)
    failed = [n for n, r in res["runs"].items() if r["status"] != "ok"]
    if failed:
        fail(f"runs failed: {', '.join(failed)} (see their train.log / eval.log under {args.out}/runs)", code=1)
    return res


if __name__ == "__main__":
    main()

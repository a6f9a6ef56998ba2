"""The recolour check: the older single-family science experiment, trained in-process.

A rule instance is a colour pair (a, b): "repaint colour a as b"; the held-out instances are never shown in
training. :func:`run_science` writes the data (:func:`write_recolour_dataset`), trains the ETRM and the zero-demo
control with ``training.loop.train`` (:func:`science_config`, the recipe of docs/science.md, "The recipe") and
measures the held-out exact accuracy of both (:func:`heldout_exact_accuracy`).
``python -m experiments.science --recolour``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import numpy as np
import torch
from tqdm import tqdm

from dataset.canvas import grid_to_canvas
from dataset.loader import create_dataloader
from dataset.metadata import DatasetMetadata
from dataset.tokens import COLOR_OFFSET, IGNORE_LABEL_ID, NUM_COLORS, PAD_ID
from dataset.writer import atomic_output_dir, save_split
from models.rollout import halt_max_steps, rollout
from training.build import load_model_for_inference
from training.loop import train

# The recolour check's recipe: held-out exact 0.717 / 0.500 / 0.733 on seeds 0 / 1 / 2, control 0.000 (78baf3e; one
# seed moves by whole instances, ~0.2; 0.93 / 0.93 / 1.00 before 076a67b: docs/record/2026-11-27-recolour-figure.md).
RECOLOUR_STEPS = 3000
RECOLOUR_DATA = {
    "num_colours": 6,
    "num_test_instances": 5,
    "test_puzzles_per_instance": 12,
    "train_puzzles_per_instance": 32,
    "colour_aug": 4,
}
RECOLOUR_TRAIN = {"lr_min_ratio": 0.1}  # cosine decay of the lr to 0.1x over the run


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


def _colour_luts(rng: np.random.Generator, a: int, b: int, heldout: set, count: int, seen: set) -> list[np.ndarray]:
    """``count`` token lookup tables, each of its own permutation of colours 1..9 (0 fixed) that does not map
    (a, b) onto a held-out instance; the instances they make are added to ``seen``."""
    luts = []
    for _ in range(count):
        while True:
            perm = np.concatenate([[0], 1 + rng.permutation(NUM_COLORS - 1)])
            if (int(perm[a]), int(perm[b])) not in heldout:
                break
        lut = np.arange(256, dtype=np.uint8)  # token ids below COLOR_OFFSET (PAD, EOS) unchanged
        lut[COLOR_OFFSET : COLOR_OFFSET + NUM_COLORS] = COLOR_OFFSET + perm
        luts.append(lut)
        seen.add((int(perm[a]), int(perm[b])))
    return luts


def colour_augment_train(
    arrays: dict,
    instances: list[tuple[int, int]],
    heldout: list[tuple[int, int]],
    copies: int,
    seed: int,
    consistent: bool = True,
) -> tuple[dict, set]:
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
            # [demos and queries] or [demos, queries]
            luts = _colour_luts(rng, a, b, heldout, 1 if consistent else 2, seen)
            for k, lo, hi in (
                ("inputs", pi[p], pi[p + 1]),
                ("labels", pi[p], pi[p + 1]),
                ("demo_inputs", di[p], di[p + 1]),
                ("demo_labels", di[p], di[p + 1]),
            ):
                parts[k].append(luts[-1 if k in ("inputs", "labels") else 0][arrays[k][lo:hi]])
            pidx.append(pidx[-1] + int(pi[p + 1] - pi[p]))
            didx.append(didx[-1] + int(di[p + 1] - di[p]))
            pids.append(int(arrays["puzzle_identifiers"][p]))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out.update(
        puzzle_identifiers=np.asarray(pids, np.int32),
        puzzle_indices=np.asarray(pidx, np.int32),
        group_indices=np.arange(len(pids) + 1, dtype=np.int32),
        demo_indices=np.asarray(didx, np.int64),
        example_demo_slot=np.full(pidx[-1], -1, np.int64),
    )
    return out, seen


def _recolour_split(
    rng: np.random.Generator,
    names: list[str],
    instances: list[tuple[int, int]],
    per_instance: int,
    queries: int,
    first_id: int,
    *,
    grid: int,
    num_colours: int,
    num_demos: int,
    num_ids: int,
    seed: int,
) -> tuple[dict, DatasetMetadata]:
    """One split: ``per_instance`` puzzles of every instance, each with ``num_demos`` demos and ``queries``
    queries, puzzle ids from ``first_id`` (their names appended to ``names``)."""
    size = grid + 1
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
    arrays = {
        "inputs": np.stack(ins),
        "labels": np.stack(labs),
        "puzzle_identifiers": np.asarray(pids, np.int32),
        "puzzle_indices": np.asarray(pidx, np.int32),
        "group_indices": np.asarray(gidx, np.int32),
        "demo_inputs": np.stack(dins),
        "demo_labels": np.stack(dlabs),
        "demo_indices": np.asarray(didx, np.int64),
        "example_demo_slot": np.full(len(ins), -1, np.int64),
    }
    meta = DatasetMetadata(
        pad_id=PAD_ID,
        ignore_label_id=PAD_ID,
        blank_identifier_id=0,
        vocab_size=COLOR_OFFSET + NUM_COLORS,
        seq_len=size * size,
        num_puzzle_identifiers=num_ids,
        total_groups=len(pids),
        mean_puzzle_examples=float(queries),
        total_puzzles=len(pids),
        sets=["all"],
        kind="synthetic-recolour",
        grid_size=size,
        test_demos_in_train=False,
        has_demos=True,
        max_demos=num_demos,
        max_demos_p99=num_demos,
        seed=seed,
        source="experiments.science",
    )
    return arrays, meta


def write_recolour_dataset(
    path: str,
    *,
    grid: int = 3,
    num_colours: int = 6,
    num_test_instances: int = 6,
    train_puzzles_per_instance: int = 24,
    test_puzzles_per_instance: int = 6,
    num_demos: int = 3,
    train_queries: int = 2,
    colour_aug: int = 0,
    seed: int = 0,
    overwrite: bool = True,
    colour_aug_consistent: bool = True,
) -> dict:
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
    n_train_p = len(train_inst) * train_puzzles_per_instance
    names = ["<blank>"]
    kw = dict(
        grid=grid,
        num_colours=num_colours,
        num_demos=num_demos,
        seed=seed,
        num_ids=n_train_p + len(test_inst) * test_puzzles_per_instance + 1,
    )
    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        tr, tr_meta = _recolour_split(rng, names, train_inst, train_puzzles_per_instance, train_queries, 1, **kw)
        te, te_meta = _recolour_split(rng, names, test_inst, test_puzzles_per_instance, 1, 1 + n_train_p, **kw)
        if colour_aug:
            tr, seen = colour_augment_train(
                tr,
                [i for i in train_inst for _ in range(train_puzzles_per_instance)],
                test_inst,
                colour_aug,
                seed,
                consistent=colour_aug_consistent,
            )
            tr_meta = tr_meta.model_copy(
                update={"total_groups": len(tr["puzzle_identifiers"]), "total_puzzles": len(tr["puzzle_identifiers"])}
            )
            train_inst = sorted(seen)
        save_split(os.path.join(tmp, "train"), tr, tr_meta)
        save_split(os.path.join(tmp, "test"), te, te_meta)
        with open(os.path.join(tmp, "identifiers.json"), "w") as f:
            json.dump(names, f)
        info = {"train_instances": train_inst, "test_instances": test_inst, "chance": 1.0 / len(inst)}
        with open(os.path.join(tmp, "rules.json"), "w") as f:
            json.dump(info, f)
    return info


def science_config(
    data_path: str,
    checkpoint_path: str,
    *,
    steps: int = RECOLOUR_STEPS,
    zero_demos: bool = False,
    encoder: "str | dict" = "standard",
    seed: int = 0,
    **overrides: Any,
) -> dict:
    """A small ETRM training config (dict for ``training.loop.train``) for :func:`write_recolour_dataset`.
    ``encoder``: a registry name or a dict of encoder config overrides (e.g. ``{"aggregation": "mean"}``); the
    trunk options not given are the encoder's defaults (the same as ``encoder=<name>``). Defaults: the recolour
    check's recipe (docs/record/2026-11-23-recolour-recipe-and-goal-check.md)."""
    arch = dict(
        name="trm",
        hidden_size=64,
        num_heads=4,
        expansion=2,
        puzzle_emb_ndim=0,
        puzzle_emb_len=2,
        H_cycles=2,
        L_cycles=2,
        L_layers=1,
        halt_max_steps=2,
        halt_exploration_prob=0.0,
        pos_encodings="rope",
        forward_dtype="float32",
        loss={"loss_type": "softmax_cross_entropy"},
    )
    arch.update(overrides.pop("arch", {}))
    enc_over = dict(encoder) if isinstance(encoder, dict) else {"name": encoder}
    enc = dict(name="standard", hidden_size=64, num_heads=4, num_layers=2, expansion=2.0, zero_demos=zero_demos)
    enc.update(enc_over)
    cfg = dict(
        arch=arch,
        encoder=enc,
        data_paths=[data_path],
        global_batch_size=64,
        epochs=100000,
        max_steps=steps,
        eval_interval=None,
        eval_at_end=False,
        lr=1e-3,
        lr_warmup_steps=50,
        weight_decay=0.0,
        checkpoint_path=checkpoint_path,
        log_interval=50,
        diag_interval=50,
        evaluators=[],
        ema=False,
        progress=False,
        wandb={"mode": "disabled"},
        run_name="science",
        project_name="etrm-science",
        device="cpu",
        seed=seed,
        **RECOLOUR_TRAIN,
    )
    cfg.update(overrides)
    return cfg


@torch.no_grad()
def heldout_exact_accuracy(
    model: torch.nn.Module,
    data_path: str,
    *,
    split: str = "test",
    batch_size: int = 64,
    device: str = "cpu",
    progress: bool = False,
) -> dict[str, float]:
    """Exact accuracy (every supervised token right) of ``model`` (an ACT model, e.g. ETRM) on ``split``: one
    ``models.rollout.rollout`` per batch in eval mode, where every example runs ``halt_max_steps`` ACT steps.
    Returns {"exact_accuracy", "accuracy", "count"}."""
    loader, _ = create_dataloader(
        dict(data_paths=[data_path], global_batch_size=batch_size, test_mode=True, encoder_mode=True), split
    )
    model.eval()
    max_steps = halt_max_steps(model)
    exact = tok = n = 0.0
    for _set, batch, _ in tqdm(loader, desc=f"eval {split}", disable=not progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        r = rollout(lambda c, b=batch: model(c, b), model.initial_carry(batch), max_steps=max_steps, keep=("preds",))
        preds = r.outputs["preds"]
        labels = r.carry.current_data["labels"]
        real = r.carry.current_data["example_index"] >= 0
        mask = labels != IGNORE_LABEL_ID
        correct = (preds == labels) & mask
        seq_ok = correct.sum(-1) == mask.sum(-1)
        exact += float((seq_ok & real).sum())
        tok += float(((correct.sum(-1) / mask.sum(-1).clamp_min(1)) * real).sum())
        n += float(real.sum())
    return {"exact_accuracy": exact / max(n, 1), "accuracy": tok / max(n, 1), "count": n}


def run_science(
    out_dir: str,
    *,
    steps: int = RECOLOUR_STEPS,
    seed: int = 0,
    encoder: "str | dict" = "standard",
    data_kw: Optional[dict] = None,
    control: bool = True,
    **cfg_overrides: Any,
) -> dict[str, Any]:
    """Build the data, train the ETRM and (``control``) the zero-demo control with the real loop, evaluate both on
    the held-out rule instances. Returns the numbers (also written to ``<out_dir>/science.json``)."""
    data = os.path.join(out_dir, "data")
    info = write_recolour_dataset(data, seed=seed, **(RECOLOUR_DATA if data_kw is None else data_kw))
    result: dict[str, Any] = {"chance": info["chance"], "test_instances": info["test_instances"], "steps": steps}
    for label, zero in (("etrm", False), ("zero_demos", True))[: 2 if control else 1]:
        t0 = time.time()
        ck = os.path.join(out_dir, label)
        summary = train(
            science_config(data, ck, steps=steps, zero_demos=zero, encoder=encoder, seed=seed, **cfg_overrides)
        )
        model, _, _ = load_model_for_inference(ck, use_ema=False)
        res = {
            "train_seconds": round(time.time() - t0, 1),
            "exit_status": summary.get("exit_status"),
            "heldout": heldout_exact_accuracy(model, data, split="test"),
            "train": heldout_exact_accuracy(model, data, split="train"),
        }
        result[label] = res
    with open(os.path.join(out_dir, "science.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result

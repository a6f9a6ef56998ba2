"""CPU-sized science check for ETRM: does the encoder read the rule from the demonstrations?

Task family ``recolour``: a rule instance is a pair of colours (a, b), a != b; the output grid is the input grid
with every cell of colour ``a`` repainted ``b``. Every query input contains colour ``a``, so the answer cannot
be guessed without knowing the instance. Train and test puzzles use DISJOINT rule instances (held-out
instances), each puzzle has its own fresh demonstration pairs (true few-shot: test demos never occur in train).
Grids are small (``grid x grid`` on a ``(grid+1)^2`` canvas with the usual EOS frame) so a tiny ETRM trains on
CPU in about a minute with the real training loop (``training.loop.train``).

The control is the same model with ``encoder.zero_demos=true`` (the encoder sees only PAD demos): it cannot
know (a, b) and stays near chance.

    python -m encoders.science --out /tmp/etrm_science --steps 600        # prints both held-out accuracies
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Optional

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


def write_recolour_dataset(path: str, *, grid: int = 3, num_colours: int = 6, num_test_instances: int = 6,
                           train_puzzles_per_instance: int = 24, test_puzzles_per_instance: int = 6,
                           num_demos: int = 3, train_queries: int = 2, seed: int = 0, overwrite: bool = True) -> dict:
    """Write the recolour task (train/ and test/ splits with the ETRM demo store) to ``path``.
    Returns {"train_instances", "test_instances", "chance"} (chance = 1 / number of instances)."""
    if not 2 <= num_colours <= NUM_COLORS:
        raise ValueError(f"num_colours must be in 2..{NUM_COLORS}, got {num_colours}")
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
        save_split(os.path.join(tmp, "train"), tr, tr_meta)
        save_split(os.path.join(tmp, "test"), te, te_meta)
        with open(os.path.join(tmp, "identifiers.json"), "w") as f:
            json.dump(names, f)
        info = {"train_instances": train_inst, "test_instances": test_inst, "chance": 1.0 / len(inst)}
        with open(os.path.join(tmp, "rules.json"), "w") as f:
            json.dump(info, f)
    return info


def science_config(data_path: str, checkpoint_path: str, *, steps: int = 600, zero_demos: bool = False,
                   encoder: "str | dict" = "standard", seed: int = 0, **overrides: Any) -> dict:
    """A small ETRM training config (dict for ``training.loop.train``) for :func:`write_recolour_dataset`.
    ``encoder``: a registry name or a dict of encoder config overrides (e.g. ``{"aggregation": "mean"}``)."""
    arch = dict(name="trm", hidden_size=64, num_heads=4, expansion=2, puzzle_emb_ndim=0, puzzle_emb_len=2,
                H_cycles=2, L_cycles=2, L_layers=1, halt_max_steps=2, halt_exploration_prob=0.0,
                pos_encodings="rope", forward_dtype="float32", loss={"loss_type": "softmax_cross_entropy"})
    arch.update(overrides.pop("arch", {}))
    enc_over = dict(encoder) if isinstance(encoder, dict) else {"name": encoder}
    enc = dict(name="standard", hidden_size=64, num_heads=4, num_layers=2, expansion=2.0, zero_demos=zero_demos)
    enc.update(enc_over)
    cfg = dict(arch=arch, encoder=enc, data_paths=[data_path], global_batch_size=64, epochs=100000, max_steps=steps,
               eval_interval=None, eval_at_end=False, lr=1e-3, lr_warmup_steps=50, lr_min_ratio=1.0, weight_decay=0.0,
               checkpoint_path=checkpoint_path, log_interval=50, diag_interval=50, evaluators=[], ema=False,
               progress=False, wandb={"mode": "disabled"}, run_name="science", project_name="etrm-science",
               device="cpu", seed=seed)
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


def run_science(out_dir: str, *, steps: int = 600, seed: int = 0, encoder: "str | dict" = "standard",
                data_kw: Optional[dict] = None, **cfg_overrides: Any) -> dict[str, Any]:
    """Build the data, train the ETRM and the zero-demo control with the real loop, evaluate both on the
    held-out rule instances. Returns the numbers (also written to ``<out_dir>/science.json``)."""
    from training.checkpoint import load_model_for_inference
    from training.loop import train

    data = os.path.join(out_dir, "data")
    info = write_recolour_dataset(data, seed=seed, **(data_kw or {}))
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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--encoder", default="standard")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    res = run_science(args.out, steps=args.steps, seed=args.seed, encoder=args.encoder)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()

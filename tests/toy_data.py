"""A tiny sequence task in the on-disk (TRM) dataset format, for tests and smoke runs of the training loop.

Task ``shift_colours``: the input is a random sequence of colour tokens (2..11) followed by EOS/PAD; the
label maps every colour ``c`` to the puzzle's colour ``perm[c]`` -- a per-puzzle permutation, so the model
must use the puzzle embedding (or learn each puzzle's map) -- and keeps EOS; PAD positions are ignored.
It is learnable by a tiny TRM in a few hundred CPU steps. Not an ARC dataset: no ``test_puzzles.json``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dataset.arc_sources import load_puzzles
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_synthetic_dataset import generate_synthetic_arc
from dataset.metadata import DatasetMetadata
from dataset.tokens import COLOR_OFFSET, EOS_ID, NUM_COLORS, PAD_ID
from dataset.writer import atomic_output_dir, save_split


def _split_arrays(
    rng: np.random.Generator, perms: np.ndarray, examples_per_puzzle: int, seq_len: int, first_id: int
) -> dict[str, np.ndarray]:
    inputs, labels, pids, pidx, gidx = [], [], [], [0], [0]
    for p, perm in enumerate(perms):
        for _ in range(examples_per_puzzle):
            n = int(rng.integers(seq_len // 2, seq_len))  # content length; position n holds EOS
            x = np.full(seq_len, PAD_ID, dtype=np.uint8)
            x[:n] = rng.integers(0, NUM_COLORS, size=n) + COLOR_OFFSET
            x[n] = EOS_ID
            y = x.copy()
            y[:n] = perm[x[:n] - COLOR_OFFSET] + COLOR_OFFSET
            inputs.append(x)
            labels.append(y)
        pids.append(first_id + p)
        pidx.append(pidx[-1] + examples_per_puzzle)
        gidx.append(gidx[-1] + 1)
    return {
        "inputs": np.stack(inputs),
        "labels": np.stack(labels),
        "puzzle_identifiers": np.asarray(pids, dtype=np.int32),
        "puzzle_indices": np.asarray(pidx, dtype=np.int32),
        "group_indices": np.asarray(gidx, dtype=np.int32),
    }


def write_toy_dataset(
    path: str,
    *,
    num_puzzles: int = 4,
    train_examples: int = 16,
    test_examples: int = 4,
    seq_len: int = 8,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Write the toy task to ``path`` (``train/`` and ``test/`` splits of the same puzzles)."""
    rng = np.random.default_rng(seed)
    perms = np.stack([rng.permutation(NUM_COLORS) for _ in range(num_puzzles)])
    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        for split, n in (("train", train_examples), ("test", test_examples)):
            arrays = _split_arrays(rng, perms, n, seq_len, first_id=1)
            meta = DatasetMetadata(
                pad_id=PAD_ID,
                ignore_label_id=PAD_ID,
                blank_identifier_id=0,
                vocab_size=COLOR_OFFSET + NUM_COLORS,
                seq_len=seq_len,
                num_puzzle_identifiers=num_puzzles + 1,
                total_groups=num_puzzles,
                mean_puzzle_examples=float(n),
                total_puzzles=num_puzzles,
                sets=["all"],
                kind="toy",
                seed=seed,
                source="tests.toy_data",
            )
            save_split(os.path.join(tmp, split), arrays, meta)
        with open(os.path.join(tmp, "identifiers.json"), "w") as f:
            json.dump(["<blank>"] + [f"toy{p}" for p in range(num_puzzles)], f)
    return path


def toy_train_config(data_path: str, checkpoint_path: str, **overrides) -> dict:
    """A tiny TRM training config (dict for ``training.loop.train``) on :func:`write_toy_dataset` data that
    reaches ~100% train exact accuracy in a few hundred CPU steps (a few seconds)."""
    arch = dict(
        name="trm",
        hidden_size=32,
        num_heads=2,
        expansion=4,
        puzzle_emb_ndim=32,
        puzzle_emb_len=1,
        H_cycles=1,
        L_cycles=1,
        L_layers=1,
        halt_max_steps=2,
        pos_encodings="rope",
        loss={"loss_type": "softmax_cross_entropy"},
    )
    arch.update(overrides.pop("arch", {}))
    cfg = dict(
        arch=arch,
        data_paths=[data_path],
        global_batch_size=16,
        epochs=300,
        eval_interval=None,
        lr=1e-3,
        lr_warmup_steps=10,
        lr_min_ratio=1.0,
        weight_decay=0.0,
        puzzle_emb_lr=1e-2,
        puzzle_emb_weight_decay=0.0,
        checkpoint_path=checkpoint_path,
        log_interval=25,
        evaluators=[],
        ema=False,
        progress=False,
        wandb={"mode": "disabled"},
        run_name="toy",
        project_name="toy",
    )
    cfg.update(overrides)
    return cfg


def synthetic_etrm_dataset(
    root: str, families: list[str], *, num_train: int, num_test: int, max_grid: int, canvas: int, seed: int
) -> str:
    """A small built ETRM dataset (``--mode etrm``: no evaluation puzzle in train/) of synthetic rule families
    (grids 3..``max_grid`` on a ``canvas`` x ``canvas`` canvas, one augmented copy); returns its directory."""
    paths = generate_synthetic_arc(
        os.path.join(root, "raw"), "s", families=families, num_train=num_train, num_test=num_test, min_grid=3,
        max_grid=max_grid, seed=seed, canvas_size=canvas, num_aug=1, progress=False,
    )  # fmt: skip
    built = os.path.join(root, "built")
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", input_file_prefix=paths["prefix"])
    build_arc_dataset(
        built, puzzles, test_set_name="evaluation", num_aug=1, seed=0, canvas_size=canvas, mode="etrm", progress=False
    )
    return built


def built_synthetic_arc(
    root, families: list[str], *, num_train: int, num_test: int, num_aug: int, mode: str, max_grid: int = 5
) -> tuple[str, dict]:
    """Generate synthetic ARC puzzles (grids 3..``max_grid``, canvas 8, seed 1) under ``root``/raw and build them
    (``mode`` trm/etrm, ``num_aug`` copies, seed 0) into ``root``/built; returns (built directory, generator paths)."""
    paths = generate_synthetic_arc(
        os.path.join(str(root), "raw"), "s", families=families, num_train=num_train, num_test=num_test, min_grid=3,
        max_grid=max_grid, seed=1, canvas_size=8, progress=False,
    )  # fmt: skip
    built = os.path.join(str(root), "built")
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", input_file_prefix=paths["prefix"])
    build_arc_dataset(
        built, puzzles, test_set_name="evaluation", num_aug=num_aug, seed=0, canvas_size=8, mode=mode, progress=False
    )
    return built, paths

"""The tests' tiny datasets and configs, one definition each: the toy sequence task (:func:`write_toy_dataset`,
:func:`toy_train_config`), a built synthetic-ARC dataset (:func:`built_synthetic_arc`), a few real ARC puzzles
built (:func:`built_arc_evaluation`), the smallest recolour benchmark (:func:`write_tiny_recolour`), metadata for a
model built without data (:func:`tiny_metadata`) and the Hydra overrides of a tiny run (``TINY_TRM``,
``TINY_ETRM``, ``TINY_PRETRAIN``).

Toy task ``shift_colours``: the input is a random sequence of colour tokens (2..11) followed by EOS/PAD; the
label maps every colour ``c`` to the puzzle's colour ``perm[c]`` -- a per-puzzle permutation, so the model
must use the puzzle embedding (or learn each puzzle's map) -- and keeps EOS; PAD positions are ignored.
It is learnable by a tiny TRM in a few hundred CPU steps. Not an ARC dataset: no ``test_puzzles.json``.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from dataset.arc_sources import load_kaggle_subset, load_puzzles
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_synthetic_dataset import generate_synthetic_arc
from dataset.metadata import DatasetMetadata
from dataset.tokens import COLOR_OFFSET, EOS_ID, NUM_COLORS, PAD_ID
from dataset.writer import atomic_output_dir, save_split
from experiments.science.recolour import write_recolour_dataset

# Hydra overrides of pretrain.py: a tiny TRM on CPU-sized data (add epochs=...) ...
TINY_TRM = [
    "arch=trm_tiny",
    "arch.hidden_size=32",
    "arch.num_heads=2",
    "arch.puzzle_emb_ndim=32",
    "arch.puzzle_emb_len=1",
    "arch.H_cycles=1",
    "arch.L_cycles=1",
    "arch.L_layers=1",
    "arch.halt_max_steps=2",
    "global_batch_size=16",
    "evaluators=[]",
    "lr_warmup_steps=2",
    "progress=false",
    "wandb.mode=disabled",
    "+project_name=t",
]
# ... a tiny ETRM (32-wide decoder and one-layer encoder, batch 16) ...
TINY_ETRM = [
    "arch.hidden_size=32",
    "arch.num_heads=2",
    "encoder.hidden_size=32",
    "encoder.num_heads=2",
    "encoder.num_layers=1",
    "global_batch_size=16",
]
# ... and the smallest decoder as well, on CPU without evaluators, EMA, W&B or progress bars (pretrain_encoder.py)
TINY_PRETRAIN = [
    *TINY_ETRM,
    "arch.expansion=2",
    "arch.L_layers=1",
    "arch.H_cycles=1",
    "arch.L_cycles=1",
    "arch.halt_max_steps=2",
    "arch.puzzle_emb_len=2",
    "arch.forward_dtype=float32",
    "evaluators=[]",
    "ema=false",
    "lr_warmup_steps=1",
    "device=cpu",
    "wandb.mode=disabled",
    "progress=false",
]
# the smallest recolour benchmark (experiments.science.recolour): 2x2 grids, 4 colours, canvas 4
TINY_RECOLOUR = dict(
    grid=2, num_colours=4, num_test_instances=2, train_puzzles_per_instance=2, test_puzzles_per_instance=1
)


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


def write_tiny_recolour(path) -> dict:
    """:data:`TINY_RECOLOUR` written to ``path``; returns the builder's info."""
    return write_recolour_dataset(str(path), **TINY_RECOLOUR)


def tiny_metadata(**fields) -> DatasetMetadata:
    """Metadata for building a model without data: vocabulary 12, 16 positions, 2 puzzles (+ the blank id) of one
    example each; ``fields`` replace or add fields (``has_demos=True, max_demos=3`` for an encoder)."""
    base = dict(
        pad_id=0,
        ignore_label_id=0,
        blank_identifier_id=0,
        vocab_size=12,
        seq_len=16,
        num_puzzle_identifiers=3,
        total_groups=2,
        mean_puzzle_examples=1.0,
        sets=["all"],
    )
    return DatasetMetadata(**{**base, **fields})


def built_synthetic_arc(
    root,
    families: Optional[list[str]] = None,
    *,
    num_train: int,
    num_test: int,
    num_aug: int,
    mode: str = "trm",
    max_grid: Optional[int] = 5,
    min_grid: int = 3,
    seed: int = 1,
    canvas: int = 8,
    prefix: str = "s",
    generator_aug: bool = False,
    build_seed: int = 0,
) -> tuple[str, dict]:
    """Generate synthetic ARC puzzles under ``root``/raw (file prefix ``prefix``; ``families``, None for all;
    grids ``min_grid``..``max_grid``, None for the canvas' default; a ``canvas`` x ``canvas`` canvas; ``seed``; with
    ``generator_aug`` the generator keeps the ``num_aug`` copies of training puzzles off the held-out instances too)
    and build them into ``root``/built (``mode`` trm/etrm, ``num_aug`` copies, ``build_seed``, the same canvas).
    Returns (built directory, the generator's paths)."""
    paths = generate_synthetic_arc(
        os.path.join(str(root), "raw"), prefix, families=families, num_train=num_train, num_test=num_test,
        min_grid=min_grid, max_grid=max_grid, seed=seed, canvas_size=canvas, num_aug=num_aug if generator_aug else 0,
        progress=False,
    )  # fmt: skip
    built = os.path.join(str(root), "built")
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", input_file_prefix=paths["prefix"])
    build_arc_dataset(
        built, puzzles, test_set_name="evaluation", num_aug=num_aug, seed=build_seed, canvas_size=canvas, mode=mode,
        num_workers=1, progress=False,
    )  # fmt: skip
    return built, paths


def built_arc_evaluation(arc_kaggle_dir: str, out, *, count: int, num_aug: int) -> tuple[str, list]:
    """The first ``count`` real ARC evaluation puzzles (``arc_kaggle_dir``: the tests' Kaggle-layout copy) built
    into ``out`` (``num_aug`` copies, seed 0, mode trm); returns (built directory, the puzzles)."""
    puzzles = load_kaggle_subset(os.path.join(arc_kaggle_dir, "arc-agi"), "evaluation")[:count]
    build_arc_dataset(
        str(out), puzzles, test_set_name="evaluation", num_aug=num_aug, seed=0, num_workers=1, progress=False
    )
    return str(out), puzzles

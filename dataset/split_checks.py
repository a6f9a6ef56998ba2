"""Consistency of one loaded split part (``<split_dir>/<set>__*.npy``) with its ``dataset.json``, checked by
:mod:`dataset.split_data` when the loader loads the data, before a model is built or a run directory written.

Only what is cheap: array shapes and lengths against the metadata and against each other, and one min / max pass
for the token range. A disagreement is a :class:`dataset.errors.DatasetError` naming the file, the field and both
values (``data/x/train/dataset.json: seq_len 82 but all__inputs.npy has rows of 81``) instead of a numpy
broadcast traceback at the first batch. ``total_groups`` / ``total_puzzles`` / ``mean_puzzle_examples`` are
informational (nothing reads them): not checked, so a directory that counts them another way still loads.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from dataset.errors import DatasetError
from dataset.metadata import DatasetMetadata

TOKEN_ARRAYS = ("inputs", "labels", "demo_inputs", "demo_labels")


def check_token_range(path: str, arr: np.ndarray, vocab_size: int, ignore: Optional[int] = None) -> None:
    """Every token id of ``arr`` must be in [0, vocab_size) (labels may also hold ``ignore``): a bad id would crash
    the embedding lookup mid-run, after checkpoints were written. One vectorised min / max (a pass over a memory
    map)."""
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 and lo == ignore:
        stray = (arr < 0) & (arr != ignore)
        lo = int(arr[stray].min()) if stray.any() else 0
    if lo < 0 or hi >= vocab_size:
        bad = hi if hi >= vocab_size else lo
        where = np.argwhere(arr == bad)[0].tolist()
        raise DatasetError(
            f"{path}: token id {bad} at index {where} is outside the vocabulary [0, {vocab_size}) "
            f"of dataset.json (vocab_size={vocab_size}); rebuild the data"
        )


def check_token_rows(split_dir: str, name: str, arr: np.ndarray, seq_len: int) -> None:
    """``arr`` (the file ``name`` of ``split_dir``) must be a 2-D integer array [rows, seq_len]."""
    path = os.path.join(split_dir, name)
    if arr.ndim != 2:
        raise DatasetError(f"{path}: expected a 2-D token array [examples, seq_len], got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(f"{path}: dtype {arr.dtype} is not an integer token type")
    if arr.shape[1] != seq_len:
        raise DatasetError(
            f"{os.path.join(split_dir, 'dataset.json')}: seq_len {seq_len} but {name} has rows of {arr.shape[1]}"
        )


def check_split_part(split_dir: str, set_name: str, d: dict, meta: DatasetMetadata) -> None:
    """The arrays ``d`` of set ``set_name`` (keys as the file names without ``<set>__`` and ``.npy``; the demo store
    only when loaded) against each other and against ``meta`` (the split's dataset.json)."""
    name = lambda k: f"{set_name}__{k}.npy"  # noqa: E731
    p = lambda k: os.path.join(split_dir, name(k))  # noqa: E731
    for k in TOKEN_ARRAYS:
        if k in d:
            check_token_rows(split_dir, name(k), d[k], meta.seq_len)
    n, P = len(d["inputs"]), len(d["puzzle_identifiers"])
    if d["inputs"].shape != d["labels"].shape:
        raise DatasetError(f"{p('labels')}: shape {d['labels'].shape} differs from inputs {d['inputs'].shape}")
    if len(d["puzzle_indices"]) != P + 1 or d["puzzle_indices"][0] != 0 or d["puzzle_indices"][-1] != n:
        raise DatasetError(f"{p('puzzle_indices')}: must have {P + 1} entries from 0 to {n}")
    if len(d["group_indices"]) < 1 or d["group_indices"][0] != 0 or d["group_indices"][-1] != P:
        raise DatasetError(f"{p('group_indices')}: must run from 0 to the number of puzzles {P}")
    if "demo_indices" in d:
        if d["demo_inputs"].shape != d["demo_labels"].shape:
            raise DatasetError(
                f"{p('demo_labels')}: shape {d['demo_labels'].shape} differs from demo_inputs {d['demo_inputs'].shape}"
            )
        if len(d["demo_indices"]) != P + 1 or d["demo_indices"][-1] != len(d["demo_inputs"]):
            raise DatasetError(f"{p('demo_indices')}: must have {P + 1} entries ending at {len(d['demo_inputs'])}")
        if len(d["example_demo_slot"]) != n:
            raise DatasetError(f"{p('example_demo_slot')}: must have one entry per example ({n})")
    for k in TOKEN_ARRAYS:
        if k in d:
            check_token_range(p(k), d[k], meta.vocab_size, meta.ignore_label_id if "labels" in k else None)
    ids = d["puzzle_identifiers"]
    if len(ids) and (ids.min() < 0 or ids.max() >= meta.num_puzzle_identifiers):
        raise DatasetError(
            f"{p('puzzle_identifiers')}: ids must be in [0, {meta.num_puzzle_identifiers}) "
            f"(num_puzzle_identifiers of dataset.json), found {int(ids.min())}..{int(ids.max())}"
        )


def no_canvas_reason(split_dir: str, meta: DatasetMetadata, asked: Optional[bool]) -> str:
    """Why translation cannot apply to a split that is not a square canvas: a dataset.json whose grid_size and
    seq_len disagree (the file was edited, or written by another tool), else data that is no canvas at all."""
    where = f"{split_dir}/dataset.json"
    if meta.grid_size is not None:
        g = int(meta.grid_size)
        return (
            f"{where}: grid_size={g} but seq_len={meta.seq_len} (a {g}x{g} canvas has {g * g} tokens): the file "
            f"disagrees with itself; rebuild the data (python -m dataset.build_*)"
        )
    source = "translate_augment=true" if asked else "the data's translate_augment"
    return (
        f"{where}: {source} moves grids inside a square canvas, but this data has no grid_size and seq_len="
        f"{meta.seq_len} is not a 30x30 ARC canvas" + ("" if asked else "; pass translate_augment=false")
    )

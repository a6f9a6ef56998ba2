"""What a built dataset directory holds, read back: one ``dataset.json`` per split (:class:`DatasetMetadata`; the
field names match the published TRM format, so a TRM data directory loads unchanged, our extra fields are
optional), the sha256 of its ``identifiers.json``, and whether a directory is a built dataset at all.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np
import pydantic

from core.io import read_json
from dataset.errors import DatasetError
from dataset.tokens import ARC_MAX_GRID


class DatasetMetadata(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    pad_id: int
    ignore_label_id: Optional[int]
    blank_identifier_id: int
    vocab_size: int
    seq_len: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float
    total_puzzles: Optional[int] = None
    sets: list[str]

    # --- extensions (absent in published TRM directories) ---
    kind: Optional[str] = None  # "arc" | "sudoku" | "maze"
    grid_size: Optional[int] = None  # canvas side for canvas datasets (30 for ARC)
    # ETRM: whether demo pairs of test-split puzzles appear in the training split
    test_demos_in_train: Optional[bool] = None
    # ETRM: per-puzzle demonstration store is present (all__demo_*.npy)
    has_demos: bool = False
    max_demos_p99: Optional[int] = None  # 99th percentile of demos per puzzle
    max_demos: Optional[int] = None  # maximum demos per puzzle
    translate_augment: bool = False  # loader may apply random translation (training split)
    seed: Optional[int] = None
    num_aug: Optional[int] = None
    source: Optional[str] = None
    # sha256 of the dataset directory's identifiers.json (the puzzle-id -> name table), filled in by load_metadata
    # and never written to dataset.json; stored in checkpoints so that evaluate.py can refuse other data
    identifiers_sha256: Optional[str] = None


def canvas_side(metadata: DatasetMetadata) -> Optional[int]:
    """Canvas side N of a canvas dataset (seq_len = N*N): ``metadata.grid_size`` when recorded, else 30 for a
    900-token directory (the published ARC format); None when the data is not a square canvas."""
    n = metadata.grid_size
    if n is None and metadata.seq_len == ARC_MAX_GRID * ARC_MAX_GRID:
        n = ARC_MAX_GRID
    return int(n) if n is not None and int(n) * int(n) == metadata.seq_len else None


_IDENTIFIERS_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def identifiers_sha256(data_dir: str) -> Optional[str]:
    """sha256 of ``<data_dir>/identifiers.json`` (None when the file is absent); cached per (path, size, mtime)."""
    path = os.path.abspath(os.path.join(data_dir, "identifiers.json"))
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _IDENTIFIERS_SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _IDENTIFIERS_SHA_CACHE[key] = h.hexdigest()
    return _IDENTIFIERS_SHA_CACHE[key]


def load_metadata(split_dir: str) -> DatasetMetadata:
    path = os.path.join(split_dir, "dataset.json")
    raw = read_json(path, DatasetError, "missing (is this a built dataset directory?)")
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: expected a JSON object of dataset fields, got {type(raw).__name__}")
    if "total_puzzles" not in raw:
        idx = os.path.join(split_dir, "all__puzzle_indices.npy")
        if os.path.exists(idx):
            raw["total_puzzles"] = int(len(np.load(idx)) - 1)
    raw["identifiers_sha256"] = identifiers_sha256(os.path.dirname(os.path.abspath(split_dir)))
    try:
        return DatasetMetadata(**raw)
    except pydantic.ValidationError as e:
        raise DatasetError(f"{path}: invalid metadata: {e}") from None


def looks_like_dataset(path: str) -> bool:
    """Whether ``path`` holds a built dataset (``identifiers.json`` or a ``train/`` / ``test/`` split with its
    ``dataset.json``): the only kind of directory ``--overwrite`` may replace."""
    return os.path.isfile(os.path.join(path, "identifiers.json")) or any(
        os.path.isfile(os.path.join(path, split, "dataset.json")) for split in ("train", "test")
    )

"""Streaming loader for built puzzle datasets (TRM on-disk format, plus the optional ETRM demo store).

``PuzzleDataset(config, split)`` is an ``IterableDataset`` yielding ``(set_name, batch, global_effective_batch_size)``
where ``batch`` holds this rank's slice of a fixed-size global batch (see docs/architecture.md §1 and docs/data.md).

Determinism: every random choice is derived from explicit seeds -- the epoch plan from ``(seed, epoch, set)``,
per-batch randomness (translation, demo subsets) from ``(seed, epoch, set, batch)`` -- so every rank computes
the same global batch, worker processes can take interleaved batches without coordination, and resuming from
``state_dict()`` (epoch + batch position) reproduces the stream exactly without reading any example data.
"""
from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import pydantic
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataset.common import (
    ARC_MAX_GRID,
    COLOR_OFFSET,
    IGNORE_LABEL_ID,
    PAD_ID,
    Augmentation,
    DatasetError,
    DatasetMetadata,
    canvas_side,
    load_metadata,
)
from dataset.split_checks import check_split_part

log = logging.getLogger(__name__)

_SPLITS = ("train", "test")
_STATE_FORMAT = "puzzle_dataset/v1"


class PuzzleDatasetConfig(pydantic.BaseModel):
    """Loader configuration (strict: unknown fields raise)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    data_paths: list[str]
    global_batch_size: int = pydantic.Field(gt=0)
    seed: int = 0
    rank: int = pydantic.Field(default=0, ge=0)
    world_size: int = pydantic.Field(default=1, ge=1)
    # Visit every example of the split once, in order, sharded by rank, last global batch padded.
    test_mode: bool = False
    # Seeded choice of this many groups (original puzzles); None = all.
    max_groups: Optional[int] = pydantic.Field(default=None, gt=0)
    # Keep only the groups whose puzzle name (identifiers.json, without the augmentation suffix) matches this
    # regular expression (re.search), applied before max_groups. None = all. E.g. "colour_map|gravity" trains a
    # synthetic build on two of its families (a curriculum stage on the same data).
    group_pattern: Optional[str] = None
    # Random translation inside the canvas (training stream only). None = take it from the metadata.
    translate_augment: Optional[bool] = None
    # ETRM: serve each query with its own puzzle's demonstration pairs.
    encoder_mode: bool = False
    # Demo slots per example in encoder mode. None = metadata.max_demos_p99 (else metadata.max_demos).
    max_demos: Optional[int] = pydantic.Field(default=None, gt=0)
    # Test mode: keep only the first N augmented puzzles of every group (the builder writes the identity copy
    # first), so a quick evaluation uses fewer copies without rebuilding. None = all.
    max_puzzles_per_group: Optional[int] = pydantic.Field(default=None, gt=0)
    num_workers: int = pydantic.Field(default=0, ge=0)
    # None = pin when CUDA is available.
    pin_memory: Optional[bool] = None

    @pydantic.field_validator("group_pattern")
    @classmethod
    def _regex(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"group_pattern {v!r} is not a regular expression: {e}") from None
        return v

    @pydantic.field_validator("data_paths")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("data_paths must name at least one data directory")
        return v

    @pydantic.model_validator(mode="after")
    def _check_ranks(self) -> "PuzzleDatasetConfig":
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} must be < world_size {self.world_size}")
        if self.global_batch_size % self.world_size != 0:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} must be divisible by world_size {self.world_size}")
        return self


# ----------------------------------------------------------------------------------------------
# One set ("all", ...) of one split, possibly concatenated over several data paths.
# ----------------------------------------------------------------------------------------------
class _Rows:
    """Row access over several (memory-mapped) 2-D arrays concatenated along axis 0."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def seq_len(self) -> int:
        return int(self.parts[0].shape[1])

    def take(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if len(self.parts) == 1:
            if len(idx) == 0:
                return np.zeros((0, self.seq_len), dtype=self.parts[0].dtype)
            # Sorted access is much faster on a memmap; restore the requested order afterwards.
            order = np.argsort(idx, kind="stable")
            out = np.empty((len(idx), self.seq_len), dtype=self.parts[0].dtype)
            out[order] = self.parts[0][idx[order]]
            return out
        out = np.empty((len(idx), self.seq_len), dtype=self.parts[0].dtype)
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        for k in np.unique(which):
            sel = np.nonzero(which == k)[0]
            out[sel] = _Rows([self.parts[k]]).take(idx[sel] - self.offsets[k])
        return out


@dataclass
class _SetData:
    name: str
    inputs: _Rows
    labels: _Rows
    puzzle_identifiers: np.ndarray  # int32 [P]
    puzzle_indices: np.ndarray  # int64 [P + 1]
    group_indices: np.ndarray  # int64 [G + 1]
    ignore_label_ids: np.ndarray  # on-disk ignore label id of each data path (-1 = none)
    label_part_offsets: np.ndarray  # first example index of each data path
    demo_inputs: Optional[_Rows] = None
    demo_labels: Optional[_Rows] = None
    demo_indices: Optional[np.ndarray] = None  # int64 [P + 1]
    example_demo_slot: Optional[np.ndarray] = None  # int64 [N]
    example_puzzle: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 [N]

    @property
    def num_examples(self) -> int:
        return int(self.puzzle_indices[-1])

    @property
    def num_groups(self) -> int:
        return len(self.group_indices) - 1


def _load_npy(path: str, mmap: bool) -> np.ndarray:
    if not os.path.exists(path):
        raise DatasetError(f"{path}: missing array file")
    try:
        return np.load(path, mmap_mode="r" if mmap else None)
    except Exception as e:  # noqa: BLE001 - re-raised with the file name
        raise DatasetError(f"{path}: cannot read numpy array ({e})") from None


def _load_split_part(split_dir: str, set_name: str, need_demos: bool, meta: DatasetMetadata) -> dict:
    p = lambda k: os.path.join(split_dir, f"{set_name}__{k}.npy")  # noqa: E731
    d = {
        "inputs": _load_npy(p("inputs"), True),
        "labels": _load_npy(p("labels"), True),
        "puzzle_identifiers": np.asarray(_load_npy(p("puzzle_identifiers"), False), dtype=np.int64),
        "puzzle_indices": np.asarray(_load_npy(p("puzzle_indices"), False), dtype=np.int64),
        "group_indices": np.asarray(_load_npy(p("group_indices"), False), dtype=np.int64),
    }
    if need_demos:
        d["demo_inputs"] = _load_npy(p("demo_inputs"), True)
        d["demo_labels"] = _load_npy(p("demo_labels"), True)
        d["demo_indices"] = np.asarray(_load_npy(p("demo_indices"), False), dtype=np.int64)
        d["example_demo_slot"] = np.asarray(_load_npy(p("example_demo_slot"), False), dtype=np.int64)
    check_split_part(split_dir, set_name, d, meta)  # shapes / lengths vs dataset.json, token range
    return d


def _combine_metadata(metas: list[DatasetMetadata], paths: list[str]) -> DatasetMetadata:
    first = metas[0]
    for m, path in zip(metas[1:], paths[1:]):
        for fld in ("vocab_size", "seq_len", "pad_id"):
            if getattr(m, fld) != getattr(first, fld):
                raise DatasetError(
                    f"{path}: metadata field {fld}={getattr(m, fld)} differs from {paths[0]} ({getattr(first, fld)}); "
                    "data_paths can only be combined when vocab_size, seq_len and pad_id agree")
    if len(metas) == 1:
        return first.model_copy()
    sets: list[str] = []
    for m in metas:
        sets += [s for s in m.sets if s not in sets]
    total_puzzles = sum(m.total_puzzles or 0 for m in metas)
    return first.model_copy(update=dict(
        num_puzzle_identifiers=1 + sum(m.num_puzzle_identifiers - 1 for m in metas),
        total_groups=sum(m.total_groups for m in metas),
        total_puzzles=total_puzzles,
        sets=sets,
        has_demos=all(m.has_demos for m in metas),
        translate_augment=all(m.translate_augment for m in metas),
        max_demos=max((m.max_demos or 0) for m in metas) or None,
        max_demos_p99=max((m.max_demos_p99 or 0) for m in metas) or None,
        test_demos_in_train=(None if any(m.test_demos_in_train is None for m in metas)
                             else any(m.test_demos_in_train for m in metas)),
        source=",".join(str(m.source) for m in metas),
        identifiers_sha256=(None if any(m.identifiers_sha256 is None for m in metas) else hashlib.sha256(
            ",".join(m.identifiers_sha256 for m in metas).encode()).hexdigest()),
    ))


def content_extents(canvases: np.ndarray, size: int = ARC_MAX_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`dataset.common.find_content_extent` for a batch [b, size*size] -> (rows [b], cols [b])."""
    arr = np.asarray(canvases).reshape(-1, size, size) >= COLOR_OFFSET
    any_r = arr.any(axis=2)
    any_c = arr.any(axis=1)
    idx = np.arange(1, size + 1)
    return (any_r * idx).max(axis=1), (any_c * idx).max(axis=1)


def translate_batch(inputs: np.ndarray, labels: np.ndarray, uniforms: np.ndarray,
                    size: int = ARC_MAX_GRID) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shift each example's input and label canvas by the same random legal offset.

    ``uniforms`` [2, b] in [0, 1) pick the offset (dr, dc) uniformly among the positions where both grids
    still fit the canvas. Returns the translated copies and the offsets [b, 2]."""
    b = len(inputs)
    ri, ci = content_extents(inputs, size)
    rl, cl = content_extents(labels, size)
    h, w = np.maximum(ri, rl), np.maximum(ci, cl)
    dr = np.floor(uniforms[0] * (size - h + 1)).astype(np.int64)
    dc = np.floor(uniforms[1] * (size - w + 1)).astype(np.int64)
    out_i = np.full((b, size, size), PAD_ID, dtype=inputs.dtype)
    out_l = np.full((b, size, size), PAD_ID, dtype=labels.dtype)
    src_i = inputs.reshape(b, size, size)
    src_l = labels.reshape(b, size, size)
    for k in range(b):
        r, c = int(dr[k]), int(dc[k])
        out_i[k, r:, c:] = src_i[k, : size - r, : size - c]
        out_l[k, r:, c:] = src_l[k, : size - r, : size - c]
    return out_i.reshape(b, -1), out_l.reshape(b, -1), np.stack([dr, dc], axis=1)


def _group_names(data_paths: list[str], metas: list[DatasetMetadata]) -> list[str]:
    """Puzzle name of every (combined) identifier: each path's identifiers.json, offset like the identifiers
    (:meth:`PuzzleDataset._load_sets`), the augmentation suffix cut off."""
    names = ["<blank>"]
    for path, m in zip(data_paths, metas):
        f = os.path.join(path, "identifiers.json")
        try:
            with open(f) as fh:
                table = json.load(fh)
        except (OSError, ValueError) as e:
            raise DatasetError(f"{f}: group_pattern needs the puzzle names of identifiers.json ({e})") from None
        if not isinstance(table, list) or len(table) != m.num_puzzle_identifiers:
            raise DatasetError(f"{f}: expected a list of {m.num_puzzle_identifiers} names (num_puzzle_identifiers "
                               f"of dataset.json)")
        try:
            names += [Augmentation.parse_name(str(n))[0] for n in table[1:]]
        except ValueError as e:
            raise DatasetError(f"{f}: {e}") from None
    return names


def _matching_groups(s: "_SetData", names: list[str], pattern: str, split: str) -> np.ndarray:
    """Indices of the groups of ``s`` whose first puzzle's name matches ``pattern`` (re.search)."""
    first = s.puzzle_identifiers[s.group_indices[:-1]]
    rx = re.compile(pattern)
    keep = np.array([bool(rx.search(names[i])) for i in first.tolist()], dtype=bool)
    if not keep.any():
        example = ", ".join(repr(names[i]) for i in first[:3].tolist())
        raise DatasetError(f"group_pattern {pattern!r}: no group of the {split} split's set {s.name!r} matches "
                           f"(its {s.num_groups} puzzle names are like {example})")
    return np.flatnonzero(keep)


# ----------------------------------------------------------------------------------------------
class PuzzleDataset(IterableDataset):
    """Fixed-size global batches from built puzzle data, sharded over ranks (docs/architecture.md §1)."""

    def __init__(self, config: PuzzleDatasetConfig, split: str = "train"):
        super().__init__()
        if isinstance(config, dict):
            config = PuzzleDatasetConfig(**config)
        if split not in _SPLITS:
            raise DatasetError(f"split must be one of {_SPLITS}, got {split!r}")
        self.config = config
        self.split = split
        self.local_batch_size = config.global_batch_size // config.world_size

        split_dirs = [os.path.join(p, split) for p in config.data_paths]
        metas = [load_metadata(d) for d in split_dirs]
        self.metadata: DatasetMetadata = _combine_metadata(metas, config.data_paths)
        self.translate = (not config.test_mode) and bool(
            self.metadata.translate_augment if config.translate_augment is None else config.translate_augment)
        # canvas side of canvas datasets: metadata.grid_size (ours), else 30 for a published 900-token ARC
        # directory; None when seq_len is not a square canvas
        self.canvas_size: Optional[int] = canvas_side(self.metadata)
        if self.translate and self.canvas_size is None:
            raise DatasetError(f"{split_dirs[0]}/dataset.json: translate_augment needs a square canvas dataset "
                               f"(grid_size N with seq_len N*N), got grid_size={self.metadata.grid_size}, "
                               f"seq_len={self.metadata.seq_len}")

        if config.encoder_mode:
            for m, d in zip(metas, split_dirs):
                if not m.has_demos:
                    raise DatasetError(f"{d}/dataset.json: has_demos is false; encoder_mode needs a dataset built "
                                       "with the demo store (python -m dataset.build_arc_dataset ...)")
            md = config.max_demos or self.metadata.max_demos_p99 or self.metadata.max_demos
            if not md:
                raise DatasetError(f"{split_dirs[0]}/dataset.json: max_demos unknown; set PuzzleDatasetConfig.max_demos")
            self.max_demos: Optional[int] = int(md)
        else:
            self.max_demos = None

        self.sets: list[_SetData] = self._load_sets(metas, split_dirs)

        # --- seeded choice of groups (same on every rank / worker) ---
        self.active_groups: list[np.ndarray] = []
        names = _group_names(config.data_paths, metas) if config.group_pattern is not None else None
        for s in self.sets:
            g = np.arange(s.num_groups)
            if names is not None:
                g = _matching_groups(s, names, config.group_pattern, split)
            if config.max_groups is not None and config.max_groups < len(g):
                rng = np.random.default_rng([config.seed, 0x6A09])
                g = np.sort(rng.choice(g, size=config.max_groups, replace=False))
            self.active_groups.append(g)

        # --- demo truncation statistics (exact, computed once) ---
        self.num_truncated_examples = 0
        self.max_available_demos = 0
        if config.encoder_mode:
            for s in self.sets:
                avail = (s.demo_indices[1:] - s.demo_indices[:-1])[s.example_puzzle] - (s.example_demo_slot >= 0)
                self.max_available_demos = max(self.max_available_demos, int(avail.max(initial=0)))
                self.num_truncated_examples += int((avail > self.max_demos).sum())
            if self.num_truncated_examples:
                log.warning("%s split: %d examples have more than max_demos=%d demos (max %d); they are truncated",
                            split, self.num_truncated_examples, self.max_demos, self.max_available_demos)
        # runtime count of truncated rows served by this process
        self.truncated_rows_served = 0

        # stream position: (epoch, set index, batch index within that set's epoch)
        self._position = (0, 0, 0)
        self._plan_cache: dict = {}
        self._passes: dict = {}  # (epoch, set) -> passes packed into that epoch
        self._test_plans: Optional[list[np.ndarray]] = None

    def fingerprint(self) -> str:
        """A cheap content hash of this split: its dataset.json fields (incl. the identifiers.json hash), every
        array's shape, and 64 evenly spaced example / puzzle rows of each set. Two builds with the same shapes but
        other content (another seed, other puzzles) differ in it; reading it costs milliseconds."""
        h = hashlib.sha256(self.metadata.model_dump_json().encode())
        for s in self.sets:
            n = s.num_examples
            rows = np.unique(np.linspace(0, max(n - 1, 0), num=min(64, max(n, 1))).astype(np.int64)) if n else np.zeros(0, np.int64)
            for arr in (s.inputs.take(rows), s.labels.take(rows), s.puzzle_identifiers, s.puzzle_indices,
                        s.group_indices):
                a = np.ascontiguousarray(arr)
                h.update(f"{s.name}:{a.shape}:{a.dtype}".encode())
                h.update(a.tobytes())
        return h.hexdigest()

    def _load_sets(self, metas: list[DatasetMetadata], split_dirs: list[str]) -> list[_SetData]:
        """Each set concatenated over the data paths (puzzle identifiers offset per path, the blank id shared)."""
        sets, id_offset, id_offsets = [], 0, []
        for m in metas:
            id_offsets.append(id_offset)
            id_offset += m.num_puzzle_identifiers - 1
        for set_name in self.metadata.sets:
            parts = []
            for m, d, off in zip(metas, split_dirs, id_offsets):
                if set_name in m.sets:
                    part = _load_split_part(d, set_name, self.config.encoder_mode, m)
                    ids = part["puzzle_identifiers"]
                    part["puzzle_identifiers"] = np.where(ids == m.blank_identifier_id, self.metadata.blank_identifier_id,
                                                          ids + off)
                    part["ignore"] = m.ignore_label_id
                    parts.append(part)
            sets.append(self._concat_parts(set_name, parts))
        return sets

    # ------------------------------------------------------------------------------------------
    def _concat_parts(self, set_name: str, parts: list[dict]) -> _SetData:
        ex_off, pz_off, demo_off = 0, 0, 0
        pi, gi, ids, di, slots = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)], [], [np.zeros(1, np.int64)], []
        label_offsets, ignores = [], []
        for part in parts:
            n, P = len(part["inputs"]), len(part["puzzle_identifiers"])
            pi.append(part["puzzle_indices"][1:] + ex_off)
            gi.append(part["group_indices"][1:] + pz_off)
            ids.append(part["puzzle_identifiers"])
            label_offsets.append(ex_off)
            ignores.append(-1 if part["ignore"] is None else part["ignore"])
            if "demo_indices" in part:
                di.append(part["demo_indices"][1:] + demo_off)
                slots.append(part["example_demo_slot"])
                demo_off += len(part["demo_inputs"])
            ex_off += n
            pz_off += P
        puzzle_indices = np.concatenate(pi)
        example_puzzle = np.repeat(np.arange(len(puzzle_indices) - 1), np.diff(puzzle_indices))
        s = _SetData(
            name=set_name,
            inputs=_Rows([p["inputs"] for p in parts]),
            labels=_Rows([p["labels"] for p in parts]),
            puzzle_identifiers=np.concatenate(ids).astype(np.int32),
            puzzle_indices=puzzle_indices,
            group_indices=np.concatenate(gi),
            ignore_label_ids=np.asarray(ignores, dtype=np.int64),
            label_part_offsets=np.asarray(label_offsets, dtype=np.int64),
            example_puzzle=example_puzzle.astype(np.int64),
        )
        if self.config.encoder_mode:
            s.demo_inputs = _Rows([p["demo_inputs"] for p in parts])
            s.demo_labels = _Rows([p["demo_labels"] for p in parts])
            s.demo_indices = np.concatenate(di)
            s.example_demo_slot = np.concatenate(slots)
        return s

    # ------------------------------------------------------------------------------------------
    # Plans (index-only; never touch example data)
    # ------------------------------------------------------------------------------------------
    def _one_pass(self, epoch: int, set_idx: int, pass_idx: int) -> np.ndarray:
        """Example order of one pass over the active groups: groups shuffled, one random augmented puzzle per
        group, that puzzle's examples shuffled. Seeded from (seed, epoch, set, pass)."""
        s = self.sets[set_idx]
        seed = [self.config.seed, epoch, set_idx] + ([pass_idx] if pass_idx else [])
        rng = np.random.default_rng(seed)
        groups = rng.permutation(self.active_groups[set_idx])
        g0, g1 = s.group_indices[groups], s.group_indices[groups + 1]
        puzzles = g0 + np.floor(rng.random(len(groups)) * (g1 - g0)).astype(np.int64)
        sizes = s.puzzle_indices[puzzles + 1] - s.puzzle_indices[puzzles]
        owner = np.repeat(np.arange(len(puzzles)), sizes)
        within = np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        examples = s.puzzle_indices[puzzles][owner] + within
        # shuffle examples inside each puzzle, keep puzzle order
        order = np.lexsort((rng.random(len(owner)), owner))
        return examples[order]

    def _epoch_plan(self, epoch: int, set_idx: int) -> np.ndarray:
        """Flat example order of one training epoch of one set, cut into full global batches.

        Normally an epoch is one pass over the active groups. When one pass holds fewer examples than a global
        batch (e.g. the 32-group overfit phase with batch 768), the epoch packs the smallest number of passes
        that fills one batch (like the published loader's ``epochs_per_iter``); :meth:`passes_per_epoch` reports
        it so the training loop can keep ``epochs`` meaning passes over the data."""
        key = (epoch, set_idx)
        if key in self._plan_cache:
            return self._plan_cache[key]
        gbs = self.config.global_batch_size
        chunks, total, passes = [], 0, 0
        while True:
            chunk = self._one_pass(epoch, set_idx, passes)
            chunks.append(chunk)
            total += len(chunk)
            passes += 1
            if total >= gbs or len(chunk) == 0:
                break
        examples = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        self._passes[key] = passes
        n_batches = len(examples) // self.config.global_batch_size
        plan = examples[: n_batches * self.config.global_batch_size].reshape(n_batches, self.config.global_batch_size)
        if len(self._plan_cache) > 4:
            self._plan_cache.clear()
        self._plan_cache[key] = plan
        return plan

    def _test_plan(self, set_idx: int) -> np.ndarray:
        """All examples of the chosen groups in order, padded with -1 to whole global batches."""
        if self._test_plans is None:
            plans = []
            for k, s in enumerate(self.sets):
                groups = self.active_groups[k]
                p0, p1 = s.group_indices[groups], s.group_indices[groups + 1]
                if self.config.max_puzzles_per_group is not None:
                    p1 = np.minimum(p1, p0 + self.config.max_puzzles_per_group)
                e0, e1 = s.puzzle_indices[p0], s.puzzle_indices[p1]
                ex = np.concatenate([np.arange(a, b) for a, b in zip(e0, e1)]) if len(groups) else np.zeros(0, np.int64)
                gbs = self.config.global_batch_size
                n_batches = -(-len(ex) // gbs)
                padded = np.full(n_batches * gbs, -1, dtype=np.int64)
                padded[: len(ex)] = ex
                plans.append(padded.reshape(n_batches, gbs))
            self._test_plans = plans
        return self._test_plans[set_idx]

    def passes_per_epoch(self, epoch: int = 0) -> int:
        """Passes over the active groups packed into training epoch ``epoch`` (1 unless one pass is smaller
        than a global batch; the largest over the sets)."""
        if self.config.test_mode:
            return 1
        passes = 1
        for k in range(len(self.sets)):
            self._epoch_plan(epoch, k)
            passes = max(passes, self._passes[(epoch, k)])
        return passes

    def num_batches(self, epoch: int = 0) -> int:
        """Global batches per epoch (train: of epoch ``epoch``; test: one full pass)."""
        if self.config.test_mode:
            return sum(len(self._test_plan(k)) for k in range(len(self.sets)))
        return sum(len(self._epoch_plan(epoch, k)) for k in range(len(self.sets)))

    def num_examples(self) -> int:
        """Real examples in one test pass (test mode) / in the active groups' puzzles."""
        return sum(int((self._test_plan(k) >= 0).sum()) for k in range(len(self.sets)))

    # ------------------------------------------------------------------------------------------
    # Stream
    # ------------------------------------------------------------------------------------------
    def _next_position(self, pos: tuple[int, int, int]) -> tuple[int, int, int]:
        epoch, set_idx, b = pos
        b += 1
        while True:
            if b < len(self._epoch_plan(epoch, set_idx)):
                return epoch, set_idx, b
            b = 0
            set_idx += 1
            if set_idx >= len(self.sets):
                set_idx, epoch = 0, epoch + 1

    def _train_positions(self, start: tuple[int, int, int]) -> Iterator[tuple[int, int, int]]:
        if all(len(self._epoch_plan(0, k)) == 0 for k in range(len(self.sets))):
            n = sum(len(self.active_groups[k]) for k in range(len(self.sets)))
            raise DatasetError(
                f"{self.config.data_paths}: split {self.split!r} has too few examples for one global batch of "
                f"{self.config.global_batch_size} (active groups: {n}); lower global_batch_size")
        pos = start
        if pos[2] >= len(self._epoch_plan(pos[0], pos[1])):
            pos = self._next_position(pos)
        while True:
            yield pos
            pos = self._next_position(pos)

    def _test_positions(self) -> Iterator[tuple[int, int, int]]:
        for k in range(len(self.sets)):
            for b in range(len(self._test_plan(k))):
                yield 0, k, b

    def _make_batch(self, pos: tuple[int, int, int]) -> tuple[str, dict, int]:
        epoch, set_idx, b = pos
        s = self.sets[set_idx]
        cfg = self.config
        if cfg.test_mode:
            global_rows = self._test_plan(set_idx)[b]
            effective = int((global_rows >= 0).sum())
        else:
            global_rows = self._epoch_plan(epoch, set_idx)[b]
            effective = cfg.global_batch_size
        rows = global_rows[cfg.rank * self.local_batch_size: (cfg.rank + 1) * self.local_batch_size]
        real = rows >= 0
        ex = rows[real]
        # Per-batch randomness, identical on every rank (drawn for the global batch, then sliced).
        rng = np.random.default_rng([cfg.seed, epoch, set_idx, b, 0x5EED])

        seq = self.metadata.seq_len
        nloc = len(rows)
        inputs = np.full((nloc, seq), self.metadata.pad_id, dtype=np.int32)
        labels = np.full((nloc, seq), IGNORE_LABEL_ID, dtype=np.int64)
        raw_in = s.inputs.take(ex)
        raw_lab = s.labels.take(ex)
        if self.translate and len(ex):
            # uniforms drawn for the whole global batch (ranks agree), then this rank's real rows
            u = rng.random((2, len(global_rows)))[:, cfg.rank * self.local_batch_size:
                                                     (cfg.rank + 1) * self.local_batch_size][:, real]
            raw_in, raw_lab, _ = translate_batch(raw_in, raw_lab, u, self.canvas_size)
        inputs[real] = raw_in
        lab = raw_lab.astype(np.int64)
        # map on-disk ignore ids (per data path) to -100
        part = np.searchsorted(s.label_part_offsets, ex, side="right") - 1
        ign = s.ignore_label_ids[part]
        lab[(ign[:, None] >= 0) & (lab == ign[:, None])] = IGNORE_LABEL_ID
        labels[real] = lab

        pids = np.full(nloc, self.metadata.blank_identifier_id, dtype=np.int32)
        pids[real] = s.puzzle_identifiers[s.example_puzzle[ex]]
        batch = {
            "inputs": torch.from_numpy(inputs),
            "labels": torch.from_numpy(labels),
            "puzzle_identifiers": torch.from_numpy(pids),
            "example_index": torch.from_numpy(rows.astype(np.int64)),
        }
        if cfg.encoder_mode:
            batch.update(self._demos(s, ex, real, (cfg.seed, epoch, set_idx, b), cfg.rank * self.local_batch_size))
        return s.name, batch, effective

    def _demos(self, s: _SetData, ex: np.ndarray, real: np.ndarray, key: tuple, row0: int) -> dict:
        """Each real row's own puzzle's demonstration pairs, packed left into ``max_demos`` slots (the query itself
        excluded). Vectorised over rows; only rows with more demos than slots (training: a seeded random subset
        per global row) take a per-row path."""
        m, seq, nloc = self.max_demos, self.metadata.seq_len, len(real)
        demo_in = np.zeros((nloc, m, seq), dtype=np.int32)
        demo_lab = np.zeros((nloc, m, seq), dtype=np.int32)
        mask = np.zeros((nloc, m), dtype=bool)
        if len(ex):
            local = np.nonzero(real)[0]
            p = s.example_puzzle[ex]
            d0 = s.demo_indices[p]
            slot = s.example_demo_slot[ex]
            avail = (s.demo_indices[p + 1] - d0) - (slot >= 0)
            j = np.arange(m)
            # candidate j of a row = demo j of its puzzle, skipping the query's own slot (a query never sees itself)
            src = d0[:, None] + j[None, :] + ((slot[:, None] >= 0) & (j[None, :] >= slot[:, None]))
            ok = j[None, :] < np.minimum(avail, m)[:, None]
            trunc = np.nonzero(avail > m)[0]
            self.truncated_rows_served += len(trunc)
            if not self.config.test_mode:  # test mode keeps the first m candidates (already in ``src``)
                for t in trunc:  # seeded per global row: independent of rank count and of other rows
                    cand = np.arange(d0[t], d0[t] + avail[t] + (slot[t] >= 0))
                    if slot[t] >= 0:
                        cand = np.delete(cand, slot[t])
                    r = np.random.default_rng(list(key) + [row0 + int(local[t]), 0xDE40])
                    src[t] = np.sort(r.choice(cand, size=m, replace=False))
            where = np.zeros((nloc, m), dtype=bool)
            where[local] = ok
            rows = src[ok]
            if len(rows):
                demo_in[where] = s.demo_inputs.take(rows)
                demo_lab[where] = s.demo_labels.take(rows)
                mask = where
        return {"demo_inputs": torch.from_numpy(demo_in), "demo_labels": torch.from_numpy(demo_lab),
                "demo_mask": torch.from_numpy(mask)}

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        positions = self._test_positions() if self.config.test_mode else self._train_positions(self._position)
        for i, pos in enumerate(positions):
            if i % nw != wid:
                continue
            item = self._make_batch(pos)
            if info is None and not self.config.test_mode:
                self._position = self._next_position(pos)  # consumed once yielded
            yield item

    # ------------------------------------------------------------------------------------------
    # Resume
    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Exact stream position: the next batch to serve is batch ``batch`` of set ``set_index`` of ``epoch``."""
        e, k, b = self._position
        return {"format": _STATE_FORMAT, "epoch": e, "set_index": k, "batch": b, "seed": self.config.seed,
                "global_batch_size": self.config.global_batch_size, "split": self.split}

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise DatasetError(f"data_state: unknown format {state.get('format')!r} (expected {_STATE_FORMAT!r})")
        for k in ("seed", "global_batch_size"):
            if state[k] != getattr(self.config, k):
                raise DatasetError(f"data_state: field {k}={state[k]} differs from the loader config "
                                   f"({getattr(self.config, k)}); the stream cannot be resumed exactly")
        self._position = (int(state["epoch"]), int(state["set_index"]), int(state["batch"]))

    def _advance(self) -> None:
        """Called by the DataLoader wrapper in the main process for each batch it hands out (worker mode)."""
        if not self.config.test_mode:
            e, k, b = self._position
            if b >= len(self._epoch_plan(e, k)):
                self._position = self._next_position((e, k, b))
            self._position = self._next_position(self._position)

    @property
    def epoch(self) -> int:
        return self._position[0]


class _TrackingDataLoader(DataLoader):
    """DataLoader that advances the dataset's resume position for every batch it hands out, so
    ``dataset.state_dict()`` is exact also with worker processes (whose dataset copies are separate)."""

    def __iter__(self):
        it = super().__iter__()
        workers = self.num_workers > 0
        try:
            for item in it:
                if workers:
                    self.dataset._advance()
                yield item
        finally:
            # shut worker processes / pin-memory thread down as soon as the consumer stops
            if hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)


def create_dataloader(config: PuzzleDatasetConfig | dict, split: str = "train") -> tuple[DataLoader, DatasetMetadata]:
    """Build :class:`PuzzleDataset` and wrap it in a DataLoader (batches come pre-assembled: ``batch_size=None``).

    Returns ``(loader, metadata)``; ``metadata`` is the (combined, for several data paths) split metadata.
    ``loader.dataset.state_dict()`` / ``loader.state_dict()`` give the exact resume position."""
    if isinstance(config, dict):
        config = PuzzleDatasetConfig(**config)
    ds = PuzzleDataset(config, split)
    pin = torch.cuda.is_available() if config.pin_memory is None else (config.pin_memory and torch.cuda.is_available())
    kwargs = {}
    if config.num_workers > 0:
        kwargs = dict(prefetch_factor=4, persistent_workers=False, multiprocessing_context=_mp_context(),
                      worker_init_fn=_ignore_sigint)
    loader = _TrackingDataLoader(ds, batch_size=None, num_workers=config.num_workers, pin_memory=pin, **kwargs)
    return loader, ds.metadata


def _ignore_sigint(_worker_id: int) -> None:
    """Loader workers ignore Ctrl-C (SIGINT reaches the whole process group): the training loop stops at a step
    boundary and shuts them down itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _mp_context():
    # fork is cheapest (memory maps are shared); fall back to spawn where fork does not exist
    return mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")

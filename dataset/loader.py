"""Streaming loader for built puzzle datasets (TRM on-disk format, plus the optional ETRM demo store).

``PuzzleDataset(config, split)`` is an ``IterableDataset`` yielding ``(set_name, batch, global_effective_batch_size)``
where ``batch`` holds this rank's slice of a fixed-size global batch (see docs/architecture.md §1 and docs/data.md).
The split's data, read and concatenated over the data paths, comes from :mod:`dataset.split_data`.

Determinism: every random choice is derived from explicit seeds -- the epoch plan from ``(seed, epoch, set)``,
per-batch randomness (translation, demo subsets) from ``(seed, epoch, set, batch)`` -- so every rank computes
the same global batch, worker processes can take interleaved batches without coordination, and resuming from
``state_dict()`` (epoch + batch position) reproduces the stream exactly without reading any example data.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import re
import signal
from typing import Iterator, Optional

import numpy as np
import pydantic
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataset.canvas import translate_batch
from dataset.errors import DatasetError
from dataset.eval_batches import eval_batches
from dataset.metadata import DatasetMetadata, canvas_side, load_metadata
from dataset.split_checks import no_canvas_reason
from dataset.split_data import SetData, combine_metadata, group_names, load_sets, matching_groups
from dataset.tokens import IGNORE_LABEL_ID

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
    # Test mode: a group's examples (every copy of one original puzzle) share one local batch: a group that does
    # not fit in the room left starts the next one (padding the rest); a group larger than a local batch fills
    # whole ones. Per-group work on a batch (test-time training of every weight, one fit per puzzle or copy) then
    # sees the whole group once. False = the examples in order, packed densely.
    whole_groups: bool = False
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
                f"global_batch_size {self.global_batch_size} must be divisible by world_size {self.world_size}"
            )
        return self


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
        self.metadata: DatasetMetadata = combine_metadata(metas, config.data_paths)
        self.translate = (not config.test_mode) and bool(
            self.metadata.translate_augment if config.translate_augment is None else config.translate_augment
        )
        # canvas side of canvas datasets: metadata.grid_size (ours), else 30 for a published 900-token ARC
        # directory; None when seq_len is not a square canvas
        self.canvas_size: Optional[int] = canvas_side(self.metadata)

        if config.encoder_mode:
            for m, d in zip(metas, split_dirs):
                if not m.has_demos:
                    raise DatasetError(
                        f"{d}/dataset.json: has_demos is false; encoder_mode needs a dataset built "
                        "with the demo store (python -m dataset.build_arc_dataset ...)"
                    )
            md = config.max_demos or self.metadata.max_demos_p99 or self.metadata.max_demos
            if not md:
                raise DatasetError(
                    f"{split_dirs[0]}/dataset.json: max_demos unknown; set PuzzleDatasetConfig.max_demos"
                )
            self.max_demos: Optional[int] = int(md)
        else:
            self.max_demos = None

        self.sets: list[SetData] = load_sets(metas, split_dirs, self.metadata, config.encoder_mode)
        if self.translate and self.canvas_size is None:  # after load_sets: arrays that disagree are named first
            raise DatasetError(no_canvas_reason(split_dirs[0], self.metadata, config.translate_augment))

        # --- seeded choice of groups (same on every rank / worker) ---
        self.active_groups: list[np.ndarray] = []
        names = group_names(config.data_paths, metas) if config.group_pattern is not None else None
        for s in self.sets:
            g = np.arange(s.num_groups)
            if names is not None:
                g = matching_groups(s, names, config.group_pattern, split)
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
                log.warning(
                    "%s split: %d examples have more than max_demos=%d demos (max %d); they are truncated",
                    split,
                    self.num_truncated_examples,
                    self.max_demos,
                    self.max_available_demos,
                )
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
            rows = (
                np.unique(np.linspace(0, max(n - 1, 0), num=min(64, max(n, 1))).astype(np.int64))
                if n
                else np.zeros(0, np.int64)
            )
            for arr in (
                s.inputs.take(rows),
                s.labels.take(rows),
                s.puzzle_identifiers,
                s.puzzle_indices,
                s.group_indices,
            ):
                a = np.ascontiguousarray(arr)
                h.update(f"{s.name}:{a.shape}:{a.dtype}".encode())
                h.update(a.tobytes())
        return h.hexdigest()

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
        """All examples of the chosen groups in order, in global batches padded with -1 (``eval_batches``)."""
        if self._test_plans is None:
            plans = []
            for k, s in enumerate(self.sets):
                groups = self.active_groups[k]
                p0, p1 = s.group_indices[groups], s.group_indices[groups + 1]
                if self.config.max_puzzles_per_group is not None:
                    p1 = np.minimum(p1, p0 + self.config.max_puzzles_per_group)
                e0, e1 = s.puzzle_indices[p0], s.puzzle_indices[p1]
                per_group = [np.arange(a, b) for a, b in zip(e0, e1)]
                cfg = self.config
                plans.append(eval_batches(per_group, cfg.global_batch_size, cfg.world_size, cfg.whole_groups))
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
                f"{self.config.global_batch_size} (active groups: {n}); lower global_batch_size"
            )
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
        rows = global_rows[cfg.rank * self.local_batch_size : (cfg.rank + 1) * self.local_batch_size]
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
            u = rng.random((2, len(global_rows)))[
                :, cfg.rank * self.local_batch_size : (cfg.rank + 1) * self.local_batch_size
            ][:, real]
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

    def _demos(self, s: SetData, ex: np.ndarray, real: np.ndarray, key: tuple, row0: int) -> dict:
        """Each real row's own puzzle's demonstration pairs in ``max_demos`` slots (:meth:`SetData.pack_demos`;
        training: a seeded random subset for a row with more demos than slots, test mode: the first ones)."""
        demo_in, demo_lab, mask, truncated = s.pack_demos(
            ex, real, self.max_demos, self.metadata.seq_len, key, row0, sample=not self.config.test_mode
        )
        self.truncated_rows_served += truncated
        return {
            "demo_inputs": torch.from_numpy(demo_in),
            "demo_labels": torch.from_numpy(demo_lab),
            "demo_mask": torch.from_numpy(mask),
        }

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
        return {
            "format": _STATE_FORMAT,
            "epoch": e,
            "set_index": k,
            "batch": b,
            "seed": self.config.seed,
            "global_batch_size": self.config.global_batch_size,
            "split": self.split,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise DatasetError(f"data_state: unknown format {state.get('format')!r} (expected {_STATE_FORMAT!r})")
        for k in ("seed", "global_batch_size"):
            if state[k] != getattr(self.config, k):
                raise DatasetError(
                    f"data_state: field {k}={state[k]} differs from the loader config "
                    f"({getattr(self.config, k)}); the stream cannot be resumed exactly"
                )
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
        kwargs = dict(
            prefetch_factor=4,
            persistent_workers=False,
            multiprocessing_context=_mp_context(),
            worker_init_fn=_ignore_sigint,
        )
    loader = _TrackingDataLoader(ds, batch_size=None, num_workers=config.num_workers, pin_memory=pin, **kwargs)
    return loader, ds.metadata


def _ignore_sigint(_worker_id: int) -> None:
    """Loader workers ignore Ctrl-C (SIGINT reaches the whole process group): the training loop stops at a step
    boundary and shuts them down itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _mp_context():
    # fork is cheapest (memory maps are shared); fall back to spawn where fork does not exist
    return mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")

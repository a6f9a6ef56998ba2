"""One split of one or more built data directories, in memory (what :class:`dataset.loader.PuzzleDataset` serves
from): the split metadata combined over the data paths, and each set (``all``, ...) with its arrays concatenated
over them -- token rows memory-mapped, puzzle identifiers offset per path (the blank id shared), on-disk ignore
label ids kept per path. Every part is checked against its ``dataset.json`` on load (:mod:`dataset.split_checks`).
Also the puzzle names behind the groups, for ``group_pattern``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from dataset.augment import Augmentation
from dataset.errors import DatasetError
from dataset.metadata import DatasetMetadata
from dataset.split_checks import check_split_part


class Rows:
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
            out[sel] = Rows([self.parts[k]]).take(idx[sel] - self.offsets[k])
        return out


@dataclass
class SetData:
    """One set of a split, concatenated over the data paths (indices are global over the concatenation)."""

    name: str
    inputs: Rows
    labels: Rows
    puzzle_identifiers: np.ndarray  # int32 [P]
    puzzle_indices: np.ndarray  # int64 [P + 1]
    group_indices: np.ndarray  # int64 [G + 1]
    ignore_label_ids: np.ndarray  # on-disk ignore label id of each data path (-1 = none)
    label_part_offsets: np.ndarray  # first example index of each data path
    demo_inputs: Optional[Rows] = None
    demo_labels: Optional[Rows] = None
    demo_indices: Optional[np.ndarray] = None  # int64 [P + 1]
    example_demo_slot: Optional[np.ndarray] = None  # int64 [N]
    example_puzzle: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 [N]

    @property
    def num_examples(self) -> int:
        return int(self.puzzle_indices[-1])

    @property
    def num_groups(self) -> int:
        return len(self.group_indices) - 1

    def pack_demos(
        self, ex: np.ndarray, real: np.ndarray, m: int, seq: int, key: tuple, row0: int, sample: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The demos of a batch's rows: (inputs [b, m, seq], labels [b, m, seq], mask [b, m], number of rows that
        had more than ``m`` demos). Row k of the batch is example ``ex`` of its real rows (``real`` [b]); each gets
        its own puzzle's demonstration pairs packed left into ``m`` slots, the query itself excluded. Vectorised
        over rows; only rows with more demos than slots take a per-row path: with ``sample`` (training) a seeded
        random subset per global row (``key`` + ``row0`` + the row), else the first ``m``."""
        nloc = len(real)
        demo_in = np.zeros((nloc, m, seq), dtype=np.int32)
        demo_lab = np.zeros((nloc, m, seq), dtype=np.int32)
        mask = np.zeros((nloc, m), dtype=bool)
        if not len(ex):
            return demo_in, demo_lab, mask, 0
        local = np.nonzero(real)[0]
        p = self.example_puzzle[ex]
        d0 = self.demo_indices[p]
        slot = self.example_demo_slot[ex]
        avail = (self.demo_indices[p + 1] - d0) - (slot >= 0)
        j = np.arange(m)
        # candidate j of a row = demo j of its puzzle, skipping the query's own slot (a query never sees itself)
        src = d0[:, None] + j[None, :] + ((slot[:, None] >= 0) & (j[None, :] >= slot[:, None]))
        ok = j[None, :] < np.minimum(avail, m)[:, None]
        trunc = np.nonzero(avail > m)[0]
        if sample:  # without: the first m candidates (already in ``src``)
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
            demo_in[where] = self.demo_inputs.take(rows)
            demo_lab[where] = self.demo_labels.take(rows)
            mask = where
        return demo_in, demo_lab, mask, len(trunc)


def load_npy(path: str, mmap: bool) -> np.ndarray:
    if not os.path.exists(path):
        raise DatasetError(f"{path}: missing array file")
    try:
        return np.load(path, mmap_mode="r" if mmap else None)
    except Exception as e:  # noqa: BLE001 - re-raised with the file name
        raise DatasetError(f"{path}: cannot read numpy array ({e})") from None


def load_split_part(split_dir: str, set_name: str, need_demos: bool, meta: DatasetMetadata) -> dict:
    p = lambda k: os.path.join(split_dir, f"{set_name}__{k}.npy")  # noqa: E731
    d = {
        "inputs": load_npy(p("inputs"), True),
        "labels": load_npy(p("labels"), True),
        "puzzle_identifiers": np.asarray(load_npy(p("puzzle_identifiers"), False), dtype=np.int64),
        "puzzle_indices": np.asarray(load_npy(p("puzzle_indices"), False), dtype=np.int64),
        "group_indices": np.asarray(load_npy(p("group_indices"), False), dtype=np.int64),
    }
    if need_demos:
        d["demo_inputs"] = load_npy(p("demo_inputs"), True)
        d["demo_labels"] = load_npy(p("demo_labels"), True)
        d["demo_indices"] = np.asarray(load_npy(p("demo_indices"), False), dtype=np.int64)
        d["example_demo_slot"] = np.asarray(load_npy(p("example_demo_slot"), False), dtype=np.int64)
    check_split_part(split_dir, set_name, d, meta)  # shapes / lengths vs dataset.json, token range
    return d


def combine_metadata(metas: list[DatasetMetadata], paths: list[str]) -> DatasetMetadata:
    first = metas[0]
    for m, path in zip(metas[1:], paths[1:]):
        for fld in ("vocab_size", "seq_len", "pad_id"):
            if getattr(m, fld) != getattr(first, fld):
                raise DatasetError(
                    f"{path}: metadata field {fld}={getattr(m, fld)} differs from {paths[0]} ({getattr(first, fld)}); "
                    "data_paths can only be combined when vocab_size, seq_len and pad_id agree"
                )
    if len(metas) == 1:
        return first.model_copy()
    sets: list[str] = []
    for m in metas:
        sets += [s for s in m.sets if s not in sets]
    total_puzzles = sum(m.total_puzzles or 0 for m in metas)
    return first.model_copy(
        update=dict(
            num_puzzle_identifiers=1 + sum(m.num_puzzle_identifiers - 1 for m in metas),
            total_groups=sum(m.total_groups for m in metas),
            total_puzzles=total_puzzles,
            sets=sets,
            has_demos=all(m.has_demos for m in metas),
            translate_augment=all(m.translate_augment for m in metas),
            max_demos=max((m.max_demos or 0) for m in metas) or None,
            max_demos_p99=max((m.max_demos_p99 or 0) for m in metas) or None,
            test_demos_in_train=(
                None if any(m.test_demos_in_train is None for m in metas) else any(m.test_demos_in_train for m in metas)
            ),
            source=",".join(str(m.source) for m in metas),
            identifiers_sha256=(
                None
                if any(m.identifiers_sha256 is None for m in metas)
                else hashlib.sha256(",".join(m.identifiers_sha256 for m in metas).encode()).hexdigest()
            ),
        )
    )


def load_sets(
    metas: list[DatasetMetadata], split_dirs: list[str], combined: DatasetMetadata, encoder_mode: bool
) -> list[SetData]:
    """Each set concatenated over the data paths (puzzle identifiers offset per path, the blank id shared:
    ``combined``'s); the demo store only in ``encoder_mode``."""
    sets, id_offset, id_offsets = [], 0, []
    for m in metas:
        id_offsets.append(id_offset)
        id_offset += m.num_puzzle_identifiers - 1
    for set_name in combined.sets:
        parts = []
        for m, d, off in zip(metas, split_dirs, id_offsets):
            if set_name in m.sets:
                part = load_split_part(d, set_name, encoder_mode, m)
                ids = part["puzzle_identifiers"]
                part["puzzle_identifiers"] = np.where(
                    ids == m.blank_identifier_id, combined.blank_identifier_id, ids + off
                )
                part["ignore"] = m.ignore_label_id
                parts.append(part)
        sets.append(_concat_parts(set_name, parts, encoder_mode))
    return sets


def _concat_parts(set_name: str, parts: list[dict], encoder_mode: bool) -> SetData:
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
    s = SetData(
        name=set_name,
        inputs=Rows([p["inputs"] for p in parts]),
        labels=Rows([p["labels"] for p in parts]),
        puzzle_identifiers=np.concatenate(ids).astype(np.int32),
        puzzle_indices=puzzle_indices,
        group_indices=np.concatenate(gi),
        ignore_label_ids=np.asarray(ignores, dtype=np.int64),
        label_part_offsets=np.asarray(label_offsets, dtype=np.int64),
        example_puzzle=example_puzzle.astype(np.int64),
    )
    if encoder_mode:
        s.demo_inputs = Rows([p["demo_inputs"] for p in parts])
        s.demo_labels = Rows([p["demo_labels"] for p in parts])
        s.demo_indices = np.concatenate(di)
        s.example_demo_slot = np.concatenate(slots)
    return s


def group_names(data_paths: list[str], metas: list[DatasetMetadata]) -> list[str]:
    """Puzzle name of every (combined) identifier: each path's identifiers.json, offset like the identifiers
    (:func:`load_sets`), the augmentation suffix cut off."""
    names = ["<blank>"]
    for path, m in zip(data_paths, metas):
        f = os.path.join(path, "identifiers.json")
        try:
            with open(f) as fh:
                table = json.load(fh)
        except (OSError, ValueError) as e:
            raise DatasetError(f"{f}: group_pattern needs the puzzle names of identifiers.json ({e})") from None
        if not isinstance(table, list) or len(table) != m.num_puzzle_identifiers:
            raise DatasetError(
                f"{f}: expected a list of {m.num_puzzle_identifiers} names (num_puzzle_identifiers of dataset.json)"
            )
        try:
            names += [Augmentation.parse_name(str(n))[0] for n in table[1:]]
        except ValueError as e:
            raise DatasetError(f"{f}: {e}") from None
    return names


def matching_groups(s: SetData, names: list[str], pattern: str, split: str) -> np.ndarray:
    """Indices of the groups of ``s`` whose first puzzle's name matches ``pattern`` (re.search)."""
    first = s.puzzle_identifiers[s.group_indices[:-1]]
    rx = re.compile(pattern)
    keep = np.array([bool(rx.search(names[i])) for i in first.tolist()], dtype=bool)
    if not keep.any():
        example = ", ".join(repr(names[i]) for i in first[:3].tolist())
        raise DatasetError(
            f"group_pattern {pattern!r}: no group of the {split} split's set {s.name!r} matches "
            f"(its {s.num_groups} puzzle names are like {example})"
        )
    return np.flatnonzero(keep)

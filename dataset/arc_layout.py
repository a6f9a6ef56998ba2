"""Where an ARC build's copies go and the files that describe them (:mod:`dataset.build_arc_dataset`): the
:class:`_Layout` of identifiers, index arrays and per-puzzle work, the preallocated split files, the index arrays,
demo store and ``dataset.json`` of both splits, ``identifiers.json`` / ``identifiers_map.json`` /
``test_puzzles.json``, and :func:`read_identifiers_map` to read the map back."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from core.io import read_json
from dataset.augment import ArcPuzzle, Augmentation
from dataset.errors import DatasetError
from dataset.metadata import DatasetMetadata
from dataset.tokens import ARC_MAX_GRID, ARC_SEQ_LEN, ARC_VOCAB_SIZE, NUM_COLORS, PAD_ID


def _preallocate(path: str, rows: int, seq_len: int = ARC_SEQ_LEN) -> None:
    """Write the .npy header of a [rows, seq_len] uint8 array and size the file (sparse until written)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (rows, seq_len)})
        f.truncate(f.tell() + rows * seq_len)


def _write_json(path: str, obj) -> None:
    # json.dumps uses the C encoder; json.dump(obj, f) falls back to the pure-Python one (10x slower)
    with open(path, "w") as f:
        f.write(json.dumps(obj, separators=(",", ":")))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _metadata(
    split: str,
    *,
    num_ids: int,
    n_groups: int,
    n_puzzles: int,
    n_examples: int,
    args,
    test_in_train,
    max_demos: int,
    max_demos_p99: int,
    source: str,
    canvas_size: int = ARC_MAX_GRID,
) -> DatasetMetadata:
    return DatasetMetadata(
        pad_id=PAD_ID,
        ignore_label_id=PAD_ID,
        blank_identifier_id=0,
        vocab_size=ARC_VOCAB_SIZE,
        seq_len=canvas_size * canvas_size,
        num_puzzle_identifiers=num_ids,
        total_groups=n_groups,
        mean_puzzle_examples=(n_examples / n_puzzles) if n_puzzles else 0.0,
        total_puzzles=n_puzzles,
        sets=["all"],
        kind="arc",
        grid_size=canvas_size,
        test_demos_in_train=test_in_train,
        has_demos=True,
        max_demos_p99=max_demos_p99,
        max_demos=max_demos,
        translate_augment=(split == "train"),
        seed=args["seed"],
        num_aug=args["num_aug"],
        source=source,
    )


@dataclass
class _Layout:
    """Where every augmented copy of every puzzle goes: identifiers, per-split index arrays, the work list."""

    identifiers: list[str]
    map_rows: list[np.ndarray]  # identifiers_map rows: (puzzle number, dihedral, colour map)
    idx: dict[str, dict[str, list]]  # split -> puzzle_indices, group_indices, puzzle_identifiers, slot, demo_indices
    tasks: list[tuple]  # _encode_task arguments, one per puzzle

    @classmethod
    def plan(
        cls,
        tmp: str,
        puzzles: Sequence[ArcPuzzle],
        chosen: list,
        test_set_name: Optional[str],
        tdit: bool,
        canvas_size: int,
    ) -> "_Layout":
        """Assign rows to every copy and preallocate the example / demo files (``tdit``: the test subset's demo
        pairs go to train/ too)."""
        lay = cls(
            ["<blank>"],
            [np.full((1, 2 + NUM_COLORS), -1, np.int64)],  # id 0 = blank
            {
                s: {
                    "puzzle_indices": [0],
                    "group_indices": [0],
                    "puzzle_identifiers": [],
                    "slot": [],
                    "demo_indices": [0],
                }
                for s in ("train", "test")
            },
            [],
        )
        paths = {
            (sp, k): os.path.join(tmp, sp, f"all__{k}.npy")
            for sp in ("train", "test")
            for k in ("inputs", "labels", "demo_inputs", "demo_labels")
        }
        for pnum, (p, (dih, luts, names)) in enumerate(zip(puzzles, chosen)):
            A, first_id = len(dih), len(lay.identifiers)
            lay.identifiers += names
            lay.map_rows.append(np.column_stack([np.full(A, pnum), dih, luts]))
            nt, P = len(p.train), len(p.train) + len(p.test)
            if p.subset == test_set_name:
                ranges = {"train": (0, nt if tdit else 0), "test": (nt, P)}
            else:
                ranges = {"train": (0, P), "test": (0, 0)}
            writes = []
            for split, (p0, p1) in ranges.items():
                if p1 - p0 > 0:
                    writes += lay._assign(split, paths, p0, p1, A, first_id, nt)
            lay.tasks.append((p, dih, luts, writes, canvas_size))
        seq_len = canvas_size * canvas_size
        for split in ("train", "test"):
            _preallocate(paths[split, "inputs"], lay.idx[split]["puzzle_indices"][-1], seq_len)
            _preallocate(paths[split, "labels"], lay.idx[split]["puzzle_indices"][-1], seq_len)
        _preallocate(paths["test", "demo_inputs"], lay.idx["test"]["demo_indices"][-1], seq_len)
        _preallocate(paths["test", "demo_labels"], lay.idx["test"]["demo_indices"][-1], seq_len)
        return lay

    def _assign(self, split: str, paths: dict, p0: int, p1: int, A: int, first_id: int, nt: int) -> list[tuple]:
        """Rows for pairs ``p0:p1`` of the ``A`` copies of one puzzle in ``split``; returns their file writes."""
        n, ix = p1 - p0, self.idx[split]
        start = ix["puzzle_indices"][-1]
        writes = [(paths[split, "inputs"], paths[split, "labels"], start, (p0, p1))]
        ix["puzzle_indices"] += (start + n * np.arange(1, A + 1)).tolist()
        ix["puzzle_identifiers"] += list(range(first_id, first_id + A))
        ix["group_indices"].append(ix["group_indices"][-1] + A)
        if split == "train":
            ix["slot"] += np.tile(np.arange(n), A).tolist()
        else:
            d0 = ix["demo_indices"][-1]
            writes.append((paths["test", "demo_inputs"], paths["test", "demo_labels"], d0, (0, nt)))
            ix["slot"] += [-1] * (A * n)
            ix["demo_indices"] += (d0 + nt * np.arange(1, A + 1)).tolist()
        return writes


def _write_splits(
    tmp: str, lay: _Layout, *, seed: int, num_aug: int, tdit: bool, source: str, canvas_size: int
) -> dict:
    """The index arrays, the demo store and dataset.json of both splits; returns their counts."""
    summary: dict = {}
    # per-puzzle demo counts (after a query's self-exclusion) for max_demos
    tr, te = lay.idx["train"], lay.idx["test"]
    tr_avail = np.diff(np.asarray(tr["puzzle_indices"])) - 1
    te_avail = np.diff(np.asarray(te["demo_indices"]))
    avail = np.concatenate([tr_avail, te_avail]) if len(tr_avail) + len(te_avail) else np.zeros(1, np.int64)
    max_demos = max(int(avail.max()), 1)
    p99 = max(int(np.ceil(np.percentile(avail, 99))), 1)
    for split in ("train", "test"):
        ix = lay.idx[split]
        d = os.path.join(tmp, split)
        n_ex = int(ix["puzzle_indices"][-1])
        arrays = {
            "puzzle_identifiers": np.asarray(ix["puzzle_identifiers"], dtype=np.int32),
            "puzzle_indices": np.asarray(ix["puzzle_indices"], dtype=np.int32),
            "group_indices": np.asarray(ix["group_indices"], dtype=np.int32),
            "example_demo_slot": np.asarray(ix["slot"], dtype=np.int32),
        }
        if split == "train":
            # the training split's demos are its own examples: share the files (hard links), no copy
            arrays["demo_indices"] = arrays["puzzle_indices"].copy()
            _link_or_copy(os.path.join(d, "all__inputs.npy"), os.path.join(d, "all__demo_inputs.npy"))
            _link_or_copy(os.path.join(d, "all__labels.npy"), os.path.join(d, "all__demo_labels.npy"))
        else:
            arrays["demo_indices"] = np.asarray(ix["demo_indices"], dtype=np.int32)
        for k, v in arrays.items():
            np.save(os.path.join(d, f"all__{k}.npy"), v)
        meta = _metadata(
            split,
            num_ids=len(lay.identifiers),
            n_groups=len(ix["group_indices"]) - 1,
            n_puzzles=len(ix["puzzle_identifiers"]),
            n_examples=n_ex,
            args={"seed": seed, "num_aug": num_aug},
            test_in_train=tdit,
            max_demos=max_demos,
            max_demos_p99=p99,
            source=source,
            canvas_size=canvas_size,
        )
        with open(os.path.join(d, "dataset.json"), "w") as f:
            json.dump(meta.model_dump(exclude={"identifiers_sha256"}), f, indent=1)
        summary[f"{split}_examples"] = n_ex
        summary[f"{split}_puzzles"] = len(ix["puzzle_identifiers"])
        summary[f"{split}_groups"] = len(ix["group_indices"]) - 1
    return summary


def _write_identifiers(tmp: str, lay: _Layout, puzzles: Sequence[ArcPuzzle], test_set_name: Optional[str]) -> None:
    """identifiers.json, identifiers_map.json and test_puzzles.json (the evaluator's ground truth)."""
    _write_json(os.path.join(tmp, "identifiers.json"), lay.identifiers)
    rows = np.concatenate(lay.map_rows)
    _write_json(
        os.path.join(tmp, "identifiers_map.json"),
        {
            "format": "columns/v1",
            "doc": "id -> (puzzle = names[puzzle[id]], subset = subsets[puzzle[id]], dihedral[id], colour_map[id]); "
            "id 0 is the blank (puzzle -1)",
            "names": [p.name for p in puzzles],
            "subsets": [p.subset for p in puzzles],
            "puzzle": rows[:, 0].tolist(),
            "dihedral": rows[:, 1].tolist(),
            "colour_map": ["".join(map(str, r)) if r[0] >= 0 else "" for r in rows[:, 2:].tolist()],
        },
    )
    _write_json(
        os.path.join(tmp, "test_puzzles.json"), {p.name: p.to_json() for p in puzzles if p.subset == test_set_name}
    )


def read_identifiers_map(data_dir: str) -> list[Optional[dict]]:
    """``identifiers_map.json`` as a list indexed by puzzle identifier: ``None`` for the blank id 0, else
    ``{"name": original puzzle name, "subset": ..., "augmentation": Augmentation}``."""
    path = os.path.join(data_dir, "identifiers_map.json")
    m = read_json(path, DatasetError)
    if not isinstance(m, dict) or m.get("format") != "columns/v1":
        raise DatasetError(f"{path}: field format: expected 'columns/v1'")
    out: list[Optional[dict]] = []
    for p, d, cm in zip(m["puzzle"], m["dihedral"], m["colour_map"]):
        if p < 0:
            out.append(None)
        else:
            out.append(
                {
                    "name": m["names"][p],
                    "subset": m["subsets"][p],
                    "augmentation": Augmentation(int(d), tuple(int(c) for c in cm)),
                }
            )
    return out

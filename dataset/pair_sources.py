"""Sources of the one-example-per-puzzle builders (Sudoku, Maze): the ``source,question,answer,rating`` CSV layout of
Sudoku-Extreme and Maze-Hard (read, and written by the generators), a seeded generator instead of a CSV, the
seeded training subsample, and the command-line options that choose among them.
"""

from __future__ import annotations

import argparse
import csv
import os
from typing import Callable, Iterator, Optional

import numpy as np
from tqdm import tqdm

from dataset.errors import DatasetError


def subsample_pairs(questions: np.ndarray, answers: np.ndarray, size: Optional[int], seed: int):
    """Seeded subsample (order kept) of ``size`` (question, answer) pairs; all of them when ``size`` is None or
    not smaller than the data (pitfall 20: never unseeded)."""
    if size is None:
        return questions, answers
    if size <= 0:
        raise DatasetError(f"--subsample-size must be > 0, got {size}")
    if size >= len(questions):
        return questions, answers
    sel = np.sort(np.random.default_rng([seed, 0x5AB]).choice(len(questions), size, replace=False))
    return questions[sel], answers[sel]


def generate_pairs(make, n: int, desc: str, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Call ``make() -> (question, answer)`` n times (with a progress bar) and stack the results."""
    pairs = [make() for _ in tqdm(range(n), desc=desc, disable=None if progress else True)]  # None: only on a tty
    return np.stack([q for q, _ in pairs]), np.stack([a for _, a in pairs])


# Column layout of the Sudoku-Extreme and Maze-Hard CSV files.
SOURCE_CSV_FIELDS = ("source", "question", "answer", "rating")


def add_source_arguments(ap: argparse.ArgumentParser, layout: str) -> None:
    """The Sudoku / Maze builders' shared options: a CSV source (``--source-dir``, ``layout`` names it) or a seeded
    generator (``--generate-train N``), the output, subsampling, seed, overwrite and progress."""
    ap.add_argument("--source-dir", default=None, help=f"directory with train.csv and test.csv ({layout} layout)")
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--subsample-size", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generate-train", type=int, default=None, help="generate this many training puzzles")
    ap.add_argument("--generate-test", type=int, default=100)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (without it: only on a terminal)")
    ap.add_argument(
        "--max-puzzles",
        type=int,
        default=None,
        metavar="N",
        help="smoke set: at most N puzzles from "
        "each source split (the first N rows of train.csv / test.csv, or N generated; N >= 1)",
    )


def source_pairs(
    args: argparse.Namespace,
    ap: argparse.ArgumentParser,
    read: Callable[[str], tuple],
    make: Callable[[], tuple],
    generated: str,
) -> tuple[tuple, tuple, str]:
    """(train pairs, test pairs, source label) from ``--source-dir`` (``read(csv path)``) or the generator
    (``make()`` per puzzle, label ``generated``); neither given is a usage error."""
    if args.source_dir is not None:
        return (
            read(os.path.join(args.source_dir, "train.csv")),
            read(os.path.join(args.source_dir, "test.csv")),
            f"csv:{args.source_dir}",
        )
    if args.generate_train is not None:
        n = lambda k: k if args.max_puzzles is None else min(k, args.max_puzzles)  # noqa: E731 (--max-puzzles)
        return (
            generate_pairs(make, n(args.generate_train), "generating train", not args.no_progress),
            generate_pairs(make, n(args.generate_test), "generating test", not args.no_progress),
            generated,
        )
    ap.error("give --source-dir <dir with train.csv/test.csv> or --generate-train N")


def write_source_csv(path: str, make_row: Callable[[], list], num: int, *, desc: str, progress: bool = False) -> str:
    """Write ``num`` rows of ``make_row()`` under the ``source,question,answer,rating`` header (the layout
    :func:`iter_source_csv` reads); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SOURCE_CSV_FIELDS)
        for _ in tqdm(range(num), desc=desc, disable=None if progress else True):
            w.writerow(make_row())
    return path


def iter_source_csv(path: str) -> Iterator[tuple[int, list[str]]]:
    """Rows of a ``source,question,answer[,rating]`` CSV as ``(line number, row)``, after checking that the file
    exists, the header starts with ``source,question,answer`` and every row has at least those three columns."""
    if not os.path.exists(path):
        raise DatasetError(f"{path}: file not found")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != list(SOURCE_CSV_FIELDS[:3]):
            raise DatasetError(f"{path}: header must start with {','.join(SOURCE_CSV_FIELDS)}, got {header}")
        for line, row in enumerate(reader, start=2):
            if len(row) < 3:
                raise DatasetError(f"{path}: line {line}: expected columns {SOURCE_CSV_FIELDS}, got {len(row)} fields")
            yield line, row

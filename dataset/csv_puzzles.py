"""The core of the one-example-per-puzzle builders (``python -m dataset.build_sudoku_dataset`` and
``dataset.build_maze_dataset``); each builder adds only its puzzle: how a board is read, checked, generated and
augmented, its vocabulary and its summary line.

Here: the ``source,question,answer,rating`` CSV layout of Sudoku-Extreme and Maze-Hard (read, and written by the
generators), a seeded generator instead of a CSV, the seeded training subsample, the build (train split = each
kept puzzle followed by its augmented copies as one group, test split as given, tokens = board value + 1 with PAD 0,
``dataset.json``, a blank ``identifiers.json``, all in an atomic output directory) and the command line shared by
both builders.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import time
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
from tqdm import tqdm

from core.errors import user_errors
from dataset.build_options import bar_disable, check_max_puzzles
from dataset.errors import DatasetError
from dataset.metadata import DatasetMetadata
from dataset.writer import atomic_output_dir, save_split, set_default_dir_mode

# (question, answer) boards -> the training copies of one puzzle, the puzzle itself first: (index, question, answer)
Copies = Callable[[int, np.ndarray, np.ndarray], list]


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


def read_source_pairs(
    path: str, parse: Callable[[int, list[str]], Optional[tuple]], max_puzzles: Optional[int], noun: str
) -> tuple[np.ndarray, np.ndarray]:
    """(questions, answers) stacked from ``parse(line number, row) -> (question, answer)`` (None skips the row) over
    the rows of a source CSV (:func:`iter_source_csv`); ``max_puzzles``: stop after the first that many kept rows
    (file order). A file with no kept row is a :class:`DatasetError` ("no ``noun``")."""
    check_max_puzzles(max_puzzles)
    qs, ans = [], []
    for line, row in iter_source_csv(path):
        pair = parse(line, row)
        if pair is None:
            continue
        qs.append(pair[0])
        ans.append(pair[1])
        if len(qs) == max_puzzles:
            break
    if not qs:
        raise DatasetError(f"{path}: no {noun}")
    return np.stack(qs), np.stack(ans)


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
def encode_boards(boards: np.ndarray) -> np.ndarray:
    """[N, h, w] board values -> [N, h*w] uint8 tokens (value + 1; 0 stays free for PAD)."""
    return (boards.reshape(len(boards), -1) + 1).astype(np.uint8)


def save_one_example_split(
    split_dir: str, inputs: np.ndarray, labels: np.ndarray, group_sizes: Sequence[int], metadata: DatasetMetadata
) -> None:
    """Save a split where every puzzle is one example (Sudoku, Maze): blank puzzle ids, groups of augmented copies
    of ``group_sizes`` puzzles each."""
    n = len(inputs)
    save_split(
        split_dir,
        {
            "inputs": inputs,
            "labels": labels,
            "puzzle_identifiers": np.zeros(n, np.int32),
            "puzzle_indices": np.arange(n + 1, dtype=np.int32),
            "group_indices": np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int32),
        },
        metadata,
    )


def write_blank_identifiers(data_dir: str) -> None:
    """identifiers.json of a dataset without puzzle identities (only the blank id 0)."""
    with open(os.path.join(data_dir, "identifiers.json"), "w") as f:
        json.dump(["<blank>"], f)


def _write_split(d: str, qs: np.ndarray, ans: np.ndarray, group_sizes: list, num_aug: int, **meta) -> None:
    n = len(qs)
    metadata = DatasetMetadata(
        pad_id=0,
        ignore_label_id=0,
        blank_identifier_id=0,
        num_puzzle_identifiers=1,
        total_groups=len(group_sizes),
        mean_puzzle_examples=1.0,
        total_puzzles=n,
        sets=["all"],
        translate_augment=False,
        num_aug=num_aug,
        **meta,
    )
    save_one_example_split(d, encode_boards(qs), encode_boards(ans), group_sizes, metadata)


def build_pairs_dataset(
    output_dir: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    copies: Copies,
    *,
    kind: str,
    unit: str,
    vocab_size: int,
    num_aug: int,
    subsample_size: Optional[int] = None,
    seed: int = 0,
    overwrite: bool = False,
    source: str = "",
    progress: bool = True,
) -> dict:
    """Write ``train/`` (the seeded subsample of ``train``, each puzzle followed by its augmented copies:
    ``copies(i, question, answer)``, one group per puzzle) and ``test/`` (as given) from (questions, answers) board
    arrays [N, side, side]. ``kind``, ``vocab_size``, ``num_aug`` (the train split's copies per puzzle minus one),
    ``seed`` and ``source`` go to ``dataset.json``; ``unit`` names a puzzle on the progress bar; ``overwrite``
    replaces an existing dataset; ``progress``: a bar when stderr is a terminal. Returns counts and seconds taken."""
    t0 = time.time()
    side = train[0].shape[1]
    tq, ta = subsample_pairs(*train, subsample_size, seed)
    meta = dict(kind=kind, vocab_size=vocab_size, seq_len=side * side, grid_size=side, seed=seed, source=source)
    with atomic_output_dir(output_dir, overwrite=overwrite) as tmp:
        qs, ans, groups = [], [], []
        for i in tqdm(range(len(tq)), desc=f"{kind} train", unit=unit, disable=bar_disable(progress)):
            group = copies(i, tq[i], ta[i])
            qs.extend(q for q, _ in group)
            ans.extend(a for _, a in group)
            groups.append(len(group))
        _write_split(os.path.join(tmp, "train"), np.stack(qs), np.stack(ans), groups, num_aug, **meta)
        _write_split(os.path.join(tmp, "test"), test[0], test[1], [1] * len(test[0]), 0, **meta)
        write_blank_identifiers(tmp)
        set_default_dir_mode(tmp)
    return {
        "train_puzzles": len(tq),
        "train_examples": len(qs),
        "test_examples": len(test[0]),
        "seconds": round(time.time() - t0, 2),
    }


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------
def run_builder(
    argv: Optional[Sequence[str]],
    *,
    module: str,
    doc: str,
    layout: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    sources: Callable[[argparse.Namespace], tuple],
    build: Callable[..., dict],
    report: Callable[[argparse.Namespace, dict], str],
) -> dict:
    """``main`` of a builder: the shared options (:func:`add_source_arguments`, ``layout`` names the CSV layout)
    plus ``add_arguments``'s; ``sources(args)`` gives ``(read(csv path), make(), generated label)`` for
    :func:`source_pairs`; ``build(args, output_dir=, train=, test=, subsample_size=, seed=, overwrite=, source=,
    progress=)`` writes the dataset and returns its summary, printed as ``report(args, summary)``. Bad input: one
    line, exit 2 (core.errors)."""
    ap = argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_source_arguments(ap, layout)
    add_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with user_errors(code=2):
        read, make, generated = sources(args)
        check_max_puzzles(args.max_puzzles)
        train, test, source = source_pairs(args, ap, read, make, generated)
        s = build(
            args,
            output_dir=args.output_dir,
            train=train,
            test=test,
            subsample_size=args.subsample_size,
            seed=args.seed,
            overwrite=args.overwrite,
            source=source,
            progress=not args.no_progress,
        )
    print(report(args, s))
    return s

"""Build a Sudoku dataset (TRM format: 81 tokens, PAD 0, blank 1, digits 1-9 -> 2..10).

    # from the Sudoku-Extreme CSV layout (train.csv / test.csv with columns source,question,answer,rating)
    python -m dataset.build_sudoku_dataset --source-dir data/sudoku-extreme-raw \\
        --output-dir data/sudoku-extreme-1k-aug-1000 --subsample-size 1000 --num-aug 1000 --seed 0

    # no download: generate unique-solution puzzles with the built-in generator (--size 4 for tiny CPU runs)
    python -m dataset.build_sudoku_dataset --generate-train 1000 --generate-test 200 --output-dir data/sudoku-gen \\
        --num-aug 100 [--size 4]

Augmentations (training split only, like the published builder): digit relabelling, transpose, permutation of
bands / stacks and of rows / columns inside each band / stack. Every augmented solution is re-checked to be a
valid Sudoku that agrees with its clues.
"""

from __future__ import annotations

import argparse
import logging
from typing import Optional, Sequence

import numpy as np

from dataset.csv_puzzles import (
    SOURCE_CSV_FIELDS,
    build_pairs_dataset,
    read_source_pairs,
    run_builder,
    write_source_csv,
)
from dataset.errors import DatasetError

log = logging.getLogger(__name__)

CSV_FIELDS = SOURCE_CSV_FIELDS


# ----------------------------------------------------------------------------------------------
# Validity, solver, generator
# ----------------------------------------------------------------------------------------------
def _box(n: int) -> int:
    b = int(round(n**0.5))
    if b * b != n or n not in (4, 9):
        raise DatasetError(f"--size must be 4 or 9, got {n}")
    return b


def is_valid_solution(grid: np.ndarray) -> bool:
    """Every row, column and box holds 1..n exactly once."""
    g = np.asarray(grid)
    n = g.shape[0]
    b = _box(n)
    want = np.arange(1, n + 1)
    rows = all(np.array_equal(np.sort(g[r]), want) for r in range(n))
    cols = all(np.array_equal(np.sort(g[:, c]), want) for c in range(n))
    boxes = all(
        np.array_equal(np.sort(g[r : r + b, c : c + b].reshape(-1)), want)
        for r in range(0, n, b)
        for c in range(0, n, b)
    )
    return rows and cols and boxes


def count_solutions(
    puzzle: np.ndarray, limit: int = 2, rng: Optional[np.random.Generator] = None, out: Optional[list] = None
) -> int:
    """Number of solutions of ``puzzle`` (0 = blank), counting up to ``limit``. Bitmask backtracking with the
    most-constrained-cell heuristic; with ``rng`` candidate order is random (used to make full grids).
    The first solution found is appended to ``out``."""
    g = np.array(puzzle, dtype=np.int64)
    n = g.shape[0]
    b = _box(n)
    full = (1 << (n + 1)) - 2
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    empties = []
    for r in range(n):
        for c in range(n):
            v = int(g[r, c])
            if v:
                bit = 1 << v
                k = (r // b) * b + c // b
                if rows[r] & bit or cols[c] & bit or boxes[k] & bit:
                    return 0
                rows[r] |= bit
                cols[c] |= bit
                boxes[k] |= bit
            else:
                empties.append((r, c, (r // b) * b + c // b))
    count = 0

    def rec() -> bool:
        nonlocal count
        best, best_opts, best_n = -1, 0, n + 1
        for i, (r, c, k) in enumerate(empties):
            if g[r, c]:
                continue
            opts = full & ~(rows[r] | cols[c] | boxes[k])
            m = bin(opts).count("1")
            if m < best_n:
                best, best_opts, best_n = i, opts, m
                if m <= 1:
                    break
        if best < 0:
            count += 1
            if out is not None and not out:
                out.append(g.copy())
            return count >= limit
        if best_n == 0:
            return False
        r, c, k = empties[best]
        vals = [v for v in range(1, n + 1) if best_opts >> v & 1]
        if rng is not None:
            vals = [vals[i] for i in rng.permutation(len(vals))]
        for v in vals:
            bit = 1 << v
            g[r, c] = v
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
            if rec():
                return True
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[k] &= ~bit
            g[r, c] = 0
        return False

    rec()
    return count


def solve(puzzle: np.ndarray) -> Optional[np.ndarray]:
    out: list = []
    count_solutions(puzzle, limit=1, out=out)
    return out[0] if out else None


def generate_puzzle(rng: np.random.Generator, size: int = 9, min_clues: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(puzzle, solution): a random full grid, then clues removed in random order while the solution stays
    unique (and at least ``min_clues`` remain)."""
    out: list = []
    count_solutions(np.zeros((size, size), np.int64), limit=1, rng=rng, out=out)
    solution = out[0]
    puzzle = solution.copy()
    for idx in rng.permutation(size * size):
        if (puzzle != 0).sum() <= min_clues:
            break
        r, c = divmod(int(idx), size)
        v = puzzle[r, c]
        puzzle[r, c] = 0
        if count_solutions(puzzle, limit=2) != 1:
            puzzle[r, c] = v
    return puzzle, solution


def _to_str(g: np.ndarray, blank: str = ".") -> str:
    return "".join(blank if v == 0 else str(int(v)) for v in np.asarray(g).reshape(-1))


def generate_sudoku_csv(path: str, num: int, *, size: int = 9, seed: int = 0, progress: bool = False) -> str:
    """Write ``num`` generated puzzles in the Sudoku-Extreme CSV layout (rating = number of blanks)."""
    rng = np.random.default_rng([seed, 0x50D0])

    def row() -> list:
        p, s = generate_puzzle(rng, size)
        return ["generated", _to_str(p), _to_str(s), int((p == 0).sum())]

    return write_source_csv(path, row, num, desc="generating sudoku", progress=progress)


# ----------------------------------------------------------------------------------------------
# CSV reading
# ----------------------------------------------------------------------------------------------
def read_sudoku_csv(
    path: str, size: int = 9, min_rating: Optional[int] = None, max_puzzles: Optional[int] = None
) -> tuple[np.ndarray, np.ndarray]:
    """(questions, answers) as int arrays [N, size, size] (0 = blank), validated; ``max_puzzles``: stop after the
    first that many kept rows (file order)."""

    def parse(line: int, row: list[str]) -> Optional[tuple[np.ndarray, np.ndarray]]:
        if min_rating is not None and len(row) > 3 and row[3].strip():
            try:
                rating = float(row[3])
            except ValueError:
                raise DatasetError(f"{path}: line {line}: field rating: not a number: {row[3]!r}") from None
            if rating < min_rating:
                return None
        q = _parse_board(row[1], size, blank_ok=True, where=f"{path}: line {line}: field question")
        a = _parse_board(row[2], size, blank_ok=False, where=f"{path}: line {line}: field answer")
        if not is_valid_solution(a):
            raise DatasetError(f"{path}: line {line}: field answer: not a valid Sudoku solution")
        if ((q != 0) & (q != a)).any():
            raise DatasetError(f"{path}: line {line}: field question: clues disagree with the answer")
        return q, a

    return read_source_pairs(path, parse, max_puzzles, "puzzles")


def _parse_board(s: str, size: int, *, blank_ok: bool, where: str) -> np.ndarray:
    s = s.strip()
    if len(s) != size * size:
        raise DatasetError(f"{where}: expected {size * size} characters, got {len(s)}")
    out = np.zeros(size * size, np.int64)
    for i, ch in enumerate(s):
        if ch in ".0":
            if not blank_ok:
                raise DatasetError(f"{where}: blank at position {i}")
        elif ch.isdigit() and 1 <= int(ch) <= size:
            out[i] = int(ch)
        else:
            raise DatasetError(f"{where}: invalid character {ch!r} at position {i}")
    return out.reshape(size, size)


# ----------------------------------------------------------------------------------------------
# Augmentation
# ----------------------------------------------------------------------------------------------
def random_sudoku_transform(rng: np.random.Generator, size: int = 9):
    """A validity-preserving transform: (digit map [size+1], transpose, row order, column order)."""
    b = _box(size)
    digits = np.concatenate([[0], rng.permutation(np.arange(1, size + 1))])
    bands = rng.permutation(b)
    rows = np.concatenate([band * b + rng.permutation(b) for band in bands])
    stacks = rng.permutation(b)
    cols = np.concatenate([st * b + rng.permutation(b) for st in stacks])
    return digits, bool(rng.random() < 0.5), rows, cols


def apply_sudoku_transform(grid: np.ndarray, t) -> np.ndarray:
    digits, transpose, rows, cols = t
    g = np.asarray(grid)
    if transpose:
        g = g.T
    return digits[g[np.ix_(rows, cols)]]


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
def build_sudoku_dataset(
    output_dir: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    num_aug: int = 0,
    seed: int = 0,
    **options,
) -> dict:
    """Write ``train/`` (subsampled, each puzzle followed by ``num_aug`` augmented copies) and ``test/`` (as given)
    from (questions, answers) arrays. Tokens: PAD 0, blank 1, digit d -> d + 1. ``options``: ``subsample_size``,
    ``overwrite``, ``source``, ``progress`` of :func:`dataset.csv_puzzles.build_pairs_dataset`."""
    size = train[0].shape[1]
    rng = np.random.default_rng([seed, 0xA06])

    def copies(i: int, q: np.ndarray, a: np.ndarray) -> list:
        out = [(q, a)]
        for _ in range(num_aug):
            t = random_sudoku_transform(rng, size)
            q2, a2 = apply_sudoku_transform(q, t), apply_sudoku_transform(a, t)
            if not is_valid_solution(a2) or ((q2 != 0) & (q2 != a2)).any():
                raise DatasetError(f"augmentation of training puzzle {i} produced an invalid Sudoku (bug)")
            out.append((q2, a2))
        return out

    summary = build_pairs_dataset(
        output_dir,
        train,
        test,
        copies,
        kind="sudoku",
        unit="puzzle",
        vocab_size=size + 2,
        num_aug=num_aug,
        seed=seed,
        **options,
    )
    seconds = summary.pop("seconds")
    return {**summary, "augmentations": summary["train_examples"] - summary["train_puzzles"], "seconds": seconds}


def _sources(args: argparse.Namespace) -> tuple:
    rng = np.random.default_rng([args.seed, 0x6E4])
    return (
        lambda path: read_sudoku_csv(path, args.size, args.min_difficulty, args.max_puzzles),
        lambda: generate_puzzle(rng, args.size),
        f"generated:size{args.size}",
    )


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--min-difficulty", type=int, default=None, help="keep rows with rating >= this")
    ap.add_argument("--num-aug", type=int, default=0)
    ap.add_argument("--size", type=int, default=9, choices=[4, 9])


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return run_builder(
        argv,
        module="dataset.build_sudoku_dataset",
        doc=__doc__,
        layout="Sudoku-Extreme",
        add_arguments=_add_arguments,
        sources=_sources,
        build=lambda args, **kw: build_sudoku_dataset(num_aug=args.num_aug, **kw),
        report=lambda args, s: (
            f"built {args.output_dir}: {s['train_puzzles']} puzzles x (1 + {args.num_aug}) = {s['train_examples']} "
            f"train examples, {s['test_examples']} test examples, {s['seconds']} s"
        ),
    )


if __name__ == "__main__":
    main()

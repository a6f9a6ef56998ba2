"""Options and input checks shared by the ``python -m dataset.build_*`` commands: ``--max-puzzles`` (a few-puzzle
smoke set), the progress-bar rule, and a JSON reader that refuses a puzzle id given twice.

Progress bars: the builders pass :func:`bar_disable` to tqdm, so a bar is drawn only when stderr is a terminal
(tqdm's ``disable=None``, as the training loop and evaluate.py do) and never with ``--no-progress``; a log file,
a pipe, the job queue or SLURM get no carriage-return bar frames.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any, Optional, Sequence, TypeVar

from core.io import read_json
from dataset.errors import DatasetError

T = TypeVar("T")


def bar_disable(progress: bool) -> Optional[bool]:
    """tqdm's ``disable`` for a builder's bar: ``None`` (tqdm draws only when its stream, stderr, is a terminal)
    when ``progress`` is on, ``True`` when it is off (``--no-progress``)."""
    return None if progress else True


def add_max_puzzles_argument(ap: argparse.ArgumentParser, meaning: str) -> None:
    """``--max-puzzles N``; ``meaning`` says what N counts for this builder (it differs per source)."""
    ap.add_argument(
        "--max-puzzles", type=int, default=None, metavar="N", help=f"smoke set: {meaning} (N >= 1; default: all)"
    )


def check_max_puzzles(max_puzzles: Optional[int]) -> Optional[int]:
    """``max_puzzles`` unchanged when None or >= 1; anything else is a :class:`DatasetError`."""
    if max_puzzles is not None and (
        isinstance(max_puzzles, bool) or not isinstance(max_puzzles, int) or max_puzzles < 1
    ):
        raise DatasetError(f"--max-puzzles must be an integer >= 1, got {max_puzzles!r}")
    return max_puzzles


def cap(n: int, max_puzzles: Optional[int]) -> int:
    """``n`` limited to ``max_puzzles`` (None = no limit)."""
    return n if check_max_puzzles(max_puzzles) is None else min(n, max_puzzles)


def first_per_subset(puzzles: Sequence[T], max_puzzles: Optional[int]) -> list[T]:
    """The first ``max_puzzles`` puzzles (objects with a ``subset`` attribute) of every subset, order kept."""
    if check_max_puzzles(max_puzzles) is None:
        return list(puzzles)
    taken: Counter = Counter()
    out = []
    for p in puzzles:
        if taken[p.subset] < max_puzzles:
            taken[p.subset] += 1
            out.append(p)
    return out


def read_json_unique_ids(path: str) -> Any:
    """The JSON in ``path``, refusing a top-level object that names one key (a puzzle id) twice: ``json.load``
    would silently keep the last one and a puzzle would vanish from the build. A missing, non-UTF-8 or malformed file
    raises :class:`DatasetError` naming it."""
    last: list = [None, ()]  # (object, its duplicated keys) of the latest object the decoder closed

    def pairs_hook(pairs: list) -> dict:
        obj = dict(pairs)
        last[0], last[1] = obj, ()
        if len(obj) != len(pairs):
            counts = Counter(k for k, _ in pairs)
            last[1] = tuple((k, n) for k, n in counts.items() if n > 1)
        return obj

    data = read_json(path, DatasetError, object_pairs_hook=pairs_hook)
    if data is last[0] and last[1]:  # the top-level object is the last one closed
        (key, n), rest = last[1][0], len(last[1]) - 1
        more = f" (and {rest} more duplicated id{'s' if rest > 1 else ''})" if rest else ""
        raise DatasetError(
            f"{path}: puzzle id {key!r} appears {n} times{more}; JSON would keep only the last "
            f"copy, so remove or rename the duplicates"
        )
    return data

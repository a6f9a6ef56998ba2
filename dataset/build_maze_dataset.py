"""Build a Maze dataset (TRM format: 30x30 = 900 tokens over '# SGo' -> 1..5, PAD 0).

    # from the Maze-Hard CSV layout (train.csv / test.csv with columns source,question,answer,rating)
    python -m dataset.build_maze_dataset --source-dir data/maze-30x30-hard-1k-raw \\
        --output-dir data/maze-30x30-hard-1k [--aug] [--subsample-size N] --seed 0

    # no download: built-in generator (labels are BFS shortest paths, unique by construction)
    python -m dataset.build_maze_dataset --generate-train 1000 --generate-test 1000 --output-dir data/maze-gen [--aug]

Question: '#' wall, ' ' open, 'S' start, 'G' goal. Answer: the question with the cells of the shortest S->G
path (excluding S and G) marked 'o'. ``--aug`` adds the 7 non-identity dihedral copies of each training maze.
"""

from __future__ import annotations

import argparse
import logging
from collections import deque
from typing import Optional, Sequence

import numpy as np

from dataset.csv_puzzles import (
    SOURCE_CSV_FIELDS,
    build_pairs_dataset,
    read_source_pairs,
    run_builder,
    write_source_csv,
)
from dataset.dihedral import dihedral_transform
from dataset.errors import DatasetError

log = logging.getLogger(__name__)

CHARSET = "# SGo"  # token = index + 1 (0 is PAD)
WALL, OPEN, START, GOAL, PATH = (CHARSET.index(c) for c in CHARSET)
MAZE_SIZE = 30
CSV_FIELDS = SOURCE_CSV_FIELDS


def bfs_distances(maze: np.ndarray, src: tuple[int, int]) -> np.ndarray:
    """4-neighbour BFS distance from ``src`` over non-wall cells (-1 = unreachable). ``maze`` holds CHARSET indices."""
    h, w = maze.shape
    dist = np.full((h, w), -1, np.int64)
    dist[src] = 0
    q = deque([src])
    while q:
        y, x = q.popleft()
        for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            ny, nx = y + dy, x + dx
            if 0 <= ny < h and 0 <= nx < w and dist[ny, nx] < 0 and maze[ny, nx] != WALL:
                dist[ny, nx] = dist[y, x] + 1
                q.append((ny, nx))
    return dist


def shortest_path_cells(maze: np.ndarray) -> tuple[Optional[np.ndarray], int]:
    """(boolean mask of the cells strictly between S and G on a shortest path, number of shortest paths).

    The mask is None when G is unreachable. When several shortest paths exist the mask is one of them."""
    s = tuple(int(v) for v in np.argwhere(maze == START)[0])
    g = tuple(int(v) for v in np.argwhere(maze == GOAL)[0])
    ds, dg = bfs_distances(maze, s), bfs_distances(maze, g)
    L = ds[g]
    if L < 0:
        return None, 0
    # number of shortest paths: DP over BFS layers
    ways = np.zeros(maze.shape, np.int64)
    ways[s] = 1
    on = (ds >= 0) & (dg >= 0) & (ds + dg == L)
    order = np.argwhere(on)
    order = order[np.argsort(ds[on], kind="stable")]
    for y, x in order:
        if (y, x) == s:
            continue
        tot = 0
        for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            ny, nx = y + dy, x + dx
            if 0 <= ny < maze.shape[0] and 0 <= nx < maze.shape[1] and on[ny, nx] and ds[ny, nx] == ds[y, x] - 1:
                tot += ways[ny, nx]
        ways[y, x] = min(tot, 2**40)
    # walk back from G along one shortest path
    mask = np.zeros(maze.shape, bool)
    cur = g
    while ds[cur] > 1:
        y, x = cur
        for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            ny, nx = y + dy, x + dx
            if 0 <= ny < maze.shape[0] and 0 <= nx < maze.shape[1] and ds[ny, nx] == ds[cur] - 1 and on[ny, nx]:
                cur = (ny, nx)
                break
        mask[cur] = True
    return mask, int(ways[g])


def generate_maze(
    rng: np.random.Generator, size: int = MAZE_SIZE, loop_prob: float = 0.08, min_path: int = 60, max_tries: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """(question, answer) as CHARSET-index arrays: a random DFS maze with extra openings (loops), S and G far
    apart, answer = the unique shortest path."""
    for _ in range(max_tries):
        maze = np.full((size, size), WALL, np.int64)
        cells = (size - 1) // 2  # cell (i, j) at (2i+1, 2j+1)
        seen = np.zeros((cells, cells), bool)
        stack = [(int(rng.integers(cells)), int(rng.integers(cells)))]
        seen[stack[0]] = True
        maze[2 * stack[0][0] + 1, 2 * stack[0][1] + 1] = OPEN
        while stack:
            i, j = stack[-1]
            nbrs = [
                (i + di, j + dj)
                for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1))
                if 0 <= i + di < cells and 0 <= j + dj < cells and not seen[i + di, j + dj]
            ]
            if not nbrs:
                stack.pop()
                continue
            ni, nj = nbrs[int(rng.integers(len(nbrs)))]
            seen[ni, nj] = True
            maze[i + ni + 1, j + nj + 1] = OPEN  # the wall between
            maze[2 * ni + 1, 2 * nj + 1] = OPEN
            stack.append((ni, nj))
        # loops: open some interior walls between two open cells
        for y in range(1, 2 * cells):
            for x in range(1, 2 * cells):
                if maze[y, x] == WALL and rng.random() < loop_prob:
                    if (maze[y - 1, x] == OPEN and maze[y + 1, x] == OPEN) or (
                        maze[y, x - 1] == OPEN and maze[y, x + 1] == OPEN
                    ):
                        maze[y, x] = OPEN
        open_cells = np.argwhere(maze == OPEN)
        s = tuple(open_cells[int(rng.integers(len(open_cells)))])
        d = bfs_distances(maze, s)
        far = np.argwhere(d >= min_path)
        if len(far) == 0:
            continue
        g = tuple(far[int(rng.integers(len(far)))])
        maze[s], maze[g] = START, GOAL
        mask, n_paths = shortest_path_cells(maze)
        if mask is None or n_paths != 1:
            continue  # the label must be unambiguous
        answer = maze.copy()
        answer[mask] = PATH
        return maze, answer
    raise DatasetError(f"maze generator: no maze with a unique shortest path >= {min_path} in {max_tries} tries")


def maze_to_str(m: np.ndarray) -> str:
    return "".join(CHARSET[int(v)] for v in np.asarray(m).reshape(-1))


def generate_maze_csv(path: str, num: int, *, seed: int = 0, progress: bool = False, **kw) -> str:
    rng = np.random.default_rng([seed, 0x3A2E])

    def row() -> list:
        q, a = generate_maze(rng, **kw)
        return ["generated", maze_to_str(q), maze_to_str(a), int((a == PATH).sum())]

    return write_source_csv(path, row, num, desc="generating mazes", progress=progress)


def read_maze_csv(path: str, max_puzzles: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
    """(questions, answers) [N, 30, 30] of CHARSET indices, validated (one S, one G, answer = question + path);
    ``max_puzzles``: only the first that many rows."""

    def parse(line: int, row: list[str]) -> tuple[np.ndarray, np.ndarray]:
        q = _parse(row[1], f"{path}: line {line}: field question")
        a = _parse(row[2], f"{path}: line {line}: field answer")
        for name, m in (("question", q), ("answer", a)):
            if (m == START).sum() != 1 or (m == GOAL).sum() != 1:
                raise DatasetError(f"{path}: line {line}: field {name}: needs exactly one 'S' and one 'G'")
        if (q == PATH).any():
            raise DatasetError(f"{path}: line {line}: field question: contains path marks 'o'")
        diff = q != a
        if not ((q[diff] == OPEN) & (a[diff] == PATH)).all():
            raise DatasetError(
                f"{path}: line {line}: field answer: differs from the question other than by marking open cells 'o'"
            )
        return q, a

    return read_source_pairs(path, parse, max_puzzles, "mazes")


def _parse(s: str, where: str) -> np.ndarray:
    if len(s) != MAZE_SIZE * MAZE_SIZE:
        raise DatasetError(f"{where}: expected {MAZE_SIZE * MAZE_SIZE} characters, got {len(s)}")
    bad = [c for c in set(s) if c not in CHARSET]
    if bad:
        raise DatasetError(f"{where}: invalid characters {sorted(bad)} (allowed: {CHARSET!r})")
    lut = {c: i for i, c in enumerate(CHARSET)}
    return np.array([lut[c] for c in s], np.int64).reshape(MAZE_SIZE, MAZE_SIZE)


def build_maze_dataset(
    output_dir: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    aug: bool = False,
    **options,
) -> dict:
    """Write ``train/`` (subsampled; with ``aug`` each maze followed by its 7 non-identity dihedral copies) and
    ``test/`` (as given) from (questions, answers) CHARSET-index arrays. Tokens: PAD 0, CHARSET index + 1.
    ``options``: ``subsample_size``, ``seed``, ``overwrite``, ``source``, ``progress`` of
    :func:`dataset.csv_puzzles.build_pairs_dataset`."""
    tids = range(8) if aug else range(1)
    summary = build_pairs_dataset(
        output_dir,
        train,
        test,
        lambda i, q, a: [(dihedral_transform(q, t), dihedral_transform(a, t)) for t in tids],
        kind="maze",
        unit="maze",
        vocab_size=len(CHARSET) + 1,
        num_aug=len(tids) - 1,
        **options,
    )
    return {"train_mazes": summary.pop("train_puzzles"), **summary}


def _sources(args: argparse.Namespace) -> tuple:
    rng = np.random.default_rng([args.seed, 0x3A2F])
    return (
        lambda path: read_maze_csv(path, args.max_puzzles),
        lambda: generate_maze(rng, min_path=args.min_path),
        "generated",
    )


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--aug", action="store_true", help="add the 7 non-identity dihedral copies (training split)")
    ap.add_argument("--min-path", type=int, default=60, help="generator: minimum shortest-path length")


def main(argv: Optional[Sequence[str]] = None) -> dict:
    return run_builder(
        argv,
        module="dataset.build_maze_dataset",
        doc=__doc__,
        layout="Maze-Hard",
        add_arguments=_add_arguments,
        sources=_sources,
        build=lambda args, **kw: build_maze_dataset(aug=args.aug, **kw),
        report=lambda args, s: (
            f"built {args.output_dir}: {s['train_examples']} train / {s['test_examples']} test examples, "
            f"{s['seconds']} s"
        ),
    )


if __name__ == "__main__":
    main()

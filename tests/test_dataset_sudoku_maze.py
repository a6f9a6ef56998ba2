"""Sudoku and Maze builders: generator + solver, CSV layouts, augmentation validity, BFS-checked labels,
seeded subsampling and byte-identical rebuilds."""

import csv
import filecmp

import numpy as np
import pytest

from dataset import build_maze_dataset as MZ
from dataset import build_sudoku_dataset as SD
from dataset.build_maze_dataset import build_maze_dataset
from dataset.csv_puzzles import subsample_pairs
from dataset.dihedral import dihedral_transform
from dataset.errors import DatasetError
from dataset.metadata import load_metadata


# ------------------------------------------------------------------------------------------------ sudoku
def _decode(tokens, n):
    return (np.asarray(tokens, np.int64) - 1).reshape(-1, n, n)  # 1 = blank -> 0, d + 1 -> d


def test_solver_and_generator_unique():
    rng = np.random.default_rng(1)
    for size in (4, 9):
        p, s = SD.generate_puzzle(rng, size)
        assert SD.is_valid_solution(s) and ((p == 0) | (p == s)).all() and (p == 0).any()
        assert SD.count_solutions(p) == 1 and np.array_equal(SD.solve(p), s)
        # removing any further clue makes it ambiguous or keeps it unique; the generator stopped at a minimal set
        q = p.copy()
        r, c = map(int, np.argwhere(p != 0)[0])
        q[r, c] = 0
        assert SD.count_solutions(q) >= 2
    bad = s.copy()
    bad[0, 0], bad[0, 1] = bad[0, 1], bad[0, 0]
    assert not SD.is_valid_solution(bad)
    assert SD.count_solutions(np.zeros((4, 4), int), limit=1000) == 288  # number of 4x4 Sudoku grids


def test_every_augmented_sudoku_valid(tmp_path):
    src = tmp_path / "src"
    SD.generate_sudoku_csv(str(src / "train.csv"), 4, size=9, seed=0)
    SD.generate_sudoku_csv(str(src / "test.csv"), 2, size=9, seed=1)
    out = tmp_path / "out"
    s = SD.main(["--source-dir", str(src), "--output-dir", str(out), "--num-aug", "7", "--seed", "3", "--no-progress"])
    assert s["train_examples"] == 4 * 8
    m = load_metadata(str(out / "train"))
    assert (m.kind, m.seq_len, m.vocab_size, m.total_groups) == ("sudoku", 81, 11, 4)
    q = _decode(np.load(out / "train" / "all__inputs.npy"), 9)
    a = _decode(np.load(out / "train" / "all__labels.npy"), 9)
    assert len({x.tobytes() for x in q}) == 32  # augmented copies really differ
    for k, (qi, ai) in enumerate(zip(q, a)):
        assert SD.is_valid_solution(ai) and ((qi == 0) | (qi == ai)).all()
        if k % 4 == 1:
            assert SD.count_solutions(qi) == 1  # transforms keep uniqueness
    g = np.load(out / "train" / "all__group_indices.npy")
    assert np.array_equal(g, np.arange(0, 33, 8))
    # test split: the CSV rows, unaugmented, in order
    rows = list(csv.DictReader(open(src / "test.csv")))
    tq = _decode(np.load(out / "test" / "all__inputs.npy"), 9)
    assert [SD._to_str(x) for x in tq] == [r["question"] for r in rows]


def test_sudoku_subsample_seeded_and_identical_bytes(tmp_path):
    src = tmp_path / "src"
    SD.generate_sudoku_csv(str(src / "train.csv"), 12, size=4, seed=0)
    SD.generate_sudoku_csv(str(src / "test.csv"), 3, size=4, seed=1)
    outs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 9)):
        SD.main(
            [
                "--source-dir",
                str(src),
                "--output-dir",
                str(tmp_path / name),
                "--size",
                "4",
                "--subsample-size",
                "5",
                "--num-aug",
                "3",
                "--seed",
                str(seed),
                "--no-progress",
            ]
        )
        outs.append(tmp_path / name / "train" / "all__inputs.npy")
    assert filecmp.cmp(outs[0], outs[1], shallow=False)
    assert not filecmp.cmp(outs[0], outs[2], shallow=False)
    assert len(np.load(outs[0])) == 5 * 4


def test_sudoku_csv_errors(tmp_path):
    p = tmp_path / "bad.csv"
    good = SD._to_str(SD.generate_puzzle(np.random.default_rng(0), 9)[1])
    p.write_text("source,question,answer,rating\nx," + "." * 80 + "," + good + ",1\n")
    with pytest.raises(DatasetError, match=r"bad\.csv: line 2: field question: expected 81 characters"):
        SD.read_sudoku_csv(str(p))
    wrong = good[1] + good[0] + good[2:]
    p.write_text("source,question,answer,rating\nx," + "." * 81 + "," + wrong + ",1\n")
    with pytest.raises(DatasetError, match="line 2: field answer: not a valid Sudoku"):
        SD.read_sudoku_csv(str(p))


# ------------------------------------------------------------------------------------------------ maze
def _check_maze_label(q, a):
    """Independent BFS check: the marked cells form a shortest S->G path through open cells."""
    s = tuple(np.argwhere(q == MZ.START)[0])
    g = tuple(np.argwhere(q == MZ.GOAL)[0])
    d = MZ.bfs_distances(q, s)
    path = {tuple(x) for x in np.argwhere(a == MZ.PATH)}
    assert len(path) == d[g] - 1  # as many cells as a shortest path has between S and G
    assert all(q[c] == MZ.OPEN for c in path)
    # walk: from S, each step to an unvisited path neighbour, ending next to G
    cur, seen = s, set()
    for _ in range(len(path)):
        nxt = [
            (cur[0] + dy, cur[1] + dx)
            for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1))
            if (cur[0] + dy, cur[1] + dx) in path - seen
        ]
        assert len(nxt) == 1
        cur = nxt[0]
        seen.add(cur)
    assert abs(cur[0] - g[0]) + abs(cur[1] - g[1]) == 1


def test_generated_mazes_bfs_shortest_and_aug(tmp_path):
    out = tmp_path / "maze"
    s = MZ.main(
        [
            "--generate-train",
            "3",
            "--generate-test",
            "2",
            "--aug",
            "--output-dir",
            str(out),
            "--seed",
            "0",
            "--no-progress",
        ]
    )
    assert s["train_examples"] == 24
    m = load_metadata(str(out / "train"))
    assert (m.kind, m.seq_len, m.vocab_size) == ("maze", 900, 6)
    q = np.load(out / "train" / "all__inputs.npy").astype(np.int64).reshape(-1, 30, 30) - 1
    a = np.load(out / "train" / "all__labels.npy").astype(np.int64).reshape(-1, 30, 30) - 1
    for qi, ai in zip(q, a):
        _check_maze_label(qi, ai)
        assert MZ.shortest_path_cells(qi)[1] == 1  # unique shortest path: the label is unambiguous
    for t in range(8):  # group = the 8 dihedral copies of one maze
        assert np.array_equal(q[t], dihedral_transform(q[0], t))
    assert MZ.bfs_distances(q[0], tuple(np.argwhere(q[0] == MZ.START)[0]))[tuple(np.argwhere(q[0] == MZ.GOAL)[0])] >= 60


def test_maze_csv_roundtrip_and_errors(tmp_path):
    src = tmp_path / "src"
    MZ.generate_maze_csv(str(src / "train.csv"), 2, seed=0)
    MZ.generate_maze_csv(str(src / "test.csv"), 1, seed=1)
    MZ.main(["--source-dir", str(src), "--output-dir", str(tmp_path / "a"), "--no-progress"])
    MZ.main(["--source-dir", str(src), "--output-dir", str(tmp_path / "b"), "--no-progress"])
    assert filecmp.cmp(
        tmp_path / "a" / "train" / "all__labels.npy", tmp_path / "b" / "train" / "all__labels.npy", shallow=False
    )
    rows = list(csv.DictReader(open(src / "test.csv")))
    tl = np.load(tmp_path / "a" / "test" / "all__labels.npy")[0]
    assert "".join(MZ.CHARSET[int(v) - 1] for v in tl) == rows[0]["answer"]
    bad = tmp_path / "bad.csv"
    q = rows[0]["question"]
    bad.write_text(f"source,question,answer,rating\nx,{q.replace('G', ' ')},{rows[0]['answer']},1\n")
    with pytest.raises(DatasetError, match=r"bad\.csv: line 2: field question: needs exactly one 'S' and one 'G'"):
        MZ.read_maze_csv(str(bad))
    bad.write_text(f"source,question,answer,rating\nx,{q[:-1]}x,{rows[0]['answer']},1\n")
    with pytest.raises(DatasetError, match=r"line 2: field question: invalid characters \['x'\]"):
        MZ.read_maze_csv(str(bad))


def test_subsample_is_seeded_ordered_and_rejects_non_positive_sizes(tmp_path):
    q = np.arange(50).reshape(50, 1)
    a1, _ = subsample_pairs(q, q, 10, seed=4)
    a2, _ = subsample_pairs(q, q, 10, seed=4)
    b, _ = subsample_pairs(q, q, 10, seed=5)
    assert np.array_equal(a1, a2) and not np.array_equal(a1, b)
    assert len(a1) == 10 and (np.diff(a1[:, 0]) > 0).all()  # order of the source kept
    assert subsample_pairs(q, q, 80, seed=4)[0] is q
    maze = np.zeros((2, 30, 30), dtype=np.uint8)
    with pytest.raises(DatasetError, match="subsample-size must be > 0"):
        build_maze_dataset(str(tmp_path / "m"), (maze, maze), (maze, maze), subsample_size=0, progress=False)
    assert not (tmp_path / "m").exists()

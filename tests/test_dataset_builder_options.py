"""Options every dataset builder shares (dataset.build_options): progress bars only on a terminal, --max-puzzles
smoke sets, and an ARC challenges / solutions file that names one puzzle id twice is refused."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dataset import build_arc_dataset as ARC
from dataset import build_maze_dataset as MZ
from dataset import build_sudoku_dataset as SD
from dataset import build_synthetic_dataset as SYN
from dataset.arc_sources import load_puzzles
from dataset.build_options import read_json_unique_ids
from dataset.errors import DatasetError
from dataset.metadata import load_metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _puzzle(k: int) -> dict:
    """A tiny valid ARC puzzle (colour k + 1 -> colour k + 2), distinct per k."""
    a, b = k % 8 + 1, k % 8 + 2
    return {
        "train": [
            {"input": [[a, 0], [0, a]], "output": [[b, 0], [0, b]]},
            {"input": [[a, a, 0]], "output": [[b, b, 0]]},
        ],
        "test": [{"input": [[0, a], [a, a]]}],
    }


def _solution(k: int) -> list:
    b = k % 8 + 2
    return [[[0, b], [b, b]]]


def _write_kaggle(d, sizes=(("training", 4), ("evaluation", 3))) -> str:
    """Kaggle-layout files of tiny generated puzzles; names are ``<subset>-<k>`` in file order."""
    os.makedirs(d, exist_ok=True)
    for subset, n in sizes:
        names = [f"{subset[:2]}{k:02d}" for k in range(n)]
        with open(os.path.join(d, f"p_{subset}_challenges.json"), "w") as f:
            json.dump({nm: _puzzle(k + 3 * (subset == "evaluation")) for k, nm in enumerate(names)}, f)
        with open(os.path.join(d, f"p_{subset}_solutions.json"), "w") as f:
            json.dump({nm: _solution(k + 3 * (subset == "evaluation")) for k, nm in enumerate(names)}, f)
    return os.path.join(d, "p")


def _arc_args(prefix, out, *extra):
    return [
        "--input-file-prefix",
        prefix,
        "--output-dir",
        out,
        "--subsets",
        "training",
        "evaluation",
        "--test-set-name",
        "evaluation",
        "--num-aug",
        "2",
        "--num-workers",
        "1",
        "--canvas-size",
        "5",
        *extra,
    ]


def _builder_argv(name: str, tmp_path) -> list:
    out = str(tmp_path / "out")
    if name == "arc":
        return ["dataset.build_arc_dataset", *_arc_args(_write_kaggle(str(tmp_path / "src")), out)]
    if name == "synthetic":
        return [
            "dataset.build_synthetic_dataset",
            "--output-dir",
            str(tmp_path / "raw"),
            "--num-train",
            "3",
            "--num-test",
            "2",
            "--max-grid",
            "4",
            "--canvas-size",
            "6",
            "--num-aug",
            "1",
            "--build-dir",
            out,
        ]
    if name == "sudoku":
        return [
            "dataset.build_sudoku_dataset",
            "--generate-train",
            "3",
            "--generate-test",
            "2",
            "--size",
            "4",
            "--num-aug",
            "1",
            "--output-dir",
            out,
        ]
    return [
        "dataset.build_maze_dataset",
        "--generate-train",
        "2",
        "--generate-test",
        "1",
        "--min-path",
        "10",
        "--output-dir",
        out,
    ]


_MAINS = {"arc": ARC.main, "synthetic": SYN.main, "sudoku": SD.main, "maze": MZ.main}


# ------------------------------------------------------------------------------------------------ progress bars
@pytest.mark.parametrize("name", ["arc", "synthetic", "sudoku", "maze"])
def test_no_progress_bar_frames_when_stderr_is_a_pipe(name, tmp_path):
    """A builder whose stderr is a log file or a pipe writes no tqdm frames (carriage returns), no --no-progress."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", *_builder_argv(name, tmp_path)], cwd=ROOT, env=env, capture_output=True, timeout=300
    )  # bytes: text mode would turn '\r' into '\n'
    assert r.returncode == 0, r.stderr[-3000:]
    assert b"\r" not in r.stderr, r.stderr[-2000:]
    assert b"built" in r.stdout or b"wrote" in r.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("name", ["arc", "synthetic", "sudoku", "maze"])
def test_progress_bar_on_a_terminal_unless_no_progress(name, tmp_path, monkeypatch):
    """On a terminal the bar is still drawn; --no-progress still turns it off."""
    argv = _builder_argv(name, tmp_path)[1:]
    for extra, bar in (([], True), (["--no-progress", "--overwrite"], False)):
        term = _Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        _MAINS[name](argv + extra)
        monkeypatch.undo()
        assert ("\r" in term.getvalue()) == bar, (extra, term.getvalue()[-500:])


# ------------------------------------------------------------------------------------------------ --max-puzzles
def test_arc_max_puzzles_keeps_the_first_n_of_each_subset(tmp_path):
    prefix = _write_kaggle(str(tmp_path / "src"))
    full, smoke = str(tmp_path / "full"), str(tmp_path / "smoke")
    ARC.main(_arc_args(prefix, full, "--no-progress"))
    s = ARC.main(_arc_args(prefix, smoke, "--no-progress", "--max-puzzles", "2"))
    assert s["puzzles"] == 4 and s["test_puzzles"] > 0
    idmap = json.load(open(os.path.join(smoke, "identifiers_map.json")))
    assert idmap["names"] == ["tr00", "tr01", "ev00", "ev01"]
    assert sorted(json.load(open(os.path.join(smoke, "test_puzzles.json")))) == ["ev00", "ev01"]
    # the same puzzles and augmented copies as in the full build (a subset of it, not another draw)
    full_ids, smoke_ids = (json.load(open(os.path.join(d, "identifiers.json"))) for d in (full, smoke))
    assert set(smoke_ids) <= set(full_ids) and len(smoke_ids) < len(full_ids)
    assert load_metadata(os.path.join(smoke, "train")).total_groups == 4  # 2 training + 2 evaluation (trm mode)
    assert load_puzzles(["training"], None, prefix, max_puzzles=10)[-1].name == "tr03"  # N > size: all


@pytest.mark.parametrize("name", ["arc", "synthetic", "sudoku", "maze"])
@pytest.mark.parametrize("bad", ["0", "-3"])
def test_max_puzzles_below_one_is_one_error_line_exit_2(name, bad, tmp_path, capsys):
    argv = _builder_argv(name, tmp_path)[1:] + ["--no-progress", "--max-puzzles", bad]
    with pytest.raises(SystemExit) as e:
        _MAINS[name](argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "--max-puzzles must be an integer >= 1" in lines[0] and bad in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_sudoku_max_puzzles_takes_the_first_rows_of_each_csv(tmp_path):
    src = tmp_path / "src"
    SD.generate_sudoku_csv(str(src / "train.csv"), 5, size=4, seed=0)
    SD.generate_sudoku_csv(str(src / "test.csv"), 4, size=4, seed=1)
    s = SD.main(
        [
            "--source-dir",
            str(src),
            "--output-dir",
            str(tmp_path / "a"),
            "--size",
            "4",
            "--max-puzzles",
            "2",
            "--no-progress",
        ]
    )
    assert (s["train_puzzles"], s["test_examples"]) == (2, 2)
    q, a = SD.read_sudoku_csv(str(src / "test.csv"), 4)
    built = np.load(tmp_path / "a" / "test" / "all__labels.npy")
    assert np.array_equal(built, (a[:2].reshape(2, -1) + 1).astype(np.uint8))  # the first two rows, in order
    q2, _ = SD.read_sudoku_csv(str(src / "train.csv"), 4, max_puzzles=3)
    assert np.array_equal(q2, SD.read_sudoku_csv(str(src / "train.csv"), 4)[0][:3])
    g = SD.main(
        [
            "--generate-train",
            "6",
            "--generate-test",
            "5",
            "--size",
            "4",
            "--output-dir",
            str(tmp_path / "g"),
            "--max-puzzles",
            "3",
            "--no-progress",
        ]
    )
    assert (g["train_puzzles"], g["test_examples"]) == (3, 3)


def test_maze_max_puzzles_takes_the_first_rows_of_each_csv(tmp_path):
    src = tmp_path / "src"
    MZ.generate_maze_csv(str(src / "train.csv"), 3, seed=0, min_path=10)
    MZ.generate_maze_csv(str(src / "test.csv"), 2, seed=1, min_path=10)
    s = MZ.main(["--source-dir", str(src), "--output-dir", str(tmp_path / "a"), "--max-puzzles", "1", "--no-progress"])
    assert (s["train_mazes"], s["test_examples"]) == (1, 1)
    q, a = MZ.read_maze_csv(str(src / "train.csv"))
    assert np.array_equal(np.load(tmp_path / "a" / "train" / "all__inputs.npy")[0], (q[0].reshape(-1) + 1))
    g = MZ.main(
        [
            "--generate-train",
            "3",
            "--generate-test",
            "3",
            "--min-path",
            "10",
            "--output-dir",
            str(tmp_path / "g"),
            "--max-puzzles",
            "2",
            "--no-progress",
        ]
    )
    assert (g["train_mazes"], g["test_examples"]) == (2, 2)


def test_synthetic_max_puzzles_caps_each_subset(tmp_path, capsys):
    paths = SYN.main(
        [
            "--output-dir",
            str(tmp_path / "raw"),
            "--num-train",
            "6",
            "--num-test",
            "4",
            "--max-grid",
            "4",
            "--canvas-size",
            "6",
            "--num-aug",
            "1",
            "--max-puzzles",
            "2",
            "--no-progress",
            "--build-dir",
            str(tmp_path / "b"),
        ]
    )
    assert len(json.load(open(paths["training_challenges"]))) == 2
    assert len(json.load(open(paths["evaluation_challenges"]))) == 2
    assert "wrote 2 training + 2 evaluation puzzles" in capsys.readouterr().out
    assert load_metadata(os.path.join(tmp_path / "b", "test")).total_groups == 2
    with pytest.raises(DatasetError, match="--max-puzzles must be an integer >= 1"):
        SYN.generate_synthetic_arc(
            str(tmp_path / "x"), num_train=2, num_test=2, max_grid=4, progress=False, max_puzzles=0
        )


# ------------------------------------------------------------------------------------------------ duplicate ids
def _dup_text(names_and_k: list) -> str:
    return "{" + ", ".join(f"{json.dumps(nm)}: {json.dumps(obj)}" for nm, obj in names_and_k) + "}"


@pytest.mark.parametrize("kind", ["challenges", "solutions"])
def test_a_puzzle_id_given_twice_is_refused_naming_file_and_id(kind, tmp_path, capsys):
    prefix = _write_kaggle(str(tmp_path / "src"))
    path = f"{prefix}_training_{kind}.json"
    make = _puzzle if kind == "challenges" else _solution
    # 6 entries, 5 distinct ids: json.load would keep the last 'tr01' and build "5 puzzles" without a word
    entries = [(f"tr{k:02d}", make(k)) for k in range(5)]
    entries.insert(3, ("tr01", make(7)))
    with open(path, "w") as f:
        f.write(_dup_text(entries))
    with pytest.raises(SystemExit) as e:
        ARC.main(_arc_args(prefix, str(tmp_path / "out"), "--no-progress"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert path in lines[0] and "'tr01'" in lines[0] and "appears 2 times" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    with pytest.raises(DatasetError, match="puzzle id 'tr01' appears 2 times"):
        load_puzzles(["training"], None, prefix)


def test_unique_reader_names_every_duplicate_and_ignores_nested_objects(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"a": 1, "b": 2, "a": 3, "b": 4, "c": {"k": 1}}')
    with pytest.raises(DatasetError, match=r"puzzle id 'a' appears 2 times \(and 1 more duplicated id\)"):
        read_json_unique_ids(str(p))
    p.write_text('{"a": {"train": 1, "train": 2}, "b": [{"x": 1, "x": 2}]}')  # nested: not puzzle ids
    assert read_json_unique_ids(str(p)) == {"a": {"train": 2}, "b": [{"x": 2}]}
    p.write_text('[{"a": 1, "a": 2}]')  # top level is not an object: nothing to refuse here
    assert read_json_unique_ids(str(p)) == [{"a": 2}]
    with pytest.raises(DatasetError, match="malformed JSON"):
        p.write_text("{")
        read_json_unique_ids(str(p))

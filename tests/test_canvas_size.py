"""--canvas-size: builders (ARC, synthetic), loader translation, ARC evaluator inverse path, and the user-facing
build -> pretrain_encoder.py -> evaluate.py path on a canvas smaller than ARC's 30x30."""

import filecmp
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from dataset.arc_sources import load_puzzles
from dataset.augment import Augmentation
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_arc_dataset import main as arc_main
from dataset.build_synthetic_dataset import default_max_grid, generate_synthetic_arc
from dataset.build_synthetic_dataset import main as synth_main
from dataset.canvas import translate_canvas
from dataset.errors import DatasetError
from dataset.loader import PuzzleDataset, PuzzleDatasetConfig
from dataset.tokens import COLOR_OFFSET, IGNORE_LABEL_ID, PAD_ID
from evaluators import ARCEvaluator
from tests.doubles import oracle_tokens, wrong_tokens
from tests.toy_data import TINY_PRETRAIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARRAYS = ("inputs", "labels", "demo_inputs", "demo_labels")
INDEX = ("puzzle_identifiers", "puzzle_indices", "group_indices", "demo_indices", "example_demo_slot")


@pytest.fixture(scope="module")
def raw10(tmp_path_factory):
    """Synthetic kaggle-layout puzzles with every grid side <= 10 (and some exactly 10)."""
    d = tmp_path_factory.mktemp("raw10")
    paths = generate_synthetic_arc(
        str(d), "s", num_train=24, num_test=8, min_grid=3, max_grid=10, seed=4, progress=False, canvas_size=10
    )
    return paths["prefix"]


def _grids(prefix):
    out = []
    for s in ("training", "evaluation"):
        chal = json.load(open(f"{prefix}_{s}_challenges.json"))
        sol = json.load(open(f"{prefix}_{s}_solutions.json"))
        for name, p in chal.items():
            out += [np.array(x["input"]) for x in p["train"] + p["test"]]
            out += [np.array(x["output"]) for x in p["train"]] + [np.array(g) for g in sol[name]]
    return out


def test_small_canvas_build_is_the_30_build_cropped(raw10, tmp_path):
    """Same puzzles at canvas 30 and 10: identical indices, identifiers and augmentations; every canvas of the
    10-build is the top-left 10x10 of the 30-build's, which holds nothing else but the EOS frame."""
    assert max(max(g.shape) for g in _grids(raw10)) == 10  # a full-width grid: no EOS column at canvas 10
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", raw10)
    for n in (30, 10):
        build_arc_dataset(
            str(tmp_path / f"c{n}"),
            puzzles,
            test_set_name="evaluation",
            num_aug=3,
            seed=1,
            mode="etrm",
            progress=False,
            canvas_size=n,
        )
    for split in ("train", "test"):
        m30 = json.load(open(tmp_path / "c30" / split / "dataset.json"))
        m10 = json.load(open(tmp_path / "c10" / split / "dataset.json"))
        assert (m30["seq_len"], m30["grid_size"], m10["seq_len"], m10["grid_size"]) == (900, 30, 100, 10)
        assert {k: v for k, v in m30.items() if k not in ("seq_len", "grid_size")} == {
            k: v for k, v in m10.items() if k not in ("seq_len", "grid_size")
        }
        for k in INDEX:
            a, b = (np.load(tmp_path / f"c{n}" / split / f"all__{k}.npy") for n in (30, 10))
            assert np.array_equal(a, b), (split, k)
        for k in ARRAYS:
            a = np.load(tmp_path / "c30" / split / f"all__{k}.npy")
            b = np.load(tmp_path / "c10" / split / f"all__{k}.npy")
            assert b.shape == (len(a), 100) and b.dtype == np.uint8
            a = a.reshape(-1, 30, 30)
            assert np.array_equal(a[:, :10, :10], b.reshape(-1, 10, 10)), (split, k)
            assert not a[:, 11:].any() and not a[:, :, 11:].any()
    for f in ("identifiers.json", "identifiers_map.json", "test_puzzles.json", "build_summary.json"):
        assert filecmp.cmp(tmp_path / "c30" / f, tmp_path / "c10" / f, shallow=False), f


def test_default_canvas_is_30_byte_identical(raw10, tmp_path):
    base = ["--input-file-prefix", raw10, "--output-dir"]
    opts = ["--num-aug", "2", "--mode", "etrm", "--no-progress", "--num-workers", "1"]
    arc_main(base + [str(tmp_path / "default")] + opts)
    arc_main(base + [str(tmp_path / "explicit")] + opts + ["--canvas-size", "30"])
    cmp = filecmp.dircmp(tmp_path / "default", tmp_path / "explicit")
    for sub in [cmp] + list(cmp.subdirs.values()):
        assert not sub.left_only and not sub.right_only and not sub.funny_files
        _, mismatch, errors = filecmp.cmpfiles(sub.left, sub.right, sub.common_files, shallow=False)
        assert not mismatch and not errors, mismatch
    assert json.load(open(tmp_path / "default" / "train" / "dataset.json"))["seq_len"] == 900


def test_grid_larger_than_canvas_is_a_clear_error(raw10, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        arc_main(
            [
                "--input-file-prefix",
                raw10,
                "--output-dir",
                str(tmp_path / "out"),
                "--num-aug",
                "1",
                "--canvas-size",
                "9",
                "--no-progress",
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--canvas-size 9" in err and "puzzle s-" in err
    assert ("x10 " in err) or ("10x" in err)  # names the offending shape
    assert not os.path.exists(tmp_path / "out") and not [f for f in os.listdir(tmp_path) if f.startswith(".out")]
    with pytest.raises(DatasetError, match="canvas-size must be in 1..30"):
        build_arc_dataset(
            str(tmp_path / "x"),
            load_puzzles(["training"], None, raw10),
            test_set_name=None,
            canvas_size=31,
            progress=False,
        )


def test_synthetic_grids_fit_the_canvas_and_max_grid_is_capped(tmp_path, capsys):
    p = generate_synthetic_arc(
        str(tmp_path / "a"), "s", num_train=40, num_test=16, seed=2, progress=False, canvas_size=6, max_grid=6
    )
    sizes = [max(g.shape) for g in _grids(p["prefix"])]
    assert max(sizes) == 6  # outputs of scale_up / copy_pattern included: every grid fits the canvas
    # the default largest input side leaves room for the loader's translations: canvas - 2 (at most 10)
    assert [default_max_grid(n) for n in (3, 6, 8, 12, 30)] == [1, 4, 6, 10, 10]
    p = generate_synthetic_arc(
        str(tmp_path / "c"), "s", num_train=40, num_test=16, seed=2, progress=False, canvas_size=6
    )
    with open(p["training_challenges"]) as f:
        inputs = [np.asarray(ex["input"]) for puz in json.load(f).values() for ex in puz["train"] + puz["test"]]
    assert max(max(g.shape) for g in inputs) == 4
    with pytest.raises(SystemExit) as e:
        synth_main(["--output-dir", str(tmp_path / "b"), "--canvas-size", "8", "--max-grid", "9", "--no-progress"])
    assert e.value.code == 2
    assert "max-grid (9) <= --canvas-size (8)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def built8(tmp_path_factory):
    d = tmp_path_factory.mktemp("b8")
    synth_main(
        [
            "--output-dir",
            str(d / "raw"),
            "--num-train",
            "24",
            "--num-test",
            "8",
            "--seed",
            "7",
            "--canvas-size",
            "8",
            "--build-dir",
            str(d / "data"),
            "--num-aug",
            "3",
            "--no-progress",
        ]
    )
    return str(d / "data")


def test_loader_translates_inside_the_small_canvas(built8):
    cfg = dict(data_paths=[built8], global_batch_size=16, seed=3)
    ds = PuzzleDataset(PuzzleDatasetConfig(**cfg), "train")
    plain = PuzzleDataset(PuzzleDatasetConfig(**cfg, translate_augment=False), "train")
    assert ds.translate and not plain.translate and ds.canvas_size == 8 and ds.metadata.seq_len == 64
    shifted, n = 0, 0
    for (_, batch, _), (_, ref, _) in zip(ds, plain):
        lab = lambda t: np.where(t["labels"].numpy() == IGNORE_LABEL_ID, PAD_ID, t["labels"].numpy())  # noqa: E731
        for x, y, x0, y0 in zip(batch["inputs"].numpy(), lab(batch), ref["inputs"].numpy(), lab(ref)):
            if not (x0 != PAD_ID).any():
                continue  # padding row
            # the same example, shifted by one legal offset (the colour block stays whole inside the 8x8 canvas)
            r0, c0 = [int(np.nonzero((x.reshape(8, 8) >= COLOR_OFFSET).any(axis=a))[0].min()) for a in (1, 0)]
            assert np.array_equal(x, translate_canvas(x0, r0, c0, size=8))
            assert np.array_equal(y, translate_canvas(y0, r0, c0, size=8))  # label: the same offset
            assert (x >= COLOR_OFFSET).sum() == (x0 >= COLOR_OFFSET).sum()
            assert (y >= COLOR_OFFSET).sum() == (y0 >= COLOR_OFFSET).sum()
            shifted += (r0, c0) != (0, 0)
            n += 1
        if n >= 150:
            break
    assert n >= 150 and shifted > n // 4


def _copies(data_dir) -> dict:
    """Puzzle name -> how many copies of it (itself included) the build holds."""
    ids = json.load(open(os.path.join(data_dir, "identifiers.json")))
    return Counter(Augmentation.parse_name(i)[0] for i in ids if i != "<blank>")


def _feed_split(ev, data_dir, token_fn, batch_size=7):
    """Every example of the test split once, labels as the model's prediction after ``token_fn``."""
    t = lambda k: np.load(os.path.join(data_dir, "test", f"all__{k}.npy"))  # noqa: E731
    inputs, labels, pidx, pids = t("inputs"), t("labels").astype(np.int64), t("puzzle_indices"), t("puzzle_identifiers")
    labels[labels == PAD_ID] = IGNORE_LABEL_ID
    ex_puz = np.searchsorted(pidx, np.arange(len(inputs)), side="right") - 1
    ev.begin_eval()
    for s in range(0, len(inputs), batch_size):
        r = np.arange(s, min(s + batch_size, len(inputs)))
        lab = torch.from_numpy(labels[r])
        ev.update(
            {
                "inputs": torch.from_numpy(inputs[r].astype(np.int32)),
                "labels": lab,
                "puzzle_identifiers": torch.from_numpy(pids[ex_puz[r]].astype(np.int32)),
                "example_index": torch.from_numpy(r.astype(np.int64)),
            },
            {"preds": token_fn(lab), "q_halt_logits": torch.zeros(len(r))},
        )
    return ev.result(None)


def test_true_labels_through_the_inverse_path_score_one_at_canvas_8(built8):
    ev = ARCEvaluator(built8, None, None, num_pictures=0)
    assert ev.grid_size == 8
    m = _feed_split(ev, built8, oracle_tokens)
    assert m["ARC/pass@1"] == 1.0 and m["ARC/num_puzzles"] == 8 and m["ARC/malformed_frac"] == 0.0
    truth = json.load(open(os.path.join(built8, "test_puzzles.json")))
    copies = _copies(built8)
    assert max(copies.values()) == 4 and min(copies.values()) >= 1  # v3: only copies that are held-out instances
    for name, per_input in ev.last_ranked.items():
        for i, ranked in enumerate(per_input):  # every augmented copy votes for the one true grid
            assert len(ranked) == 1 and ranked[0].votes == copies[name]
            assert ranked[0].grid_list() == truth[name]["test"][i]["output"]
    assert _feed_split(ARCEvaluator(built8, None, None, num_pictures=0), built8, wrong_tokens)["ARC/pass@2"] == 0.0


def test_pretrain_encoder_and_evaluate_on_a_canvas_8_build(built8, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    ck = tmp_path / "ck"
    p = subprocess.run(
        [
            sys.executable,
            "pretrain_encoder.py",
            f"data_paths=[{built8}]",
            f"checkpoint_path={ck}",
            f"hydra.run.dir={tmp_path / 'h1'}",
            "max_steps=2",
            *TINY_PRETRAIN,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    state = torch.load(next(ck.glob("step_*.pt")), map_location="cpu", weights_only=False)
    assert (state["metadata"]["seq_len"], state["metadata"]["grid_size"]) == (64, 8)
    assert state["model"]["encoder.trunk.pos"].shape[0] == 64  # the encoder's canvas positions follow the data
    out = tmp_path / "ev"
    p = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            f"checkpoint={ck}",
            f"data_path={built8}",
            f"output_dir={out}",
            f"hydra.run.dir={tmp_path / 'h2'}",
            "progress=false",
            "num_pictures=0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.load(open(out / "metrics.json"))["metrics"]
    truth = json.load(open(os.path.join(built8, "test_puzzles.json")))
    assert m["ARC/num_puzzles"] == len(truth) == 8
    assert m["ARC/num_test_inputs"] == sum(len(t["test"]) for t in truth.values())
    pred = json.load(open(out / "predictions.json"))
    assert sorted(pred) == sorted(truth)
    copies = _copies(built8)
    for name, rows in pred.items():
        assert len(rows) == len(truth[name]["test"])
        for row in rows:
            assert row["num_votes"] == copies[name]  # every augmented copy of every test input voted once
            for c in row["candidates"]:
                assert c["grid"] is None or max(len(c["grid"]), len(c["grid"][0])) <= 8

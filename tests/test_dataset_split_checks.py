"""dataset.json that disagrees with its .npy arrays is refused when the data is loaded (dataset.split_checks), with
one line naming the file, the field and both values; a training run on such data ends with one ``error:`` line
and leaves no summary.json saying "running"; a run whose first batch fails records status "failed"."""

import json
import os
import shutil

import numpy as np
import pytest

from dataset.errors import DatasetError
from dataset.loader import PuzzleDataset, PuzzleDatasetConfig
from tests.test_user_errors import TINY_TRM, _hydra_cli, _one_error_line
from tests.toy_data import toy_train_config


@pytest.fixture()
def toy_copy(toy, tmp_path):
    """A private copy of the module's toy dataset (seq_len 8) that a test may break."""
    d = str(tmp_path / "toy")
    shutil.copytree(toy, d)
    return d


def _set_meta(data_dir: str, split: str, **fields) -> str:
    path = os.path.join(data_dir, split, "dataset.json")
    meta = json.load(open(path))
    meta.update(fields)
    json.dump(meta, open(path, "w"))
    return path


def _load(data_dir: str, split: str = "train", **kw) -> PuzzleDataset:
    return PuzzleDataset(PuzzleDatasetConfig(data_paths=[data_dir], global_batch_size=4, **kw), split)


def test_seq_len_disagreeing_with_the_arrays_names_file_field_and_both_values(toy_copy):
    meta_path = _set_meta(toy_copy, "train", seq_len=9)
    with pytest.raises(DatasetError) as e:
        _load(toy_copy)
    assert str(e.value) == f"{meta_path}: seq_len 9 but all__inputs.npy has rows of 8"
    _load(toy_copy, "test")  # the other split is fine


def test_token_arrays_must_be_2d_integer_and_demo_rows_match(toy_copy, tmp_path):
    split = os.path.join(toy_copy, "train")
    labels = np.load(os.path.join(split, "all__labels.npy"))
    np.save(os.path.join(split, "all__labels.npy"), labels.reshape(-1))
    with pytest.raises(
        DatasetError,
        match=r"all__labels\.npy: expected a 2-D token array \[examples, seq_len\], "
        rf"got shape \({labels.size},\)",
    ):
        _load(toy_copy)
    np.save(os.path.join(split, "all__labels.npy"), labels.astype(np.float32))
    with pytest.raises(DatasetError, match=r"all__labels\.npy: dtype float32 is not an integer token type"):
        _load(toy_copy)
    np.save(os.path.join(split, "all__labels.npy"), labels)
    # demo store (encoder mode) with rows of another width than seq_len
    n = len(labels)
    for k, v in {
        "demo_inputs": labels[:, :6],
        "demo_labels": labels[:, :6],
        "demo_indices": np.load(os.path.join(split, "all__puzzle_indices.npy")),
        "example_demo_slot": np.zeros(n, np.int32),
    }.items():
        np.save(os.path.join(split, f"all__{k}.npy"), v)
    _set_meta(toy_copy, "train", has_demos=True, max_demos=4)
    _load(toy_copy)  # without encoder mode the demo store is not read
    with pytest.raises(DatasetError, match=r"train/dataset\.json: seq_len 8 but all__demo_inputs\.npy has rows of 6"):
        _load(toy_copy, encoder_mode=True)


def test_pretrain_on_mismatched_data_is_one_error_line_and_no_running_summary(toy_copy, tmp_path, monkeypatch, capsys):
    import pretrain

    for split in ("train", "test"):
        _set_meta(toy_copy, split, seq_len=9)
    ck = tmp_path / "ck"
    err = _hydra_cli(
        monkeypatch,
        capsys,
        pretrain.main,
        ["pretrain.py", *TINY_TRM, f"data_paths=[{toy_copy}]", f"checkpoint_path={ck}"],
        tmp_path,
    )
    _one_error_line(err, os.path.join(toy_copy, "train", "dataset.json"), "seq_len 9", "rows of 8")
    summary = ck / "summary.json"
    assert not summary.exists() or json.load(open(summary))["status"] == "failed"


def test_a_first_batch_failure_marks_the_summary_failed(toy, tmp_path, monkeypatch):
    """summary.json is written ("running") before the first batch is fetched: an error there must not leave it
    "running" (the queue's gates would wait on a dead run)."""
    from training.loop import train

    def broken(self):
        raise DatasetError("bad row 3 of all__inputs.npy")
        yield  # unreachable: a generator, like the real __iter__

    monkeypatch.setattr(PuzzleDataset, "__iter__", broken)
    ck = tmp_path / "ck"
    with pytest.raises(DatasetError, match="bad row 3"):
        train(toy_train_config(toy, str(ck), max_steps=2, epochs=1, global_batch_size=8))
    s = json.load(open(ck / "summary.json"))
    assert s["status"] == "failed" and s["stop_reason"] == "error" and s["exit_status"] == 1
    assert "bad row 3" in s["message"]


def test_a_consistent_toy_dataset_still_loads(toy):
    ds = _load(toy)
    assert ds.metadata.seq_len == 8 and ds.sets[0].inputs.seq_len == 8

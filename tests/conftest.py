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


def _find_shared_arc() -> str | None:
    for cand in (os.environ.get("TRM_SHARED_ARC"), os.path.join(ROOT, "..", "shared", "data", "arc")):
        if cand and os.path.isfile(os.path.join(cand, "arc-agi_training_challenges.json")):
            return os.path.abspath(cand)
    return None


@pytest.fixture(scope="session")
def shared_arc_dir() -> str:
    """Directory with the kaggle-layout ARC files (../shared/data/arc)."""
    d = _find_shared_arc()
    if d is None:
        pytest.fail("../shared/data/arc not found; set TRM_SHARED_ARC to a directory with arc-agi_*_challenges.json")
    return d


@pytest.fixture(autouse=True)
def _torch_threads():
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
    yield

"""Test-split loader for evaluation, with an optional cap on augmented copies per original puzzle.

``num_augmentations=N`` keeps the first N augmented puzzles of every group (the builder writes the
identity copy first), so a quick evaluation uses fewer copies without rebuilding the dataset. It maps to the
loader's ``max_puzzles_per_group``; every kept example is visited exactly once, sharded by rank.
"""

from __future__ import annotations

from typing import Optional

from torch.utils.data import DataLoader

from dataset.loader import PuzzleDataset, PuzzleDatasetConfig


def build_eval_loader(
    data_path: str,
    global_batch_size: int,
    *,
    num_augmentations: Optional[int] = None,
    rank: int = 0,
    world_size: int = 1,
    max_groups: Optional[int] = None,
    encoder_mode: bool = False,
    max_demos: Optional[int] = None,
    num_workers: int = 0,
    split: str = "test",
    seed: int = 0,
    whole_groups: bool = False,
):
    """-> (DataLoader yielding ``(set_name, batch, effective_batch)``, split metadata).

    ``seed`` only decides the seeded ``max_groups`` choice; pass the training run's seed to evaluate the same
    groups as its ``max_eval_groups`` eval hook. ``whole_groups``: every copy of one original puzzle in one local
    batch (the loader's ``whole_groups``), for per-puzzle work on a batch."""
    if num_augmentations is not None and num_augmentations < 1:
        raise ValueError(f"num_augmentations must be >= 1 or None, got {num_augmentations}")
    cfg = PuzzleDatasetConfig(
        data_paths=[data_path],
        global_batch_size=global_batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        test_mode=True,
        max_groups=max_groups,
        encoder_mode=encoder_mode,
        max_demos=max_demos,
        num_workers=num_workers,
        max_puzzles_per_group=num_augmentations,
        whole_groups=whole_groups,
    )
    ds = PuzzleDataset(cfg, split)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    return loader, ds.metadata

"""Test-split loader for evaluation, with an optional cap on augmented copies per original puzzle.

``num_augmentations=N`` keeps the first N augmented puzzles of every group (the builder writes the
identity copy first), so a quick evaluation uses fewer copies without rebuilding the dataset.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from torch.utils.data import DataLoader

from dataset.loader import PuzzleDataset, PuzzleDatasetConfig


class AugmentationSubsetDataset(PuzzleDataset):
    """:class:`dataset.loader.PuzzleDataset` in test mode restricted to the first ``num_augmentations``
    puzzles of each group. Every kept example is visited exactly once, sharded by rank."""

    def __init__(self, config: PuzzleDatasetConfig, split: str = "test", num_augmentations: Optional[int] = None):
        if not config.test_mode:
            raise ValueError("AugmentationSubsetDataset needs test_mode=True")
        if num_augmentations is not None and num_augmentations < 1:
            raise ValueError(f"num_augmentations must be >= 1 or None, got {num_augmentations}")
        self.num_augmentations = num_augmentations
        super().__init__(config, split)

    def _test_plan(self, set_idx: int) -> np.ndarray:  # overrides the loader's full-split plan
        if self.num_augmentations is None:
            return super()._test_plan(set_idx)
        if self._test_plans is None:
            plans = []
            gbs = self.config.global_batch_size
            for k, s in enumerate(self.sets):
                ex = []
                for g in self.active_groups[k]:
                    p0 = int(s.group_indices[g])
                    p1 = min(int(s.group_indices[g + 1]), p0 + self.num_augmentations)
                    ex.append(np.arange(int(s.puzzle_indices[p0]), int(s.puzzle_indices[p1])))
                ex = np.concatenate(ex) if ex else np.zeros(0, np.int64)
                n_batches = -(-len(ex) // gbs)
                padded = np.full(n_batches * gbs, -1, dtype=np.int64)
                padded[: len(ex)] = ex
                plans.append(padded.reshape(n_batches, gbs))
            self._test_plans = plans
        return self._test_plans[set_idx]


def build_eval_loader(data_path: str, global_batch_size: int, *, num_augmentations: Optional[int] = None,
                      rank: int = 0, world_size: int = 1, max_groups: Optional[int] = None,
                      encoder_mode: bool = False, max_demos: Optional[int] = None, num_workers: int = 0,
                      split: str = "test"):
    """-> (DataLoader yielding ``(set_name, batch, effective_batch)``, split metadata)."""
    cfg = PuzzleDatasetConfig(data_paths=[data_path], global_batch_size=global_batch_size, rank=rank,
                              world_size=world_size, test_mode=True, max_groups=max_groups,
                              encoder_mode=encoder_mode, max_demos=max_demos, num_workers=num_workers)
    ds = AugmentationSubsetDataset(cfg, split, num_augmentations)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    return loader, ds.metadata

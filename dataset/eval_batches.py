"""The test-mode batch plan of :class:`dataset.loader.PuzzleDataset`: every example of the chosen groups once, in
order, as rows of global batches (-1 = a padding row)."""

from __future__ import annotations

import numpy as np


def eval_batches(per_group: list[np.ndarray], gbs: int, world_size: int, whole_groups: bool) -> np.ndarray:
    """[n_batches, gbs] example rows from each group's examples (``per_group``, in order), -1 padding.

    Dense (``whole_groups=False``): the examples back to back, the last global batch padded. ``whole_groups``: no
    group's examples straddle two local batches (rank r's slice ``[r * local, (r + 1) * local)`` of a global
    batch) unless the group alone is larger than one: a group that does not fit in the room left starts the next
    local batch (the rest padded), a larger one fills whole local batches and its remainder starts the next."""
    if not whole_groups:
        ex = np.concatenate(per_group) if per_group else np.zeros(0, np.int64)
        padded = np.full(-(-len(ex) // gbs) * gbs, -1, dtype=np.int64)
        padded[: len(ex)] = ex
        return padded.reshape(-1, gbs)
    local = gbs // world_size
    slots: list[np.ndarray] = []  # local batches, each padded to ``local``
    cur: list[np.ndarray] = []

    def flush() -> None:
        if cur:
            row = np.full(local, -1, dtype=np.int64)
            filled = np.concatenate(cur)
            row[: len(filled)] = filled
            slots.append(row)
            cur.clear()

    room = local
    for ex in per_group:
        if len(ex) > room:
            flush()
            room = local
        while len(ex) > local:
            cur.append(ex[:local])
            flush()
            ex = ex[local:]
        if len(ex):
            cur.append(ex)
            room -= len(ex)
    flush()
    slots += [np.full(local, -1, dtype=np.int64)] * (-len(slots) % world_size)  # whole global batches
    return np.stack(slots).reshape(-1, gbs) if slots else np.zeros((0, gbs), dtype=np.int64)

"""The dihedral group D4 on grids, in the numbering of the published TRM code (so identifier strings agree):
0 identity, 1/2/3 rotations by 90/180/270 degrees, 4 left-right flip, 5 up-down flip, 6 transpose,
7 anti-diagonal reflection. Besides the maps themselves: each one's inverse, the composition table and the
matrix each map applies to a displacement (row, column), which is how a rule's parameters change under an
augmentation (:mod:`dataset.rule_identity`).
"""

from __future__ import annotations

import numpy as np


def dihedral_transform(arr: np.ndarray, tid: int) -> np.ndarray:
    """Apply dihedral transform ``tid`` (0..7) to the last two axes of ``arr``."""
    if tid == 0:
        out = arr
    elif tid == 1:
        out = np.rot90(arr, k=1, axes=(-2, -1))
    elif tid == 2:
        out = np.rot90(arr, k=2, axes=(-2, -1))
    elif tid == 3:
        out = np.rot90(arr, k=3, axes=(-2, -1))
    elif tid == 4:
        out = np.flip(arr, axis=-1)  # horizontal flip (left-right)
    elif tid == 5:
        out = np.flip(arr, axis=-2)  # vertical flip (up-down)
    elif tid == 6:
        out = np.swapaxes(arr, -1, -2)  # transpose (main diagonal)
    elif tid == 7:
        out = np.flip(np.rot90(arr, k=1, axes=(-2, -1)), axis=-1)  # anti-diagonal reflection
    else:
        raise ValueError(f"dihedral transform id must be in 0..7, got {tid}")
    return np.ascontiguousarray(out)


# Inverse element of each transform: rotations by 90/270 invert each other, reflections are involutions.
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def inverse_dihedral_transform(arr: np.ndarray, tid: int) -> np.ndarray:
    return dihedral_transform(arr, DIHEDRAL_INVERSE[tid])


def _dihedral_tables() -> tuple[list[list[int]], list[np.ndarray]]:
    """Composition table of D4 in :func:`dihedral_transform`'s numbering (``comp[a][b]`` = a after b) and, per
    transform, the 2x2 integer matrix it applies to a displacement (row, column) on the grid."""
    probe = np.arange(9).reshape(3, 3)
    images = [dihedral_transform(probe, t) for t in range(8)]
    comp = [
        [
            next(c for c in range(8) if np.array_equal(dihedral_transform(dihedral_transform(probe, b), a), images[c]))
            for b in range(8)
        ]
        for a in range(8)
    ]
    mats = []
    for t in range(8):
        cols = []
        for unit in ((1, 0), (0, 1)):
            g = np.zeros((5, 5), np.uint8)
            g[2 + unit[0], 2 + unit[1]] = 1
            r, c = np.argwhere(dihedral_transform(g, t))[0]
            cols.append((int(r) - 2, int(c) - 2))
        mats.append(np.array(cols).T)
    return comp, mats


# D4_COMPOSE[a][b]: the transform "b, then a"; D4_MATRIX[t] @ (dr, dc): where transform t moves a displacement
D4_COMPOSE, D4_MATRIX = _dihedral_tables()

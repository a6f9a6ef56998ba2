"""Grid <-> canvas: a colour grid written into the top-left of an N x N token canvas (:mod:`dataset.tokens`; N = 30
for ARC), decoded back from a (predicted) canvas, and shifted inside the canvas (the loader's translation
augmentation, drawn at load time); plus the shape-aware grid hash used for deduplication and voting.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from dataset.tokens import ARC_MAX_GRID, COLOR_OFFSET, EOS_ID, NUM_COLORS, PAD_ID


def grid_to_canvas(grid: np.ndarray, offset: tuple[int, int] = (0, 0), size: int = ARC_MAX_GRID) -> np.ndarray:
    """Encode a colour grid into a flattened ``size*size`` token canvas (uint8)."""
    grid = np.asarray(grid)
    h, w = grid.shape
    r0, c0 = offset
    if r0 < 0 or c0 < 0 or r0 + h > size or c0 + w > size:
        raise ValueError(f"grid {h}x{w} at offset {offset} does not fit a {size}x{size} canvas")
    canvas = np.full((size, size), PAD_ID, dtype=np.uint8)
    canvas[r0 : r0 + h, c0 : c0 + w] = grid.astype(np.uint8) + COLOR_OFFSET
    if r0 + h < size:
        canvas[r0 + h, c0 : c0 + w] = EOS_ID
    if c0 + w < size:
        canvas[r0 : r0 + h, c0 + w] = EOS_ID
    return canvas.reshape(-1)


def canvas_to_grid(tokens: np.ndarray, size: int = ARC_MAX_GRID, strict: bool = True) -> Optional[np.ndarray]:
    """Decode a (predicted) top-left-anchored canvas to a colour grid; ``None`` when malformed.

    strict=True (default): the EOS frame defines the extent. Width w = number of leading colour tokens in
    row 0; height h = number of leading rows whose first w tokens are colours. The prediction is malformed
    when w == 0, when a row inside the extent is not closed by EOS at column w (unless w == size), or when
    the row below the extent is not EOS over columns 0..w-1 (unless h == size). Ragged rows and missing
    EOS therefore give None (a wrong candidate), never an exception.

    strict=False: the published TRM crop (largest all-colour rectangle anchored at the top-left); it
    never returns None unless the first token is not a colour.
    """
    arr = np.asarray(tokens).reshape(size, size)
    is_colour = (arr >= COLOR_OFFSET) & (arr < COLOR_OFFSET + NUM_COLORS)
    if not strict:
        best_area, best = 0, (0, 0)
        num_c = size
        for num_r in range(1, size + 1):
            row = is_colour[num_r - 1, :num_c]
            if not row.all():
                num_c = int(np.argmin(row))
            if num_r * num_c > best_area:
                best_area, best = num_r * num_c, (num_r, num_c)
        if best_area == 0:
            return None
        return (arr[: best[0], : best[1]] - COLOR_OFFSET).astype(np.uint8)

    row0 = is_colour[0]
    w = size if row0.all() else int(np.argmin(row0))
    if w == 0:
        return None
    rows_ok = is_colour[:, :w].all(axis=1)
    h = size if rows_ok.all() else int(np.argmin(rows_ok))
    if w < size and not (arr[:h, w] == EOS_ID).all():
        return None
    if h < size and not (arr[h, :w] == EOS_ID).all():
        return None
    return (arr[:h, :w] - COLOR_OFFSET).astype(np.uint8)


def find_content_extent(canvas: np.ndarray, size: int = ARC_MAX_GRID) -> tuple[int, int]:
    """(rows, cols) of the colour content anchored at the top-left of an untranslated canvas."""
    arr = np.asarray(canvas).reshape(size, size)
    colour = arr >= COLOR_OFFSET
    rows = int(np.nonzero(colour.any(axis=1))[0].max() + 1) if colour.any() else 0
    cols = int(np.nonzero(colour.any(axis=0))[0].max() + 1) if colour.any() else 0
    return rows, cols


def translate_canvas(canvas: np.ndarray, dr: int, dc: int, size: int = ARC_MAX_GRID) -> np.ndarray:
    """Shift a top-left-anchored canvas by (dr, dc); tokens pushed past the edge (only EOS/PAD when the
    offset is legal) are dropped, exactly like encoding the grid at that offset."""
    arr = np.asarray(canvas).reshape(size, size)
    out = np.full_like(arr, PAD_ID)
    out[dr:, dc:] = arr[: size - dr, : size - dc]
    return out.reshape(-1)


def content_extents(canvases: np.ndarray, size: int = ARC_MAX_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`find_content_extent` for a batch [b, size*size] -> (rows [b], cols [b])."""
    arr = np.asarray(canvases).reshape(-1, size, size) >= COLOR_OFFSET
    any_r = arr.any(axis=2)
    any_c = arr.any(axis=1)
    idx = np.arange(1, size + 1)
    return (any_r * idx).max(axis=1), (any_c * idx).max(axis=1)


def translate_batch(
    inputs: np.ndarray, labels: np.ndarray, uniforms: np.ndarray, size: int = ARC_MAX_GRID
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shift each example's input and label canvas by the same random legal offset.

    ``uniforms`` [2, b] in [0, 1) pick the offset (dr, dc) uniformly among the positions where both grids
    still fit the canvas. Returns the translated copies and the offsets [b, 2]."""
    b = len(inputs)
    ri, ci = content_extents(inputs, size)
    rl, cl = content_extents(labels, size)
    h, w = np.maximum(ri, rl), np.maximum(ci, cl)
    dr = np.floor(uniforms[0] * (size - h + 1)).astype(np.int64)
    dc = np.floor(uniforms[1] * (size - w + 1)).astype(np.int64)
    out_i = np.full((b, size, size), PAD_ID, dtype=inputs.dtype)
    out_l = np.full((b, size, size), PAD_ID, dtype=labels.dtype)
    src_i = inputs.reshape(b, size, size)
    src_l = labels.reshape(b, size, size)
    for k in range(b):
        r, c = int(dr[k]), int(dc[k])
        out_i[k, r:, c:] = src_i[k, : size - r, : size - c]
        out_l[k, r:, c:] = src_l[k, : size - r, : size - c]
    return out_i.reshape(b, -1), out_l.reshape(b, -1), np.stack([dr, dc], axis=1)


def grid_hash(grid: np.ndarray) -> str:
    """Hash of shape + content (pitfall 19: never hash raw bytes without the shape)."""
    g = np.ascontiguousarray(np.asarray(grid, dtype=np.uint8))
    h = hashlib.sha256()
    h.update(np.asarray(g.shape, dtype=np.int64).tobytes())
    h.update(g.tobytes())
    return h.hexdigest()

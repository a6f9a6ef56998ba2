"""Small tensor operations shared by the model core (models/) and the demo encoders (encoders/)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def split_projections(x: torch.Tensor) -> bool:
    """Whether a fused projection (qkv, gate/up) runs as one matmul per chunk (CPU) or as one matmul then a split
    (CUDA). Both give the same forward numbers (tests/test_models_layers.py compares them)."""
    return not x.is_cuda


def linear_chunks(x: torch.Tensor, weight: torch.Tensor, sizes: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """``F.linear(x, weight).split(sizes, -1)`` with the same numbers. On CPU each chunk is its own matmul on a
    slice of the weight: the backward then adds the chunks' input gradients instead of concatenating full-size
    activation gradients (a large copy on CPU); on CUDA one matmul, then the split."""
    if not split_projections(x):
        return F.linear(x, weight).split(list(sizes), dim=-1)
    return tuple(F.linear(x, w) for w in weight.split(list(sizes), dim=0))


def grid_coordinates(tokens: torch.Tensor, side: int, first_colour: int = 2) -> torch.Tensor:
    """Grid-relative coordinates of every canvas cell: [n, side*side, 4] long in ``[0, 2*side]``.

    ``tokens`` [n, L] holds flattened ``side x side`` canvases (L <= side*side: a cropped tail counts as empty).
    The grid of a canvas is the bounding box of its colour cells (tokens >= ``first_colour``; PAD and EOS are not
    colours), wherever it sits on the canvas (translation augmentation moves it). For cell (r, c) the four values
    are its offsets from that box's top, bottom, left and right edge: ``r - r0, r1 - r, c - c0, c1 - c`` (negative
    outside the box), clamped to ``[-side, side]`` and shifted by ``side`` to index an embedding table. A canvas
    without colour cells gives an empty box at the origin (r0 = c0 = 0, r1 = c1 = -1). No host sync."""
    n, L = tokens.shape
    if L > side * side:
        raise ValueError(f"grid_coordinates: {L} tokens do not fit a {side}x{side} canvas")
    if L < side * side:
        tokens = F.pad(tokens, (0, side * side - L))
    grid = (tokens >= first_colour).view(n, side, side)
    ar = torch.arange(side, device=tokens.device)

    def extent(occupied: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [n, side] -> first, last index
        first = torch.where(occupied, ar, side).amin(1)
        last = torch.where(occupied, ar, -1).amax(1)
        empty = last < 0
        return first.masked_fill(empty, 0)[:, None], last[:, None]

    r0, r1 = extent(grid.any(2))
    c0, c1 = extent(grid.any(1))
    rows, cols = (ar - r0, r1 - ar), (ar - c0, c1 - ar)  # each [n, side]
    coords = torch.stack(
        [
            rows[0][:, :, None].expand(n, side, side),
            rows[1][:, :, None].expand(n, side, side),
            cols[0][:, None, :].expand(n, side, side),
            cols[1][:, None, :].expand(n, side, side),
        ],
        -1,
    )
    return (coords.clamp(-side, side) + side).view(n, side * side, 4)


# ---------------------------------------------------------------------------------------------- pointer RoPE
# The pointer of each dihedral map (dataset.dihedral.dihedral_transform ids) as (row, column) coefficients over a
# cell's features (top, bottom, left, right, 1) relative to the *input* grid: the output cell (u, v) of the map reads
# the input cell it points at (tests/test_models_trm.py checks every map on grids of several shapes).
DIHEDRAL_POINTERS = {
    0: ((1, 0, 0, 0, 0), (0, 0, 1, 0, 0)),  # identity: (top, left)
    1: ((0, 0, 1, 0, 0), (-1, 0, 1, 1, 0)),  # rot90 counter-clockwise: (left, W - top), W = left + right
    2: ((0, 1, 0, 0, 0), (0, 0, 0, 1, 0)),  # rot180: (bottom, right)
    3: ((1, 1, -1, 0, 0), (1, 0, 0, 0, 0)),  # rot90 clockwise: (H - left, top), H = top + bottom
    4: ((1, 0, 0, 0, 0), (0, 0, 0, 1, 0)),  # horizontal flip: (top, right)
    5: ((0, 1, 0, 0, 0), (0, 0, 1, 0, 0)),  # vertical flip: (bottom, left)
    6: ((0, 0, 1, 0, 0), (1, 0, 0, 0, 0)),  # transpose: (left, top)
    7: ((1, 1, -1, 0, 0), (-1, 0, 1, 1, 0)),  # anti-diagonal reflection: (H - left, W - top)
}
# how pointer heads start: all at the identity (plain grid-relative 2D RoPE), or head h at dihedral map h % 8
POINTER_INITS = ("identity", "dihedral")


def pointer_bias(num_heads: int, init: str) -> torch.Tensor:
    """[num_heads * 2 * 5] starting pointers of ``num_heads`` heads (``POINTER_INITS``), flattened as the bias of a
    pointer projection whose output is viewed [heads, 2 (row, column), 5 (features)]."""
    if init not in POINTER_INITS:
        raise ValueError(f"pointer init must be one of {POINTER_INITS}, got {init!r}")
    maps = [0] * num_heads if init == "identity" else [h % 8 for h in range(num_heads)]
    return torch.tensor([DIHEDRAL_POINTERS[m] for m in maps], dtype=torch.float32).flatten()


def pointer_freqs(head_dim: int, side: int) -> torch.Tensor:
    """[head_dim / 4] angular frequencies per axis: ``pi * k / side`` for k = 1 .. head_dim/4 - 1 (no aliasing
    between offsets within one canvas) and one pair at 0 (content, not position)."""
    if head_dim % 4 or head_dim < 8:
        raise ValueError(f"pointer RoPE needs a head dimension divisible by 4 and at least 8, got {head_dim}")
    return torch.tensor([math.pi * (k + 1) / side for k in range(head_dim // 4 - 1)] + [0.0])


def pointer_features(tokens: torch.Tensor, side: int, prefix: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token features and key positions of pointer RoPE, from flattened ``side x side`` canvases ``tokens`` [n, L]
    (``grid_coordinates``: the grid is the canvas's colour cells). Returns (feats [n, prefix + L, 5] float32: the
    offsets from the top, bottom, left and right edge of the grid and 1; key_pos [n, prefix + L, 2]: the (row,
    column) offset from the grid's top-left corner). ``prefix`` leading non-cell slots (context slots, a CLS token)
    get features (0, 0, 0, 0, 1) and the key position (1.5 side, 1.5 side): at least side / 2 + 1 from every cell
    of the grid on each axis, modulo the lowest frequency's period (2 side)."""
    n, L = tokens.shape
    coords = (grid_coordinates(tokens, side)[:, :L] - side).to(torch.float32)
    feats = torch.cat((coords, coords.new_ones(n, L, 1)), -1)
    key_pos = coords[..., 0::2]
    if prefix:
        ctx = feats.new_zeros(n, prefix, 5)
        ctx[..., 4] = 1.0
        feats = torch.cat((ctx, feats), 1)
        key_pos = torch.cat((key_pos.new_full((n, prefix, 2), 1.5 * side), key_pos), 1)
    return feats, key_pos


def dihedral_sources(tokens: torch.Tensor, side: int) -> torch.Tensor:
    """For every cell of flattened ``side x side`` canvases ``tokens`` [n, L] and every dihedral map d
    (:data:`DIHEDRAL_POINTERS`), the canvas index of the cell of the canvas's grid that map d sends there, or -1
    where it sends none: [n, 8, L] long. So if an output grid placed at the input grid's top-left corner is the
    input grid transformed by d, ``tokens[src[:, d, p]]`` is the output's colour at every output cell p
    (``dataset.dihedral.dihedral_transform``; tests/test_encoders_variants.py checks every map and grid shape)."""
    n, L = tokens.shape
    feats, _ = pointer_features(tokens, side)  # [n, L, 5]: offsets from the grid's top, bottom, left, right; 1
    coef = torch.tensor([DIHEDRAL_POINTERS[d] for d in range(8)], dtype=feats.dtype, device=feats.device)
    rc = torch.einsum("nlf,dkf->ndlk", feats, coef).round().long()  # [n, 8, L, 2] (row, col) inside the grid
    t, b, l, r = (feats[..., i].round().long() for i in range(4))
    h, w = (t + b + 1)[:, None], (l + r + 1)[:, None]  # the grid's height / width ([n, 1, L]; 0 if no grid)
    row0 = torch.arange(L, device=tokens.device) // side - t  # the grid's top-left corner ([n, L])
    col0 = torch.arange(L, device=tokens.device) % side - l
    inside = (rc[..., 0] >= 0) & (rc[..., 0] < h) & (rc[..., 1] >= 0) & (rc[..., 1] < w)
    src = (row0[:, None] + rc[..., 0]) * side + col0[:, None] + rc[..., 1]
    return torch.where(inside & (src < L), src, -1)


# the shifts of the shift views (unwrapped and wrapped): every (dr, dc) with |dr|, |dc| <= 3 but (0, 0). These views
# are candidates written to the covered benchmark families' ranges (docs/science.md; the report's program row)
VIEW_SHIFTS: tuple[tuple[int, int], ...] = tuple(
    (dr, dc) for dr in range(-3, 4) for dc in range(-3, 4) if (dr, dc) != (0, 0)
)
# the (rows, columns) factors of the scale views (each cell a ky x kx block) and of the tile views (the grid repeated
# ry x rx times, plain or with every other tile mirrored): 1..3 each, not both 1 (candidates, as above)
VIEW_FACTORS: tuple[tuple[int, int], ...] = tuple((a, b) for a in range(1, 4) for b in range(1, 4) if (a, b) != (1, 1))
# the kinds of grid views (view_sources) and how many views each has
VIEW_KINDS = {
    "dihedral": 8,
    "shift": len(VIEW_SHIFTS),
    "roll": len(VIEW_SHIFTS),
    "scale": len(VIEW_FACTORS),
    "tile": 2 * len(VIEW_FACTORS),
    "settle": 4 * 10,
}
# settle views (candidates, as above): the directions (each made "down" by this many np.rot90 turns) and
# the wall candidates (none, then colours 1..9); view (d, w) is index d * 10 + w
SETTLE_DIRECTIONS = ("down", "left", "up", "right")


def _grid_frame(tokens: torch.Tensor, side: int):
    """(t, l, h, w, row0, col0) of flattened canvases [n, L]: every cell's (row, column) offset from its grid's
    top-left corner, the grid's height / width ([n, 1, L] each) and the corner's canvas row / column ([L]-broadcast)."""
    n, L = tokens.shape
    feats, _ = pointer_features(tokens, side)  # [n, L, 5]
    t, b, l, r = (feats[..., i].round().long()[:, None, :] for i in range(4))  # [n, 1, L]
    pos = torch.arange(L, device=tokens.device)
    return t, l, t + b + 1, l + r + 1, pos // side - t, pos % side - l


def _to_canvas(rr, cc, ok, row0, col0, side: int, L: int) -> torch.Tensor:
    src = (row0 + rr) * side + col0 + cc
    return torch.where(ok & (src >= 0) & (src < L), src, -1)


def block_sources(tokens: torch.Tensor, side: int, kind: str) -> torch.Tensor:
    """``kind`` scale: for every factor (ky, kx) of :data:`VIEW_FACTORS`, cell (r, c) of the ky h x kx w output
    (offsets from the input grid's top-left corner) reads input (r // ky, c // kx) (``np.kron`` with a block of
    ones); tile: for every (ry, rx) plain then mirrored, cell (r, c) of the ry h x rx w output reads (r mod h,
    c mod w), with the row (column) index reflected in odd tile rows (columns) when mirrored. [n, K, L] canvas
    indices, -1 outside that output."""
    n, L = tokens.shape
    t, l, h, w, row0, col0 = _grid_frame(tokens, side)
    f = torch.tensor(VIEW_FACTORS, dtype=torch.long, device=tokens.device)
    fy, fx = f[None, :, 0, None], f[None, :, 1, None]  # [1, K, 1]
    ok = (t >= 0) & (l >= 0) & (t < fy * h) & (l < fx * w) & (h > 0)
    if kind == "scale":
        return _to_canvas(t // fy, l // fx, ok, row0, col0, side, L)
    hh, ww = h.clamp_min(1), w.clamp_min(1)
    rr, cc = t % hh, l % ww
    plain = _to_canvas(rr.expand_as(ok), cc.expand_as(ok), ok, row0, col0, side, L)
    mr = torch.where((t // hh) % 2 == 1, hh - 1 - rr, rr)
    mc = torch.where((l // ww) % 2 == 1, ww - 1 - cc, cc)
    mirrored = _to_canvas(mr.expand_as(ok), mc.expand_as(ok), ok, row0, col0, side, L)
    return torch.cat((plain, mirrored), 1)


def shift_sources(tokens: torch.Tensor, side: int, wrap: bool = False) -> torch.Tensor:
    """For every cell of flattened ``side x side`` canvases ``tokens`` [n, L] and every shift (dr, dc) of
    :data:`VIEW_SHIFTS`, the canvas index of the grid cell that the shift moves there, or -1: [n, K, L] long. Cell
    (r, c) of the grid (offsets from its top-left corner) reads (r - dr, c - dc): -1 where that is off the grid
    (``wrap=False``: the content shifted by (dr, dc), background coming in) or taken modulo the grid's height and
    width (``wrap=True``: ``np.roll``); -1 for every cell outside the grid."""
    n, L = tokens.shape
    t, l, h, w, row0, col0 = _grid_frame(tokens, side)
    sh = torch.tensor(VIEW_SHIFTS, dtype=torch.long, device=tokens.device)
    rr, cc = t - sh[None, :, 0, None], l - sh[None, :, 1, None]  # [n, K, L]
    if wrap:
        rr, cc = rr % h.clamp_min(1), cc % w.clamp_min(1)
    cell_in_grid = (t >= 0) & (t < h) & (l >= 0) & (l < w)
    inside = cell_in_grid & (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
    return _to_canvas(rr, cc, inside, row0, col0, side, L)


def view_sources_reference(tokens: torch.Tensor, side: int, kinds: Sequence[str]) -> torch.Tensor:
    """[n, V, L]: :func:`dihedral_sources` / :func:`shift_sources` (unwrapped, wrapped) / :func:`block_sources`
    (scale, tile) for each kind of :data:`VIEW_KINDS` in ``kinds``, stacked in that order (V = the sum of their
    sizes). The definition; :func:`view_sources` gives the same from a table."""
    parts = {
        "dihedral": lambda: dihedral_sources(tokens, side),
        "shift": lambda: shift_sources(tokens, side, wrap=False),
        "roll": lambda: shift_sources(tokens, side, wrap=True),
        "scale": lambda: block_sources(tokens, side, "scale"),
        "tile": lambda: block_sources(tokens, side, "tile"),
        "settle": lambda: settle_sources(tokens, side),
    }
    unknown = [k for k in kinds if k not in parts]
    if unknown or not kinds:
        raise ValueError(f"grid views: kinds must be a non-empty subset of {sorted(parts)}, got {list(kinds)}")
    return torch.cat([parts[k]() for k in kinds], 1)


_VIEW_TABLES: dict = {}


def view_table(side: int, kinds: Sequence[str]) -> torch.Tensor:
    """[side + 1, side + 1, V, side * side] long, on the CPU: for a grid of height h and width w whose top-left corner
    is the canvas origin, the :func:`view_sources_reference` of every canvas cell of the shape views of ``kinds``
    (every kind but ``settle``: they depend only on the grid's size and on the cell's offset from its corner). Built
    once per (side, kinds) and process; a module keeps it as a buffer (``InputViews.table``), so a compiled forward
    reads it as an input and never traces its build (traced on a cold cache, the build became a CPU kernel inside the
    CUDA graph that inductor failed to compile: H200, torch 2.11, 2026-11-27)."""
    shape_kinds = tuple(k for k in kinds if k != "settle")
    key = (side, shape_kinds)
    if key not in _VIEW_TABLES:
        canvases = torch.zeros((side + 1) ** 2, side, side, dtype=torch.long)
        for h in range(side + 1):
            for w in range(side + 1):
                canvases[h * (side + 1) + w, :h, :w] = 2  # any colour: the sources do not depend on it
        table = view_sources_reference(canvases.view(-1, side * side), side, shape_kinds)
        _VIEW_TABLES[key] = table.view(side + 1, side + 1, table.shape[1], side * side)
    return _VIEW_TABLES[key]


def view_sources(
    tokens: torch.Tensor, side: int, kinds: Sequence[str], table: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """:func:`view_sources_reference` (the same numbers, tested) from a table of every grid size: two gathers
    instead of the views' arithmetic. ``tokens`` [n, side * side]; ``table``: :func:`view_table` of (side, kinds) on
    the tokens' device (None: built or cached here)."""
    n, L = tokens.shape
    if L != side * side:
        return view_sources_reference(tokens, side, kinds)
    if "settle" in kinds:  # depends on the content: computed, not looked up; the others in one table gather
        shape_kinds = [k for k in kinds if k != "settle"]
        sizes = [VIEW_KINDS[k] for k in shape_kinds]
        parts = iter(view_sources(tokens, side, shape_kinds, table).split(sizes, 1) if shape_kinds else ())
        return torch.cat([settle_sources(tokens, side) if k == "settle" else next(parts) for k in kinds], 1)
    if table is None:
        table = view_table(side, kinds).to(tokens.device)
    coords = grid_coordinates(tokens, side) - side  # [n, L, 4]: offsets from the grid's top, bottom, left, right
    t, b, l, r = coords.unbind(-1)
    h, w = (t + b + 1).amax(1).clamp(0, side), (l + r + 1).amax(1).clamp(0, side)  # [n] (0: no grid)
    top = torch.arange(L, device=tokens.device)[None, :] // side - t  # the corner's row (the same for every cell)
    left = torch.arange(L, device=tokens.device)[None, :] % side - l
    top, left = top[:, :1], left[:, :1]  # [n, 1]
    inside = (t >= 0) & (l >= 0)  # cells at or right / below the corner (every view's output lies there)
    rel = (t.clamp_min(0) * side + l.clamp_min(0)).clamp_max(L - 1)  # the cell in the table's frame
    per_grid = table[h, w]  # [n, V, L]: the views of a grid of this size at the origin
    src = per_grid.gather(2, rel[:, None, :].expand(-1, per_grid.shape[1], -1))
    src = torch.where(src >= 0, src + top[:, :, None] * side + left[:, :, None], -1)
    return torch.where(inside[:, None, :] & (src >= 0), src, -1)


def view_agreement(
    inp: torch.Tensor, out: torch.Tensor, side: int, kinds: Sequence[str] = ("dihedral",), first_colour: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dihedral_agreement` for the views of ``kinds`` (:func:`view_sources`): (colour [n, V, L], agreement
    [n, V, L] in {0: no source or no output colour, 1: differs, 2: equals})."""
    n, L = inp.shape
    src = view_sources(inp, side, kinds)
    V = src.shape[1]
    colour = inp.gather(1, src.clamp_min(0).flatten(1)).view(n, V, L).masked_fill(src < 0, 0)
    none = (src < 0) | (out < first_colour)[:, None]
    agreement = torch.where(none, 0, 1 + (colour == out[:, None]).long())
    return colour, agreement


def dihedral_agreement(
    inp: torch.Tensor, out: torch.Tensor, side: int, first_colour: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output cell and dihedral map d, of demo canvases inp / out [n, L]: (colour [n, 8, L]: the input token
    that d sends to the cell, 0 (PAD) where none; agreement [n, 8, L]: 0 = no source or no output colour there,
    1 = the output differs from it, 2 = equals it). Where the output is the input transformed by d, every output
    cell agrees under d."""
    return view_agreement(inp, out, side, ("dihedral",), first_colour)


def pointer_coefficients(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., heads, 2, 5] pointer coefficients of tokens x [..., d] through a pointer projection (weight
    [heads * 10, d], bias [heads * 10]), always in fp32 (also under autocast): bf16 rounds a coefficient near 1 by
    up to 2^-8, which at a 30-cell offset moves the pointed-at position by ~0.1 cell."""
    with torch.autocast(x.device.type, enabled=False):
        coef = F.linear(x.float(), weight.float(), bias.float())
    return coef.view(*x.shape[:-1], heads, 2, 5)


def pointer_tables(pos: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [..., 4 * len(freqs)] in the "rotate half" layout of (row, column) positions ``pos`` [..., 2]: the
    first half of the frequency pairs turn with the row, the second half with the column."""
    angles = torch.cat((pos[..., 0:1] * freqs, pos[..., 1:2] * freqs), -1)
    angles = torch.cat((angles, angles), -1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_pointer_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    coef: torch.Tensor,
    feats: torch.Tensor,
    k_cos: torch.Tensor,
    k_sin: torch.Tensor,
    freqs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pointer RoPE on q, k [..., heads, head_dim]: each query rotated to the position its head points at,
    ``(coef [..., heads, 2, 5] * feats [..., 5]).sum(-1)``, each key by its own table ``k_cos`` / ``k_sin``
    [..., 1, head_dim]; computed in fp32, returned in q's dtype."""
    dtype = q.dtype
    pos = (coef.to(torch.float32) * feats[..., None, None, :]).sum(-1)  # [..., heads, 2]
    q_cos, q_sin = pointer_tables(pos, freqs)
    q32, k32 = q.float(), k.float()
    return (q32 * q_cos + rotate_half(q32) * q_sin).to(dtype), (k32 * k_cos + rotate_half(k32) * k_sin).to(dtype)


def _settle_down(g: torch.Tensor, wall: torch.Tensor, first_colour: int) -> torch.Tensor:
    """[n, W, L] sources of the "down" settle views of canvases ``g`` [n, side, side], one per wall token of ``wall``
    [W] (-1: no wall): in each column, the cells of a colour other than the background and the wall fall until the
    grid's bottom edge, a wall cell or a settled cell; a wall cell stays; every other cell reads none (-1)."""
    n, side, _ = g.shape
    W, L = wall.shape[0], side * side
    rows = torch.arange(side, device=g.device)[None, None, :, None]
    g = g[:, None]  # [n, 1, side, side]
    in_grid = g >= first_colour
    is_wall = in_grid & (g == wall[None, :, None, None])  # [n, W, side, side]
    solid = in_grid & (g > first_colour) & ~is_wall
    bottom = torch.where(in_grid, rows, -1).amax(2, keepdim=True)  # [n, 1, 1, side]: the grid's last row
    wall_at = torch.where(is_wall, rows, side).flip(2).cummin(2).values.flip(2)  # the first wall row >= r
    wall_below = torch.cat((wall_at[:, :, 1:], torch.full_like(wall_at[:, :, :1], side)), 2)
    end = torch.minimum(wall_below, bottom + 1)  # one past the cell's segment
    after = F.pad(solid.long().flip(2).cumsum(2).flip(2), (0, 0, 0, 1))  # [n, W, side + 1, side]: solid in rows >= r
    below = after[:, :, 1:] - after.gather(2, end)  # solid cells below the cell, in its segment
    idx = torch.arange(L, device=g.device).view(1, 1, side, side).expand(n, W, -1, -1)
    dest = torch.where(solid, (end - 1 - below) * side + idx % side, L)
    src = torch.full((n, W, L + 1), -1, dtype=torch.long, device=g.device)  # slot L: where non-solid cells go
    src.scatter_(2, dest.reshape(n, W, L), idx.reshape(n, W, L))
    return torch.where(is_wall.reshape(n, W, L), idx.reshape(n, W, L), src[..., :L])


def settle_sources(tokens: torch.Tensor, side: int, first_colour: int = 2) -> torch.Tensor:
    """[n, 40, L] long: the settle views of flattened canvases ``tokens`` [n, side * side] (view d * 10 + w: direction
    :data:`SETTLE_DIRECTIONS` [d], wall colour w, none for w = 0). Cell sources as :func:`_settle_down` after turning
    the canvas so that the direction is down (tested against the benchmark's gravity family); -1 where no
    cell lands (the background). Unlike the other views it depends on the colours."""
    n, L = tokens.shape
    g = tokens.long().view(n, side, side)
    walls = torch.tensor([-1] + [first_colour + w for w in range(1, 10)], device=tokens.device)
    out = []
    for k in range(len(SETTLE_DIRECTIONS)):
        where = torch.rot90(torch.arange(L, device=tokens.device).view(side, side), k).reshape(L)  # turned -> canvas
        src = _settle_down(torch.rot90(g, k, dims=(1, 2)), walls, first_colour)  # [n, 10, L] in turned indices
        canvas = torch.full_like(src, -1)
        canvas[..., where] = torch.where(src >= 0, where[src.clamp_min(0)], -1)
        out.append(canvas)
    return torch.cat(out, 1)

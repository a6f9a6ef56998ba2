"""The canvas codec and augmentation primitives every dataset, model and evaluator share."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dataset.arc_sources import validate_grid
from dataset.augment import Augmentation
from dataset.canvas import canvas_to_grid, find_content_extent, grid_hash, grid_to_canvas, translate_canvas
from dataset.dihedral import dihedral_transform, inverse_dihedral_transform
from dataset.errors import DatasetError
from dataset.tokens import ARC_MAX_GRID, COLOR_OFFSET, EOS_ID, PAD_ID


@st.composite
def grids(draw, max_side=ARC_MAX_GRID):
    h = draw(st.integers(1, max_side))
    w = draw(st.integers(1, max_side))
    return draw(arrays(np.uint8, (h, w), elements=st.integers(0, 9)))


@settings(max_examples=150, deadline=None)
@given(grids(), st.booleans())
def test_canvas_roundtrip_both_decoders(grid, strict):
    canvas = grid_to_canvas(grid)
    assert canvas.shape == (ARC_MAX_GRID * ARC_MAX_GRID,)
    out = canvas_to_grid(canvas, strict=strict)
    assert out is not None and out.shape == grid.shape and (out == grid).all()


@settings(max_examples=100, deadline=None)
@given(grids(), st.data())
def test_translate_equals_encoding_at_offset(grid, data):
    h, w = grid.shape
    dr = data.draw(st.integers(0, ARC_MAX_GRID - h))
    dc = data.draw(st.integers(0, ARC_MAX_GRID - w))
    direct = grid_to_canvas(grid, offset=(dr, dc))
    shifted = translate_canvas(grid_to_canvas(grid), dr, dc)
    assert (direct == shifted).all()
    assert find_content_extent(grid_to_canvas(grid)) == (h, w)


def test_canvas_layout_matches_published_trm():
    g = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.uint8)
    c = grid_to_canvas(g).reshape(30, 30)
    assert c[0, 0] == COLOR_OFFSET and c[2, 1] == 5 + COLOR_OFFSET
    assert (c[3, :2] == EOS_ID).all() and (c[:3, 2] == EOS_ID).all()
    assert c[3, 2] == PAD_ID  # the corner is not EOS
    assert (c[4:] == PAD_ID).all() and (c[:, 3:] == PAD_ID).all()


def _canvas(grid):
    return grid_to_canvas(np.asarray(grid, dtype=np.uint8)).reshape(30, 30).copy()


@pytest.mark.parametrize("mutate", ["no_eos_right", "ragged_long", "ragged_short", "no_eos_below", "empty"])
def test_strict_decode_rejects_malformed(mutate):
    c = _canvas(np.ones((3, 4)))
    if mutate == "no_eos_right":
        c[1, 4] = PAD_ID
    elif mutate == "ragged_long":
        c[1, 4] = COLOR_OFFSET + 2  # row 1 is one longer than the others
    elif mutate == "ragged_short":
        c[2, 3] = EOS_ID  # row 2 is one shorter
    elif mutate == "no_eos_below":
        c[3, 1] = PAD_ID
    elif mutate == "empty":
        c[0, 0] = EOS_ID
    assert canvas_to_grid(c) is None


def test_lenient_decode_is_max_area_crop():
    c = _canvas(np.ones((3, 4)))
    c[2, 3] = EOS_ID  # ragged: the 3x3 block (area 9) beats the 2x4 block (area 8)
    out = canvas_to_grid(c, strict=False)
    assert out.shape == (3, 3)


@settings(max_examples=200, deadline=None)
@given(grids(), st.integers(0, 7), st.permutations(list(range(1, 10))))
def test_augmentation_inverse_exact(grid, tid, perm):
    aug = Augmentation(tid, tuple([0] + list(perm)))
    out = aug.apply(grid)
    if tid in (1, 3, 6, 7):
        assert out.shape == grid.shape[::-1]
    assert (aug.invert(out) == grid).all()
    assert (inverse_dihedral_transform(dihedral_transform(grid, tid), tid) == grid).all()
    base, parsed = Augmentation.parse_name(aug.name_for("007bbfd7"))
    assert base == "007bbfd7" and parsed == aug


def test_dihedral_group_numbering():
    g = np.arange(6).reshape(2, 3)
    assert (dihedral_transform(g, 1) == np.rot90(g)).all()
    # every id, not only some: the distinct-images check below would not catch two ids swapped (e.g. 2 and 3),
    # which would silently disagree with the published identifiers.json / checkpoints
    assert (dihedral_transform(g, 0) == g).all()
    assert (dihedral_transform(g, 2) == np.rot90(g, k=2)).all()
    assert (dihedral_transform(g, 3) == np.rot90(g, k=3)).all()
    assert (dihedral_transform(g, 7) == np.fliplr(np.rot90(g, k=1))).all()
    assert (dihedral_transform(g, 4) == np.fliplr(g)).all()
    assert (dihedral_transform(g, 5) == np.flipud(g)).all()
    assert (dihedral_transform(g, 6) == g.T).all()
    # 8 distinct images of an asymmetric grid
    assert len({dihedral_transform(g, t).tobytes() + bytes(dihedral_transform(g, t).shape) for t in range(8)}) == 8


def test_colour_zero_is_fixed_and_validated():
    with pytest.raises(ValueError):
        Augmentation(0, (1, 0, 2, 3, 4, 5, 6, 7, 8, 9))
    with pytest.raises(ValueError):
        Augmentation(8)


def test_grid_hash_sees_shape():
    a = np.zeros((2, 3), dtype=np.uint8)
    b = np.zeros((3, 2), dtype=np.uint8)
    assert a.tobytes() == b.tobytes() and grid_hash(a) != grid_hash(b)


@pytest.mark.parametrize(
    "grid, fragment",
    [
        ([[1, 2], [3]], "ragged"),
        ([[1, 10]], "outside 0-9"),
        ([[1, -1]], "outside 0-9"),
        ([[0] * 31], "exceeds 30x30"),
        ([], "non-empty"),
        ("x", "non-empty"),
    ],
)
def test_validate_grid_errors_name_location(grid, fragment):
    with pytest.raises(DatasetError) as e:
        validate_grid(grid, where="f.json: puzzle abc: train[0].input")
    assert "f.json: puzzle abc: train[0].input" in str(e.value) and fragment in str(e.value)

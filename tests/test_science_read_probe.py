"""experiments.science.read_probe: the encoder readout probe (can an encoder read the map from the demos?)."""

import json

import numpy as np
import pytest

from dataset.canvas import canvas_to_grid
from dataset.dihedral import dihedral_transform
from experiments.science import read_probe


def test_probe_puzzles_show_the_labelled_map_in_every_demo():
    """Each puzzle's demo outputs are its demo inputs under the labelled map (decoded from the canvases), grids
    within the asked sizes, every demo slot valid."""
    maps = [1, 4, 6]
    di, dl, dm, y = read_probe.make_puzzles(np.random.default_rng(0), 12, maps, side=7, sizes=(2, 5), demos=3)
    assert di.shape == dl.shape == (12, 3, 49) and dm.all() and set(y.tolist()) <= {0, 1, 2}
    for i in range(12):
        for j in range(3):
            g = canvas_to_grid(di[i, j].numpy(), size=7)
            assert 2 <= min(g.shape) and max(g.shape) <= 5
            assert np.array_equal(canvas_to_grid(dl[i, j].numpy(), size=7), dihedral_transform(g, maps[int(y[i])]))


def test_recipe_encoder_is_the_science_config_with_overrides():
    cfg = read_probe.recipe_encoder("standard", ["pointer=dihedral"])
    assert cfg["name"] == "standard" and cfg["hidden_size"] == 64 and cfg["grid_coords"] is True  # cfg_science
    assert cfg["pointer"] == "dihedral"
    with pytest.raises(ValueError, match="unknown encoder"):
        read_probe.recipe_encoder("nonesuch")


def test_readout_learns_a_map_that_changes_the_grid_shape(tmp_path):
    """Identity against a quarter turn on non-square grids (the output's extent tells them apart): a small encoder
    with its readout goes well above chance within a few dozen steps, and the CLI writes the curve."""
    cfg = read_probe.recipe_encoder("standard", ["hidden_size=32", "num_layers=1"])
    res = read_probe.train_readout(
        cfg,
        maps=[0, 1],
        steps=60,
        batch=32,
        lr=3e-3,
        side=6,
        sizes=(2, 5),
        num_eval=128,
        eval_every=30,
        hidden_size=32,
        log=False,
    )
    assert [c["step"] for c in res["curve"]] == [30, 60] and res["chance"] == 0.5
    assert res["curve"][-1]["heldout_acc"] > 0.75
    out = tmp_path / "r.json"
    read_probe.main(
        [
            "--maps",
            "0",
            "1",
            "--steps",
            "2",
            "--batch",
            "4",
            "--canvas-size",
            "6",
            "--sizes",
            "2",
            "4",
            "--json",
            str(out),
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["maps"] == [0, 1] and saved["curve"][-1]["step"] == 2
    with pytest.raises(ValueError, match="do not fit"):
        read_probe.train_readout(cfg, sizes=(2, 9), side=8)

"""experiments.science.view_match: without a model, the grid views' match names the view that is each puzzle's rule
(the reading half of arch=trm_views), on generated puzzles of the five families that are views."""

from dataset.build_synthetic_dataset import generate_synthetic_arc
from experiments.science.view_match import main, true_view


def test_the_match_names_the_rules_view_of_every_held_out_puzzle(tmp_path, capsys):
    fams = ["flip_rotate", "translate", "roll", "scale_up", "copy_pattern", "colour_map"]
    paths = generate_synthetic_arc(
        str(tmp_path), "synth", num_train=12, num_test=30, families=fams, max_grid=6, seed=1, progress=False,
        canvas_size=8,
    )  # fmt: skip
    assert paths["prefix"] == str(tmp_path / "synth")
    table = main([str(tmp_path), "--match", "explain", "--canvas-size", "8"])
    assert "| flip_rotate |" in capsys.readouterr().out
    assert sorted(table) == sorted(f for f in fams if f != "colour_map")  # colour_map is not a view
    for fam, row in table.items():
        assert row["puzzles"] == 5 and row["among_best"] == 5, (fam, row)
        if fam != "translate":  # translate ties the roll by the same shift (the same colours on the grid)
            assert row["unique_best"] == 5, (fam, row)
    agree = main([str(tmp_path), "--match", "agree", "--canvas-size", "8"])
    assert agree["flip_rotate"]["unique_best"] == 5  # agree names the dihedral maps too, but ties partial views
    assert true_view("colour_map", {}) is None and true_view("flip_rotate", {"dihedral": 3}) == 3

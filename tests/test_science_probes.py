"""experiments.science.probes: the core-fit probe data (076a67b, docs/record/2026-11-25-spatial-core-fit-probes.md)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dataset.dihedral import dihedral_transform
from experiments.science.probes import main


def test_probe_puzzles_follow_their_map_and_oracle_ids_name_it(tmp_path):
    args = ["--dihedral", "1", "4", "6", "--num-train", "12", "--num-eval", "4", "--sizes", "2", "5"]
    built = main(["--out", str(tmp_path), *args, "--oracle"])
    rules = json.load(open(tmp_path / "probe_rules.json"))
    assert set(rules.values()) <= {1, 4, 6} and len(set(rules.values())) > 1
    ch = json.load(open(tmp_path / "probe_training_challenges.json"))
    for pid, p in ch.items():
        for pair in p["train"]:
            assert np.array_equal(dihedral_transform(np.array(pair["input"]), rules[pid]), np.array(pair["output"]))
    # the same build without --oracle: every puzzle identifier is replaced by its puzzle's map id
    plain = main(["--out", str(tmp_path / "plain"), *args])
    names = json.load(open(os.path.join(plain, "identifiers.json")))
    for split in ("train", "test"):
        ids = np.load(os.path.join(plain, split, "all__puzzle_identifiers.npy"))
        oracle = np.load(os.path.join(built, split, "all__puzzle_identifiers.npy"))
        assert oracle.tolist() == [rules[names[i].split("|")[0]] for i in ids.tolist()]
        assert len(set(ids.tolist())) > 3  # the plain build has one identifier per puzzle


def test_probe_refuses_bad_maps_and_sizes(tmp_path):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--dihedral", "0"])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--sizes", "2", "8"])  # no room for the end marker on an 8 canvas


def test_shift_probe_moves_every_cell_by_its_shift(tmp_path):
    from dataset.synthetic_rules import rule_apply

    shift = lambda dr, dc, wrap: rule_apply("roll" if wrap else "translate", {"dr": dr, "dc": dc})  # noqa: E731
    g = np.arange(1, 13).reshape(3, 4)
    assert shift(1, -1, True)(g).tolist() == [[10, 11, 12, 9], [2, 3, 4, 1], [6, 7, 8, 5]]
    k = np.where(np.arange(12).reshape(3, 4) == 0, 9, 0)  # content at the top-left corner: nothing falls off
    assert shift(2, 3, False)(k).tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 9]]
    assert shift(1, -1, False)(g) is None and shift(3, 0, False)(k) is None  # content would leave the grid
    main(
        [
            "--out",
            str(tmp_path),
            "--shift",
            "1",
            "2",
            "--shift",
            "-2",
            "0",
            "--shift",
            "0",
            "-4",
            "--num-train",
            "24",
            "--num-eval",
            "4",
            "--sizes",
            "2",
            "5",
        ]
    )
    rules = json.load(open(tmp_path / "probe_rules.json"))
    assert set(rules.values()) == {1, 2, 3}
    shifts = {1: (1, 2), 2: (-2, 0), 3: (0, -4)}
    ch = json.load(open(tmp_path / "probe_training_challenges.json"))
    for pid, p in ch.items():
        dr, dc = shifts[rules[pid]]
        for pair in p["train"]:
            a, b = np.array(pair["input"]), np.array(pair["output"])
            assert a.shape == b.shape and a.any()
            assert np.count_nonzero(a) == np.count_nonzero(b)  # no content shifted off the grid
            for (r, c), v in np.ndenumerate(b):  # each output cell is the input cell the shift brings there
                src = (r - dr, c - dc)
                inside = 0 <= src[0] < a.shape[0] and 0 <= src[1] < a.shape[1]
                assert v == (a[src] if inside else 0)
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "w"), "--wrap"])  # --wrap without --shift
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "z"), "--shift", "0", "0"])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "d"), "--shift", "1", "0", "--dihedral", "4"])  # one or the other

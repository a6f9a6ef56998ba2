"""experiments.science.probes: the core-fit probe data (docs/science.md, spatial families)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dataset.common import dihedral_transform
from experiments.science.probes import main


def test_probe_puzzles_follow_their_map_and_oracle_ids_name_it(tmp_path):
    built = main(["--out", str(tmp_path), "--dihedral", "1", "4", "6", "--num-train", "12", "--num-eval", "4",
                  "--sizes", "2", "5", "--oracle"])
    rules = json.load(open(tmp_path / "probe_rules.json"))
    assert set(rules.values()) <= {1, 4, 6} and len(set(rules.values())) > 1
    ch = json.load(open(tmp_path / "probe_training_challenges.json"))
    for pid, p in ch.items():
        for pair in p["train"]:
            assert np.array_equal(dihedral_transform(np.array(pair["input"]), rules[pid]), np.array(pair["output"]))
    # the same build without --oracle: every puzzle identifier is replaced by its puzzle's map id
    plain = main(["--out", str(tmp_path / "plain"), "--dihedral", "1", "4", "6", "--num-train", "12",
                  "--num-eval", "4", "--sizes", "2", "5"])
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

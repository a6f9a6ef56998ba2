"""Synthetic rule families: rule semantics checked independently, instance split, hold-out families,
determinism and the --build-dir path into the ARC builder and the loader."""

import filecmp
import json
import os

import numpy as np
import pytest

from dataset.build_synthetic_dataset import generate_synthetic_arc, main
from dataset.dihedral import dihedral_transform
from dataset.errors import DatasetError
from dataset.loader import PuzzleDataset, PuzzleDatasetConfig
from dataset.synthetic_rules import FAMILIES, GridSpec, _components, rule_apply


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("syn")
    paths = generate_synthetic_arc(
        str(d), "s", num_train=72, num_test=27, min_grid=3, max_grid=8, seed=11, progress=False, families=list(FAMILIES)
    )  # the covered families, whose semantics _check states independently (open ones: tests/test_open_families.py)
    load = lambda k: json.load(open(paths[k]))  # noqa: E731
    return (
        paths,
        {s: (load(f"{s}_challenges"), load(f"{s}_solutions")) for s in ("training", "evaluation")},
        json.load(open(paths["rules"])),
    )


def _pairs(chal, sol, name):
    p = chal[name]
    demo = [(np.array(x["input"]), np.array(x["output"])) for x in p["train"]]
    test = [(np.array(x["input"]), np.array(o)) for x, o in zip(p["test"], sol[name])]
    return demo, test


def _recolour(g, rc):
    g = g.copy()
    if rc:
        g[g == rc[0]] = rc[1]
    return g


def _check(family, params, gi, go):
    if family == "colour_map":
        m = {int(k): v for k, v in params["map"].items()}
        assert np.array_equal(go, np.vectorize(lambda c: m.get(int(c), int(c)))(gi))
    elif family == "flip_rotate":
        assert np.array_equal(go, _recolour(dihedral_transform(gi, params["dihedral"]), params["recolour"]))
    elif family == "translate":  # unwrapped: every coloured cell moves by (dr, dc) and stays on the grid
        ys, xs = np.nonzero(gi)
        assert len(ys) and np.array_equal(go[ys + params["dr"], xs + params["dc"]], gi[ys, xs])
        assert (go != 0).sum() == (gi != 0).sum()
    elif family == "roll":  # wrapped, and some coloured cell crosses an edge
        dr, dc = params["dr"], params["dc"]
        ys, xs = np.nonzero(gi)
        h, w = gi.shape
        assert np.array_equal(go[(ys + dr) % h, (xs + dc) % w], gi[ys, xs]) and (go != 0).sum() == len(ys)
        assert ((ys + dr < 0) | (ys + dr >= h) | (xs + dc < 0) | (xs + dc >= w)).any()
    elif family == "scale_up":
        ky, kx = params["ky"], params["kx"]
        assert go.shape == (gi.shape[0] * ky, gi.shape[1] * kx)
        for a in range(ky):
            for b in range(kx):
                assert np.array_equal(go[a::ky, b::kx], _recolour(gi, params["recolour"]))
    elif family == "gravity":
        k = {"down": 0, "left": 1, "up": 2, "right": 3}[params["direction"]]
        r_in, r_out = np.rot90(gi, k), np.rot90(go, k)  # now falling is "down"
        wall = params["wall"]
        for c in range(r_in.shape[1]):
            a, b = r_in[:, c], r_out[:, c]
            if wall is not None:
                assert np.array_equal(a == wall, b == wall)  # walls never move
            # colour order preserved, every moving cell rests on the floor, a wall or another cell
            mv = lambda v: [x for x in v if x != 0 and x != wall]  # noqa: E731
            assert mv(a) == mv(b)
            for y in range(len(b) - 1):
                if b[y] != 0 and b[y] != wall:
                    assert b[y + 1] != 0
    elif family == "fill_enclosed":
        rc = params.get("recolour")
        filled = (gi != go) & (gi == 0)
        assert (go[filled] == params["fill"]).all() and filled.any()
        if rc:  # the outlines are recoloured afterwards, nothing else changes
            assert rc[0] == params["border"] and np.array_equal((gi != go) & ~filled, gi == rc[0])
            assert (go[gi == rc[0]] == rc[1]).all()
        else:
            assert ((gi != go) == filled).all()
    elif family == "recolour_by_size":
        assert not (go == params["src"]).any()
        assert np.array_equal(
            gi == params["src"], np.isin(go, [params["big"], params["small"]]) & (gi == params["src"])
        )
        assert {params["big"], params["small"]} <= set(np.unique(go).tolist())
    elif family == "copy_pattern":
        h, w = gi.shape
        assert go.shape == (h * params["ry"], w * params["rx"])
        assert np.array_equal(go[:h, :w], _recolour(gi, params["recolour"]))
    else:
        raise AssertionError(family)


def test_every_pair_follows_its_rule(synth):
    _, data, rules = synth
    fams = set()
    for _subset, (chal, sol) in data.items():
        for name in chal:
            r = rules[name]
            fams.add(r["family"])
            demo, test = _pairs(chal, sol, name)
            assert 2 <= len(demo) <= 5 and 1 <= len(test) <= 2
            for gi, go in demo + test:
                assert 3 <= gi.shape[0] <= 8 and 3 <= gi.shape[1] <= 8 or r["family"] in ("scale_up", "copy_pattern")
                assert go.max() <= 9 and max(go.shape) <= 30
                assert not (gi.shape == go.shape and (gi == go).all())
                _check(r["family"], r["params"], gi, go)
    assert fams == set(FAMILIES)


def test_train_and_test_are_different_rule_instances(synth):
    _, _, rules = synth
    key = lambda r: (r["family"], json.dumps(r["params"], sort_keys=True))  # noqa: E731
    tr = {key(r) for r in rules.values() if r["subset"] == "training"}
    te = {key(r) for r in rules.values() if r["subset"] == "evaluation"}
    assert len(te) > 10 and not tr & te


def test_demos_show_every_optional_part_of_the_rule(synth):
    """A puzzle's demos determine its rule: a recolour's source colour, a gravity wall, every changed colour of a
    colour_map appear in some demo input; a roll moves some demo content across the border (and no other shift
    explains its demos); a
    size threshold t has demo objects of size t - 1 (where t > 2) and t (where t < 4), so t-1 / t+1 would differ."""
    _, data, rules = synth
    for _subset, (chal, sol) in data.items():
        for name in chal:
            fam, p = rules[name]["family"], rules[name]["params"]
            demo, _ = _pairs(chal, sol, name)
            colours = set(np.concatenate([i.ravel() for i, _ in demo]).tolist())
            if p.get("recolour"):
                assert p["recolour"][0] in colours, name
            if fam == "gravity" and p["wall"] is not None:
                assert p["wall"] in colours, name
            if fam == "colour_map":
                assert {int(a) for a, b in p["map"].items() if int(a) != b} <= colours, name
            if fam == "roll":
                assert any(
                    not np.array_equal(o != 0, np.roll(np.pad(i != 0, 8), (p["dr"], p["dc"]), axis=(0, 1))[8:-8, 8:-8])
                    for i, o in demo
                ), name
                others = [
                    (a, b) for a in range(-3, 4) for b in range(-3, 4) if (a, b) not in ((0, 0), (p["dr"], p["dc"]))
                ]
                for a, b in others:  # on grids of one height, a roll by dr is one by dr - h too
                    assert not all(np.array_equal(np.roll(i, (a, b), axis=(0, 1)), o) for i, o in demo), (name, a, b)
            if fam == "recolour_by_size":
                sizes = {len(c) for i, _ in demo for c in _components(i == p["src"])}
                t = p["threshold"]
                assert (t == 2 or t - 1 in sizes) and (t == 4 or t in sizes), (name, t, sizes)


def test_evaluation_families_are_balanced(synth):
    _, _, rules = synth
    counts = [sum(r["family"] == f and r["subset"] == "evaluation" for r in rules.values()) for f in FAMILIES]
    assert counts == [3] * len(FAMILIES) == [3] * 9  # 27 puzzles over 9 families, every family held out


def test_holdout_families(tmp_path):
    p = generate_synthetic_arc(
        str(tmp_path), "h", num_train=16, num_test=8, holdout_families=["gravity"], max_grid=6, seed=0, progress=False
    )
    rules = json.load(open(p["rules"]))
    assert {r["family"] for r in rules.values() if r["subset"] == "evaluation"} == {"gravity"}
    assert "gravity" not in {r["family"] for r in rules.values() if r["subset"] == "training"}
    with pytest.raises(DatasetError, match="unknown family 'nope'"):
        generate_synthetic_arc(str(tmp_path), "x", families=["nope"], progress=False)
    with pytest.raises(DatasetError, match="max-grid"):
        generate_synthetic_arc(str(tmp_path), "x", min_grid=5, max_grid=4, progress=False)
    with pytest.raises(DatasetError, match="roll translate: a shift needs grids of side >= 2"):
        generate_synthetic_arc(str(tmp_path), "x", families=["translate", "roll"], min_grid=1, max_grid=1)


def test_same_seed_identical_bytes_and_build_dir(tmp_path):
    args = ["--num-train", "12", "--num-test", "4", "--max-grid", "6", "--seed", "5", "--no-progress"]
    a = main(["--output-dir", str(tmp_path / "a")] + args + ["--build-dir", str(tmp_path / "built"), "--num-aug", "2"])
    b = main(["--output-dir", str(tmp_path / "b")] + args + ["--num-aug", "2"])  # --num-aug shapes the raw data
    c = main(["--output-dir", str(tmp_path / "c")] + args[:-2] + ["6", "--no-progress", "--num-aug", "2"])
    files = ("training_challenges", "training_solutions", "evaluation_challenges", "evaluation_solutions", "rules")
    for k in files + ("augmentations", "leaks", "shifts"):  # the sidecars too
        assert filecmp.cmp(a[k], b[k], shallow=False), k
    assert not filecmp.cmp(a["training_challenges"], c["training_challenges"], shallow=False)
    # the built directory is an etrm-mode ARC dataset the loader serves in encoder mode
    ds = PuzzleDataset(
        PuzzleDatasetConfig(
            data_paths=[str(tmp_path / "built")], global_batch_size=4, test_mode=True, encoder_mode=True
        ),
        "test",
    )
    assert ds.metadata.test_demos_in_train is False
    _, batch, _ = next(iter(ds))
    assert batch["demo_mask"].any(dim=1).all()
    assert os.path.exists(tmp_path / "built" / "test_puzzles.json")


# ---------------------------------------------------------------------------------------------------------------
# translate (unwrapped) and roll (wrapped): benchmark v2
# ---------------------------------------------------------------------------------------------------------------
def test_translate_never_wraps_and_its_content_stays_on_the_grid():
    """Every translate input is larger than its shift and holds content only where the shift keeps it on the grid:
    the unwrapped mapping never refuses it, and the wrapped one (roll) gives the same output (nothing crosses)."""
    rng = np.random.default_rng(0)
    spec = GridSpec(3, 6)
    shifts = set()
    for _ in range(300):
        rule = FAMILIES["translate"](rng, spec)
        dr, dc = rule.params["dr"], rule.params["dc"]
        assert set(rule.params) == {"dr", "dc"} and max(abs(dr), abs(dc)) <= 3 and (dr, dc) != (0, 0)
        shifts.add((dr, dc))
        for _ in range(3):
            x = rule.make_input(rng)
            h, w = x.shape
            assert 3 <= h <= 6 and 3 <= w <= 6 and h > abs(dr) and w > abs(dc) and x.any()
            y = rule.apply(x)
            assert y is not None and (y != 0).sum() == (x != 0).sum()
            assert np.array_equal(y, rule_apply("roll", rule.params)(x))
    assert len(shifts) == 48  # every shift drawn
    # the mapping itself refuses content that would leave the grid (a wrapped puzzle's input)
    x = np.zeros((4, 4), np.uint8)
    x[3, 0] = 5
    assert rule_apply("translate", {"dr": 1, "dc": 0})(x) is None
    assert rule_apply("roll", {"dr": 1, "dc": 0})(x)[0, 0] == 5


def test_roll_wraps_every_input():
    """Every roll input has content on a cell the shift carries across an edge: the unwrapped shift refuses it."""
    rng = np.random.default_rng(1)
    spec = GridSpec(3, 6)
    for _ in range(200):
        rule = FAMILIES["roll"](rng, spec)
        assert set(rule.params) == {"dr", "dc"}
        for _ in range(3):
            x = rule.make_input(rng)
            assert x.shape[0] > abs(rule.params["dr"]) and x.shape[1] > abs(rule.params["dc"])
            assert np.array_equal(rule.apply(x), np.roll(x, (rule.params["dr"], rule.params["dc"]), axis=(0, 1)))
            assert rule_apply("translate", rule.params)(x) is None


def test_shift_table_is_about_uniform_in_training_and_held_out(tmp_path):
    """Shifts are drawn by (|dr|, |dc|) cell, the held-out shifts spread over the cells (one per cell per cycle) and
    shared by translate and roll, and a training shift that is held out is replaced by a free sign variant of its
    cell: every one of the 15 non-zero cells is about as common as any other, in training (puzzles and copies) and
    held out. (Benchmark v1: no unwrapped translate with a shift of 3 in training at all.)"""
    paths = generate_synthetic_arc(
        str(tmp_path),
        "s",
        families=["translate", "roll"],
        num_train=480,
        num_test=30,
        heldout_puzzles_per_instance=1,
        min_grid=3,
        max_grid=6,
        canvas_size=8,
        num_aug=8,
        seed=0,
        progress=False,
    )
    table = json.load(open(paths["shifts"]))["families"]
    rules = json.load(open(paths["rules"]))
    held = {(r["family"], r["params"]["dr"], r["params"]["dc"]) for r in rules.values() if r["subset"] == "evaluation"}
    assert {(dr, dc) for f, dr, dc in held if f == "translate"} == {(dr, dc) for f, dr, dc in held if f == "roll"}
    for fam in ("translate", "roll"):
        t = {k: np.array(v) for k, v in table[fam].items()}
        assert t["training"][0, 0] == t["training_copies"][0, 0] == t["heldout"][0, 0] == 0
        cells = [(a, b) for a in range(4) for b in range(4) if (a, b) != (0, 0)]
        assert [t["heldout"][c] for c in cells] == [1] * 15  # 15 held-out shifts, one per cell
        n = np.array([t["training"][c] for c in cells])
        assert n.sum() == 240 and n.min() / n.max() > 0.3, (fam, n)
        copies = np.array([t["training_copies"][c] for c in cells])
        assert copies.sum() > 240 * 8 and copies.min() / copies.max() > 0.4, (fam, copies)
        # the table counts what the files hold
        train_cells = [
            (abs(r["params"]["dr"]), abs(r["params"]["dc"]))
            for r in rules.values()
            if r["family"] == fam and r["subset"] == "training"
        ]
        assert [train_cells.count(c) for c in cells] == n.tolist()

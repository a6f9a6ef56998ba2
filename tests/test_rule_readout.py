"""The auxiliary rule readout (encoder.rule_readout, rule_labels; the option: docs/models.md).

Labels (dataset.rule_labels.rule_targets, dataset.rule_labels.rule_label_table): every family fills its slots in
range; an augmented copy is labelled with the rule it *shows* (the conjugate under its augmentation), checked against
the copy's own demo pairs; held-out puzzles are never labelled. The head (encoders.probes.RuleReadout): mean
cross-entropy over the labelled slots only. The loop: the labels reach the loss through the ACT carry, the readout
trains the encoder, and the checkpoint evaluates without labels."""

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dataset.arc_sources import load_puzzles
from dataset.build_arc_dataset import read_identifiers_map
from dataset.families import ALL_FAMILIES, family_apply
from dataset.open_families import DIRECTIONS
from dataset.rule_labels import NO_COLOUR, RULE_SLOTS, UNLABELLED, rule_label_table, rule_targets
from dataset.synthetic_rules import FAMILIES, GRAVITY_DIRECTIONS, GridSpec, rule_apply
from encoders.probes import RuleReadout
from experiments.science.common import ScienceError
from experiments.science.run import _rule_readout_overrides, oracle_eval_overrides
from tests.toy_data import TINY_ETRM, built_synthetic_arc
from training.config import ConfigError, load_config

SLOTS = list(RULE_SLOTS)


def test_rule_targets_fill_every_family_in_range():
    rng = np.random.default_rng(0)
    assert list(ALL_FAMILIES)[: len(FAMILIES)] == list(FAMILIES)  # the covered indices did not move
    for i, (fam, make) in enumerate(ALL_FAMILIES.items()):
        for _ in range(40):
            t = rule_targets(fam, make(rng, GridSpec(3, 6)).params)
            assert t["family"] == i and len(t) > 1
            assert all(0 <= v < RULE_SLOTS[k] for k, v in t.items())
        assert rule_targets(fam, None) == {"family": i}
    assert rule_targets("translate", {"dr": -3, "dc": 2}) == {"family": 2, "dr": 0, "dc": 5}
    assert rule_targets("roll", {"dr": -3, "dc": 2}) == {"family": 8, "dr": 0, "dc": 5}
    lut = rule_targets("colour_map", {"map": {"3": 7, "7": 3}})
    assert [lut[f"lut_{c}"] for c in range(10)] == [0, 1, 2, 7, 4, 5, 6, 3, 8, 9]
    assert rule_targets("flip_rotate", {"dihedral": 5, "recolour": None})["colour_a"] == NO_COLOUR
    assert "colour_c" not in rule_targets("fill_enclosed", {"border": 1, "fill": 2, "noise": 3})  # input-only noise
    ray = {"direction": "up_left", "mark": 1, "line": 2, "stop": False}
    assert rule_targets("extend_lines", ray) == {
        "family": 9, "ray": 4, "stop": 0, "colour_a": 1, "colour_b": 2, "colour_c": NO_COLOUR,
    }  # fmt: skip
    bar = {"orientation": "column", "unit": "objects", "colour": 4}
    assert rule_targets("count_to_bar", bar) == {"family": 15, "orientation": 1, "unit": 1, "colour_a": 4}
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        rule_targets("nope", {})


def _params_from_labels(row: np.ndarray) -> tuple[str, dict]:
    """Decode a label row back to a rule instance (the families of the table test)."""
    t = {k: int(v) for k, v in zip(SLOTS, row) if v != UNLABELLED}
    fam = list(FAMILIES)[t["family"]]
    col = lambda k: None if t[k] == NO_COLOUR else t[k]  # noqa: E731
    if fam == "flip_rotate":
        rc = None if t["colour_a"] == NO_COLOUR else [t["colour_a"], t["colour_b"]]
        return fam, {"dihedral": t["dihedral"], "recolour": rc}
    if fam in ("translate", "roll"):
        return fam, {"dr": t["dr"] - 3, "dc": t["dc"] - 3}
    if fam == "gravity":
        return fam, {
            "direction": next(d for d, k in GRAVITY_DIRECTIONS.items() if k == t["direction"]),
            "wall": col("colour_a"),
        }
    assert fam == "colour_map"
    return fam, {"map": {str(c): t[f"lut_{c}"] for c in range(10)}}


def test_rule_label_table_labels_each_augmented_copy_with_the_rule_it_shows(tmp_path):
    fams = ["flip_rotate", "translate", "gravity", "colour_map", "roll"]
    built, paths = built_synthetic_arc(
        tmp_path, fams, num_train=16, num_test=8, num_aug=4, mode="etrm", max_grid=6, seed=3, canvas=10,
        generator_aug=True,
    )  # fmt: skip
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", input_file_prefix=paths["prefix"])
    table = rule_label_table(built, paths["rules"])
    ids = read_identifiers_map(built)
    rules = json.load(open(paths["rules"]))
    raw = {p.name: p for p in puzzles}
    assert table.shape == (len(ids), len(RULE_SLOTS)) and (table[0] == UNLABELLED).all()
    checked = changed = 0
    for i, entry in enumerate(ids):
        if entry is None:
            continue
        if rules[entry["name"]]["subset"] == "evaluation":  # held-out puzzles: never labelled
            assert (table[i] == UNLABELLED).all()
            continue
        fam, params = _params_from_labels(table[i])
        assert fam == rules[entry["name"]]["family"]
        aug, f = entry["augmentation"], rule_apply(fam, params)
        for x, y in raw[entry["name"]].train + raw[entry["name"]].test:  # the copy shows (g(x), g(y))
            got = f(aug.apply(x))
            assert got is not None and np.array_equal(got, aug.apply(y)), (entry, fam, params)
        checked += 1
        changed += not np.array_equal(
            table[i],
            table[
                ids.index(next(e for e in ids if e and e["name"] == entry["name"] and e["augmentation"].is_identity))
            ],
        )
    assert checked == 16 * 5 and changed > 16  # the copies' labels differ from their puzzle's: conjugated


def _open_params_from_labels(row: np.ndarray) -> tuple[str, dict]:
    """Decode a label row of an open family of the open table test back to a rule instance."""
    t = {k: int(v) for k, v in zip(SLOTS, row) if v != UNLABELLED}
    fam = list(ALL_FAMILIES)[t["family"]]
    col = lambda k: None if t[k] == NO_COLOUR else t[k]  # noqa: E731
    if fam == "extend_lines":
        p = {"direction": list(DIRECTIONS)[t["ray"]], "mark": t["colour_a"], "line": t["colour_b"]}
        return fam, dict(p, stop=bool(t["stop"]), **({"block": t["colour_c"]} if t["stop"] else {}))
    if fam == "connect_pairs":
        return fam, {"orientation": ["rows", "columns"][t["orientation"]], "segment": col("colour_a")}
    assert fam == "mirror_complete"
    return fam, {"axis": ["vertical", "horizontal"][t["axis"]], "output": ["full", "patch"][t["output"]],
                 "mask": t["colour_a"]}  # fmt: skip


def test_open_families_are_labelled_with_the_rule_each_copy_shows(tmp_path):
    """The open families' labels (the oracle control on the whole benchmark): decoded back to an instance, each
    training copy's labels reproduce that copy's own demo pairs, so a transposing copy swaps rows and columns and
    a turned one turns the ray."""
    fams = ["extend_lines", "connect_pairs", "mirror_complete"]
    built, paths = built_synthetic_arc(
        tmp_path, fams, num_train=12, num_test=6, num_aug=4, mode="etrm", max_grid=6, seed=1, canvas=10,
        generator_aug=True,
    )  # fmt: skip
    puzzles = load_puzzles(["training", "evaluation"], "evaluation", input_file_prefix=paths["prefix"])
    raw, rules = {p.name: p for p in puzzles}, json.load(open(paths["rules"]))
    table = rule_label_table(built, paths["rules"])
    checked, kinds = 0, set()
    for i, entry in enumerate(read_identifiers_map(built)):
        if entry is None or rules[entry["name"]]["subset"] == "evaluation":
            continue
        fam, params = _open_params_from_labels(table[i])
        assert fam == rules[entry["name"]]["family"]
        aug, f = entry["augmentation"], family_apply(fam, params)
        for x, y in raw[entry["name"]].train + raw[entry["name"]].test:
            got = f(aug.apply(x))
            assert got is not None and np.array_equal(got, aug.apply(y)), (entry, fam, params)
        checked += 1
        kinds.add((fam, params.get("direction", params.get("orientation", params.get("axis")))))
    assert checked >= 12 * 4 and len(kinds) >= 6  # every training copy; several directions / sides


def test_training_labels_never_name_a_held_out_puzzle_even_when_its_demos_are_in_train(tmp_path):
    """A TRM-mode build shows the test puzzles' demo pairs in train/ under the test identifiers: the training
    labels still leave every held-out puzzle unlabelled (its rule would otherwise reach the readout / oracle)."""
    built, paths = built_synthetic_arc(tmp_path, ["gravity"], num_train=6, num_test=4, num_aug=1, mode="trm")
    ids = read_identifiers_map(built)
    in_train = set(np.load(os.path.join(built, "train", "all__puzzle_identifiers.npy")).tolist())
    held = [
        i
        for i in in_train
        if ids[i]
        and ids[i]["name"].endswith("gravity")
        and json.load(open(paths["rules"]))[ids[i]["name"]]["subset"] == "evaluation"
    ]
    assert held  # not vacuous: the held-out puzzles' demos are in train/
    table = rule_label_table(built, paths["rules"])
    assert all((table[i] == UNLABELLED).all() for i in held)
    assert (table[sorted(in_train - set(held) - {0})][:, 0] >= 0).all()
    with pytest.raises(ValueError, match="no 'nope' split"):
        rule_label_table(built, paths["rules"], split="nope")


def test_rule_label_table_errors_name_the_file_and_puzzle(tmp_path):
    built, paths = built_synthetic_arc(tmp_path, ["translate"], num_train=4, num_test=2, num_aug=0, mode="etrm")
    rules = json.load(open(paths["rules"]))
    name = sorted(n for n, r in rules.items() if r["subset"] == "training")[0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({n: r for n, r in rules.items() if n != name}))
    with pytest.raises(ValueError, match=f"bad.json: train puzzle '{name}'.*has no rule"):
        rule_label_table(built, str(bad))
    bad.write_text(json.dumps({**rules, name: {"family": "gravitee", "params": {}}}))
    with pytest.raises(ValueError, match=f"puzzle '{name}': field 'family' = 'gravitee'"):
        rule_label_table(built, str(bad))
    with pytest.raises(ValueError, match="no such file"):
        rule_label_table(built, str(tmp_path / "none.json"))


def test_readout_loss_is_the_mean_cross_entropy_of_the_labelled_slots():
    torch.manual_seed(0)
    head = RuleReadout(2 * 8)
    ctx = torch.randn(3, 2, 8)
    targets = torch.full((3, len(SLOTS)), UNLABELLED)
    targets[0, SLOTS.index("family")] = 1
    targets[0, SLOTS.index("dihedral")] = 6
    targets[1, SLOTS.index("family")] = 2  # sample 2: no labels
    loss, exact = head(ctx, targets)
    logits = head.proj(ctx.flatten(1))
    parts = dict(zip(SLOTS, torch.split(logits, list(RULE_SLOTS.values()), dim=-1)))
    want0 = (
        F.cross_entropy(parts["family"][:1], torch.tensor([1]))
        + F.cross_entropy(parts["dihedral"][:1], torch.tensor([6]))
    ) / 2
    want1 = F.cross_entropy(parts["family"][1:2], torch.tensor([2]))
    assert torch.allclose(loss, torch.stack([want0, want1, torch.tensor(0.0)]), atol=1e-6)
    assert exact[2] == 0
    # unlabelled slots do not matter; exact = every labelled slot named right
    with torch.no_grad():
        head.proj.bias[sum(list(RULE_SLOTS.values())[:3]) :] += 100.0  # slots after family / dihedral
        head.proj.bias[1] += 100.0  # family 1
        head.proj.bias[RULE_SLOTS["family"] + 6] += 100.0  # dihedral 6
    loss2, exact2 = head(ctx, targets)
    assert exact2.tolist() == [1.0, 0.0, 0.0] and loss2[0] < 1e-3 and loss2[2] == 0
    with pytest.raises(ValueError, match="rule targets"):
        head(ctx, targets[:, :3])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the logits stay fp32 under autocast
        loss_bf, _ = head(ctx.bfloat16(), targets)
    assert loss_bf.dtype == torch.float32
    torch.testing.assert_close(loss_bf, head(ctx.bfloat16().float(), targets)[0])


def test_config_refuses_a_readout_without_labels_labels_without_a_readout_and_demos_without_the_oracle():
    with pytest.raises(ConfigError, match="rule_readout=1.0 needs rule_labels"):
        load_config("cfg_science", ["encoder=standard", "encoder.rule_readout=1.0"])
    with pytest.raises(ConfigError, match="oracle_context=true needs rule_labels"):
        load_config("cfg_science", ["encoder=standard", "encoder.oracle_context=true"])
    with pytest.raises(ConfigError, match="oracle_demos=true shows the demos .* needs encoder.oracle_context=true"):
        load_config("cfg_science", ["encoder=standard", "encoder.oracle_demos=true"])
    told = ["encoder=standard", "encoder.oracle_context=true", "rule_labels=r.json"]
    assert load_config("cfg_science", [*told, "encoder.oracle_demos=true"]).encoder.oracle_demos
    assert not load_config("cfg_science", told).encoder.oracle_demos  # told, not shown: the default
    with pytest.raises(ConfigError, match="has no effect"):
        load_config("cfg_science", ["encoder=standard", "rule_labels=r.json"])
    cfg = load_config("cfg_science", ["encoder=standard", "encoder.rule_readout=0.5", "rule_labels=r.json"])
    assert cfg.encoder.rule_readout == 0.5 and cfg.rule_labels == "r.json"
    assert _rule_readout_overrides("/o", 0.0, None) == []
    assert _rule_readout_overrides("/o", 2.0, None) == [
        "encoder.rule_readout=2.0",
        "rule_labels=/o/data/raw/synth_rules.json",
    ]
    with pytest.raises(ScienceError, match="your own puzzles have no rule labels"):
        _rule_readout_overrides("/o", 1.0, "my/prefix")
    with pytest.raises(ScienceError, match=">= 0"):
        _rule_readout_overrides("/o", -1.0, None)


TINY = [
    *TINY_ETRM,
    "log_interval=10",
    "diag_interval=10",
    "device=cpu",
    "checkpoint_every=null",
    "lr=3e-3",
    "lr_warmup_steps=1",
]


@pytest.fixture(scope="module")
def tiny_synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("rule readout")
    built, paths = built_synthetic_arc(
        d, ["flip_rotate", "gravity"], num_train=12, num_test=4, num_aug=2, mode="etrm", seed=2, generator_aug=True
    )
    return d, built, paths["rules"]


def test_the_readout_weight_adds_its_loss_to_the_step_loss(tiny_synthetic):
    """The config's weight reaches the loss head: loss(w) = loss(0) + w * sum of the per-sample readout losses of
    the head on the same context, and the labels reach the encoder's head from the batch. The head does not change
    the initialisation of the rest of the model (same seed, same weights: runs with and without it compare)."""
    from dataset.loader import create_dataloader  # noqa: PLC0415 - test-only imports
    from training.build import build_etrm_model, build_loss_head  # noqa: PLC0415

    d, built, rules = tiny_synthetic
    loader, meta = create_dataloader(dict(data_paths=[built], global_batch_size=8, encoder_mode=True))
    batch = {k: torch.as_tensor(v) for k, v in next(iter(loader))[1].items()}
    table = torch.as_tensor(rule_label_table(built, rules))
    batch["rule_targets"] = table[batch["puzzle_identifiers"].long()]
    assert (batch["rule_targets"][:, 0] >= 0).all()
    losses = {}
    for w in (0.0, 2.5):
        cfg = load_config(
            "cfg_science",
            ["encoder=standard", *TINY, f"data_paths=[{built}]"]
            + ([f"encoder.rule_readout={w}", f"rule_labels={rules}"] if w else []),
        )
        torch.manual_seed(0)
        model = build_etrm_model(cfg, meta, batch_size=8, verbose=False)
        head = build_loss_head(model)
        assert ("rule_readout" in head.extra_loss_weights) == (w > 0)
        _, loss, metrics, out, _ = head(head.initial_carry(batch), batch, return_keys=("encoder_context",))
        losses[w] = (loss, metrics, out, model)
    loss, metrics, out, model = losses[2.5]
    per_sample, exact = model.encoder.rule_head(out["encoder_context"], batch["rule_targets"])
    assert torch.allclose(metrics["rule_readout"], per_sample.sum(), atol=1e-5)
    assert torch.allclose(loss, losses[0.0][0] + 2.5 * per_sample.sum(), atol=1e-4)
    assert metrics["rule_exact"] == exact.sum() and "rule_readout" not in losses[0.0][1]
    base = losses[0.0][3].state_dict()
    assert all(torch.equal(v, base[k]) for k, v in model.state_dict().items() if "rule_head" not in k)


def test_within_class_share_is_zero_for_one_context_per_class_and_near_one_for_a_context_that_ignores_it():
    from experiments.science.readout import within_class_share  # noqa: PLC0415 - test-only import

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (400,), generator=g)
    codes = torch.randn(4, 6, generator=g)
    assert within_class_share(codes[labels], labels) == 0.0  # the oracle's table: one context per class
    noise = torch.randn(400, 6, generator=g)
    assert 0.97 < within_class_share(noise, labels) <= 1.0  # ignores the class: ~1 - (classes - 1) / n
    mixed = codes[labels] + 0.1 * noise
    want = (
        sum((mixed[labels == c] - mixed[labels == c].mean(0)).square().sum() for c in range(4))
        / (mixed - mixed.mean(0)).square().sum()
    )
    assert abs(within_class_share(mixed, labels) - float(want)) < 1e-9 and within_class_share(mixed, labels) < 0.05


@pytest.mark.slow
def test_a_run_with_the_readout_learns_to_name_the_rules_and_evaluates_without_labels(tiny_synthetic, tmp_path):
    from evaluate import EvaluateConfig, run  # noqa: PLC0415 - test-only import
    from training.loop import train  # noqa: PLC0415

    d, built, rules = tiny_synthetic
    ck = tmp_path / "ck"
    cfg = load_config(
        "cfg_science",
        [
            "encoder=standard",
            *TINY,
            f"data_paths=[{built}]",
            f"checkpoint_path={ck}",
            "max_steps=200",
            "arch=trm_grid",  # the pooled core the thresholds below were measured with
            "encoder.rule_readout=1.0",
            f"rule_labels={rules}",
        ],
    )
    summary = train(cfg)
    rows = [json.loads(line) for line in open(ck / "metrics.jsonl") if '"train/rule_readout"' in line]
    assert [r["step"] for r in rows] == list(range(10, 201, 10))
    # 12 puzzles x 3 copies: the head learns to name them (family, map / direction, colours)
    assert rows[-1]["train/rule_readout"] < 0.5 * rows[0]["train/rule_readout"]
    assert rows[-1]["train/rule_exact"] > rows[0]["train/rule_exact"] + 0.2
    m = run(
        EvaluateConfig(
            checkpoint=str(ck), data_path=built, output_dir=str(tmp_path / "ev"), device="cpu", progress=False
        )
    )
    assert m["ARC/num_puzzles"] == 4 and 0.0 <= m["ARC/pass@1"] <= 1.0
    assert summary["exit_status"] == 0
    # the context carries every slot the head learned to name (a context that ignored a slot, or contexts paired
    # with the wrong labels, leave ~all of its variance inside the slot's classes); the maps most clearly (0.23)
    from experiments.science.readout import main as readout_main  # noqa: PLC0415 - test-only import

    sep = readout_main([str(ck), "--data", built, "--rules", rules, "--split", "train", "--separation"])
    assert sep["n"] > 36 and set(sep["slots"]) >= {"family", "dihedral", "direction"}
    assert sep["slots"]["family"]["classes"] == 2 and all(r["within"] < 0.85 for r in sep["slots"].values()), sep
    assert sep["slots"]["dihedral"]["within"] < 0.4, sep


@pytest.mark.slow
def test_science_command_with_the_readout_reports_what_the_context_names(tmp_path, capsys):
    """--rule-readout W trains with the readout (labels from the builder's rules.json) and science.md gets the
    per-family readout table; experiments.science.readout gives the same numbers from the command line."""
    from experiments.science.cli import main  # noqa: PLC0415 - test-only imports
    from experiments.science.readout import main as readout_main  # noqa: PLC0415

    out = tmp_path / "s"
    args = [
        "--families",
        "flip_rotate",
        "gravity",
        "--num-train",
        "12",
        "--num-test",
        "4",
        "--num-aug",
        "1",
        "--steps",
        "6",
        "--canvas-size",
        "8",
        "--max-grid",
        "5",
        "--encoders",
        "standard",
        "--rule-readout",
        "0.5",
    ]
    res = main(["--out", str(out)] + args + [a for o in TINY_ETRM for a in ("--override", o)])
    run = res["runs"]["standard"]
    log = open(out / "runs" / "standard" / "train.log").read()
    assert "encoder.rule_readout=0.5" in log and "rule readout: labels of 24 training identifiers" in log
    held = run["rule_readout"]["heldout"]
    assert set(held["families"]) == {"flip_rotate", "gravity"} and held["split"] == "test"
    n_test = len(np.load(out / "data" / "built" / "test" / "all__inputs.npy"))  # every query of every copy
    assert held["all"]["n"] == sum(f["n"] for f in held["families"].values()) == n_test >= 8
    assert set(held["families"]["gravity"]["slots"]) == {"family", "direction", "colour_a"}
    assert run["rule_readout"]["train"]["all"]["n"] > 24
    md = open(out / "science.md").read()
    assert "**Rule readout, standard**" in md and "| gravity | " in md
    capsys.readouterr()
    cli = readout_main(
        [
            str(out / "runs" / "standard" / "checkpoint"),
            "--data",
            str(out / "data" / "built"),
            "--rules",
            str(out / "data" / "raw" / "synth_rules.json"),
        ]
    )
    assert cli == json.loads(json.dumps(held)) and "rule named" in capsys.readouterr().out
    saved = json.load(open(out / "science.json"))
    assert saved["runs"]["standard"]["rule_readout"]["heldout"] == cli


def test_oracle_context_is_the_embedding_of_the_true_rule_and_ignores_the_demos(tiny_synthetic):
    """encoder.oracle_context (the science control's upper bound): the core's context is the sum of learned
    embeddings of the sample's rule labels; the demos do not matter, another label changes it, unlabelled slots add
    nothing, and a batch without labels (evaluation) gets a zero context."""
    from dataset.loader import create_dataloader  # noqa: PLC0415 - test-only imports
    from training.build import build_etrm_model, build_loss_head, with_rule_targets  # noqa: PLC0415

    d, built, rules = tiny_synthetic
    loader, meta = create_dataloader(dict(data_paths=[built], global_batch_size=8, encoder_mode=True))
    batch = {k: torch.as_tensor(v) for k, v in next(iter(loader))[1].items()}
    labelled = with_rule_targets(batch, torch.as_tensor(rule_label_table(built, rules)))
    cfg = load_config(
        "cfg_science",
        ["encoder=standard", *TINY, f"data_paths=[{built}]", "encoder.oracle_context=true", f"rule_labels={rules}"],
    )
    model = build_etrm_model(cfg, meta, batch_size=8, verbose=False)
    head = build_loss_head(model)

    def context(b):
        return head(head.initial_carry(b), b, return_keys=("encoder_context",))[3]["encoder_context"]

    ctx = context(labelled)
    t = labelled["rule_targets"]
    oracle = model.encoder.rule_oracle
    offsets = oracle.offsets.tolist()
    want = torch.stack([sum(oracle.table[offsets[j] + int(v)] for j, v in enumerate(row) if v >= 0) for row in t])
    torch.testing.assert_close(ctx, want.view_as(ctx))
    shuffled = dict(labelled, demo_inputs=labelled["demo_inputs"].flip(0), demo_labels=labelled["demo_labels"].flip(0))
    torch.testing.assert_close(context(shuffled), ctx)
    other = t.clone()
    other[0, SLOTS.index("family")] = (int(t[0, 0]) + 1) % len(FAMILIES)
    assert not torch.allclose(context(dict(labelled, rule_targets=other))[0], ctx[0])
    assert torch.count_nonzero(context(batch)) == 0


def test_an_oracle_run_is_evaluated_on_the_labels_of_the_evaluated_puzzles(tiny_synthetic, tmp_path, monkeypatch):
    """evaluate.py rule_labels=...: an oracle_context checkpoint's evaluation batches carry the rule labels of the
    held-out puzzles (each augmented copy's own), so its context is the oracle's embedding of their rule; evaluating
    an oracle run without labels, or giving labels to another run, is refused by name."""
    from evaluators.data import build_eval_loader  # noqa: PLC0415
    from training import evaluation as ev  # noqa: PLC0415 - test-only imports (evaluate.py's body)
    from training.loop import train  # noqa: PLC0415

    d, built, rules = tiny_synthetic
    ck = tmp_path / "oracle"
    train(
        load_config(
            "cfg_science",
            [
                "encoder=standard",
                *TINY,
                f"data_paths=[{built}]",
                f"checkpoint_path={ck}",
                "max_steps=2",
                "encoder.oracle_context=true",
                f"rule_labels={rules}",
            ],
        )
    )
    cfg = ev.EvaluateConfig(
        checkpoint=str(ck),
        data_path=built,
        output_dir=str(tmp_path / "ev"),
        device="cpu",
        progress=False,
        rule_labels=rules,
    )
    seen = []

    class Spy(ev._LabelledLoader):
        def __iter__(self):
            for item in super().__iter__():
                seen.append(item[1]["rule_targets"])
                yield item

    monkeypatch.setattr(ev, "_LabelledLoader", Spy)
    m = ev.run(cfg)
    assert m["ARC/num_puzzles"] == 4 and seen and all((t[:, 0] >= 0).any() for t in seen)  # every batch labelled
    with pytest.raises(ev.EvaluateError, match="oracle_context run .*needs rule_labels"):
        ev.run(cfg.model_copy(update={"rule_labels": None, "output_dir": str(tmp_path / "ev2")}))
    plain = tmp_path / "plain"
    train(
        load_config(
            "cfg_science",
            ["encoder=standard", *TINY, f"data_paths=[{built}]", f"checkpoint_path={plain}", "max_steps=1"],
        )
    )
    with pytest.raises(ev.EvaluateError, match="only an encoder.oracle_context run reads rule labels"):
        ev.run(cfg.model_copy(update={"checkpoint": str(plain), "output_dir": str(tmp_path / "ev3")}))
    # what the evaluation feeds the model: the test split's labels, and the context is their embedding
    head, _, _, info = ev.load_model(cfg, ev.load_metadata(os.path.join(built, "test")), 8, "cpu")
    table = ev._oracle_labels(cfg, info)
    assert torch.equal(table, torch.as_tensor(rule_label_table(built, rules, split="test")))
    loader, _ = build_eval_loader(built, 8, encoder_mode=True)
    _, batch, _ = next(iter(ev._LabelledLoader(loader, table)))
    t = batch["rule_targets"]
    real = batch["puzzle_identifiers"] > 0
    assert torch.equal(t, table[batch["puzzle_identifiers"].long()]) and (t[real, 0] >= 0).all() and real.any()
    with torch.no_grad():
        ctx = head(head.initial_carry(batch), batch, return_keys=("encoder_context",))[3]["encoder_context"]
    torch.testing.assert_close(ctx, head.model.encoder.rule_oracle(t).view_as(ctx))


def test_the_science_command_evaluates_an_oracle_run_with_its_rule_labels():
    over = ["encoder.oracle_context=true", "rule_labels=/x/synth_rules.json", "arch.hidden_size=32"]
    oracle, plain = {"encoder": {"oracle_context": True}}, {"encoder": {"oracle_context": False}}
    assert oracle_eval_overrides(oracle, over, ["batch_size=8"]) == ["batch_size=8", "rule_labels=/x/synth_rules.json"]
    assert oracle_eval_overrides(plain, over, ["batch_size=8"]) == ["batch_size=8"]

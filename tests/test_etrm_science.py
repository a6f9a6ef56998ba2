"""ETRM science (experiments/science/).

The science command (``python -m experiments.science``): builder ->
pretrain_encoder.py -> evaluate.py -> per-family table, end to end on a tiny setting; the table's arithmetic by hand;
the zero-demo control's predictions do not depend on the demos; the recolour check's data. The learning-threshold
claims (a model trained by the real loop answers held-out rules above the control) are the science floors,
``python -m experiments.science.floors`` (tests/test_science_floors.py)."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from dataset.canvas import canvas_to_grid
from dataset.families import ALL_FAMILIES
from dataset.loader import create_dataloader
from dataset.synthetic_rules import FAMILIES
from evaluate import EvaluateConfig, run
from evaluators.data import build_eval_loader
from experiments.science.cli import main
from experiments.science.common import CONTROL, ENCODERS, ONE_COPY_TABLE, PROGRAM, SEARCH, ScienceError
from experiments.science.recolour import write_recolour_dataset
from experiments.science.report import family_table, puzzle_scores
from experiments.science.run import run_plan
from tests.toy_data import TINY_ETRM, tiny_metadata
from training.build import build_etrm_model, load_model_for_inference
from training.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_recolour_dataset_is_few_shot_and_heldout(tmp_path):
    info = write_recolour_dataset(
        str(tmp_path / "d"),
        grid=3,
        num_colours=5,
        num_test_instances=4,
        train_puzzles_per_instance=2,
        test_puzzles_per_instance=2,
        seed=3,
    )
    assert not set(map(tuple, info["train_instances"])) & set(map(tuple, info["test_instances"]))
    assert info["chance"] == pytest.approx(1 / 16)  # a in 1..4, b in 0..4, b != a
    loader, meta = create_dataloader(
        dict(data_paths=[str(tmp_path / "d")], global_batch_size=4, test_mode=True, encoder_mode=True), "test"
    )
    assert meta.seq_len == 16 and meta.has_demos
    n = 0
    for _, batch, _ in loader:
        for i in range(batch["inputs"].shape[0]):
            if batch["example_index"][i] < 0:
                continue
            n += 1
            x = canvas_to_grid(batch["inputs"][i].numpy(), size=4)
            y = canvas_to_grid(np.where(batch["labels"][i].numpy() < 0, 0, batch["labels"][i].numpy()), size=4)
            changed = {(int(a), int(b)) for a, b in zip(x.ravel(), y.ravel()) if a != b}
            assert len(changed) == 1  # exactly one colour a is repainted b
            ((a, b),) = changed
            assert (a, b) in set(map(tuple, info["test_instances"]))
            for d in range(int(batch["demo_mask"][i].sum())):  # the demos show the same rule
                dx = canvas_to_grid(batch["demo_inputs"][i, d].numpy(), size=4)
                dy = canvas_to_grid(batch["demo_labels"][i, d].numpy(), size=4)
                assert np.array_equal(np.where(dx == a, b, dx), dy)
    assert n == 4 * 2


# ---------------------------------------------------------------------------------------------------------------
# The science command
# ---------------------------------------------------------------------------------------------------------------
def test_family_table_by_hand():
    rules = {
        "a1": {"subset": "evaluation", "family": "fa"},
        "a2": {"subset": "evaluation", "family": "fa"},
        "b1": {"subset": "evaluation", "family": "fb"},
        "t1": {"subset": "training", "family": "fa"},
        "t2": {"subset": "training", "family": "fc"},
    }  # fc: no held-out instance left
    row = lambda *ranks: [{"test_index": i, "correct_rank": r} for i, r in enumerate(ranks)]  # noqa: E731
    pred = {
        "x": {"a1": row(1), "a2": row(2, None), "b1": row(3)},
        "y": {"a1": row(None), "a2": row(1, 1), "b1": row(2)},
    }
    assert puzzle_scores(row(2, None)) == (0.0, 0.5) and puzzle_scores(row(1, 2)) == (0.5, 1.0)
    t = family_table(rules, pred, holdout_families=["fb"])
    assert [(f, t[f]["count"], t[f]["heldout_family"]) for f in ("fa", "fb", "fc", "all")] == [
        ("fa", 2, False),
        ("fb", 1, True),
        ("fc", 0, False),
        ("all", 3, False),
    ]
    assert t["fa"]["runs"]["x"] == {"pass@1": 0.5, "pass@2": 0.75}  # (1 + 0) / 2, (1 + 0.5) / 2
    assert t["fb"]["runs"]["x"] == {"pass@1": 0.0, "pass@2": 0.0}
    assert t["all"]["runs"]["x"] == {"pass@1": pytest.approx(1 / 3), "pass@2": pytest.approx(1.5 / 3)}
    assert t["fa"]["runs"]["y"] == {"pass@1": 0.5, "pass@2": 0.5} and t["fb"]["runs"]["y"]["pass@2"] == 1.0
    with pytest.raises(ScienceError, match="missing \\['b1'\\]"):
        family_table(rules, {"x": {"a1": row(1), "a2": row(1)}})
    with pytest.raises(ScienceError, match="unexpected \\['t1'\\]"):
        family_table(rules, {"x": dict(pred["x"], t1=row(1))})


def test_headline_row_is_over_the_headline_families_only(tmp_path):
    """Benchmark v2: roll (the wrapped shift) is in the table but outside the headline. The headline row counts the
    held-out (and train-fit) puzzles of the headline families only, the total row every puzzle; the markdown marks
    roll as outside; compare's bold column is the headline; the default data are the 9 families with 20 held-out
    puzzles each, recorded as benchmark 2, and an --out built on benchmark 1 is refused."""
    from experiments.science import compare
    from experiments.science.data import _build_once, headline_families
    from experiments.science.report import _family_lines
    from experiments.science.settings import ScienceSettings

    rules = {
        "c1": {"subset": "evaluation", "family": "colour_map"},
        "c2": {"subset": "evaluation", "family": "colour_map"},
        "r1": {"subset": "evaluation", "family": "roll"},
        "t1": {"subset": "training", "family": "colour_map"},
        "t2": {"subset": "training", "family": "roll"},
    }
    row = lambda *ranks: [{"test_index": i, "correct_rank": r} for i, r in enumerate(ranks)]  # noqa: E731
    pred = {"x": {"c1": row(1), "c2": row(None), "r1": row(1)}}
    fit = (["t1", "t2"], {"x": {"t1": row(None), "t2": row(1)}})
    t = family_table(rules, pred, train_fit=fit, headline=["colour_map"])
    assert list(t) == ["colour_map", "roll", "headline", "all"]
    assert t["headline"]["count"] == 2 and t["headline"]["families"] == ["colour_map"] and t["all"]["count"] == 3
    assert t["headline"]["runs"]["x"]["pass@1"] == 0.5 and t["all"]["runs"]["x"]["pass@1"] == pytest.approx(2 / 3)
    assert t["headline"]["train_count"] == 1 and t["headline"]["train_runs"]["x"]["pass@1"] == 0.0
    assert "headline" not in family_table(rules, pred)  # no headline given: the total row is the headline
    result = {"families": t, "runs": {"x": {"status": "ok"}}, "settings": {"data": {}}}
    md = "\n".join(_family_lines(result))
    assert "| roll (outside the headline) | 1 |" in md and "| **headline** (colour_map) | 2 |" in md
    assert "| all (every family) | 3 |" in md
    # compare: the bold column is the headline, the total next to it
    res = {"settings": {"data": {"seed": 0}}, "families": t, "runs": {"x": {"status": "ok", "steps": 4}}}
    (tmp_path / "d").mkdir()
    json.dump(res, open(tmp_path / "d" / "science.json", "w"))
    lines = compare.render(compare.load_rows([str(tmp_path / "d")])).splitlines()
    head = [c.strip() for c in lines[2].split("|")[1:-1]]
    body = [c.strip() for c in lines[4].split("|")[1:-1]]
    assert head[5:] == ["**headline**", "all", "colour_map", "roll"] and body[5:7] == ["**0.50 / 0.00**", "0.67 / 0.50"]
    # which families make the headline
    assert headline_families(list(FAMILIES)) == [f for f in FAMILIES if f != "roll"] and len(FAMILIES) == 9
    assert headline_families(["translate", "roll"]) == ["translate"]
    assert headline_families(["translate", "gravity"]) is None and headline_families(["roll"]) is None
    # the defaults and the benchmark version
    fams, _ = ScienceSettings(out="o").check()
    data = ScienceSettings(out="o").synthetic_data(fams)
    assert fams == list(ALL_FAMILIES) and data["num_test"] == 320 and data["num_train"] == 1600
    assert data["benchmark"] == 3 and len(ALL_FAMILIES) == 16
    out = tmp_path / "old"
    (out / "data").mkdir(parents=True)
    json.dump({k: v for k, v in data.items() if k != "benchmark"}, open(out / "data" / "settings.json", "w"))
    with pytest.raises(ScienceError, match="holds data of synthetic benchmark v1, this command builds v3"):
        _build_once(str(out), data, ["false"], what="x", no_train=False)


@pytest.mark.parametrize("name", list(ENCODERS) + [CONTROL, "dihedral_views"])
def test_science_config_builds_every_run(name):
    """config/cfg_science.yaml (the recipe) composes with every run of the table, and with a registered variant
    named by --encoders (dihedral_views), and builds a valid ETRM (strict config validation, pitfall 8) on a
    canvas-8 dataset."""
    encoder, extra = run_plan(name)
    cfg = load_config("cfg_science", ["data_paths=[unused]", f"encoder={encoder}", *extra])
    assert cfg.encoder.name == name if name != CONTROL else cfg.encoder.name == "standard"
    assert bool(cfg.encoder.zero_demos) == (name == CONTROL)
    assert cfg.arch.name == "trm_local" and cfg.arch.cell_descriptor and cfg.arch.grid_gather  # no family operator (46)
    a = cfg.arch  # arch=trm_counted_roles: the counted form in the demos' frame, 2 rounds, its read recoloured,
    assert a.gather_demo_form and a.gather_demo_form_frame and a.gather_demo_form_colour  # counted over roles too
    assert a.gather_demo_form_roles
    assert a.gather_demo_form_rounds == 2
    # the sample budget of every v3 figure (batch 64 x 2000 steps), since 2026-12-08 in smaller steps (docs/science.md)
    assert (cfg.global_batch_size, cfg.max_steps) == (32, 4000)
    meta = tiny_metadata(seq_len=64, num_puzzle_identifiers=5, total_groups=1, grid_size=8, has_demos=True, max_demos=3)
    model = build_etrm_model(cfg, meta, batch_size=2, verbose=False)
    assert model.encoder.seq_len == 64


@pytest.mark.parametrize(
    "args, message",
    [
        (["--override", "+encoder.nope=1"], "unknown key 'encoder.nope' (value 1)"),
        (["--override", "+arch.nope=1"], "unknown key 'arch.nope'"),
        (["--override", "nope=1"], "Could not override 'nope'"),
        (["--encoders", "standard", "lpm"], "unknown run 'lpm'"),
        (["--families", "gravity", "gravitee"], "unknown family 'gravitee'"),
        (["--steps", "0"], "--steps must be > 0"),
    ],
)
def test_bad_input_fails_at_once_and_writes_nothing(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "out")] + args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_the_command_line_becomes_one_settings_object():
    """argparse -> ScienceSettings in one place (cli.settings_from_args): the options' defaults are the settings'
    defaults, every option reaches its field, a Python caller's lists become tuples, and the checks name the
    option."""
    from experiments.science.cli import build_parser, settings_from_args
    from experiments.science.settings import ScienceSettings

    assert settings_from_args(build_parser().parse_args(["--out", "o"])) == ScienceSettings(out="o")
    argv = [
        "--out",
        "o",
        "--encoders",
        "lpn",
        CONTROL,
        "--input-file-prefix",
        "p",
        "--groups",
        "g.json",
        "--steps",
        "3",
        "--canvas-size",
        "9",
        "--num-aug",
        "2",
        "--train-fit-puzzles",
        "4",
        "--no-train",
        "--curve",
        "--rule-readout",
        "0.5",
        "--halting-step",
        "--seed",
        "3",
        "--override",
        "lr=1",
        "--override",
        "ema=true",
        "--eval-override",
        "batch_size=8",
        "--config",
        "cfg_pretrain",
    ]
    s = settings_from_args(build_parser().parse_args(argv), "the command")
    assert s == ScienceSettings(
        out="o",
        encoders=["lpn", CONTROL],
        input_file_prefix="p",
        groups_file="g.json",
        steps=3,
        canvas_size=9,
        num_aug=2,
        train_fit_puzzles=4,
        no_train=True,
        curve=True,
        rule_readout=0.5,
        halting_step=True,
        seed=3,
        overrides=["lr=1", "ema=true"],
        eval_overrides=["batch_size=8"],
        config="cfg_pretrain",
        command="the command",
    )
    assert s.encoders == ("lpn", CONTROL) and s.files_num_aug == 2 and s.check()[1] == ["lpn", CONTROL]
    with pytest.raises(ScienceError, match="--input-file-prefix and --holdout-families are mutually exclusive"):
        ScienceSettings(out="o", input_file_prefix="p", holdout_families=["gravity"]).check()
    fams, names = ScienceSettings(out="o", families=["gravity"], holdout_families=["colour_map"]).check()
    assert fams == ["gravity", "colour_map"] and names == ["standard", CONTROL]


FAMS = ["colour_map", "flip_rotate"]
ARGS = [
    "--families",
    *FAMS,
    "--num-train",
    "16",
    "--num-test",
    "6",
    "--num-aug",
    "2",
    "--steps",
    "4",
    "--canvas-size",
    "8",
    "--max-grid",
    "5",
] + [a for o in TINY_ETRM for a in ("--override", o)]


@pytest.fixture(scope="module")
def science_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("science out,x=1")  # the paths reach Hydra overrides: quoted
    res = main(["--out", str(out)] + ARGS)
    return str(out), res


@pytest.mark.slow
def test_science_command_table_counts_every_heldout_puzzle_once(science_out, capsys):
    out, res = science_out
    saved = json.load(open(os.path.join(out, "science.json")))
    md = open(os.path.join(out, "science.md")).read()
    assert saved["families"] == json.loads(json.dumps(res["families"])) and "| **all** | 6 |" in md
    # 4 steps fit nothing: the table says so for the encoder run, not for the control (expected low)
    assert res["runs"]["standard"]["train_exact"] < 0.5
    assert "**Not fitted** (train exact under 0.5): standard (" in md and "control (" not in md
    assert saved["settings"]["data"]["canvas_size"] == 8 and saved["settings"]["encoders"] == ["standard", CONTROL]
    rules = json.load(open(os.path.join(out, "data", "raw", "synth_rules.json")))
    heldout = [p for p, r in rules.items() if r["subset"] == "evaluation"]
    assert len(heldout) == 6 and sorted(res["families"]) == sorted(FAMS + ["all"])
    assert sum(res["families"][f]["count"] for f in FAMS) == res["families"]["all"]["count"] == 6
    for f in FAMS:
        assert res["families"][f]["count"] == sum(rules[p]["family"] == f for p in heldout)
    for name in ("standard", CONTROL):
        r = res["runs"][name]
        assert r["status"] == "ok" and r["steps"] == 4 and r["metrics"]["ARC/num_puzzles"] == 6
        assert r["zero_demos"] == (name == CONTROL)
        # independent recount from evaluate.py's predictions.json, family from the puzzle name's suffix
        pred = json.load(open(os.path.join(out, "runs", name, "eval", "predictions.json")))
        assert sorted(pred) == sorted(heldout)
        for f in FAMS:
            names = [p for p in pred if p.endswith("-" + f)]
            p1 = np.mean([np.mean([row["correct_rank"] == 1 for row in pred[p]]) for p in names])
            row = res["families"][f]["runs"][name]
            assert row["pass@1"] == pytest.approx(p1) and row["pass@2"] >= row["pass@1"]
        # the run really went through pretrain_encoder.py with the control's override and the user's overrides
        log = open(os.path.join(out, "runs", name, "train.log")).read()
        assert "pretrain_encoder.py --config-name cfg_science" in log and "arch.hidden_size=32" in log
        assert ("encoder.zero_demos=true" in log) == (name == CONTROL)
    # the search row (no weights, no candidate): per family, the share of puzzles a direct call answers
    from dataset.arc_sources import load_kaggle_subset
    from experiments.science.pointer import search_predictions

    puzzles = load_kaggle_subset(os.path.join(out, "data", "raw", "synth"), "evaluation")
    direct = search_predictions([p for p in puzzles if p.name in heldout], 8)
    assert sorted(direct) == sorted(heldout) and res["runs"][SEARCH]["program"] is True
    for f in FAMS:
        want = np.mean([np.mean([x["correct_rank"] == 1 for x in direct[p]]) for p in direct if p.endswith("-" + f)])
        assert res[ONE_COPY_TABLE][f]["runs"][SEARCH]["pass@1"] == pytest.approx(want)
    assert f" {SEARCH} |" in md  # a column of the tables
    # resumable: nothing is trained or evaluated again; other settings in the same --out are refused
    mtimes = {run: os.path.getmtime(os.path.join(out, "runs", run, "train.log")) for run in ("standard", CONTROL)}
    capsys.readouterr()
    again = main(["--out", out] + ARGS)
    text = capsys.readouterr().out
    assert text.count("training finished earlier") == 2
    assert text.count("evaluation of the held-out puzzles exists, reused") == 2
    assert text.count("evaluation of the train-fit set (16 training puzzles) exists, reused") == 2
    assert again["families"] == res["families"]
    assert mtimes == {run: os.path.getmtime(os.path.join(out, "runs", run, "train.log")) for run in mtimes}
    with pytest.raises(SystemExit) as e:
        main(["--out", out] + [("5" if a == "4" and ARGS[i - 1] == "--steps" else a) for i, a in enumerate(ARGS)])
    assert e.value.code == 2 and "steps=4" in capsys.readouterr().err


def _shuffle_heldout_demos(built, dst):
    """A copy of the built data whose held-out (test split) demo pairs are permuted across puzzles."""
    shutil.copytree(built, dst)
    di = np.load(os.path.join(built, "test", "all__demo_inputs.npy"))
    dl = np.load(os.path.join(built, "test", "all__demo_labels.npy"))
    perm = np.random.default_rng(0).permutation(len(di))
    assert (di[perm] != di).any(axis=1).mean() > 0.8  # most demo slots now hold another puzzle's pair
    np.save(os.path.join(dst, "test", "all__demo_inputs.npy"), di[perm])
    np.save(os.path.join(dst, "test", "all__demo_labels.npy"), dl[perm])
    return dst


@pytest.mark.slow
def test_zero_demo_control_predictions_do_not_depend_on_the_demos(science_out, tmp_path):
    """The trained checkpoints on the held-out puzzles, with their demos and with other puzzles' demos: the
    control's outputs (logits, q) and evaluate.py predictions are identical, the standard encoder's logits are not
    (the check can see demo information: it would fail if zero_demos leaked any)."""
    out, _ = science_out
    built = os.path.join(out, "data", "built")
    other = _shuffle_heldout_demos(built, str(tmp_path / "shuffled"))
    ck = lambda name: os.path.join(out, "runs", name, "checkpoint")  # noqa: E731

    @torch.no_grad()
    def outputs(name, data):
        model, cfg, _ = load_model_for_inference(ck(name), use_ema=False, batch_size=8)
        model.eval()
        loader, _ = build_eval_loader(data, 8, encoder_mode=True, max_demos=cfg.max_demos)
        logits, q = [], []
        for _, batch, _ in loader:
            carry = model.initial_carry(batch)
            for _ in range(cfg.arch.halt_max_steps):
                carry, o = model(carry, batch)
            logits.append(o["logits"])
            q.append(o["q_halt_logits"])
        return torch.cat(logits), torch.cat(q)

    (lc, qc), (lc2, qc2) = outputs(CONTROL, built), outputs(CONTROL, other)
    assert torch.equal(lc, lc2) and torch.equal(qc, qc2)
    (ls, _), (ls2, _) = outputs("standard", built), outputs("standard", other)
    assert ls.shape == ls2.shape == lc.shape and (ls - ls2).abs().max() > 1e-4

    def predictions(data):
        d = str(tmp_path / f"pred-{os.path.basename(data)}")
        run(
            EvaluateConfig(
                checkpoint=ck(CONTROL),
                data_path=data,
                output_dir=d,
                device="cpu",
                progress=False,
                num_pictures=0,
                rank_malformed=True,
            )
        )
        return json.load(open(os.path.join(d, "predictions.json")))

    assert predictions(built) == predictions(other)


@pytest.mark.slow
def test_compare_puts_science_runs_side_by_side(science_out, tmp_path, capsys):
    """experiments.science.compare on the command's real science.json and an edited copy of it (another
    override, an evaluation override, other scores): every cell is the family table's pass@1 (held-out / train
    fit), a row names only what it changes from the baseline (evaluate.py's overrides as eval:key=value), s/step
    is the run's own, and --runs picks runs."""
    from experiments.science import compare

    out, res = science_out
    saved = json.load(open(os.path.join(out, "science.json")))
    other = tmp_path / "f8-lr"
    other.mkdir()
    saved["settings"]["overrides"] = saved["settings"]["overrides"] + ["lr=2e-3", "seed=1", "checkpoint_every=1000"]
    saved["settings"]["eval_overrides"] = ["use_ema=false"]
    saved["families"]["flip_rotate"]["runs"]["standard"]["pass@1"] = 0.75
    saved["runs"]["standard"]["train_seconds"] = 8.0
    json.dump(saved, open(other / "science.json", "w"))
    md = compare.main([out, str(other), "--runs", "standard", "--out", str(tmp_path / "t.md")])
    assert open(tmp_path / "t.md").read() == md == capsys.readouterr().out
    rows = [line for line in md.splitlines() if line.startswith("| ") and "standard" in line]
    assert len(rows) == 2 and "control" not in md  # --runs standard
    fam = res["families"]
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    want = {
        f: f"{fam[f]['runs']['standard']['pass@1']:.2f} / {fam[f]['train_runs']['standard']['pass@1']:.2f}"
        for f in ("all", "colour_map", "flip_rotate")
    }
    assert cells[5] == f"**{want['all']}**" and cells[6:] == [want["colour_map"], want["flip_rotate"]]
    assert cells[1] == "(baseline) " + " ".join(f"`{o}`" for o in res["settings"]["overrides"]) and cells[2] == "0, 0"
    r = res["runs"]["standard"]
    assert cells[3] == "4" and cells[4] == f"{r['train_seconds'] / 4:.2f}"
    edited = [c.strip() for c in rows[1].split("|")[1:-1]]
    assert edited[1] == "`lr=2e-3` `seed=1` `eval:use_ema=false`" and edited[2] == "0, 1" and edited[4] == "2.00"
    assert edited[7].startswith("0.75 / ") and edited[6] == cells[6]
    assert sorted(r["run"] for r in compare.load_rows([out])) == sorted(["standard", CONTROL, PROGRAM, SEARCH])  # all
    with pytest.raises(ScienceError, match="nowhere/science.json"):
        compare.load_rows([str(tmp_path / "nowhere")])
    with pytest.raises(ScienceError, match="no scored run named lpn"):
        compare.load_rows([out], ["lpn"])


@pytest.mark.slow
def test_halting_step_scores_each_run_where_its_q_head_halts(science_out, tmp_path):
    """--halting-step: every run is evaluated a second time with evaluate.py halt_early=true, and the second
    per-family table is those predictions. A copy of the trained runs whose Q head is made to halt at once
    (q_halt bias +20, weights 0): the halting-step evaluation runs 1 ACT step (the every-step one 2), and its
    table's numbers are a direct evaluate.py halt_early=true run's."""
    from experiments.science.report import HALTING_TABLE

    out, _ = science_out
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    ck_dir = os.path.join(copy, "runs", "standard", "checkpoint")
    path = [os.path.join(ck_dir, f) for f in os.listdir(ck_dir) if f.startswith("step_")][0]
    state = torch.load(path, map_location="cpu", weights_only=False)
    keys = [k for k in state["model"] if k.endswith("q_head.weight")]
    assert len(keys) == 1
    state["model"][keys[0]].zero_()
    state["model"][keys[0].replace("weight", "bias")][0] = 20.0
    torch.save(state, path)
    res = main(["--out", copy, "--no-train", "--halting-step"] + ARGS)
    halt = res[HALTING_TABLE]
    assert sorted(halt) == sorted(res["families"]) and set(halt["all"]["runs"]) == {"standard", CONTROL}
    ev = lambda sub: json.load(open(os.path.join(copy, "runs", "standard", sub, "metrics.json")))["metrics"]  # noqa
    assert ev("eval-halt")["all.steps"] == 1.0 and ev("eval")["all.steps"] == 2.0
    direct = str(tmp_path / "direct")
    run(
        EvaluateConfig(
            checkpoint=ck_dir,
            data_path=os.path.join(copy, "data", "built"),
            output_dir=direct,
            device="cpu",
            progress=False,
            num_pictures=0,
            pass_ks=[1, 2],
            halt_early=True,
        )
    )
    assert json.load(open(os.path.join(direct, "predictions.json"))) == json.load(
        open(os.path.join(copy, "runs", "standard", "eval-halt", "predictions.json"))
    )
    m = json.load(open(os.path.join(direct, "metrics.json")))["metrics"]
    assert halt["all"]["runs"]["standard"]["pass@1"] == pytest.approx(m["ARC/pass@1"])
    assert res["runs"]["standard"]["halting_step"]["metrics"]["ARC/pass@1"] == pytest.approx(m["ARC/pass@1"])
    assert "train_fit_metrics" in res["runs"]["standard"]["halting_step"] and "train_runs" in halt["all"]
    md = open(os.path.join(copy, "science.md")).read()
    assert md.count("| **all** | 6 |") == 3 and "## At the Q head's halting step" in md  # one copy, voted, halting


@pytest.mark.slow
def test_an_out_made_before_an_arch_option_existed_is_reused_not_refused(science_out, tmp_path, capsys):
    """A run.json written before the arch config changed (here: its record as commit 0b65cd7 wrote it, arch name
    trm with grid_coords=true and the other switches, models/legacy.py) is the run of ``arch=trm_grid`` today: the
    same command reuses the run; a saved record with a switch that no variant has (context_broadcast=true) is still
    refused, naming it."""
    out, _ = science_out
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    for name in ("standard", CONTROL):  # as if both had been trained with the grid core of then (arch=trm_grid now)
        spath = os.path.join(copy, "runs", name, "run.json")
        spec = json.load(open(spath))
        assert spec["recipe"]["arch"]["name"] == "trm_local"
        later = ("memory_", "grid_ops", "cell_descriptor", "grid_gather", "gather_", "cell_features")  # added after it
        arch = {k: v for k, v in spec["recipe"]["arch"].items() if not k.startswith(later)}
        arch.update(
            name="trm", grid_coords=True, pointer_init="identity", pointer_source="token", context_broadcast=False
        )
        spec["recipe"]["arch"], spec["overrides"] = arch, spec["overrides"] + ["arch=trm_grid"]
        json.dump(spec, open(spath, "w"))
    capsys.readouterr()
    main(["--out", copy] + ARGS + ["--override", "arch=trm_grid"])
    assert capsys.readouterr().out.count("training finished earlier") == 2
    spec["recipe"]["arch"]["context_broadcast"] = True
    json.dump(spec, open(spath, "w"))
    with pytest.raises(SystemExit) as e:
        main(["--out", copy] + ARGS + ["--override", "arch=trm_grid"])
    assert e.value.code == 2 and "recipe.arch.context_broadcast=True" in capsys.readouterr().err


@pytest.mark.slow
def test_an_evaluation_is_reused_only_with_the_same_eval_overrides(science_out, tmp_path, capsys):
    """An existing evaluation is the answer only to the evaluate.py overrides it was made with: --no-train with
    --eval-override num_augmentations=1 evaluates again (and its metrics say so: one copy per puzzle), the same
    command then reuses that, and dropping the override evaluates with the defaults again."""
    out, _ = science_out
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    metrics = lambda: json.load(open(os.path.join(copy, "runs", "standard", "eval", "metrics.json")))  # noqa
    every = metrics()["metrics"]["ARC/num_examples"]
    capsys.readouterr()
    main(["--out", copy, "--no-train", "--eval-override", "num_augmentations=1"] + ARGS)
    text = capsys.readouterr().out
    # the one-copy evaluation sets num_augmentations=1 itself: made with the same overrides, reused
    assert text.count("exists, reused") == text.count("evaluation of one copy exists, reused") == 2
    assert text.count("evaluating the held-out puzzles") == 2
    m = metrics()
    assert m["config"]["num_augmentations"] == 1
    assert m["metrics"]["ARC/num_examples"] == m["metrics"]["ARC/num_test_inputs"] < every
    main(["--out", copy, "--no-train", "--eval-override", "num_augmentations=1"] + ARGS)
    assert capsys.readouterr().out.count("exists, reused") == 6
    main(["--out", copy, "--no-train"] + ARGS)
    text = capsys.readouterr().out
    assert text.count("exists, reused") == text.count("evaluation of one copy exists, reused") == 2
    assert metrics()["config"]["num_augmentations"] is None and metrics()["metrics"]["ARC/num_examples"] == every


@pytest.mark.slow
def test_score_tables_any_predictions_as_the_command_does(science_out, tmp_path, capsys):
    """experiments.science.score on the command's own one-copy predictions gives its one-copy table's pass@1 in
    every row; a predictions file that misses a held-out puzzle or a bad NAME=PATH fails with one line naming it."""
    from experiments.science import score

    out, res = science_out
    own = os.path.join(out, "runs", "standard", "eval-one-copy", "predictions.json")
    ctrl = os.path.join(out, "runs", CONTROL, "eval-one-copy", "predictions.json")
    table = score.score(out, {"a": own, "b": ctrl})
    want = res["families_one_copy"]
    rows = [f for f, r in want.items() if r.get("count")]
    assert rows and sorted(f for f, r in table.items() if r.get("count")) == sorted(rows)
    for f in rows:
        assert table[f]["runs"]["a"]["pass@1"] == want[f]["runs"]["standard"]["pass@1"]
        assert table[f]["runs"]["b"]["pass@1"] == want[f]["runs"][CONTROL]["pass@1"]
    md = score.main([out, f"a={own}", "--out", str(tmp_path / "t.md")])
    assert open(tmp_path / "t.md").read() == md and f"| all ({want['all']['count']}) |" in md
    # the headline puzzles split by whether a dihedral map of the puzzle reaches a trained structure: the two rows
    # partition the headline row (counts and per-puzzle pass@1)
    half = {
        p: [dict(r, correct_rank=1 if i % 2 else None) for r in rows]
        for i, (p, rows) in enumerate(sorted(json.load(open(own)).items()))
    }  # every other puzzle right
    split = score.orbit_split(score.load_data(out), {"a": half})
    assert "headline" not in table and sum(r["count"] for r in split.values()) == len(half) == 6  # all headline
    assert sum(r["count"] * r["runs"]["a"]["pass@1"] for r in split.values()) == pytest.approx(3)
    assert "held out up to symmetry" in md and all(f"| {r} ({split[r]['count']}) |" in md for r in split)
    # paired with a run that answers nothing: the 3 puzzles half answers are its own, none the other's
    none = {p: [dict(r, correct_rank=None) for r in rows] for p, rows in half.items()}
    pairs = score.paired(score.load_data(out), {"none": none, "half": half, "same": none})
    assert pairs["half"] == {"all": (0, 3, 0.25)} and pairs["same"] == {"all": (0, 0, 1.0)}  # no group rows here
    assert score.paired(score.load_data(out), {"half": half, "none": none})["none"]["all"] == (3, 0, 0.25)
    json.dump(half, open(tmp_path / "half.json", "w"))
    two = score.main([out, f"none={own}", f"half={tmp_path / 'half.json'}"])
    assert "| half | all |" in two and "sign test p" in two and "sign test p" not in md
    short = json.load(open(own))
    short.pop(sorted(short)[0])
    json.dump(short, open(tmp_path / "short.json", "w"))
    capsys.readouterr()
    for args, message in (([f"a={tmp_path / 'short.json'}"], "short.json"), (["a"], "expected NAME=PREDICTIONS")):
        with pytest.raises(SystemExit) as e:
            score.main([out] + args)
        assert e.value.code == 1 and message in capsys.readouterr().err


def test_the_sign_test_is_the_exact_binomial_tail_doubled():
    from experiments.science.score import sign_test

    assert sign_test(0, 5) == 2 / 32 and sign_test(5, 0) == 2 / 32  # one of the two most uneven splits of 5
    assert sign_test(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert sign_test(3, 3) == 1.0 and sign_test(0, 0) == 1.0 and sign_test(2, 3) == 1.0  # capped at 1
    for a, b in ((1, 4), (2, 7), (4, 9)):  # every outcome of n fair coins at least as uneven, counted one by one
        n = a + b
        uneven = sum(min(k, n - k) <= min(a, b) for k in (bin(m).count("1") for m in range(2**n)))
        assert sign_test(a, b) == pytest.approx(uneven / 2**n)


def test_paired_counts_each_groups_discordant_puzzles_against_the_first_run():
    from experiments.science.data import ScienceData
    from experiments.science.score import paired, sign_test

    fams = {"p1": "a", "p2": "a", "p3": "b", "p4": "b", "p5": "c", "t1": "a"}
    rules = {p: {"family": f, "subset": "training" if p[0] == "t" else "evaluation"} for p, f in fams.items()}
    data = ScienceData({}, "", rules, "family", "", headline=["a", "b"], groups={"covered": ["a"], "open": ["b"]})
    right = lambda *ok: {p: [{"correct_rank": 1 if p in ok else None}] for p in fams if p[0] == "p"}  # noqa: E731
    got = paired(data, {"base": right("p1", "p3"), "run": right("p2", "p3", "p4", "p5")})["run"]
    assert got == {
        "covered": (1, 1, 1.0),  # p1 only the base's, p2 only the run's
        "open": (0, 1, 1.0),  # p3 both's, p4 the run's
        "headline": (1, 2, sign_test(1, 2)),
        "all": (1, 3, sign_test(1, 3)),  # p5 (family c) outside the headline, in the total
    }


@pytest.mark.slow
def test_score_splits_a_test_time_trained_run_by_demo_fit(science_out, tmp_path, capsys):
    """With a ttt.json beside the predictions, experiments.science.score adds the demo-fit table: per family, the share
    of held-out puzzles as drawn whose demos were fitted (fit_after 1.0) and how many of the fitted / the others
    answered every test output, counted here by hand; an augmented copy's entry is not counted, and a held-out
    puzzle without an entry of its own, or an entry without its fields, is refused naming the ttt.json. Stdout is
    the tables alone."""
    from experiments.science import score

    out, _ = science_out
    pred_path = os.path.join(out, "runs", "standard", "eval-one-copy", "predictions.json")
    pred = json.load(open(pred_path))
    # a model that answered the puzzles of odd index: the outcome is then known whatever the tiny run predicted
    names = sorted(pred)
    for i, p in enumerate(names):
        pred[p] = [dict(r, correct_rank=1 if i % 2 else None) for r in pred[p]]
    ids = json.load(open(os.path.join(out, "data", "built", "identifiers.json")))
    copy_id = next(i for i, n in enumerate(ids) if "|||" in n and n.split("|||")[0] in pred)
    entries = [{"puzzle_identifier": ids.index(p), "fit_after": 1.0 if i % 3 else 0.5} for i, p in enumerate(names)]
    entries.append({"puzzle_identifier": copy_id, "fit_after": 1.0})  # an augmented copy: not counted
    run = tmp_path / "ttt"
    run.mkdir()
    json.dump(pred, open(run / "predictions.json", "w"))
    json.dump({"puzzles": entries}, open(run / "ttt.json", "w"))
    rules = json.load(open(os.path.join(out, "data", "raw", "synth_rules.json")))
    capsys.readouterr()
    md = score.main([out, f"ttt={run / 'predictions.json'}"])
    assert capsys.readouterr().out.startswith("| family (held-out puzzles) | ttt |")  # the data's notes: stderr
    assert "| ttt: demo fit (puzzles) | fitted | answered | fitted | answered | not fitted |" in md
    for fam in FAMS + ["all"]:
        mine = [i for i, p in enumerate(names) if fam == "all" or rules[p]["family"] == fam]
        fitted = [i for i in mine if i % 3]
        rest = [i for i in mine if not i % 3]
        share = lambda xs: f"{sum(i % 2 for i in xs) / len(xs):.2f}" if xs else "-"  # noqa: E731
        want = f"| {fam} ({len(mine)}) | {len(fitted) / len(mine):.2f} | {share(fitted)} | {share(rest)} |"
        assert want in md, want
    bad = [({"puzzles": entries[1:]}, "no entry for 1 held-out puzzles"), ({"puzzles": [{"fit": 1}]}, "puzzles[0]")]
    for ttt, message in bad:
        json.dump(ttt, open(run / "ttt.json", "w"))
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            score.main([out, f"ttt={run / 'predictions.json'}"])
        err = capsys.readouterr().err
        assert e.value.code == 1 and "ttt.json" in err and message in err


def test_one_copy_scores_a_voted_run_by_its_identity_copy_alone():
    """experiments.science.score --one-copy: a test input counts as right when the candidate the identity copy voted
    for is right, whatever the vote says; a malformed identity answer (no flagged candidate) is wrong; without the
    flags (a file written before them) a one-vote row is kept as it is and a voted row is refused."""
    from experiments.science.score import identity_answers

    def cand(votes, identity, correct):
        return {"votes": votes, "identity": identity, "correct": correct}

    pred = {
        "outvoted": [{"correct_rank": 2, "candidates": [cand(5, False, False), cand(1, True, True)]}],
        "vote_right": [{"correct_rank": 1, "candidates": [cand(7, False, True), cand(1, True, False)]}],
        "malformed": [{"correct_rank": 1, "candidates": [cand(7, False, True)]}],
        "two_inputs": [
            {"correct_rank": 1, "candidates": [cand(8, True, True)]},
            {"correct_rank": None, "candidates": [cand(4, False, False), cand(4, True, False)]},
        ],
    }
    got = identity_answers(pred, "p.json")
    assert {n: [r["correct_rank"] for r in rows] for n, rows in got.items()} == {
        "outvoted": [1],
        "vote_right": [None],
        "malformed": [None],
        "two_inputs": [1, None],
    }
    assert pred["outvoted"][0]["correct_rank"] == 2  # the input is not changed
    one = {"p": [{"correct_rank": 1, "num_votes": 1, "candidates": [{"votes": 1, "correct": True}]}]}
    assert identity_answers(one, "p.json") == one  # one copy, written before the flags: its answer as it is
    old = {"p": [{"correct_rank": 1, "num_votes": 3, "candidates": [{"votes": 3, "correct": True}]}]}
    with pytest.raises(ScienceError, match="p.json: 'p' has candidates without 'identity'"):
        identity_answers(old, "p.json")


def test_the_demo_fit_split_counts_each_row_over_its_own_puzzles(tmp_path):
    """experiments.science.score.fit_transfer: a family row counts its own held-out puzzles, a group row its
    families', the total row all of them; a family without held-out puzzles (fewer --num-test than families) gets
    no row, not the total's figures."""
    from types import SimpleNamespace

    from experiments.science.score import fit_transfer

    names = ["<blank>", "a1", "a2", "b1", "t1"]
    json.dump(names, open(tmp_path / "identifiers.json", "w"))
    rules = {n: {"subset": "evaluation", "family": n[0]} for n in ("a1", "a2", "b1")}
    rules["t1"] = {"subset": "training", "family": "c"}
    data = SimpleNamespace(built=str(tmp_path), rules=rules)
    pred = {"a1": [{"correct_rank": 1}], "a2": [{"correct_rank": None}], "b1": [{"correct_rank": 1}]}
    ttt = {"puzzles": [{"puzzle_identifier": i, "fit_after": f} for i, f in ((1, 1.0), (2, 1.0), (3, 0.5))]}
    table = {"a": {}, "b": {}, "c": {}, "group": {"families": ["a", "c"]}, "all": {}}
    got = fit_transfer(data, table, pred, ttt)
    assert set(got) == {"a", "b", "group", "all"}  # c has no held-out puzzle
    assert got["a"] == {"count": 2, "fitted": 1.0, "answered_fitted": 0.5, "answered_not_fitted": None}
    assert got["b"] == {"count": 1, "fitted": 0.0, "answered_fitted": None, "answered_not_fitted": 1.0}
    assert got["group"] == got["a"] and got["all"]["count"] == 3 and got["all"]["fitted"] == pytest.approx(2 / 3)


@pytest.mark.slow
def test_pointer_program_scores_and_falls_back_on_a_science_out(science_out, tmp_path, capsys):
    """experiments.science.pointer on the command's held-out puzzles: one row per puzzle, the combined file takes the
    model's row exactly where the pointer does not reproduce the demos, and score tables both; a fallback that misses
    a puzzle is refused before any fit, with nothing written."""
    from experiments.science import pointer, score

    out, _ = science_out
    own = os.path.join(out, "runs", "standard", "eval-one-copy", "predictions.json")
    model = json.load(open(own))
    p, c = tmp_path / "p.json", tmp_path / "c.json"
    rows = pointer.main([out, "--out", str(p), "--steps", "20", "--fallback", own, "--combined", str(c)])
    assert set(rows) == set(model) and json.load(open(p)) == rows
    both = json.load(open(c))
    for k, r in rows.items():
        want = (
            r
            if all(x["demos_reproduced"] for x in r)
            else [{"correct_rank": x.get("correct_rank"), "answered_by": "fallback"} for x in model[k]]
        )
        assert both[k] == want
    table = score.score(out, {"pointer": str(p), "combined": str(c)})
    assert table["all"]["runs"]["pointer"]["pass@1"] is not None
    # the cells program through the same command, chained in front of the pointer-else-model file
    cells = pointer.main([out, "--method", "cells", "--out", str(tmp_path / "k.json"), "--loo"])
    assert set(cells) == set(model) and all(isinstance(x["loo"], (bool, type(None))) for r in cells.values() for x in r)
    cells = pointer.main(
        [out, "--method", "cells", "--out", str(tmp_path / "k.json"), "--fallback", str(c), "--combined", str(p)]
    )
    chained = json.load(open(p))
    for k, r in cells.items():
        assert chained[k] == (
            r
            if all(x["demos_reproduced"] for x in r)
            else [{"correct_rank": x["correct_rank"], "answered_by": "fallback"} for x in both[k]]
        )
    # the learned maps through the same command: learned on the out's training puzzles, one row per held-out puzzle
    maps = pointer.main(
        [out, "--method", "maps", "--out", str(tmp_path / "m.json"), "--steps", "20"]
        + ["--maps-forms", "2", "--maps-steps", "5"]
    )
    assert set(maps) == set(model) and all(isinstance(x["demos_reproduced"], bool) for r in maps.values() for x in r)
    assert "maps: learned on" in capsys.readouterr().out
    short = dict(model)
    short.pop(sorted(short)[0])
    json.dump(short, open(tmp_path / "short.json", "w"))
    with pytest.raises(SystemExit, match="short.json: no predictions for 1 of the puzzles"):
        pointer.main(
            [
                out,
                "--out",
                str(tmp_path / "q.json"),
                "--fallback",
                str(tmp_path / "short.json"),
                "--combined",
                str(tmp_path / "d.json"),
            ]
        )
    assert not (tmp_path / "q.json").exists() and not (tmp_path / "d.json").exists()


@pytest.mark.slow
def test_a_command_naming_some_runs_says_which_trained_runs_it_leaves_out(science_out, tmp_path, capsys):
    """--encoders standard on an --out that also holds a trained control: the report (science.json) holds standard
    alone, and the command says so before any work, naming the run left out and the --encoders that reports both."""
    from experiments.science.common import unreported_runs

    out, _ = science_out
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    assert unreported_runs(copy, ["standard", CONTROL]) == [] and unreported_runs(copy, ["standard"]) == [CONTROL]
    capsys.readouterr()
    res = main(["--out", copy, "--no-train", "--encoders", "standard"] + ARGS)
    text = capsys.readouterr().out
    assert f"also holds the trained run(s) {CONTROL}" in text and f"--encoders standard {CONTROL} reports" in text
    assert text.index("also holds") < text.index("standard: ")  # before the runs' stages
    assert CONTROL not in res["runs"] and "standard" in res["runs"]
    assert CONTROL not in json.load(open(os.path.join(copy, "science.json")))["runs"]

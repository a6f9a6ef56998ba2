"""Test-time training (models.ttt, evaluators.ttt, evaluate.py ttt_*): a batch is fitted as its rows would be one
by one; leave-one-out never decodes a demo from an encoding that saw it, and the test answers never enter the fit;
``all`` restores the weights between puzzles; TRM gets a fresh embedding from the trained mean; config ->
evaluate.py -> metrics.json / ttt.json."""

from __future__ import annotations

import json
import os

import pytest
import torch

import models
import models.ttt as mttt
from evaluators.inference import _StepPlan
from evaluators.ttt import TestTimeTraining as TTTRunner
from models.rollout import halt_max_steps
from models.ttt import TTTSettings
from tests.test_etrm_model import B, batch, build
from tests.toy_data import built_synthetic_arc
from training.evaluation import base_puzzle_index

CPU = torch.device("cpu")


def _run(head, b, settings, pool_of=None):
    plan = _StepPlan(head, {"preds", "logits", "q_halt_logits"}, False, halt_max_steps(head))
    ttt = TTTRunner(head, settings, pool_of=pool_of)
    with plan.eval_mode(), torch.inference_mode():
        r = ttt.run(plan, b, CPU)
    return r, ttt


def _rows(b, rows):
    return {k: v[rows] for k, v in b.items()}


def _batch():
    b = batch()
    b["puzzle_identifiers"] = torch.arange(B, dtype=torch.int32)
    return b


@pytest.mark.parametrize("encoder", ["standard", "lpn"])
def test_a_batch_is_fitted_as_its_rows_one_by_one(encoder):
    head = models.build_loss_head(build(encoder).eval())
    b, s = _batch(), TTTSettings(steps=3, lr=0.05)
    together, ttt = _run(head, b, s)
    plain, _ = _run(head, b, TTTSettings(steps=0))
    assert not torch.allclose(together.outputs["logits"], plain.outputs["logits"])  # the fit changed predictions
    for i in range(B):
        alone, one = _run(head, _rows(b, [i]), s)
        torch.testing.assert_close(alone.outputs["logits"][0], together.outputs["logits"][i], atol=2e-5, rtol=1e-4)
        assert one.records[0]["fit_after"] == ttt.records[i]["fit_after"]
    assert [r["num_demos"] for r in ttt.records] == [2, 3, 3, 3]  # row 0 has a masked demo slot


def test_the_fit_lowers_the_demo_loss_and_leaves_the_weights_alone():
    m = build("standard").eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    b = _batch()
    demos = mttt.demo_set(b)
    loo = mttt.loo_demos(b, demos, True)
    with torch.no_grad():
        base = m.encoder(*loo).context
    prefix_of = lambda th: base + th.index_select(0, demos.owner)  # noqa: E731
    with mttt.frozen_weights(m):
        res = mttt.fit(m, demos, torch.zeros(B, *base.shape[1:]), prefix_of, steps=15, lr=0.05)
    with torch.no_grad():
        loss = lambda th: mttt.demo_loss(mttt.decode_logits(m, demos.inputs, prefix_of(th)), demos)[0]  # noqa: E731
        assert loss(res.theta) < 0.9 * loss(torch.zeros_like(res.theta))
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert all(p.requires_grad for p in m.parameters())


def test_leave_one_out_never_decodes_a_demo_from_an_encoding_that_saw_it(monkeypatch):
    """At the first step (offset 0) demo j of sample i is decoded from the encoder's context of sample i's OTHER
    demos, computed here by masking demo j by hand."""
    m = build("standard").eval()
    b = _batch()
    seen = []
    orig = mttt.decode_logits

    def spy(model, inputs, prefix, demos=None, memory=None):
        seen.append(prefix.detach().clone())
        return orig(model, inputs, prefix, demos, memory)

    monkeypatch.setattr(mttt, "decode_logits", spy)
    _run(models.build_loss_head(m), b, TTTSettings(steps=1, lr=0.05))
    expect = []
    with torch.no_grad():
        for i in range(B):
            for j in range(b["demo_mask"].shape[1]):
                if b["demo_mask"][i, j]:
                    mask = b["demo_mask"][i : i + 1].clone()
                    mask[0, j] = False
                    expect.append(m.encoder(b["demo_inputs"][i : i + 1], b["demo_labels"][i : i + 1], mask).context[0])
    torch.testing.assert_close(seen[0], torch.stack(expect), atol=1e-5, rtol=1e-5)


def test_the_test_answers_never_enter_the_fit():
    head = models.build_loss_head(build("standard").eval())
    b = _batch()
    r1, t1 = _run(head, b, TTTSettings(steps=3, lr=0.05))
    b2 = dict(b, labels=torch.randint(2, 12, b["labels"].shape, generator=torch.Generator().manual_seed(9)))
    r2, t2 = _run(head, b2, TTTSettings(steps=3, lr=0.05))
    fits = lambda t: [{k: v for k, v in r.items() if k != "seconds"} for r in t.records]  # noqa: E731
    assert torch.equal(r1.outputs["logits"], r2.outputs["logits"]) and fits(t1) == fits(t2)


def test_all_restores_the_weights_and_nothing_learned_on_one_puzzle_reaches_another():
    m = build("standard").eval()
    head = models.build_loss_head(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    b = _batch()
    b["puzzle_identifiers"] = torch.tensor([0, 0, 1, 1], dtype=torch.int32)
    s = TTTSettings(steps=3, lr=1e-2, params="all")
    both, ttt = _run(head, b, s)
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    second, _ = _run(head, _rows(b, [2, 3]), s)  # puzzle 1 alone: as inside the batch, after puzzle 0's fit
    torch.testing.assert_close(second.outputs["logits"], both.outputs["logits"][2:], atol=1e-5, rtol=1e-5)
    plain, _ = _run(head, b, TTTSettings(steps=0))
    assert not torch.allclose(both.outputs["logits"], plain.outputs["logits"])
    assert len(ttt.records) == 2 and all(r["steps"] == 3 for r in ttt.records)


def test_pooled_copies_are_fitted_together_as_one_puzzle_and_apart_from_other_puzzles():
    m = build("standard").eval()
    head = models.build_loss_head(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    b = _batch()  # identifiers 0..3: four copies; copies 0, 1 of puzzle 0 and copies 2, 3 of puzzle 1
    s = TTTSettings(steps=3, lr=1e-2, params="all", pool=True)
    pooled, ttt = _run(head, b, s, pool_of=[0, 0, 1, 1, 2])
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    # the same as one identifier per puzzle fitted per identifier (the encoder never reads the identifier)
    same = dict(b, puzzle_identifiers=torch.tensor([0, 0, 1, 1], dtype=torch.int32))
    grouped, _ = _run(head, same, TTTSettings(steps=3, lr=1e-2, params="all"))
    torch.testing.assert_close(pooled.outputs["logits"], grouped.outputs["logits"], atol=1e-5, rtol=1e-5)
    per_copy, _ = _run(head, b, TTTSettings(steps=3, lr=1e-2, params="all"))
    assert not torch.allclose(pooled.outputs["logits"], per_copy.outputs["logits"])
    assert [r["puzzle_identifier"] for r in ttt.records] == [0, 1, 2, 3]  # a record per copy still
    with pytest.raises(ValueError, match="ttt_params=all"):
        TTTSettings(steps=1, params="context", pool=True)
    with pytest.raises(ValueError, match="pool_of"):
        TTTRunner(head, s)


def _trm():
    torch.manual_seed(0)
    return models.build_model(
        {
            "name": "trm",
            "hidden_size": 32,
            "num_heads": 4,
            "expansion": 2,
            "puzzle_emb_ndim": 32,
            "puzzle_emb_len": 2,
            "H_cycles": 1,
            "L_cycles": 1,
            "L_layers": 1,
            "halt_max_steps": 2,
        },
        vocab_size=12,
        seq_len=16,
        num_puzzle_identifiers=6,
        batch_size=B,
    ).eval()


def test_trm_gets_a_fresh_embedding_from_the_trained_mean_and_context_is_refused():
    m = _trm()
    with torch.no_grad():
        m.puzzle_emb.weights[1] = 1.0  # two "trained" puzzles; 0 and 3-5 never seen (TRM's zero init)
        m.puzzle_emb.weights[2] = 3.0
    head = models.build_loss_head(m)
    b = _batch()
    b["puzzle_identifiers"] = torch.tensor([1, 3, 4, 2], dtype=torch.int32)
    init = mttt.embedding_init(m, b["puzzle_identifiers"])
    assert torch.equal(init[1, 0], torch.full((32,), 2.0)) and torch.equal(init[1, 1], torch.zeros(32))  # padded
    assert torch.equal(init[0, 0], torch.full((32,), 1.0)) and torch.equal(init[3, 0], torch.full((32,), 3.0))
    emb = m.puzzle_emb.weights.clone()
    r, ttt = _run(head, b, TTTSettings(steps=2, lr=0.05, params="embedding"))
    assert torch.equal(m.puzzle_emb.weights, emb) and len(ttt.records) == B
    with pytest.raises(ValueError, match="no encoder"):
        TTTRunner(head, TTTSettings(steps=2, params="context"))


@pytest.fixture(scope="module")
def etrm_run(tmp_path_factory):
    from training.config import load_config
    from training.loop import train

    d = tmp_path_factory.mktemp("ttt")
    data, _ = built_synthetic_arc(
        d, ["colour_map"], num_train=8, num_test=2, num_aug=1, mode="etrm", max_grid=4, canvas=6, generator_aug=True
    )
    cfg = load_config(
        "cfg_science",
        [
            "encoder=standard",
            "arch.hidden_size=32",
            "encoder.hidden_size=32",
            "encoder.num_layers=1",
            "global_batch_size=8",
            "device=cpu",
            "max_steps=3",
            "lr_warmup_steps=1",
            "evaluators=[]",
            "progress=false",
            f"data_paths=[{data}]",
            f"checkpoint_path={d / 'ck'}",
        ],
    )
    return data, train(cfg)["last_checkpoint"], d


def test_evaluate_with_ttt_writes_its_metrics_and_per_puzzle_record(etrm_run):
    import evaluate as ev

    data, ck, d = etrm_run
    base = dict(checkpoint=ck, data_path=data, device="cpu", progress=False, num_pictures=0, use_ema=False)
    plain = ev.run(ev.EvaluateConfig(**base, output_dir=str(d / "plain")))
    m = ev.run(ev.EvaluateConfig(**base, output_dir=str(d / "ttt"), ttt_steps=2, ttt_lr=0.05, ttt_augment=1))
    assert m["ttt/steps"] == 2 and m["ttt/num_puzzles"] > 0 and 0 <= m["ttt/fit_after"] <= 1
    assert "ttt/steps" not in plain and m["ARC/num_puzzles"] == plain["ARC/num_puzzles"]
    rec = json.load(open(os.path.join(d, "ttt", "ttt.json")))
    assert rec["settings"]["steps"] == 2 and len(rec["puzzles"]) == m["ttt/num_fits"] >= m["ttt/num_puzzles"]
    assert m["ttt/num_puzzles"] == len({r["puzzle_identifier"] for r in rec["puzzles"]})
    assert {"fit_before", "fit_after", "seconds", "num_demos", "puzzle_identifier"} <= set(rec["puzzles"][0])
    with pytest.raises(ev.EvaluateError, match="num_augmentations"):
        ev.run(ev.EvaluateConfig(**base, ttt_steps=1, ttt_augment=1, num_augmentations=5))
    # ttt_pool: the copies of a puzzle share their original's index (read from identifiers.json)
    names = json.load(open(os.path.join(data, "identifiers.json")))
    index = base_puzzle_index(data)
    assert len(index) == len(names) and len(set(index)) == len({n.split("|||")[0] for n in names}) < len(names)
    assert all(
        (index[i] == index[j]) == (names[i].split("|||")[0] == names[j].split("|||")[0])
        for i in range(len(names))
        for j in range(len(names))
    )
    pool = dict(ttt_steps=1, ttt_params="all", ttt_pool=True, ttt_augment=1)
    for one in (dict(ttt_augment=0), dict(num_augmentations=1)):  # a pool of one copy is refused, not run as one
        with pytest.raises(ev.EvaluateError, match="only the original copy is evaluated"):
            ev.run(ev.EvaluateConfig(**base, output_dir=str(d / "pool1"), **{**pool, "ttt_augment": None, **one}))
        assert not os.path.exists(d / "pool1")
    fits = []  # demo pairs of every pooled fit
    import evaluators.ttt as ettt

    def spy(model, demos, *a, **kw):
        fits.append(demos.n)
        return orig(model, demos, *a, **kw)

    orig, ettt.fit = ettt.fit, spy
    try:  # batches of 4 rows: packed densely, the second puzzle (4 test rows, after 2) would fall in two
        mp = ev.run(ev.EvaluateConfig(**base, output_dir=str(d / "pool"), batch_size=4, **pool))
    finally:
        ettt.fit = orig
    assert mp["ttt/num_puzzles"] == m["ttt/num_puzzles"] and mp["ARC/num_puzzles"] == plain["ARC/num_puzzles"]
    # one fit per original puzzle on all its copies' demos: a puzzle's copies always share a batch
    assert len([n for n in fits if n > 0]) == plain["ARC/num_puzzles"], fits


def test_the_science_table_notes_the_test_time_training_of_a_run():
    from experiments.science.report import _run_lines

    run = {
        "status": "ok",
        "steps": 10,
        "train_exact": 0.9,
        "train_seconds": 5.0,
        "eval_seconds": 2.0,
        "metrics": {
            "ARC/pass@1": 0.5,
            "ttt/steps": 8.0,
            "ttt/fit_before": 0.125,
            "ttt/fit_after": 0.75,
            "ttt/seconds_per_puzzle": 0.5,
            "ttt/num_puzzles": 16.0,
        },
    }
    lines = _run_lines({"runs": {"standard": run, "other": dict(run, metrics={"ARC/pass@1": 0.1})}, "settings": {}})
    assert (
        "standard: test-time training 8 steps on each held-out puzzle's demos: demo fit 0.12 -> 0.75, 0.50 s "
        "per puzzle copy (16 copies)"
    ) in lines
    assert not any(ln.startswith("other: test-time") for ln in lines)


def test_a_variational_encoder_with_its_kl_head_and_the_weights_learning_rate():
    """The evaluation loss head of a KL encoder expects outputs['kl'] with a fitted context too; ``all`` moves
    the weights at ``weight_lr``, not at the context's lr (and restores them)."""
    m = build("variational").eval()
    head = models.build_loss_head(m, extra_loss_weights={"kl": 1e-3})
    b = _batch()
    r, ttt = _run(head, b, TTTSettings(steps=2, lr=0.05))
    assert r.outputs["logits"].shape[0] == B and len(ttt.records) == B
    before = {k: v.clone() for k, v in m.state_dict().items()}
    seen = []
    orig_fit = mttt.fit

    def spy(*a, **kw):
        seen.append(kw.get("extra_lr"))
        return orig_fit(*a, **kw)

    import evaluators.ttt as ettt

    ettt.fit, saved = spy, ettt.fit
    try:
        _run(head, b, TTTSettings(steps=1, lr=0.05, weight_lr=3e-5, params="all"))
    finally:
        ettt.fit = saved
    assert seen and all(x == 3e-5 for x in seen)
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert all(p.grad is None for p in m.parameters())


def test_the_fit_clears_autocasts_cache_of_cast_weights_after_every_update(monkeypatch):
    """Under autocast a weight's cast copy is cached for the whole autocast region: without clearing it, every
    step after the first would run (and ``all`` would predict) with the weights of the first step."""
    cleared = []
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: cleared.append(1))
    m = build("standard").eval()
    b = _batch()
    demos = mttt.demo_set(b)
    with torch.no_grad():
        base = m.encoder(*mttt.loo_demos(b, demos, True)).context
    mttt.fit(m, demos, torch.zeros(B, *base.shape[1:]), lambda th: base + th.index_select(0, demos.owner), steps=3,
             lr=0.05)  # fmt: skip
    assert len(cleared) == 3


@pytest.mark.parametrize("params", ["context", "embedding", "all"])
def test_a_core_that_reads_the_demo_memory_is_fitted_leave_one_out_and_restored(params, monkeypatch):
    """arch=trm_memory: demo j is decoded with the memory of the OTHER demos only (the memory would otherwise hold
    its answer cell by cell); a batch is fitted as its rows one by one; ``all`` restores the weights."""
    from tests.test_models_memory import batch as memory_batch
    from tests.test_models_memory import build as memory_build

    m = memory_build().eval()
    head = models.build_loss_head(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    b = memory_batch()
    b["puzzle_identifiers"] = torch.arange(b["inputs"].shape[0], dtype=torch.int32)
    seen, orig = [], mttt.decode_logits

    def spy(model, inputs, prefix, demos=None, memory=None):
        seen.append(tuple(t.clone() for t in demos))
        return orig(model, inputs, prefix, demos, memory)

    monkeypatch.setattr(mttt, "decode_logits", spy)
    s = TTTSettings(steps=2, lr=0.05, params=params)
    together, ttt = _run(head, b, s)
    demos = mttt.demo_set(b)
    first = seen[:1] if params != "all" else seen[:: s.steps + 1]  # the first decode of each fitted group
    di, _, mask = (torch.cat([x[i] for x in first]) for i in range(3))
    for k in range(demos.n):  # the pair's own slot is masked, the other valid slots are visible
        i, j = int(demos.owner[k]), int(demos.slot[k])
        expected = b["demo_mask"][i].clone()
        expected[j] = False
        assert torch.equal(mask[k], expected) and torch.equal(di[k], b["demo_inputs"][i])
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    monkeypatch.setattr(mttt, "decode_logits", orig)
    together, _ = _run(head, b, s)
    for i in (0, 2):
        alone, _ = _run(head, _rows(b, [i]), s)
        torch.testing.assert_close(alone.outputs["logits"][0], together.outputs["logits"][i], atol=5e-5, rtol=1e-4)


def test_a_puzzle_copy_fitted_in_two_batches_counts_once_with_both_fits_time():
    """A copy whose test inputs fall in two batches is fitted in each: the summary counts the copy once (puzzles),
    both fits (fits), and charges the copy the time of both."""
    from types import SimpleNamespace

    rec = lambda pid, before, after, sec: dict(  # noqa: E731
        puzzle_identifier=pid, num_demos=3, fit_before=before, fit_after=after, steps=4, seconds=sec
    )
    runner = SimpleNamespace(
        settings=SimpleNamespace(steps=4),
        records=[rec(7, 0.0, 1.0, 1.0), rec(7, 0.0, 1.0, 1.0), rec(9, 0.5, 0.5, 2.0)],
    )
    m = TTTRunner.summary(runner)
    assert (m["ttt/num_puzzles"], m["ttt/num_fits"]) == (2.0, 3.0)
    assert m["ttt/seconds_per_puzzle"] == pytest.approx(2.0)  # (1 + 1 + 2) s over 2 copies
    assert m["ttt/fit_before"] == pytest.approx(1 / 6) and m["ttt/fit_after"] == pytest.approx(5 / 6)


def test_gather_fits_only_the_gather_forms_per_puzzle_and_restores_them(monkeypatch):
    """``ttt_params=gather``: the fit's optimiser holds the gather's forms and null logits only (the context offset at
    learning rate 0), the forms move and change the answer, everything is restored after each puzzle, a batch is
    fitted as its puzzles one by one; a core without a gather is refused by name."""
    from tests.test_models_memory import batch as memory_batch
    from tests.test_models_memory import build as memory_build

    m = memory_build(name="trm_local", grid_gather=True, gather_maps=3, gather_heads=2, gather_width=4).eval()
    with torch.no_grad():
        m.inner.gather.out_proj.weight.normal_(0, 0.5)  # the trained core reads its gather (zero at init)
    head = models.build_loss_head(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    b = memory_batch()
    b["puzzle_identifiers"] = torch.arange(b["inputs"].shape[0], dtype=torch.int32)
    fitted, orig = [], mttt.fit

    def spy(model, demos, theta0, prefix_of, **kw):
        names = {id(p): n for n, p in model.named_parameters()}
        fitted.append(([names[id(p)] for p in kw["extra_params"]], kw["lr"], kw["extra_lr"]))
        res = orig(model, demos, theta0, prefix_of, **kw)
        moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
        fitted[-1] += (sorted(moved),)
        return res

    monkeypatch.setattr(mttt, "fit", spy)
    monkeypatch.setattr("evaluators.ttt.fit", spy)
    s = TTTSettings(steps=3, lr=0.05, params="gather")
    together, ttt = _run(head, b, s)
    assert len(fitted) == b["inputs"].shape[0]  # one fit per puzzle
    for names, lr, extra_lr, moved in fitted:
        assert sorted(names) == ["inner.gather.forms", "inner.gather.null"] and lr == 0.0 and extra_lr == 0.05
        assert "inner.gather.forms" in moved and set(moved) <= {"inner.gather.forms", "inner.gather.null"}
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    plain, _ = _run(head, b, TTTSettings(steps=0))
    assert not torch.allclose(together.outputs["logits"], plain.outputs["logits"], atol=1e-4)
    monkeypatch.setattr("evaluators.ttt.fit", orig)
    together, _ = _run(head, b, s)
    for i in (0, 2):
        alone, _ = _run(head, _rows(b, [i]), s)
        torch.testing.assert_close(alone.outputs["logits"][0], together.outputs["logits"][i], atol=5e-5, rtol=1e-4)
    # the encoder is not fitted, so the demo memory is encoded once per fit, not once per step: the same answers
    calls, enc = [], m.encoder.demo_memory
    monkeypatch.setattr(m.encoder, "demo_memory", lambda *a: calls.append(1) or enc(*a))
    cached, _ = _run(head, b, s)
    n_cached = len(calls)
    monkeypatch.setattr("evaluators.ttt.fit", lambda *a, **kw: orig(*a, **{**kw, "encoder_fixed": False}))
    encoded, _ = _run(head, b, s)
    assert (len(calls) - n_cached) - n_cached == b["inputs"].shape[0] * s.steps  # re-encoded at each step of each fit
    torch.testing.assert_close(cached.outputs["logits"], encoded.outputs["logits"], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"no parameter named \*gather.forms.*arch.grid_gather=true"):
        _run(models.build_loss_head(memory_build().eval()), b, s)

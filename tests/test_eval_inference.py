"""The shared inference path: real loader + test-double ACT models, exactly-once, halting, subsets, DDP."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest
import torch

from evaluators import ARCEvaluator
from evaluators.data import build_eval_loader
from evaluators.inference import evaluate, per_sample_lm_loss, resolve_autocast_dtype
from tests.doubles import FakeACT, FakeLossHead, oracle_tokens, wrong_tokens

NUM_COPIES = 8  # identity + 7 augmentations


@pytest.fixture(scope="module")
def arc_data(tmp_path_factory, arc_kaggle_dir):
    """A few real ARC evaluation puzzles (with solutions) x 8 copies, built by dataset.build_arc_dataset."""
    from dataset.arc_sources import load_kaggle_subset
    from dataset.build_arc_dataset import build_arc_dataset

    puzzles = load_kaggle_subset(os.path.join(arc_kaggle_dir, "arc-agi"), "evaluation")
    chosen = puzzles[:4] + [p for p in puzzles[4:] if len(p.test) > 1][:1]  # one with two test inputs
    d = str(tmp_path_factory.mktemp("arc") / "data")
    build_arc_dataset(
        d, chosen, test_set_name="evaluation", num_aug=NUM_COPIES - 1, seed=0, num_workers=1, progress=False
    )
    n_inputs = sum(len(p.test) for p in chosen)
    assert sum(1 for p in chosen if len(p.test) > 1) == 1
    return d, len(chosen), n_inputs


class Recorder:
    """Evaluator double: records every example index it is given."""

    required_outputs = {"preds", "q_halt_logits", "steps"}

    def __init__(self):
        self.seen: list[int] = []
        self.begins = 0

    def begin_eval(self):
        self.begins += 1
        self.seen = []

    def update(self, batch, outputs):
        assert outputs["preds"].device.type == "cpu"
        ex = batch["example_index"]
        self.seen += ex[ex >= 0].tolist()

    def result(self, save_path):
        return {"rec/n": float(len(self.seen))}


def test_every_test_example_evaluated_exactly_once(arc_data):
    d, n_puz, n_inputs = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=7)
    rec = Recorder()
    arc = ARCEvaluator(d, meta, None, num_pictures=0)
    m = evaluate(FakeLossHead(FakeACT(oracle_tokens)), loader, [arc, rec], device="cpu", progress=False)
    n_total = n_inputs * NUM_COPIES
    assert sorted(rec.seen) == list(range(n_total))
    assert m["eval/num_examples"] == n_total and m["ARC/num_examples"] == n_total
    assert m["ARC/pass@1"] == 1.0 and m["ARC/num_puzzles"] == n_puz and m["ARC/num_test_inputs"] == n_inputs
    assert m["all.accuracy"] == 1.0 and m["all.exact_accuracy"] == 1.0 and m["all.steps"] == 3.0
    assert m["all.q_halt_accuracy"] == 0.0  # q_halt = -1 < 0 although every answer is exact
    assert 0 < m["all.lm_loss"] < 1e-3


def test_wrong_model_scores_zero_and_metrics_match_between_head_and_bare_model(arc_data):
    d, n_puz, _ = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=16)
    arc = ARCEvaluator(d, meta, None, num_pictures=0)
    m_head = evaluate(FakeLossHead(FakeACT(wrong_tokens)), loader, [arc], device="cpu", progress=False)
    m_bare = evaluate(FakeACT(wrong_tokens), loader, [arc], device="cpu", progress=False)
    assert m_head["ARC/pass@1"] == 0.0 and m_bare["ARC/pass@1"] == 0.0
    assert m_head["all.exact_accuracy"] == 0.0
    assert 0.0 < m_head["all.accuracy"] < 1.0  # EOS tokens stay right, colours are wrong
    assert m_head["all.q_halt_accuracy"] == 1.0  # q < 0 and not exact
    for k in ("accuracy", "exact_accuracy", "lm_loss", "q_halt_accuracy", "steps"):
        assert m_bare[f"all.{k}"] == pytest.approx(m_head[f"all.{k}"], rel=1e-5), k
    assert m_head["all.lm_loss"] > 1.0


def test_halt_early_stops_when_all_halted(arc_data):
    d, _, n_inputs = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=64)
    n_batches = -(-n_inputs * NUM_COPIES // 64)
    model = FakeACT(oracle_tokens, halt_max_steps=5, q_positive_from=2)
    m = evaluate(
        model, loader, [ARCEvaluator(d, meta, None, num_pictures=0)], device="cpu", progress=False, halt_early=True
    )
    assert model.calls == 2 * n_batches and m["all.steps"] == 2.0 and m["ARC/pass@1"] == 1.0
    assert model.halt_early_in_eval is False  # restored
    model.calls = 0
    m = evaluate(FakeLossHead(model), loader, [], device="cpu", progress=False, halt_early=False)
    assert model.calls == 5 * n_batches and m["all.steps"] == 5.0


def test_outputs_frozen_at_each_samples_own_halting_step(arc_data):
    """halt_early: a sample is read at the step it halts, not at the step the batch stops."""
    d, _, _ = arc_data

    def q_fn(data, steps):  # even example rows halt at step 1, odd rows at step 3
        return torch.where((data["example_index"] % 2 == 0) | (steps >= 3), 1.0, -1.0)

    class Model(FakeACT):
        def forward(self, carry, batch):
            c, out = super().forward(carry, batch)
            # the answer is right only at step 1; later steps predict garbage
            out["logits"] = torch.where((c.steps == 1).view(-1, 1, 1), out["logits"], -out["logits"])
            return c, out

    loader, meta = build_eval_loader(d, global_batch_size=8)
    rec = Recorder()
    m = evaluate(
        Model(oracle_tokens, halt_max_steps=4, q_fn=q_fn), loader, [rec], device="cpu", progress=False, halt_early=True
    )
    assert m["all.steps"] == pytest.approx(2.0, abs=0.15)  # ~half at 1, half at 3
    assert m["all.exact_accuracy"] == pytest.approx(0.5, abs=0.1)


def test_num_augmentations_subset(arc_data):
    d, n_puz, n_inputs = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=8, num_augmentations=2)
    rec = Recorder()
    arc = ARCEvaluator(d, meta, None, num_pictures=0)
    m = evaluate(FakeLossHead(FakeACT(oracle_tokens)), loader, [arc, rec], device="cpu", progress=False)
    assert m["ARC/num_examples"] == 2 * n_inputs and m["ARC/num_puzzles"] == n_puz and m["ARC/pass@1"] == 1.0
    assert all(c[0].votes == 2 for per in arc.last_ranked.values() for c in per)


def test_missing_output_raises(arc_data):
    d, _, _ = arc_data

    class NeedsMore(Recorder):
        required_outputs = {"preds", "z_H"}

    loader, _ = build_eval_loader(d, global_batch_size=64)
    with pytest.raises(KeyError, match="z_H"):
        evaluate(FakeACT(oracle_tokens), loader, [NeedsMore()], device="cpu", progress=False)


def test_stablemax_loss_and_autocast_resolution():
    logits = torch.tensor([[[2.0, -1.0, 0.5]]])
    labels = torch.tensor([[0]])
    s = torch.where(logits < 0, 1 / (1 - logits), logits + 1)
    expect = -torch.log(s[..., 0] / s.sum(-1))
    assert per_sample_lm_loss(logits, labels, "stable_max_cross_entropy").item() == pytest.approx(expect.item(), 1e-6)
    assert per_sample_lm_loss(logits, labels).item() == pytest.approx(-torch.log_softmax(logits, -1)[0, 0, 0].item())
    assert per_sample_lm_loss(logits, torch.tensor([[-100]])).item() == 0.0
    assert resolve_autocast_dtype("auto", torch.device("cpu")) is None
    assert resolve_autocast_dtype("auto", torch.device("cuda")) is torch.bfloat16
    with pytest.raises(ValueError, match="autocast_dtype"):
        resolve_autocast_dtype("int8", torch.device("cpu"))


# ---------------------------------------------------------------- DDP: 2 gloo processes
def _ddp_worker(rank: int, world: int, data_dir: str, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        loader, meta = build_eval_loader(data_dir, global_batch_size=6, rank=rank, world_size=world)
        rec = Recorder()
        arc = ARCEvaluator(data_dir, meta, None, num_pictures=0)
        sys.stderr = tty = _Terminal()  # both ranks "on a terminal": only rank 0 draws the bar
        m = evaluate(FakeLossHead(FakeACT(oracle_tokens)), loader, [arc, rec], device="cpu", progress=True)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"metrics": m, "seen": rec.seen, "bar": tty.getvalue().split("\r")[-1]}, f)
    finally:
        sys.stderr = sys.__stderr__
        dist.destroy_process_group()


def test_ddp_gather_two_gloo_processes(arc_data, tmp_path):
    import socket

    import torch.multiprocessing as mp

    d, n_puz, n_inputs = arc_data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(2, d, port, str(tmp_path)), nprocs=2, join=True)
    r0 = json.load(open(tmp_path / "rank0.json"))
    r1 = json.load(open(tmp_path / "rank1.json"))
    n_total = n_inputs * NUM_COPIES
    # disjoint shards covering every example once
    assert not set(r0["seen"]) & set(r1["seen"]) and sorted(r0["seen"] + r1["seen"]) == list(range(n_total))
    m = r0["metrics"]
    assert m["ARC/num_examples"] == n_total and m["ARC/pass@1"] == 1.0 and m["ARC/num_puzzles"] == n_puz
    assert m["eval/num_examples"] == n_total and m["all.exact_accuracy"] == 1.0
    assert "ARC/pass@1" not in r1["metrics"] and r1["metrics"]["all.accuracy"] == 1.0
    # rank 0's progress bar counts every rank's examples: it ends at eval/num_examples (the [eval] line's count)
    assert f"{n_total}/{n_total}" in r0["bar"] and r1["bar"] == "", (r0["bar"], r1["bar"])


# ---------------------------------------------------------------- the real model + loss head
def _tiny_arch() -> dict:
    """config/arch/trm_tiny.yaml as Hydra composes it (the file holds only what differs from the class defaults)."""
    from training.config import load_config

    return load_config("cfg_pretrain", ["arch=trm_tiny", "data_paths=[x]"]).arch.model_dump(mode="json")


def _tiny_trm(meta, batch_size):
    import models

    arch = _tiny_arch()
    arch.update(
        hidden_size=32,
        num_heads=2,
        H_cycles=1,
        L_cycles=1,
        L_layers=1,
        halt_max_steps=2,
        puzzle_emb_ndim=32,
        puzzle_emb_len=2,
    )
    torch.manual_seed(0)
    model = models.build_model(
        arch,
        vocab_size=meta.vocab_size,
        seq_len=meta.seq_len,
        num_puzzle_identifiers=meta.num_puzzle_identifiers,
        batch_size=batch_size,
    )
    return model, models.build_loss_head(model)


def test_real_trm_head_metrics_equal_recomputed_metrics(arc_data):
    d, n_puz, n_inputs = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=16, num_augmentations=2)
    model, head = _tiny_trm(meta, 16)
    arc = ARCEvaluator(d, meta, None, num_pictures=0)
    m_head = evaluate(head, loader, [arc], device="cpu", progress=False)
    m_bare = evaluate(model, loader, [arc], device="cpu", progress=False)
    assert m_head["ARC/num_examples"] == 2 * n_inputs and m_head["ARC/num_puzzles"] == n_puz
    assert m_head["all.steps"] == 2.0
    for k in ("accuracy", "exact_accuracy", "lm_loss", "q_halt_accuracy", "steps"):
        assert m_bare[f"all.{k}"] == pytest.approx(m_head[f"all.{k}"], rel=1e-4), k
    assert m_head["all.lm_loss"] > 0.5  # random weights
    assert model.halt_early_in_eval is False
    m_early = evaluate(head, loader, [arc], device="cpu", progress=False, halt_early=True)
    assert 1.0 <= m_early["all.steps"] <= 2.0 and m_early["ARC/num_examples"] == 2 * n_inputs


def test_return_keys_are_saved_without_padding_rows(arc_data, tmp_path):
    d, _, n_inputs = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=5, num_augmentations=1)
    evaluate(
        FakeACT(oracle_tokens),
        loader,
        [],
        device="cpu",
        progress=False,
        return_keys=("inputs", "preds", "steps", "not_there"),
        save_path=str(tmp_path),
    )
    out = torch.load(tmp_path / "outputs.rank0.pt")
    assert sorted(out) == ["example_index", "inputs", "preds", "steps"]
    assert out["preds"].shape == (n_inputs, meta.seq_len) and (out["steps"] == 3).all()
    assert sorted(out["example_index"].tolist()) == sorted(set(out["example_index"].tolist()))
    assert (out["example_index"] >= 0).all()


def test_etrm_model_in_encoder_mode(arc_data):
    """The same path serves ETRM: encoder-mode batches (demos) through models.etrm + the ARC evaluator."""

    import models
    from training.build import build_etrm_model
    from training.config import config_from_dict

    d, n_puz, n_inputs = arc_data
    loader, meta = build_eval_loader(d, global_batch_size=8, num_augmentations=1, encoder_mode=True, max_demos=3)
    arch = _tiny_arch()
    arch.update(
        hidden_size=32,
        num_heads=2,
        H_cycles=1,
        L_cycles=1,
        L_layers=1,
        halt_max_steps=2,
        puzzle_emb_ndim=0,
        puzzle_emb_len=2,
    )
    enc = dict(name="standard", hidden_size=32, num_layers=1, num_heads=2)
    torch.manual_seed(0)
    model = build_etrm_model(
        config_from_dict({"arch": arch, "encoder": enc, "global_batch_size": 8}), meta, verbose=False
    )
    rec = Recorder()
    m = evaluate(
        models.build_loss_head(model),
        loader,
        [ARCEvaluator(d, meta, None, num_pictures=0), rec],
        device="cpu",
        progress=False,
    )
    assert sorted(rec.seen) == sorted(set(rec.seen)) and len(rec.seen) == n_inputs
    assert m["ARC/num_examples"] == n_inputs and m["ARC/num_puzzles"] == n_puz and m["all.steps"] == 2.0


@pytest.mark.parametrize("loss_type", ["softmax_cross_entropy", "stable_max_cross_entropy", "stablemax_cross_entropy"])
def test_recomputed_lm_loss_is_the_loss_heads_definition(loss_type):
    """The per-sample loss of the recomputed metrics is the loss head's token loss / supervised-token count (one
    definition; any alias the head accepts is accepted here)."""
    from models.losses import get_loss_fn

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 30, 12, generator=g) * 20  # large magnitudes: both stablemax branches
    labels = torch.randint(0, 12, (4, 30), generator=g)
    labels[1, ::2] = -100
    labels[3] = -100  # no supervised token -> 0
    n = (labels != -100).sum(-1).clamp_min(1)
    expect = (get_loss_fn(loss_type)(logits, labels).sum(-1) / n).float()
    got = per_sample_lm_loss(logits, labels, loss_type)
    assert got.dtype == torch.float32 and got[3] == 0.0
    assert torch.allclose(got, expect, rtol=1e-6, atol=0)


def test_progress_bar_writes_no_carriage_returns_off_a_terminal(arc_data, capfd, monkeypatch):
    """progress=True in a log file / the queue (stderr not a TTY): no '\\r' bar lines; on a terminal the bar runs."""
    import sys

    d, _, _ = arc_data
    loader, _ = build_eval_loader(d, global_batch_size=64)
    capfd.readouterr()
    evaluate(FakeACT(oracle_tokens), loader, [], device="cpu", progress=True)
    assert "\r" not in capfd.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    evaluate(FakeACT(oracle_tokens), loader, [], device="cpu", progress=True)
    assert "eval" in capfd.readouterr().err  # the bar itself (tqdm checks isatty when disable=None)


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (tqdm then draws its bar, with carriage returns)."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_counts_the_examples_the_metrics_report_and_progress_false_forces_it_off(arc_data, monkeypatch):
    """On a terminal the bar counts test examples (the loader's global batch counts) and ends at the number that
    eval/num_examples (the training loop's [eval] line) reports, here with a padded last batch; progress=False keeps
    it off even on a terminal."""
    d, _, n_inputs = arc_data
    loader, _ = build_eval_loader(d, global_batch_size=64)  # 64 does not divide the example count: padding rows
    n = n_inputs * NUM_COPIES
    assert n % 64
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    m = evaluate(FakeACT(oracle_tokens), loader, [], device="cpu", progress=True)
    assert m["eval/num_examples"] == n
    final = tty.getvalue().split("\r")[-1]
    assert f"{n}/{n}" in final and "example" in final, final
    tty.seek(0)
    tty.truncate()
    evaluate(FakeACT(oracle_tokens), loader, [], device="cpu", progress=False)
    assert tty.getvalue() == ""


def test_progress_bar_off_a_terminal_writes_nothing(arc_data, monkeypatch):
    """stderr redirected to a file (the queue, SLURM, `2> log`): no bar and no '\\r', progress=True or not."""
    d, _, _ = arc_data
    loader, _ = build_eval_loader(d, global_batch_size=64)
    log_file = io.StringIO()  # isatty() is False
    monkeypatch.setattr(sys, "stderr", log_file)
    evaluate(FakeACT(oracle_tokens), loader, [], device="cpu", progress=True)
    assert "\r" not in log_file.getvalue() and log_file.getvalue() == ""

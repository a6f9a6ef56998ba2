"""ARC evaluator: voting, ranking, pass@K, inverse path, malformed predictions, denominators, outputs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from dataset.augment import Augmentation
from dataset.canvas import canvas_to_grid, grid_hash, grid_to_canvas
from dataset.tokens import EOS_ID, IGNORE_LABEL_ID
from evaluators import EVALUATOR_REGISTRY, ARCEvaluator, EvaluatorError, build_evaluators
from evaluators.arc import MALFORMED, Candidate, build_submission, pass_at_k, rank_candidates
from tests.doubles import malformed_tokens, oracle_tokens, write_tiny_arc_test_split, wrong_tokens

AUGS = [
    Augmentation(),
    Augmentation(1, (0, 2, 3, 4, 5, 6, 7, 8, 9, 1)),
    Augmentation(4, (0, 9, 8, 7, 6, 5, 4, 3, 2, 1)),
    Augmentation(6, (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)),
    Augmentation(2, (0, 3, 1, 2, 5, 4, 7, 6, 9, 8)),
    Augmentation(7, (0, 5, 6, 7, 8, 9, 1, 2, 3, 4)),
    Augmentation(5, (0, 1, 3, 2, 4, 5, 6, 8, 7, 9)),
    Augmentation(3, (0, 4, 3, 2, 1, 9, 8, 7, 6, 5)),
]


def _g(rows):
    return np.asarray(rows, dtype=np.uint8)


# A hand-written puzzle set: asymmetric grids so every dihedral transform changes them.
PUZZLES = {
    "p_one": {"train": [], "test": [{"input": [[1, 2, 0], [0, 3, 0]], "output": [[1, 2], [3, 4], [5, 0]]}]},
    "p_two": {
        "train": [],
        "test": [
            {"input": [[4, 0], [0, 5], [6, 6]], "output": [[7, 8, 9]]},
            {"input": [[1, 1, 2]], "output": [[2, 0], [0, 1]]},
        ],
    },
    "p_three": {"train": [], "test": [{"input": [[3]], "output": [[6, 1, 1], [0, 0, 2]]}]},
}


@pytest.fixture()
def tiny_data(tmp_path):
    return write_tiny_arc_test_split(str(tmp_path / "data"), PUZZLES, AUGS)


def _run(ev: ARCEvaluator, data_dir: str, token_fn, *, q=None, rows=None, batch_size=5, save=None):
    """Feed every example of the tiny split (or ``rows``) to ``ev`` in batches with padding rows."""
    inputs = np.load(os.path.join(data_dir, "test", "all__inputs.npy"))
    labels = np.load(os.path.join(data_dir, "test", "all__labels.npy")).astype(np.int64)
    pidx = np.load(os.path.join(data_dir, "test", "all__puzzle_indices.npy"))
    pids = np.load(os.path.join(data_dir, "test", "all__puzzle_identifiers.npy"))
    labels[labels == 0] = IGNORE_LABEL_ID
    ex_puz = np.searchsorted(pidx, np.arange(len(inputs)), side="right") - 1
    rows = np.arange(len(inputs)) if rows is None else np.asarray(rows)
    ev.begin_eval()
    for s in range(0, len(rows), batch_size):
        r = rows[s : s + batch_size]
        pad = batch_size - len(r)
        ex = np.concatenate([r, -np.ones(pad, np.int64)])
        take = np.where(ex >= 0, ex, 0)
        lab = torch.from_numpy(labels[take])
        batch = {
            "inputs": torch.from_numpy(inputs[take].astype(np.int32)),
            "labels": lab,
            "puzzle_identifiers": torch.from_numpy(np.where(ex >= 0, pids[ex_puz[take]], 0).astype(np.int32)),
            "example_index": torch.from_numpy(ex.astype(np.int64)),
        }
        preds = token_fn(lab)
        qv = torch.zeros(batch_size) if q is None else torch.as_tensor([q(int(e)) for e in ex], dtype=torch.float32)
        ev.update(batch, {"preds": preds, "q_halt_logits": qv})
    return ev.result(save)


# ---------------------------------------------------------------- ranking by hand
def test_hand_built_ranking_votes_ties_and_q():
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    a = Candidate("a", [[1]], votes=3, q_sum=3 * sig(-2.0))  # most votes, low q
    b = Candidate("b", [[2]], votes=2, q_sum=2 * sig(1.0))  # tie with c on votes; higher mean q
    c = Candidate("c", [[3]], votes=2, q_sum=2 * sig(0.5))
    d = Candidate("d", [[4]], votes=1, q_sum=sig(5.0))  # best q but one vote
    m = Candidate(MALFORMED, None, votes=4, q_sum=4 * sig(3.0))
    ranked = rank_candidates([d, c, m, b, a])
    assert [x.hash for x in ranked] == ["a", "b", "c", "d"]
    assert [x.hash for x in rank_candidates([d, c, m, b, a], rank_malformed=True)] == [MALFORMED, "a", "b", "c", "d"]
    # truth = c: rank 3 -> fails @1 and @2, passes @5
    assert pass_at_k(ranked, "c", (1, 2, 5)) == {1: False, 2: False, 5: True}
    assert pass_at_k(ranked, "zzz", (1, 1000)) == {1: False, 1000: False}
    assert pass_at_k(ranked, "a", (1,)) == {1: True}


def test_pass_at_k_by_hand_through_the_evaluator(tiny_data):
    """8 copies per test input; per-copy predictions chosen so that votes, a vote tie and q decide ranks.

    p_one (1 input):  truth 3 votes, wrong W1 4 votes -> rank 2: pass@1 0, pass@2 1.
    p_two input 0:    truth 4 votes, W1 4 votes, truth mean q higher -> rank 1.
    p_two input 1:    truth 2 votes, W1 3, malformed 3 (no rank)  -> rank 2.
          p_two score: @1 = 1/2, @2 = 1.
    p_three:          truth 1 vote (q high), W1 4, W2 3 -> rank 3: @1 0, @2 0, @5 1.
    pass@1 = (0 + .5 + 0)/3, pass@2 = (1 + 1 + 0)/3, pass@5 = 1.
    """
    ev = ARCEvaluator(tiny_data, None, None, pass_ks=(1, 2, 5), num_pictures=0)
    pidx = np.load(os.path.join(tiny_data, "test", "all__puzzle_indices.npy"))
    ids = json.load(open(os.path.join(tiny_data, "identifiers.json")))
    pids = np.load(os.path.join(tiny_data, "test", "all__puzzle_identifiers.npy"))
    # example -> (puzzle name, test index, copy number)
    info = {}
    for p in range(len(pids)):
        name, _ = Augmentation.parse_name(ids[pids[p]])
        copy = p % len(AUGS)
        for j, e in enumerate(range(pidx[p], pidx[p + 1])):
            info[e] = (name, j, copy)
    plan = {  # (name, test index) -> per copy: "T" truth, "W" wrong(+1), "V" wrong(+2), "M" malformed
        ("p_one", 0): "TTTWWWWV",
        ("p_two", 0): "TTTTWWWW",
        ("p_two", 1): "TTWWWMMM",
        ("p_three", 0): "TWWWWVVV",
    }

    def pred_for(e, lab):
        """Prediction of one copy, built in ORIGINAL space then augmented like the copy's input, so that
        equal original-space grids are equal candidates only after the evaluator inverts the augmentation."""
        if e < 0:
            return oracle_tokens(lab)
        name, j, copy = info[e]
        kind = plan[(name, j)][copy]
        truth = _g(PUZZLES[name]["test"][j]["output"])
        grid = {"T": truth, "W": (truth + 1) % 10, "V": (truth + 2) % 10, "M": truth}[kind]
        canvas = torch.from_numpy(grid_to_canvas(AUGS[copy].apply(grid)).astype(np.int64))
        if kind == "M":
            canvas = torch.where(canvas == EOS_ID, 0, canvas)
        return canvas

    def token_fn_rows(labels, exs):
        return torch.stack([pred_for(int(e), lab) for lab, e in zip(labels, exs)])

    def q(e):
        if e < 0:
            return 0.0
        name, j, copy = info[e]
        kind = plan[(name, j)][copy]
        return 2.0 if kind == "T" else -2.0

    inputs = np.load(os.path.join(tiny_data, "test", "all__inputs.npy"))
    labels = np.load(os.path.join(tiny_data, "test", "all__labels.npy")).astype(np.int64)
    labels[labels == 0] = IGNORE_LABEL_ID
    ex_puz = np.searchsorted(pidx, np.arange(len(inputs)), side="right") - 1

    def feed(qf):
        ev.begin_eval()
        order = np.random.default_rng(0).permutation(len(inputs))  # order must not matter
        for s in range(0, len(order), 7):
            r = order[s : s + 7]
            lab = torch.from_numpy(labels[r])
            batch = {
                "inputs": torch.from_numpy(inputs[r].astype(np.int32)),
                "labels": lab,
                "puzzle_identifiers": torch.from_numpy(pids[ex_puz[r]].astype(np.int32)),
                "example_index": torch.from_numpy(r.astype(np.int64)),
            }
            ev.update(batch, {"preds": token_fn_rows(lab, r), "q_halt_logits": torch.tensor([qf(int(e)) for e in r])})
        return ev.result(None)

    # q favouring the wrong candidates: the p_two/0 vote tie now goes to W1 -> pass@1 = 0, pass@2 unchanged
    m = feed(lambda e: -q(e))
    assert m["ARC/pass@1"] == 0.0 and m["ARC/pass@2"] == pytest.approx(2 / 3)
    m = feed(q)
    assert m["ARC/pass@1"] == pytest.approx((0 + 0.5 + 0) / 3)
    assert m["ARC/pass@2"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["ARC/pass@5"] == pytest.approx(1.0)
    assert m["ARC/num_puzzles"] == 3 and m["ARC/num_test_inputs"] == 4
    assert m["ARC/num_examples"] == 4 * 8
    assert m["ARC/malformed_frac"] == pytest.approx(3 / 32)
    # votes and mean q of the p_two/1 ranking
    r = ev.last_ranked["p_two"][1]
    assert [c.votes for c in r] == [3, 2]
    assert r[1].grid_list() == PUZZLES["p_two"]["test"][1]["output"]


# ---------------------------------------------------------------- inverse path, end to end
def test_oracle_predictions_through_inverse_path_score_one(tiny_data, tmp_path):
    ev = ARCEvaluator(tiny_data, None, None, num_pictures=1)
    m = _run(ev, tiny_data, oracle_tokens, save=str(tmp_path / "out"))
    for k in (1, 2, 5, 10, 100, 1000):
        assert m[f"ARC/pass@{k}"] == 1.0
    assert m["ARC/num_examples"] == 32 and m["ARC/malformed_frac"] == 0.0
    # one candidate with all 8 votes per test input, although the 8 raw predictions differ
    for name, per_input in ev.last_ranked.items():
        for i, r in enumerate(per_input):
            assert len(r) == 1 and r[0].votes == 8
            assert r[0].grid_list() == PUZZLES[name]["test"][i]["output"]
    # outputs
    sub = json.load(open(tmp_path / "out" / "submission.json"))
    assert sorted(sub) == sorted(PUZZLES)
    for name, entries in sub.items():
        assert len(entries) == len(PUZZLES[name]["test"])
        for i, e in enumerate(entries):
            assert set(e) == {"attempt_1", "attempt_2"}
            assert e["attempt_1"] == PUZZLES[name]["test"][i]["output"]
            assert e["attempt_2"] == e["attempt_1"]  # one candidate -> repeated
    pred = json.load(open(tmp_path / "out" / "predictions.json"))
    assert pred["p_two"][1]["candidates"][0]["votes"] == 8 and pred["p_two"][1]["correct_rank"] == 1
    pngs = os.listdir(tmp_path / "out" / "pictures")
    assert len(pngs) == 1 and pngs[0].endswith(".png")
    assert (tmp_path / "out" / "pictures" / pngs[0]).stat().st_size > 1000


def test_augmented_copies_disagree_until_inverted(tiny_data):
    labels = np.load(os.path.join(tiny_data, "test", "all__labels.npy"))
    pidx = np.load(os.path.join(tiny_data, "test", "all__puzzle_indices.npy"))
    # the 8 copies of p_one's test input: raw predicted grids are pairwise different...
    raw = {grid_hash(canvas_to_grid(labels[pidx[p]])) for p in range(8)}
    assert len(raw) == 8
    # ...but the evaluator sees one candidate (above) - and a mistaken identity inverse would not:
    ev = ARCEvaluator(tiny_data, None, None, num_pictures=0)
    ev._aug_cache = {}
    orig = Augmentation.invert
    try:
        Augmentation.invert = lambda self, g: np.asarray(g, dtype=np.uint8)  # type: ignore[assignment]
        with pytest.raises(EvaluatorError, match="matches no test input"):
            _run(ev, tiny_data, oracle_tokens)
    finally:
        Augmentation.invert = orig  # type: ignore[assignment]


def test_wrong_predictions_score_zero(tiny_data):
    m = _run(ARCEvaluator(tiny_data, None, None, num_pictures=0), tiny_data, wrong_tokens)
    assert all(m[f"ARC/pass@{k}"] == 0.0 for k in (1, 2, 1000))
    assert m["ARC/num_puzzles"] == 3


def test_malformed_predictions_are_wrong_candidates_not_crashes(tiny_data, tmp_path):
    def ragged(lab):
        t = oracle_tokens(lab).clone()
        row1 = t[:, 30:60]  # view: row 1 of the canvas gets one colour more than row 0 (ragged)
        first_eos = (row1 == EOS_ID).int().argmax(-1)
        row1[torch.arange(len(t)), first_eos] = 2
        return t

    def no_leading_colour(lab):
        t = torch.full_like(lab, 5)  # every token a colour: 30x30 grid with no EOS -> decodes (valid, wrong)
        t[:, 0] = 0  # first token PAD -> w == 0 -> malformed
        return t

    for fn in (malformed_tokens, ragged, no_leading_colour):
        ev = ARCEvaluator(tiny_data, None, None, num_pictures=0)
        m = _run(ev, tiny_data, fn, save=str(tmp_path / fn.__name__))
        assert m["ARC/malformed_frac"] == 1.0, fn.__name__
        assert m["ARC/pass@1000"] == 0.0
        sub = json.load(open(tmp_path / fn.__name__ / "submission.json"))
        assert sub["p_one"][0] == {"attempt_1": [[0]], "attempt_2": [[0]]}
    # strict_decode=False: the published crop accepts a missing EOS frame -> correct
    m = _run(ARCEvaluator(tiny_data, None, None, num_pictures=0, strict_decode=False), tiny_data, malformed_tokens)
    assert m["ARC/pass@1"] == 1.0 and m["ARC/malformed_frac"] == 0.0


def test_denominator_is_puzzles_evaluated(tiny_data):
    # only p_one's and p_three's examples: p_one correct, p_three wrong -> 0.5 (not 1/3)
    pidx = np.load(os.path.join(tiny_data, "test", "all__puzzle_indices.npy"))
    ids = json.load(open(os.path.join(tiny_data, "identifiers.json")))
    pids = np.load(os.path.join(tiny_data, "test", "all__puzzle_identifiers.npy"))
    rows = [
        e
        for p in range(len(pids))
        if Augmentation.parse_name(ids[pids[p]])[0] in ("p_one", "p_three")
        for e in range(pidx[p], pidx[p + 1])
    ]
    name_of = {
        e: Augmentation.parse_name(ids[pids[p]])[0] for p in range(len(pids)) for e in range(pidx[p], pidx[p + 1])
    }
    ev = ARCEvaluator(tiny_data, None, None, num_pictures=0)

    def fn_rows(lab):
        return lab  # replaced below

    # predict truth for p_one, wrong for p_three via q-independent token choice keyed on example rows
    inputs = np.load(os.path.join(tiny_data, "test", "all__inputs.npy"))
    labels = np.load(os.path.join(tiny_data, "test", "all__labels.npy")).astype(np.int64)
    labels[labels == 0] = IGNORE_LABEL_ID
    ex_puz = np.searchsorted(pidx, np.arange(len(inputs)), side="right") - 1
    ev.begin_eval()
    r = np.asarray(rows)
    lab = torch.from_numpy(labels[r])
    preds = torch.stack([oracle_tokens(l) if name_of[int(e)] == "p_one" else wrong_tokens(l) for l, e in zip(lab, r)])
    ev.update(
        {
            "inputs": torch.from_numpy(inputs[r].astype(np.int32)),
            "labels": lab,
            "puzzle_identifiers": torch.from_numpy(pids[ex_puz[r]].astype(np.int32)),
            "example_index": torch.from_numpy(r),
        },
        {"preds": preds, "q_halt_logits": torch.zeros(len(r))},
    )
    m = ev.result(None)
    assert m["ARC/num_puzzles"] == 2 and m["ARC/num_test_inputs"] == 2
    assert m["ARC/pass@1"] == 0.5


def test_votes_reset_between_evaluations_unless_accumulating(tiny_data):
    ev = ARCEvaluator(tiny_data, None, None, num_pictures=0)
    assert _run(ev, tiny_data, oracle_tokens)["ARC/pass@1"] == 1.0
    m = _run(ev, tiny_data, wrong_tokens)
    assert m["ARC/pass@1"] == 0.0 and m["ARC/num_examples"] == 32
    assert all(sum(c.votes for c in r) == 8 for per in ev.last_ranked.values() for r in per)  # not 16
    acc = ARCEvaluator(tiny_data, None, None, num_pictures=0, accumulate_votes=True)
    _run(acc, tiny_data, oracle_tokens, q=lambda e: 1.0)
    m = _run(acc, tiny_data, wrong_tokens, q=lambda e: -1.0)
    # 8 true votes from the first evaluation survive the second one
    assert m["ARC/pass@1"] == 1.0 and m["ARC/num_examples"] == 32
    r = acc.last_ranked["p_one"][0]
    assert r[0].votes == 8 and sum(c.votes for c in r) == 16


def test_the_identity_copys_answer_is_flagged_in_the_predictions(tiny_data, tmp_path):
    """Each candidate says whether the identity copy (the puzzle as drawn) voted for it, so a voted evaluation
    also holds its one-copy answer (experiments.science.score --one-copy): here the identity copy of every
    puzzle answers wrong and the 7 augmented copies right, so the vote is right and the one-copy answer wrong."""
    labels = np.load(os.path.join(tiny_data, "test", "all__labels.npy")).astype(np.int64)
    pidx = np.load(os.path.join(tiny_data, "test", "all__puzzle_indices.npy"))
    names = json.load(open(os.path.join(tiny_data, "identifiers.json")))
    pids = np.load(os.path.join(tiny_data, "test", "all__puzzle_identifiers.npy"))
    ident = [int(p) for p in range(len(pids)) if Augmentation.parse_name(names[pids[p]])[1].is_identity]
    assert len(ident) == 3  # one identity copy per puzzle
    hit = torch.zeros(len(labels), dtype=torch.bool)
    for p in ident:
        hit[pidx[p] : pidx[p + 1]] = True

    def identity_wrong(lab):  # one batch holding every example in order
        return torch.where(hit[:, None], wrong_tokens(lab), oracle_tokens(lab))

    ev = ARCEvaluator(tiny_data, None, None, num_pictures=0)
    m = _run(ev, tiny_data, identity_wrong, batch_size=len(labels), save=str(tmp_path / "out"))
    assert m["ARC/pass@1"] == 1.0
    pred = json.load(open(tmp_path / "out" / "predictions.json"))
    for name, per_input in pred.items():
        for row in per_input:
            flags = [(c["votes"], c["identity"], c["correct"]) for c in row["candidates"]]
            assert flags == [(7, False, True), (1, True, False)], (name, flags)
    # kept beyond the top k: the identity copy's candidate ranked last is still written
    ranked = {"p": [[Candidate(str(i), _g([[i]]), votes=9 - i, identity=i == 5) for i in range(6)]]}
    from evaluators.arc import write_predictions

    write_predictions(str(tmp_path / "p.json"), ranked, {"p": [(None, None, "0")]}, top_k=2)
    got = json.load(open(tmp_path / "p.json"))["p"][0]["candidates"]
    assert [(c["hash"], c["identity"]) for c in got] == [("0", False), ("1", False), ("5", True)]


def test_duplicate_rows_on_one_rank_are_counted_once(tiny_data):
    ev = ARCEvaluator(tiny_data, None, None, num_pictures=0)
    rows = list(range(32)) + [0, 1, 2]
    m = _run(ev, tiny_data, oracle_tokens, rows=rows)
    assert m["ARC/num_examples"] == 32 and m["ARC/duplicate_examples"] == 3
    assert ev.last_ranked["p_one"][0][0].votes == 8


def test_missing_test_input_counts_as_unsolved(tiny_data):
    # drop p_two's second test input (examples at position 1 of each p_two copy)
    pidx = np.load(os.path.join(tiny_data, "test", "all__puzzle_indices.npy"))
    ids = json.load(open(os.path.join(tiny_data, "identifiers.json")))
    pids = np.load(os.path.join(tiny_data, "test", "all__puzzle_identifiers.npy"))
    drop = {pidx[p] + 1 for p in range(len(pids)) if Augmentation.parse_name(ids[pids[p]])[0] == "p_two"}
    rows = [e for e in range(32) if e not in drop]
    m = _run(ARCEvaluator(tiny_data, None, None, num_pictures=0), tiny_data, oracle_tokens, rows=rows)
    assert m["ARC/missing_test_inputs"] == 1 and m["ARC/num_test_inputs"] == 4
    assert m["ARC/pass@1"] == pytest.approx((1 + 0.5 + 1) / 3)


def test_submission_fallbacks():
    sub = build_submission(
        {
            "x": [
                [Candidate("h1", [[1]], 3), Candidate("h2", [[2]], 1)],
                [],
                [Candidate(MALFORMED, None, 5), Candidate("h3", [[3]], 1)],
            ]
        }
    )
    assert sub == {
        "x": [
            {"attempt_1": [[1]], "attempt_2": [[2]]},
            {"attempt_1": [[0]], "attempt_2": [[0]]},
            {"attempt_1": [[3]], "attempt_2": [[3]]},
        ]
    }


def test_registry_and_loud_construction_errors(tiny_data, tmp_path):
    assert EVALUATOR_REGISTRY["arc"].cls is ARCEvaluator and EVALUATOR_REGISTRY["arc@ARC"].cls is ARCEvaluator
    evs = build_evaluators([{"name": "arc", "pass_ks": [1, 2]}], data_path=tiny_data)
    assert isinstance(evs[0], ARCEvaluator) and evs[0].pass_ks == (1, 2)
    with pytest.raises(EvaluatorError, match="unknown evaluator 'nope'"):
        build_evaluators(["nope"], data_path=tiny_data)
    with pytest.raises(EvaluatorError, match="could not be built.*dataset.json"):
        build_evaluators(["arc"], data_path=str(tmp_path / "missing"))
    with pytest.raises(EvaluatorError, match="bogus"):
        build_evaluators([{"name": "arc", "bogus": 1}], data_path=tiny_data)
    os.remove(os.path.join(tiny_data, "identifiers.json"))
    with pytest.raises(EvaluatorError, match="identifiers.json"):
        ARCEvaluator(tiny_data, None, None)


def test_wandb_table_and_pictures_logged_with_an_active_run(tiny_data, tmp_path, monkeypatch):
    import wandb

    logged = {}
    run = wandb.init(mode="disabled")
    monkeypatch.setattr(wandb, "log", lambda d, **kw: logged.update(d))
    try:
        _run(ARCEvaluator(tiny_data, None, None, num_pictures=2), tiny_data, oracle_tokens, save=str(tmp_path / "o"))
    finally:
        run.finish()
    assert isinstance(logged["ARC/predictions"], wandb.Table)
    assert len(logged["ARC/predictions"].data) == 4  # one row per test input (single candidate each)
    assert len(logged["ARC/pictures"]) == 2


def test_q_halt_probability_in_float64_ranks_confident_candidates(tmp_path):
    """Two candidates with one vote each: the tie is broken by sigmoid(q_halt). With logits 18 and 20 an fp32
    sigmoid gives exactly 1.0 for both (a tie settled by hash, i.e. the same order both ways); the published
    evaluator's float64 sigmoid keeps them apart, so swapping the logits must swap the ranking."""
    data = write_tiny_arc_test_split(
        str(tmp_path / "d"), {"p": PUZZLES["p_one"]}, [Augmentation(), Augmentation(2)]
    )  # dihedral only: wrong_tokens commutes

    def preds(lab):  # example 0 (identity copy) predicts the truth, example 1 a wrong grid
        return torch.stack([oracle_tokens(lab[0]), wrong_tokens(lab[1])])

    assert torch.sigmoid(torch.tensor([18.0, 20.0])).tolist() == [1.0, 1.0]  # the fp32 saturation this guards
    for truth_q, wrong_q, solved in ((20.0, 18.0, 1.0), (18.0, 20.0, 0.0)):
        ev = ARCEvaluator(data, None, None, pass_ks=(1, 2), num_pictures=0)
        m = _run(ev, data, preds, q=lambda e, a=truth_q, b=wrong_q: a if e == 0 else b, batch_size=2)
        assert m["ARC/pass@1"] == solved, (truth_q, wrong_q)
        assert m["ARC/pass@2"] == 1.0
        top = ev.last_ranked["p"][0]
        assert [c.votes for c in top] == [1, 1] and top[0].mean_q > top[1].mean_q


def test_original_trm_evaluator_spelling_is_an_alias(tmp_path):
    """`arc@ARC` (the published TRM config's evaluator name) builds the ARC evaluator; an unknown name is refused."""
    from evaluators import build_evaluators

    with pytest.raises(EvaluatorError, match="evaluator 'arc@ARC' could not be built"):  # found, then data missing
        build_evaluators([{"name": "arc@ARC"}], data_path=str(tmp_path))
    with pytest.raises(EvaluatorError, match="unknown evaluator 'arc@XYZ'"):
        build_evaluators([{"name": "arc@XYZ"}], data_path=str(tmp_path))


def test_prediction_pictures_show_the_demonstrations(tmp_path):
    """A puzzle's picture has a row of its demo pairs above the test rows (input, truth, top-k): more demos, a
    taller picture; a puzzle without demos has only its test row."""
    import struct

    import numpy as np

    from evaluators.arc import Candidate
    from evaluators.pictures import draw_puzzle

    def height(path):
        with open(path, "rb") as f:
            return struct.unpack(">II", f.read(24)[16:24])[1]  # PNG IHDR: width, height

    grid = [[1, 2], [3, 4]]
    test = [{"input": grid, "output": grid}]
    ranked = [[Candidate("a", np.asarray(grid), votes=3, q_sum=2.0)]]
    demos = [{"input": grid, "output": grid}] * 4  # 4 pairs at 3 per row: 2 demo rows
    h0 = height(draw_puzzle(str(tmp_path / "0.png"), "p", {"train": [], "test": test}, ranked))
    h4 = height(draw_puzzle(str(tmp_path / "4.png"), "p", {"train": demos, "test": test}, ranked))
    assert h4 > 2.5 * h0


def test_prediction_picture_panels_show_demos_input_truth_and_candidates():
    """What each panel of a puzzle's picture shows: every demo pair (input, output), then per test input its input,
    the ground truth and the top-k candidates (votes out of that input's votes; green title = correct, red = wrong;
    a slot without a candidate says why), each title with its grid's size (height x width)."""
    from evaluators.arc import Candidate
    from evaluators.pictures import CORRECT_COLOR, DEMO_COLOR, WRONG_COLOR, puzzle_figure

    demos = [{"input": [[d, 1], [2, 3]], "output": [[3, 2], [1, d]]} for d in range(4)]
    tests = [{"input": [[5, 6]], "output": [[6, 5]]}, {"input": [[7]], "output": [[8]]}]
    ranked = [
        [Candidate("a", _g([[6, 5]]), votes=4, q_sum=3.6), Candidate("b", _g([[1, 1]]), votes=1, q_sum=0.1)],
        [Candidate("c", _g([[9]]), votes=2, q_sum=0.2)],
    ]
    fig = puzzle_figure("p", {"train": demos, "test": tests}, ranked, top_k=2)
    shown = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}

    def grid(title):
        return shown[title].images[0].get_array().tolist()

    for d, ex in enumerate(demos):
        assert grid(f"demo {d}: input 2x2") == ex["input"] and grid(f"demo {d}: output 2x2") == ex["output"]
        assert shown[f"demo {d}: input 2x2"].title.get_color() == DEMO_COLOR
    assert grid("test 0: input 1x2") == tests[0]["input"] and grid("test 1: input 1x1") == tests[1]["input"]
    truths = [ax.images[0].get_array().tolist() for ax in fig.axes if ax.get_title().startswith("ground truth")]
    assert truths == [tests[0]["output"], tests[1]["output"]]
    top1 = shown["top-1 1x2: 4/5 votes, q=0.90"]
    assert top1.images[0].get_array().tolist() == [[6, 5]] and top1.title.get_color() == CORRECT_COLOR
    assert shown["top-2 1x2: 1/5 votes, q=0.10"].title.get_color() == WRONG_COLOR
    assert shown["top-1 1x1: 2/2 votes, q=0.10"].title.get_color() == WRONG_COLOR
    empty = [ax for ax in fig.axes if ax.get_title() == "top-2" and not ax.images]
    assert len(empty) == 1 and empty[0].texts[0].get_text() == "no other candidate\n(the copies agree)"
    from matplotlib.text import Text

    assert any(t.get_text().startswith("p: 4 demos, 2 test input(s)") for t in fig.findobj(Text))  # figure title


def test_prediction_picture_cells_have_one_size_and_empty_slots_say_why():
    """A 2x2 input used to be stretched to its whole panel like the 6x6 output beside it: every panel of a puzzle
    now spans the puzzle's largest grid (same limits, equal aspect), so a cell is the same size in all panels and the
    2x2 input covers a third of its panel's width. A test input without a valid prediction says so, with the number
    of augmented copies that were malformed (the evaluator's counts)."""
    from evaluators.arc import Candidate
    from evaluators.pictures import Copies, puzzle_figure

    small, big = [[1, 2], [3, 4]], [[(r + c) % 10 for c in range(6)] for r in range(6)]
    tests = [{"input": small, "output": big}, {"input": [[5]], "output": [[5, 5], [5, 5]]}]
    ranked = [[Candidate("a", _g(big), votes=5, q_sum=4.0)], []]
    fig = puzzle_figure(
        "p",
        {"train": [{"input": small, "output": big}], "test": tests},
        ranked,
        top_k=2,
        copies=[Copies(8, 3), Copies(8, 8)],
    )
    fig.canvas.draw()
    shown = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    drawn = [ax for ax in shown.values() if ax.images]
    assert {(ax.get_xlim(), ax.get_ylim()) for ax in drawn} == {((0.0, 6.0), (6.0, 0.0))}
    widths = {
        t: shown[t].get_window_extent().width
        for t in ("demo 0: input 2x2", "demo 0: output 6x6", "test 0: input 2x2", "ground truth 6x6")
    }
    assert len({round(w) for w in widths.values()}) == 1  # same panel size, same limits: same cell size
    left, right, _, _ = shown["test 0: input 2x2"].images[0].get_extent()
    assert right - left == 2  # two cells of the six the panel spans
    assert shown["top-1 6x6: 5/8 votes, q=0.80"].images  # votes out of all 8 copies, malformed ones included
    texts = {ax.texts[0].get_text().replace("\n", " ") for ax in fig.axes if ax.get_title() == "top-2" and ax.texts}
    assert texts == {"no other candidate (3 of 8 copies malformed)", "no valid prediction (all 8 copies malformed)"}


def test_evaluator_pictures_count_the_malformed_copies(tiny_data, tmp_path, monkeypatch):
    """Every copy malformed: the evaluator hands the pictures its per-test-input counts (8 augmented copies, 8
    malformed), so the top-1 slot reads "no valid prediction (all 8 copies malformed)" instead of "none"."""
    from evaluators import pictures
    from evaluators.pictures import Copies, puzzle_figure

    drawn = {}

    def spy(path, name, puzzle, ranked, top_k=2, copies=None):  # draw_puzzle without the PNG
        fig = puzzle_figure(name, puzzle, ranked, top_k, copies)
        drawn[name] = [
            ax.texts[0].get_text().replace("\n", " ")
            for ax in fig.axes
            if ax.get_title().startswith("top-") and ax.texts
        ]
        return path

    monkeypatch.setattr(pictures, "draw_puzzle", spy)
    ev = ARCEvaluator(tiny_data, None, None, num_pictures=3)
    _run(ev, tiny_data, malformed_tokens, save=str(tmp_path / "o"))
    assert ev.last_copies["p_two"] == [Copies(8, 8), Copies(8, 8)]
    assert drawn["p_one"] == ["no valid prediction (all 8 copies malformed)"] * 2
    assert drawn["p_two"] == ["no valid prediction (all 8 copies malformed)"] * 4

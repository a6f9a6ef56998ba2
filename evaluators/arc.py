"""ARC evaluator: augmentation voting and pass@K (definition in docs/evaluation.md).

For every evaluated test example (one augmented copy of one test input of one puzzle):

1. decode the predicted tokens to a grid with :func:`dataset.canvas.canvas_to_grid` (strict EOS-framed
   decode by default; ``strict_decode=False`` uses the published max-area crop);
2. invert the copy's augmentation exactly (identifier name -> :class:`dataset.augment.Augmentation`);
3. hash shape + content (:func:`dataset.canvas.grid_hash`) and add one vote for that candidate of the
   key ``(original puzzle, test input index)``, together with sigmoid(q_halt) of the copy (in float64, as
   the published evaluator: in fp32 it saturates to exactly 1.0 above a logit of ~17).

Candidates are ranked by vote count, ties broken by the mean sigmoid(q_halt) of their voters (then by
hash, for determinism). A test input is solved at K when its ground truth is among the top-K
candidates; a puzzle's score is the mean over its test inputs; ``ARC/pass@K`` is the mean over the
puzzles actually evaluated (pitfall 11). Malformed predictions are wrong candidates: by default they
get no rank (they can never be submitted), with ``rank_malformed=True`` they form one ranked sentinel
candidate that is never correct. Their share is reported as ``ARC/malformed_frac``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from core.errors import PlatformError
from core.io import read_json, write_json_atomic
from dataset.augment import Augmentation
from dataset.canvas import canvas_to_grid, grid_hash
from dataset.metadata import canvas_side, load_metadata
from evaluators import dist as edist
from evaluators.pictures import Copies, save_prediction_pictures

log = logging.getLogger(__name__)

DEFAULT_PASS_KS: tuple[int, ...] = (1, 2, 5, 10, 100, 1000)
MALFORMED = "<malformed>"
FALLBACK_GRID = [[0]]


class EvaluatorError(PlatformError, ValueError):
    """Bad evaluator input (missing file, unknown puzzle, ...). The message names file / field / value."""


@dataclass
class Candidate:
    """One distinct predicted grid (after inverting the augmentation) of one test input."""

    hash: str
    grid: Optional[np.ndarray]  # uint8 [h, w] (compact: up to 1001 candidates per test input); None = malformed
    votes: int = 0
    q_sum: float = 0.0
    identity: bool = False  # the puzzle as drawn (the identity copy) voted for it: its one-copy answer

    @property
    def mean_q(self) -> float:
        return self.q_sum / max(self.votes, 1)

    def grid_list(self) -> Optional[list]:
        return None if self.grid is None else np.asarray(self.grid).tolist()

    def to_dict(self) -> dict:
        return {
            "grid": self.grid_list(),
            "votes": self.votes,
            "mean_q": round(self.mean_q, 6),
            "hash": self.hash,
            "identity": self.identity,
        }


def rank_candidates(cands: Sequence[Candidate], rank_malformed: bool = False) -> list[Candidate]:
    """Sort by (votes desc, mean sigmoid(q_halt) desc, hash asc). Drops the malformed sentinel unless
    ``rank_malformed``."""
    pool = [c for c in cands if rank_malformed or c.hash != MALFORMED]
    return sorted(pool, key=lambda c: (-c.votes, -c.mean_q, c.hash))


def pass_at_k(ranked: Sequence[Candidate], truth_hash: str, ks: Sequence[int]) -> dict[int, bool]:
    """Whether the ground truth hash is among the top-k ranked candidates, for each k."""
    pos = next((i for i, c in enumerate(ranked) if c.hash == truth_hash), None)
    return {k: pos is not None and pos < k for k in ks}


def _read_json(path: str) -> Any:
    return read_json(path, EvaluatorError, "missing (the ARC evaluator needs a built ARC dataset directory)")


class ARCEvaluator:
    """Voting pass@K over augmented copies. Protocol: docs/architecture.md §5.

    Args:
        data_path: built ARC dataset directory (``identifiers.json``, ``test_puzzles.json``, ``test/``);
            a one-element list is accepted.
        metadata: the test split's :class:`DatasetMetadata` (may be None: read from ``data_path``).
        output_dir: default directory for outputs when ``result`` gets no ``save_path``.
        pass_ks: the K values of pass@K.
        strict_decode: EOS-framed decode (True) or the published max-area crop (False).
        rank_malformed: give malformed predictions one ranked (never correct) sentinel candidate.
        accumulate_votes: keep votes across ``begin_eval`` calls (an ensemble over checkpoints; off by
            default, pitfall 12).
        submission_k: top candidates written per test input to predictions.json.
        num_pictures: puzzles drawn as PNGs by ``result`` (0 disables pictures).
        split: dataset split evaluated.
    """

    required_outputs: set[str] = {"preds", "q_halt_logits"}

    def __init__(
        self,
        data_path: Union[str, Sequence[str]],
        metadata: Any = None,
        output_dir: Optional[str] = None,
        *,
        pass_ks: Sequence[int] = DEFAULT_PASS_KS,
        strict_decode: bool = True,
        rank_malformed: bool = False,
        accumulate_votes: bool = False,
        submission_k: int = 10,
        num_pictures: int = 8,
        split: str = "test",
        seed: int = 0,
    ):
        if not isinstance(data_path, str):
            paths = list(data_path)
            if len(paths) != 1:
                raise EvaluatorError(f"ARCEvaluator: data_path must be one directory, got {paths}")
            data_path = paths[0]
        if not pass_ks or any(int(k) < 1 for k in pass_ks):
            raise EvaluatorError(f"ARCEvaluator: pass_ks must be positive integers, got {list(pass_ks)}")
        self.data_path = data_path
        self.output_dir = output_dir
        self.pass_ks = tuple(sorted({int(k) for k in pass_ks}))
        self.strict_decode = bool(strict_decode)
        self.rank_malformed = bool(rank_malformed)
        self.accumulate_votes = bool(accumulate_votes)
        self.submission_k = int(submission_k)
        self.num_pictures = int(num_pictures)
        self.seed = int(seed)

        split_dir = os.path.join(data_path, split)
        self.metadata = metadata if metadata is not None else load_metadata(split_dir)
        side = canvas_side(self.metadata)  # grid_size in dataset.json; a published 900-token directory: 30
        if side is None:
            raise EvaluatorError(
                f"{split_dir}/dataset.json: seq_len={self.metadata.seq_len} is not a square canvas "
                f"(grid_size={self.metadata.grid_size}); the ARC evaluator only handles canvas datasets"
            )
        self.grid_size = side
        sets = list(self.metadata.sets)
        if len(sets) != 1:
            raise EvaluatorError(f"{split_dir}/dataset.json: sets={sets}; the ARC evaluator supports one set")
        set_name = sets[0]
        ids = _read_json(os.path.join(data_path, "identifiers.json"))
        if not isinstance(ids, list):
            raise EvaluatorError(f"{data_path}/identifiers.json: expected a list of names, got {type(ids).__name__}")
        self.identifiers: list[str] = ids
        self._aug_cache: dict[int, tuple[str, Augmentation]] = {}
        self.test_puzzles, self._truth = load_ground_truth(data_path)
        try:
            self.puzzle_indices = np.load(os.path.join(split_dir, f"{set_name}__puzzle_indices.npy"))
        except FileNotFoundError:
            raise EvaluatorError(f"{split_dir}/{set_name}__puzzle_indices.npy: missing") from None
        self.num_examples_total = int(self.puzzle_indices[-1])
        self._votes: dict[tuple[str, int], dict[str, Candidate]] = {}
        self._seen: dict[int, tuple[str, int]] = {}
        self._malformed = 0
        self._duplicates = 0
        self.last_ranked: dict[str, list[list[Candidate]]] = {}
        self.last_copies: dict[str, list[Copies]] = {}

    # ------------------------------------------------------------------ protocol
    def begin_eval(self) -> None:
        """Start one evaluation: votes are reset unless ``accumulate_votes`` (pitfall 12)."""
        if not self.accumulate_votes:
            self._votes = {}
        self._seen = {}
        self._malformed = 0
        self._duplicates = 0

    def _name_aug(self, pid: int) -> tuple[str, Augmentation]:
        hit = self._aug_cache.get(pid)
        if hit is None:
            if not 0 < pid < len(self.identifiers):
                raise EvaluatorError(
                    f"{self.data_path}/identifiers.json: puzzle identifier {pid} out of range "
                    f"1..{len(self.identifiers) - 1}"
                )
            try:
                hit = Augmentation.parse_name(self.identifiers[pid])
            except ValueError as e:
                raise EvaluatorError(f"{self.data_path}/identifiers.json[{pid}]: {e}") from None
            if hit[0] not in self._truth:
                raise EvaluatorError(
                    f"{self.data_path}/test_puzzles.json: no puzzle {hit[0]!r} "
                    f"(from identifiers.json[{pid}] = {self.identifiers[pid]!r})"
                )
            self._aug_cache[pid] = hit
        return hit

    def _test_index(self, name: str, aug: Augmentation, ex: int, input_tokens: np.ndarray) -> int:
        """Which test input of ``name`` this example is: its position inside its augmented puzzle,
        cross-checked against the inverted input grid (falls back to the hash match)."""
        p = int(np.searchsorted(self.puzzle_indices, ex, side="right") - 1)
        local = ex - int(self.puzzle_indices[p])
        truth = self._truth[name]
        grid = canvas_to_grid(input_tokens, size=self.grid_size, strict=True)
        if grid is None:
            if 0 <= local < len(truth):
                return local
            raise EvaluatorError(f"example {ex} of puzzle {name!r}: position {local} but only {len(truth)} test inputs")
        h = grid_hash(aug.invert(grid))
        if 0 <= local < len(truth) and truth[local][0] == h:
            return local
        for i, row in enumerate(truth):
            if row[0] == h:
                return i
        raise EvaluatorError(
            f"example {ex} ({name!r}): its inverted input grid matches no test input of "
            f"test_puzzles.json[{name!r}] (wrong data_path, or the split holds demo pairs?)"
        )

    def update(self, batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        """Add one vote per real (non-padding) example of the batch. Tensors may be on any device."""
        ex_idx = batch["example_index"].detach().cpu().numpy().astype(np.int64)
        pids = batch["puzzle_identifiers"].detach().cpu().numpy().astype(np.int64)
        inputs = batch["inputs"].detach().cpu().numpy()
        preds = outputs["preds"].detach().cpu().numpy()
        # float64 as the published evaluator: an fp32 sigmoid is exactly 1.0 above a logit of ~17, which would
        # turn confident candidates into ties settled by hash
        q = torch.sigmoid(outputs["q_halt_logits"].detach().cpu().to(torch.float64)).numpy()
        for r in np.nonzero(ex_idx >= 0)[0]:
            ex = int(ex_idx[r])
            name, aug = self._name_aug(int(pids[r]))
            tidx = self._test_index(name, aug, ex, inputs[r])
            if ex in self._seen:
                self._duplicates += 1
                continue
            self._seen[ex] = (name, tidx)
            grid = canvas_to_grid(preds[r], size=self.grid_size, strict=self.strict_decode)
            if grid is None:
                h, g = MALFORMED, None
                self._malformed += 1
            else:
                g = aug.invert(grid)
                h = grid_hash(g)
            c = self._votes.setdefault((name, tidx), {}).setdefault(h, Candidate(h, g))
            c.votes += 1
            c.q_sum += float(q[r])
            c.identity |= aug.is_identity

    # ------------------------------------------------------------------ results
    def _gathered_state(self) -> Optional[tuple[dict, dict, int, int]]:
        state = (self._votes, self._seen, self._malformed, self._duplicates)
        parts = edist.gather_to_rank0(state)
        if parts is None:
            return None
        votes: dict[tuple[str, int], dict[str, Candidate]] = {}
        seen: dict[int, tuple[str, int]] = {}
        malformed = dup = 0
        overlap = 0
        for v, s, m, d in parts:
            malformed += m
            dup += d
            overlap += len(set(seen) & set(s))
            seen.update(s)
            for key, cands in v.items():
                dst = votes.setdefault(key, {})
                for h, c in cands.items():
                    t = dst.setdefault(h, Candidate(h, c.grid))
                    t.votes += c.votes
                    t.q_sum += c.q_sum
                    t.identity |= c.identity
        if overlap:
            # votes are already merged, so the duplicates cannot be removed: refuse instead of biasing pass@K
            raise RuntimeError(
                f"ARC evaluator: {overlap} test examples were evaluated on more than one rank; "
                "the loader must shard test examples disjointly (pitfall 13)"
            )
        return votes, seen, malformed, dup

    def compute(
        self, votes: dict, seen: dict, malformed: int, duplicates: int
    ) -> tuple[dict[str, float], dict[str, list[list[Candidate]]]]:
        """Metrics and ranked candidates (per puzzle, per test input) from merged votes."""
        puzzles = sorted({name for name, _ in votes})
        ranked_all: dict[str, list[list[Candidate]]] = {}
        solved = {k: 0.0 for k in self.pass_ks}
        missing = 0
        n_inputs = 0
        for name in puzzles:
            truth = self._truth[name]
            per_input = []
            scores = {k: 0.0 for k in self.pass_ks}
            for i, (_, _, th) in enumerate(truth):
                n_inputs += 1
                cands = votes.get((name, i))
                if cands is None:
                    missing += 1
                    per_input.append([])
                    continue
                ranked = rank_candidates(list(cands.values()), self.rank_malformed)
                per_input.append(ranked)
                for k, ok in pass_at_k(ranked, th, self.pass_ks).items():
                    scores[k] += float(ok)
            for k in self.pass_ks:
                solved[k] += scores[k] / len(truth)
            ranked_all[name] = per_input
        n_p = len(puzzles)
        metrics: dict[str, float] = {f"ARC/pass@{k}": (solved[k] / n_p if n_p else 0.0) for k in self.pass_ks}
        n_ex = len(seen)
        metrics.update(
            {
                "ARC/num_puzzles": float(n_p),
                "ARC/num_test_inputs": float(n_inputs),
                "ARC/num_examples": float(n_ex),
                "ARC/missing_test_inputs": float(missing),
                "ARC/malformed_frac": float(malformed / n_ex) if n_ex else 0.0,
                "ARC/duplicate_examples": float(duplicates),
            }
        )
        if missing:
            log.warning(
                "ARC evaluator: %d test inputs of evaluated puzzles received no prediction (counted as unsolved)",
                missing,
            )
        return metrics, ranked_all

    def result(self, save_path: Optional[str] = None) -> Optional[dict[str, float]]:
        """Gather votes to rank 0 and compute pass@K. Rank 0 returns the metrics (and writes
        submission.json, predictions.json and pictures under ``save_path`` or ``output_dir``); other ranks
        return None."""
        state = self._gathered_state()
        if state is None:
            return None
        metrics, ranked = self.compute(*state)
        self.last_ranked = ranked
        self.last_copies = copy_counts(state[0], ranked)
        out_dir = save_path if save_path is not None else self.output_dir
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            write_submission(os.path.join(out_dir, "submission.json"), ranked)
            write_predictions(os.path.join(out_dir, "predictions.json"), ranked, self._truth, self.submission_k)
            if self.num_pictures > 0:
                save_prediction_pictures(
                    os.path.join(out_dir, "pictures"),
                    ranked,
                    self.test_puzzles,
                    num_puzzles=self.num_pictures,
                    seed=self.seed,
                    copies=self.last_copies,
                )
        log_wandb_table(ranked, self._truth)
        return metrics


def copy_counts(
    votes: dict[tuple[str, int], dict[str, Candidate]], ranked: dict[str, list[list[Candidate]]]
) -> dict[str, list[Copies]]:
    """Per puzzle, per test input: how many augmented copies voted (one vote each, malformed ones included) and
    how many of them were malformed (the pictures' "no valid prediction (all N copies malformed)")."""
    out = {}
    for name, per_input in ranked.items():
        counts = []
        for i in range(len(per_input)):
            cands = votes.get((name, i), {})
            bad = cands.get(MALFORMED)
            counts.append(Copies(sum(c.votes for c in cands.values()), bad.votes if bad is not None else 0))
        out[name] = counts
    return out


def load_ground_truth(data_path: str) -> tuple[dict[str, dict], dict[str, list[tuple[str, list, str]]]]:
    """``<data_path>/test_puzzles.json`` -> (puzzles, ground truth per puzzle: a list over its test inputs of
    (input hash, output grid, output hash))."""
    raw = _read_json(os.path.join(data_path, "test_puzzles.json"))
    if not isinstance(raw, dict):
        raise EvaluatorError(f"{data_path}/test_puzzles.json: expected {{puzzle_id: puzzle}}")
    truth: dict[str, list[tuple[str, list, str]]] = {}
    for name, puz in raw.items():
        tests = puz.get("test") if isinstance(puz, dict) else None
        if not isinstance(tests, list) or not tests:
            raise EvaluatorError(f"{data_path}/test_puzzles.json: puzzle {name!r} has no 'test' list")
        rows = []
        for i, ex in enumerate(tests):
            if "output" not in ex:
                raise EvaluatorError(
                    f"{data_path}/test_puzzles.json: puzzle {name!r} test[{i}] has no 'output' (ground truth)"
                )
            rows.append(
                (
                    grid_hash(np.asarray(ex["input"], dtype=np.uint8)),
                    ex["output"],
                    grid_hash(np.asarray(ex["output"], dtype=np.uint8)),
                )
            )
        truth[name] = rows
    return raw, truth


# ---------------------------------------------------------------------- outputs
def submission_attempts(ranked: Sequence[Candidate]) -> dict[str, list]:
    """attempt_1 / attempt_2 from ranked candidates. One candidate: it is used for both attempts; none:
    ``[[0]]`` (documented in docs/evaluation.md). The malformed sentinel is never submitted."""
    grids = [c.grid_list() for c in ranked if c.grid is not None][:2]
    if not grids:
        grids = [FALLBACK_GRID]
    if len(grids) == 1:
        grids = grids * 2
    return {"attempt_1": grids[0], "attempt_2": grids[1]}


def build_submission(ranked: dict[str, list[list[Candidate]]]) -> dict[str, list[dict]]:
    """Kaggle format: {puzzle_id: [{"attempt_1": grid, "attempt_2": grid}, ...]} one entry per test input."""
    return {name: [submission_attempts(r) for r in per_input] for name, per_input in sorted(ranked.items())}


def write_submission(path: str, ranked: dict[str, list[list[Candidate]]]) -> None:
    write_json_atomic(path, build_submission(ranked), compact=True)


def write_predictions(path: str, ranked: dict[str, list[list[Candidate]]], truth: dict, top_k: int = 10) -> None:
    """Per puzzle, per test input: top candidates with votes, mean sigmoid(q_halt), correctness, and whether the
    identity copy (the puzzle as drawn) voted for it (``identity``: the one-copy answer of a voted evaluation)."""
    out = {}
    for name, per_input in sorted(ranked.items()):
        rows = []
        for i, r in enumerate(per_input):
            th = truth[name][i][2]
            rows.append(
                {
                    "test_index": i,
                    "num_votes": int(sum(c.votes for c in r)),
                    "num_candidates": len(r),
                    "correct_rank": next((j + 1 for j, c in enumerate(r) if c.hash == th), None),
                    # the identity copy's candidate is kept beyond the top k: the one-copy answer is always there
                    "candidates": [
                        dict(c.to_dict(), correct=c.hash == th) for j, c in enumerate(r) if j < top_k or c.identity
                    ],
                }
            )
        out[name] = rows
    write_json_atomic(path, out, compact=True)


def log_wandb_table(ranked: dict[str, list[list[Candidate]]], truth: dict, max_rows: int = 2000) -> None:
    """Log a table of predictions to the active W&B run (no-op without one)."""
    try:
        import wandb
    except ImportError:  # pragma: no cover
        return
    if wandb.run is None:
        return
    cols = ["puzzle", "test_index", "rank", "votes", "mean_q", "correct", "grid"]
    data = []
    for name, per_input in sorted(ranked.items()):
        for i, r in enumerate(per_input):
            for j, c in enumerate(r[:2]):
                data.append([name, i, j + 1, c.votes, c.mean_q, c.hash == truth[name][i][2], json.dumps(c.grid_list())])
                if len(data) >= max_rows:
                    break
    wandb.log({"ARC/predictions": wandb.Table(columns=cols, data=data)}, commit=False)

"""Test doubles for the evaluation path: a tiny on-disk ARC test split writer and ACT models whose
predictions are fixed functions of the labels (oracle / wrong / malformed). Used by tests/test_eval_*.py
and benchmarks; never by product code paths."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from dataset.augment import Augmentation
from dataset.canvas import grid_to_canvas
from dataset.metadata import DatasetMetadata
from dataset.tokens import ARC_VOCAB_SIZE, EOS_ID, IGNORE_LABEL_ID, PAD_ID
from dataset.writer import save_split


def write_tiny_arc_test_split(
    out_dir: str, puzzles: dict[str, dict], augmentations: Sequence[Augmentation], canvas_size: int = 30
) -> str:
    """Write ``out_dir/{identifiers.json, test_puzzles.json, test/...}`` in the on-disk layout of
    docs/architecture.md §1 on a ``canvas_size`` x ``canvas_size`` canvas: one group per puzzle, one augmented
    puzzle per augmentation (the first should be the identity), one example per test input (labels: PAD =
    ignore id 0)."""
    names = ["<blank>"]
    inputs, labels, pids, pidx, gidx = [], [], [], [0], [0]
    for name in sorted(puzzles):
        for aug in augmentations:
            names.append(aug.name_for(name))
            for ex in puzzles[name]["test"]:
                inputs.append(grid_to_canvas(aug.apply(np.asarray(ex["input"])), size=canvas_size))
                labels.append(grid_to_canvas(aug.apply(np.asarray(ex["output"])), size=canvas_size))
            pids.append(len(names) - 1)
            pidx.append(len(inputs))
        gidx.append(len(pids))
    meta = DatasetMetadata(
        pad_id=PAD_ID,
        ignore_label_id=PAD_ID,
        blank_identifier_id=0,
        vocab_size=ARC_VOCAB_SIZE,
        seq_len=canvas_size * canvas_size,
        num_puzzle_identifiers=len(names),
        total_groups=len(puzzles),
        mean_puzzle_examples=len(inputs) / max(len(pids), 1),
        total_puzzles=len(pids),
        sets=["all"],
        kind="arc",
        grid_size=canvas_size,
    )
    save_split(
        os.path.join(out_dir, "test"),
        {
            "inputs": np.stack(inputs).astype(np.uint8),
            "labels": np.stack(labels).astype(np.uint8),
            "puzzle_identifiers": np.asarray(pids, np.int32),
            "puzzle_indices": np.asarray(pidx, np.int32),
            "group_indices": np.asarray(gidx, np.int32),
        },
        meta,
    )
    with open(os.path.join(out_dir, "identifiers.json"), "w") as f:
        json.dump(names, f)
    with open(os.path.join(out_dir, "test_puzzles.json"), "w") as f:
        json.dump(puzzles, f)
    return out_dir


def oracle_tokens(labels: torch.Tensor) -> torch.Tensor:
    """The label canvas as a prediction (ignored positions -> PAD)."""
    return torch.where(labels == IGNORE_LABEL_ID, torch.full_like(labels, PAD_ID), labels)


def wrong_tokens(labels: torch.Tensor) -> torch.Tensor:
    """The label canvas with every colour c mapped to (c + 1) mod 10: always a wrong, well-formed grid."""
    t = oracle_tokens(labels)
    colour = t >= 2
    return torch.where(colour, (t - 2 + 1) % 10 + 2, t)


def malformed_tokens(labels: torch.Tensor) -> torch.Tensor:
    """No EOS anywhere (EOS -> PAD): the strict decoder rejects every such prediction."""
    t = oracle_tokens(labels)
    return torch.where(t == EOS_ID, torch.full_like(t, PAD_ID), t)


@dataclass
class FakeCarry:
    inner_carry: torch.Tensor
    steps: torch.Tensor
    halted: torch.Tensor
    current_data: dict = field(default_factory=dict)


@dataclass
class FakeConfig:
    halt_max_steps: int = 3


class FakeACT(nn.Module):
    """ACT model with the contract's carry semantics; logits put 10 on ``token_fn(labels)``; q_halt is
    ``q_fn(current_data, steps)`` (default: +1 from step ``q_positive_from`` on, else -1)."""

    def __init__(
        self,
        token_fn: Callable[[torch.Tensor], torch.Tensor] = oracle_tokens,
        halt_max_steps: int = 3,
        q_fn: Optional[Callable[[dict, torch.Tensor], torch.Tensor]] = None,
        q_positive_from: int = 10**9,
    ):
        super().__init__()
        self.config = FakeConfig(halt_max_steps)
        self.token_fn = token_fn
        self.q_fn = q_fn
        self.q_positive_from = q_positive_from
        self.dummy = nn.Parameter(torch.zeros(()))
        self.halt_early_in_eval = False
        self.calls = 0

    def initial_carry(self, batch: dict) -> FakeCarry:
        b = batch["inputs"].shape[0]
        dev = batch["inputs"].device
        return FakeCarry(
            torch.zeros(b, device=dev),
            torch.zeros(b, dtype=torch.int32, device=dev),
            torch.ones(b, dtype=torch.bool, device=dev),
            {k: torch.zeros_like(v) for k, v in batch.items() if torch.is_tensor(v)},
        )

    def forward(self, carry: FakeCarry, batch: dict) -> tuple[FakeCarry, dict]:
        self.calls += 1
        h = carry.halted
        data = {
            k: torch.where(h.view(-1, *([1] * (batch[k].dim() - 1))), batch[k], v)
            for k, v in carry.current_data.items()
        }
        steps = torch.where(h, torch.zeros_like(carry.steps), carry.steps) + 1
        tokens = self.token_fn(data["labels"])
        logits = torch.nn.functional.one_hot(tokens.long(), ARC_VOCAB_SIZE).float() * 10.0 + self.dummy
        if self.q_fn is not None:
            q = self.q_fn(data, steps).float()
        else:
            q = torch.where(steps >= self.q_positive_from, 1.0, -1.0).float()
        halted = steps >= self.config.halt_max_steps
        if self.halt_early_in_eval or self.training:
            halted = halted | (q > 0)
        return FakeCarry(carry.inner_carry, steps.int(), halted, data), {
            "logits": logits,
            "q_halt_logits": q,
            "q_continue_logits": -q,
        }


class FakeLossHead(nn.Module):
    """Loss head over :class:`FakeACT` with the contract's metric sums (count = halted samples with at
    least one supervised token)."""

    def __init__(self, model: FakeACT, loss_type: str = "softmax_cross_entropy"):
        super().__init__()
        self.model = model
        self.loss_type = loss_type

    def initial_carry(self, batch: dict) -> FakeCarry:
        return self.model.initial_carry(batch)

    def forward(self, carry, batch, return_keys=()):
        from evaluators.inference import per_sample_lm_loss

        new_carry, out = self.model(carry, batch)
        labels = new_carry.current_data["labels"]
        mask = labels != IGNORE_LABEL_ID
        n = mask.sum(-1)
        preds = out["logits"].argmax(-1)
        correct = (preds == labels) & mask
        exact = correct.sum(-1) == n
        valid = new_carry.halted & (n > 0)
        lm = per_sample_lm_loss(out["logits"], labels, self.loss_type)
        metrics = {
            "count": valid.sum(),
            "accuracy": torch.where(valid, correct.sum(-1) / n.clamp_min(1), 0).sum(),
            "exact_accuracy": (valid & exact).sum(),
            "q_halt_accuracy": (valid & ((out["q_halt_logits"] >= 0) == exact)).sum(),
            "steps": torch.where(valid, new_carry.steps, 0).sum(),
            "lm_loss": torch.where(valid, lm, 0).sum(),
        }
        out = dict(out, preds=preds)
        return new_carry, lm.sum(), metrics, {k: out[k] for k in return_keys if k in out}, new_carry.halted.all()

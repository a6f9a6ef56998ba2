"""Evaluation throughput: augmented copies per second through the shared inference path
(``evaluators.inference.evaluate``) for the ARC TRM (config/arch/trm.yaml, :mod:`benchmarks.arc_arch`), and the
projected time of a full ARC-AGI-1 evaluation (400 puzzles, 419 test inputs, x 1001 copies = identity + 1000
augmentations).

    python -m benchmarks.eval_throughput                      # device auto: CUDA if present, else a small CPU run
    python -m benchmarks.eval_throughput --batch-size 512 --compile --json out.json

On CPU the run is kept to about a minute: it measures ``--measure-steps`` ACT steps of a small batch and
extrapolates linearly to 16 steps (every step costs the same: no halting in eval). The evaluator's own
per-example cost (decode, inverse augmentation, hash, vote) is measured separately and added.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Optional

import numpy as np
import torch

import models
from benchmarks.arc_arch import arc_arch
from core.nn import compile_module
from dataset.augment import Augmentation
from dataset.tokens import IGNORE_LABEL_ID
from evaluators import ARCEvaluator
from evaluators.inference import evaluate
from tests.doubles import oracle_tokens, write_tiny_arc_test_split

# ARC-AGI-1 public evaluation set
ARC1_EVAL_PUZZLES = 400
ARC1_EVAL_TEST_INPUTS = 419


def eval_arch(halt_max_steps: int, cuda: bool) -> dict:
    """The ARC TRM of config/arch/trm.yaml (:func:`benchmarks.arc_arch.arc_arch`) with the two overrides this
    benchmark needs: its ``halt_max_steps`` and the device's forward dtype (bf16 on CUDA, fp32 on CPU)."""
    dtype = "bfloat16" if cuda else "float32"
    return arc_arch([f"arch.halt_max_steps={halt_max_steps}", f"arch.forward_dtype={dtype}"])


def _synthetic_batches(num_batches: int, batch_size: int, seq_len: int, num_ids: int, seed: int = 0) -> list:
    """Test-mode batches shaped like the loader's (random tokens; the model cost does not depend on them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(num_batches):
        inputs = torch.randint(0, 12, (batch_size, seq_len), generator=g, dtype=torch.int32)
        labels = torch.randint(0, 12, (batch_size, seq_len), generator=g).long()
        out.append(
            (
                "all",
                {
                    "inputs": inputs,
                    "labels": labels,
                    "puzzle_identifiers": torch.randint(1, num_ids, (batch_size,), generator=g, dtype=torch.int32),
                    "example_index": torch.arange(b * batch_size, (b + 1) * batch_size),
                },
                batch_size,
            )
        )
    return out


def measure_evaluator_cost(num_examples: int = 512) -> float:
    """Seconds per example of ``ARCEvaluator.update`` (decode, invert, hash, vote) on CPU."""

    rng = np.random.default_rng(0)
    puzzles = {
        f"p{i}": {
            "train": [],
            "test": [
                {"input": rng.integers(0, 10, (12, 15)).tolist(), "output": rng.integers(0, 10, (14, 11)).tolist()}
            ],
        }
        for i in range(8)
    }
    augs = [Augmentation()] + [Augmentation.random(rng) for _ in range(7)]
    with tempfile.TemporaryDirectory() as d:
        write_tiny_arc_test_split(d, puzzles, augs)
        ev = ARCEvaluator(d, None, None, num_pictures=0)
        inputs = np.load(os.path.join(d, "test", "all__inputs.npy")).astype(np.int32)
        labels = np.load(os.path.join(d, "test", "all__labels.npy")).astype(np.int64)
        labels[labels == 0] = IGNORE_LABEL_ID
        pids = np.load(os.path.join(d, "test", "all__puzzle_identifiers.npy"))
        n = len(inputs)
        batch = {
            "inputs": torch.from_numpy(inputs),
            "labels": torch.from_numpy(labels),
            "puzzle_identifiers": torch.from_numpy(pids.astype(np.int32)),  # one example per puzzle here
            "example_index": torch.arange(n),
        }
        outs = {"preds": oracle_tokens(batch["labels"]), "q_halt_logits": torch.zeros(n)}
        reps = max(1, num_examples // n)
        t0 = time.perf_counter()
        for _ in range(reps):
            ev.begin_eval()
            ev.update(batch, outs)
        per = (time.perf_counter() - t0) / (reps * n)
        ev.result(None)
    return per


def measure_eval_throughput(
    *,
    device: str = "auto",
    batch_size: Optional[int] = None,
    num_batches: Optional[int] = None,
    measure_steps: Optional[int] = None,
    halt_max_steps: int = 16,
    compile: bool = False,
    autocast: str = "auto",
    arch_overrides: Optional[dict] = None,
    seq_len: int = 900,
    num_test_inputs: int = ARC1_EVAL_TEST_INPUTS,
    num_copies: int = 1001,
    include_evaluator_cost: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure augmented copies per second of the ARC TRM through ``evaluators.inference.evaluate``.

    ``measure_steps`` < ``halt_max_steps`` runs only that many ACT steps per batch and scales the time by
    ``halt_max_steps / measure_steps`` (defaults: all 16 steps on CUDA, 1 on CPU). Returns a dict with
    ``copies_per_second``, ``projected_seconds`` / ``projected_hours`` for ``num_test_inputs x num_copies``
    copies, and the settings used.
    """

    dev = torch.device(
        "cuda" if (device == "auto" and torch.cuda.is_available()) else ("cpu" if device == "auto" else device)
    )
    cuda = dev.type == "cuda"
    batch_size = batch_size or (512 if cuda else 2)
    num_batches = num_batches or (4 if cuda else 1)
    measure_steps = min(measure_steps or (halt_max_steps if cuda else 1), halt_max_steps)
    arch = eval_arch(halt_max_steps, cuda)
    arch.update(arch_overrides or {})
    num_ids = 1024
    torch.manual_seed(0)
    model = models.build_model(
        arch, vocab_size=12, seq_len=seq_len, num_puzzle_identifiers=num_ids, batch_size=batch_size
    )
    head = models.build_loss_head(model).to(dev).eval()
    run_model = compile_module(head) if compile else head
    batches = _synthetic_batches(num_batches + 1, batch_size, seq_len, num_ids)

    def timed(bs):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        evaluate(run_model, bs, [], device=dev, autocast_dtype=autocast, progress=progress, max_steps=measure_steps)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    warm = timed(batches[:1])  # warm-up (compile, allocator, kernels)
    secs = timed(batches[1:])
    copies = num_batches * batch_size
    model_secs_per_copy = secs / copies * (halt_max_steps / measure_steps)
    eval_secs_per_copy = measure_evaluator_cost() if include_evaluator_cost else 0.0
    per_copy = model_secs_per_copy + eval_secs_per_copy
    total_copies = num_test_inputs * num_copies
    projected = total_copies * per_copy
    name = torch.cuda.get_device_name(dev) if cuda else f"cpu ({torch.get_num_threads()} threads)"
    return {
        "device": name,
        "batch_size": batch_size,
        "num_batches": num_batches,
        "measure_steps": measure_steps,
        "halt_max_steps": halt_max_steps,
        "compile": compile,
        "autocast": autocast,
        "seq_len": seq_len,
        "arch": {
            k: arch[k] for k in ("hidden_size", "H_cycles", "L_cycles", "L_layers", "puzzle_emb_len", "forward_dtype")
        },
        "warmup_seconds": warm,
        "measured_seconds": secs,
        "model_seconds_per_copy": model_secs_per_copy,
        "evaluator_seconds_per_copy": eval_secs_per_copy,
        "copies_per_second": 1.0 / per_copy,
        "total_copies": total_copies,
        "projected_seconds": projected,
        "projected_hours": projected / 3600.0,
        "goal_hours_h100": 2.0,
    }


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.eval_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=None, help="default 512 on CUDA, 2 on CPU")
    ap.add_argument("--num-batches", type=int, default=None, help="timed batches (default 4 CUDA, 1 CPU)")
    ap.add_argument("--measure-steps", type=int, default=None, help="ACT steps run per batch (default 16 CUDA, 1 CPU)")
    ap.add_argument("--halt-max-steps", type=int, default=16)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--autocast", default="auto")
    ap.add_argument("--num-test-inputs", type=int, default=ARC1_EVAL_TEST_INPUTS)
    ap.add_argument("--num-copies", type=int, default=1001, help="copies per test input (identity + augmentations)")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available()):
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    res = measure_eval_throughput(
        device=args.device,
        batch_size=args.batch_size,
        num_batches=args.num_batches,
        measure_steps=args.measure_steps,
        halt_max_steps=args.halt_max_steps,
        compile=args.compile,
        autocast=args.autocast,
        num_test_inputs=args.num_test_inputs,
        num_copies=args.num_copies,
    )
    print(json.dumps(res, indent=1))
    print(
        f"{res['device']}: {res['copies_per_second']:.2f} copies/s -> full ARC-AGI-1 eval "
        f"({res['total_copies']:,} copies x {res['halt_max_steps']} steps): {res['projected_hours']:.2f} h",
        file=sys.stderr,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()

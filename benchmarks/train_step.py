"""Training throughput of the ARC TRM configuration (one optimizer step = one ACT supervision step).

    python -m benchmarks.train_step                                  # device auto; small on CPU (~1-2 min)
    python -m benchmarks.train_step --batch 256 --steps 20 --device cuda --compile both --json out.json
    python -m benchmarks.train_step --config science [--compile both --interleave 3]   # benchmarks/trainer_step.py
    python -m benchmarks.train_step --config trm-tiny

``--config arc`` (default) is described below; ``science`` / ``trm-tiny`` time the real ``Trainer.train_step`` of
config/cfg_science.yaml / cfg_demo.yaml on generated data with a per-phase split (see benchmarks/trainer_step.py).

Measures the exact step of ``training.loop`` (ACTLossHead forward, loss / batch backward, global grad norm,
clipping, AdamATan2 + SignSGDSparse updates) on random ARC-shaped batches: the TRM of config/arch/trm.yaml as
Hydra composes it (``arch=trm``, :mod:`benchmarks.arc_arch`), seq 900 + its puzzle-prefix tokens, bf16 autocast
on CUDA / fp32 on CPU.

Reported per mode (eager / compiled): seconds per step, samples/s (= batch / step time: samples advanced by
one supervision step), tokens/s (samples/s x (900 + ``puzzle_emb_len``)). Model FLOPs per step are analytic
(``analytic_step_flops``: projections, SwiGLU, attention, lm head; forward of every cycle + backward of the last)
and cross-checked with ``torch.utils.flop_counter`` (``flops_per_step_counted``; on CPU it misses the SDPA
kernel's attention FLOPs).
Achieved FLOP/s = model FLOPs / step time; on CUDA also as a fraction of a bf16 matmul measured in the same run.
The evaluation engineer's ``benchmarks.eval_throughput`` is run afterwards when ``--with-eval`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional

import torch
from torch.utils.flop_counter import FlopCounterMode

import models
from benchmarks import eval_throughput, trainer_step
from benchmarks.arc_arch import arc_arch
from core.nn import compile_module
from models.layers import swiglu_intermediate_size
from training import distributed as D
from training.build import build_loss_head, build_optimizers
from training.config import config_from_dict
from training.distributed import resolve_device

SEQ_LEN, VOCAB, NUM_IDS = 900, 12, 1000


def _batch(batch_size: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b = {
        "inputs": torch.randint(0, VOCAB, (batch_size, SEQ_LEN), generator=g, dtype=torch.int32),
        "labels": torch.randint(0, VOCAB, (batch_size, SEQ_LEN), generator=g).long(),
        "puzzle_identifiers": torch.randint(1, NUM_IDS, (batch_size,), generator=g, dtype=torch.int32),
        "example_index": torch.arange(batch_size),
    }
    return {k: v.to(device) for k, v in b.items()}


def build(batch_size: int, device: torch.device, compiled: bool, arch: Optional[dict] = None):
    """Model, loss head (maybe compiled), optimizers and a step function identical to the training loop's."""

    arch = arch or arc_arch()
    torch.manual_seed(0)
    cfg = config_from_dict(
        {"arch": arch, "data_paths": ["<benchmark>"], "global_batch_size": batch_size, "lr": 1e-4, "lr_warmup_steps": 0}
    )
    model = models.build_model(
        arch, vocab_size=VOCAB, seq_len=SEQ_LEN, num_puzzle_identifiers=NUM_IDS, batch_size=batch_size
    ).to(device)
    head = build_loss_head(model, None).to(device)
    opts = build_optimizers(cfg, model, world_size=1)
    params = [p for p in model.parameters() if p.requires_grad]
    fwd = compile_module(head, dynamic=False) if compiled else head
    state = {"carry": None}

    def step(batch):
        if state["carry"] is None:
            with torch.device(device):
                state["carry"] = model.initial_carry(batch)
        with D.autocast(device):
            state["carry"], loss, _m, _o, _ = fwd(carry=state["carry"], batch=batch)
        (loss / batch_size).backward()
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))
        coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
        for p in params:
            p.grad.mul_(coef)
        for o in opts.values():
            o.step()
            o.zero_grad(set_to_none=True)
        return loss

    return model, step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_step_flops(batch_size: int, device: torch.device, arch: Optional[dict] = None) -> float:
    """FLOPs of one training step (forward + backward), counted on an eager model."""

    _, step = build(batch_size, device, compiled=False, arch=arch)
    batch = _batch(batch_size, device, 0)
    with FlopCounterMode(display=False) as fc:
        step(batch)
    return float(fc.get_total_flops())


def analytic_step_flops(batch_size: int, arch: dict) -> float:
    """Model FLOPs of one TRM training step from the architecture (2 FLOPs per multiply-add).

    Per block and token: q/k/v/o projections 8h^2, SwiGLU 6*h*inter, attention scores + weighted sum 4*S*h.
    Forward: H_cycles x (L_cycles + 1) passes of L_layers blocks; backward (last H cycle only): 2x the forward
    of its (L_cycles + 1) passes. Plus the lm head (forward + backward). This is the usual MFU convention."""

    h, seq = arch["hidden_size"], SEQ_LEN + arch["puzzle_emb_len"]
    inter = swiglu_intermediate_size(h, arch["expansion"])
    per_token_block = 8 * h * h + 6 * h * inter + 4 * seq * h
    passes = arch["H_cycles"] * (arch["L_cycles"] + 1) + 2 * (arch["L_cycles"] + 1)
    blocks = passes * arch["L_layers"] * per_token_block
    head = 3 * 2 * h * VOCAB
    return float(batch_size * seq * (blocks + head))


def bf16_matmul_flops(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """Achieved FLOP/s of a large bf16 matmul (the reference ceiling on this GPU)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    _sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t)


def measure(
    batch_size: int, steps: int, warmup: int, device: torch.device, compiled: bool, arch: Optional[dict] = None
) -> dict[str, float]:
    arch = arch or arc_arch()
    t0 = time.perf_counter()
    _, step = build(batch_size, device, compiled, arch)
    batches = [_batch(batch_size, device, s) for s in range(2)]
    for i in range(warmup):
        step(batches[i % 2])
    _sync(device)
    warm_s = time.perf_counter() - t0
    t = time.perf_counter()
    for i in range(steps):
        step(batches[i % 2])
    _sync(device)
    dt = (time.perf_counter() - t) / steps
    return {
        "seconds_per_step": dt,
        "samples_per_s": batch_size / dt,
        "tokens_per_s": batch_size * (SEQ_LEN + arch["puzzle_emb_len"]) / dt,
        "setup_and_warmup_s": warm_s,
    }


def run(
    batch: Optional[int] = None,
    steps: Optional[int] = None,
    device: str = "auto",
    compile: str = "auto",
    warmup: Optional[int] = None,
    with_eval: bool = False,
    arch_overrides: Optional[dict] = None,
) -> dict[str, Any]:
    """Measure; ``arch_overrides`` changes the ARC config (tests use a tiny model)."""

    arch = {**arc_arch(), **(arch_overrides or {})}

    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    batch = batch or (256 if cuda else 2)
    steps = steps or (20 if cuda else 3)
    warmup = warmup if warmup is not None else (3 if cuda else 1)
    modes = {
        "auto": ["eager", "compiled"] if cuda else ["eager"],
        "both": ["eager", "compiled"],
        "eager": ["eager"],
        "compiled": ["compiled"],
    }[compile]
    torch.set_float32_matmul_precision("high")
    out: dict[str, Any] = {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": batch,
        "steps": steps,
        "arch": arch,
        "seq_len": SEQ_LEN + arch["puzzle_emb_len"],
        "dtype": "bf16 autocast" if cuda else "fp32",
    }
    counted = count_step_flops(min(batch, 2), dev, arch) * batch / min(batch, 2)  # linear in the batch
    flops = analytic_step_flops(batch, arch)
    out["flops_per_step"] = flops  # analytic model FLOPs (used for FLOP/s)
    # torch.utils.flop_counter cross-check; it does not see the CPU SDPA kernel (attention FLOPs missing on CPU)
    out["flops_per_step_counted"] = counted
    peak = bf16_matmul_flops(dev) if cuda else None
    if peak:
        out["bf16_matmul_flops_per_s"] = peak
    for mode in modes:
        r = measure(batch, steps, warmup, dev, compiled=(mode == "compiled"), arch=arch)
        r["model_flops_per_s"] = flops / r["seconds_per_step"]
        if peak:
            r["fraction_of_bf16_matmul"] = r["model_flops_per_s"] / peak
        out[mode] = r
        print(
            f"[train_step] {mode:8s} batch {batch}: {r['seconds_per_step'] * 1e3:9.1f} ms/step  "
            f"{r['samples_per_s']:9.2f} samples/s  {r['tokens_per_s']:11.0f} tokens/s  "
            f"{r['model_flops_per_s'] / 1e12:7.3f} TFLOP/s"
            + (f"  ({100 * r['fraction_of_bf16_matmul']:.1f}% of bf16 matmul)" if peak else ""),
            flush=True,
        )
    if with_eval:
        out["eval"] = eval_throughput.main(["--device", device])
    return out


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.train_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--config",
        choices=["arc", *trainer_step.CONFIGS],
        default="arc",
        help="arc: the ARC TRM step on random batches; science / trm-tiny: the real training step of "
        "cfg_science / cfg_demo on generated data, with a phase split",
    )
    ap.add_argument(
        "--interleave",
        type=int,
        default=1,
        help="science / trm-tiny: rounds alternating the --compile modes (median reported)",
    )
    ap.add_argument("--trace", default=None, help="science / trm-tiny: write a torch profiler trace to this dir")
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="batch size (arc: default 256 on CUDA, 2 on CPU; science / trm-tiny: the config's global_batch_size)",
    )
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20 on CUDA, 3 on CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3 CUDA / 1 CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--compile",
        choices=["auto", "both", "eager", "compiled"],
        default="auto",
        help="auto = both on CUDA, eager on CPU",
    )
    ap.add_argument("--with-eval", action="store_true", help="also run benchmarks.eval_throughput")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    if a.batch is not None and a.batch <= 0 or a.steps is not None and a.steps <= 0:
        ap.error("--batch and --steps must be positive")
    if a.config != "arc":
        out = trainer_step.run(
            a.config,
            steps=a.steps or 20,
            warmup=a.warmup if a.warmup is not None else 3,
            compile="eager" if a.compile == "auto" else a.compile,
            device="cpu" if a.device == "auto" and not torch.cuda.is_available() else a.device,
            trace=a.trace,
            interleave=a.interleave,
            batch=a.batch,
        )
    else:
        out = run(a.batch, a.steps, a.device, a.compile, a.warmup, a.with_eval)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    else:
        json.dump({k: v for k, v in out.items() if k != "arch"}, sys.stdout, indent=2)
        print()
    return out


if __name__ == "__main__":
    main()

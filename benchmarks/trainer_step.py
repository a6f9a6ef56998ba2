"""Time the exact training step of a small config: the real ``training.loop.Trainer.train_step`` on generated data,
with a per-phase split (data, encoder forward, core forward, optimizer, the rest = loss + backward + grad norms).

    python -m benchmarks.train_step --config science        # cfg_science: ETRM standard encoder + grid-views core
    python -m benchmarks.train_step --config science-memory # the same with arch=trm_memory (no grid views)
    python -m benchmarks.train_step --config science-pooled # the same with arch=trm_grid (no demo memory)
    python -m benchmarks.train_step --config trm-tiny       # cfg_demo: TRM tiny on 4x4 Sudoku
    python -m benchmarks.train_step --config science --compile both --steps 30 --json out.json

Reported per mode (eager / compiled): seconds per step, samples/s (global batch / step time), FLOPs of one step
counted by ``torch.utils.flop_counter`` (forward + backward; on CPU it does not see the SDPA kernel's attention
FLOPs, so it is a lower bound), achieved FLOP/s, and (eager mode: hooks would break a compiled graph) the phase
split: the phases come from timers in forward hooks of the model and its encoder and in the optimizers' step hooks
(``torch.profiler.record_function`` ranges of the same names are recorded too, so ``--trace DIR`` writes a profiler
trace with them). The first ``--warmup`` steps (compilation included) are not timed.

The ceiling (CPU): an fp32 matmul of the step's own largest GEMM shape, measured in the same run at the same thread
count (``fp32_matmul_flops_per_s``). ``floor_s_per_step`` = counted FLOPs / that rate is the fastest the step could
run at identical arithmetic (every FLOP at matmul speed, nothing else costing time); ``fraction_of_fp32_matmul`` =
achieved / ceiling. A speed-up target above ``seconds_per_step / floor_s_per_step`` needs fewer FLOPs, not faster
code (the science step runs at 35% / 28% of the ceiling at one / two threads: 5695a84,
docs/record/2026-11-25-science-step-ceiling.md).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any, Optional, Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from dataset.arc_sources import load_puzzles
from dataset.build_arc_dataset import build_arc_dataset
from dataset.build_sudoku_dataset import main as build_sudoku
from dataset.build_synthetic_dataset import generate_synthetic_arc
from training.config import load_config
from training.distributed import DistInfo, resolve_device
from training.loop import Trainer

CONFIGS = ("science", "science-memory", "science-pooled", "trm-tiny")


def make_data(config: str, root: str) -> str:
    """A small dataset of the config's shape under ``root`` (built once; seconds)."""
    out = os.path.join(root, f"data-{config}")
    if os.path.isdir(out):
        return out
    if config.startswith("science"):  # the science command's data: 8 rule families, canvas 8, demo store (ETRM)
        raw = generate_synthetic_arc(
            os.path.join(root, "raw"),
            "synth",
            num_train=96,
            num_test=16,
            seed=0,
            progress=False,
            canvas_size=8,
            num_aug=8,
        )
        puzzles = load_puzzles(["training", "evaluation"], "evaluation", raw["prefix"])
        build_arc_dataset(
            out, puzzles, test_set_name="evaluation", num_aug=8, seed=0, mode="etrm", progress=False, canvas_size=8
        )
    else:
        build_sudoku(
            [
                "--output-dir",
                out,
                "--generate-train",
                "400",
                "--generate-test",
                "16",
                "--size",
                "4",
                "--num-aug",
                "4",
                "--no-progress",
            ]
        )
    return out


def make_trainer(
    config: str, data: str, run_dir: str, compile_flag: bool, device: str, overrides: Sequence[str] = ()
) -> Trainer:
    name, extra = {
        "science": ("cfg_science", ["encoder=standard"]),
        "science-memory": ("cfg_science", ["encoder=standard", "arch=trm_memory"]),  # the recipe before grid views
        "science-pooled": ("cfg_science", ["encoder=standard", "arch=trm_grid"]),  # the recipe before demo memory
        "trm-tiny": ("cfg_demo", []),
    }[config]
    cfg = load_config(
        name,
        [
            *extra,
            f"data_paths=[{data}]",
            f"checkpoint_path={run_dir}",
            "eval_interval=null",
            "eval_at_end=false",
            "evaluators=[]",
            "progress=false",
            "wandb.mode=disabled",
            f"compile={str(compile_flag).lower()}",
            f"device={device}",
            *overrides,
        ],
    )
    return Trainer(cfg, DistInfo(device=resolve_device(device)))


class PhaseTimer:
    """Wall time of the model's forward, its encoder's forward and the optimizers' steps, from hooks."""

    PHASES = ("forward", "encoder", "optimizer")

    def __init__(self, trainer: Trainer):
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self.sync = trainer.device.type == "cuda"
        self._open: dict[str, tuple[float, Any]] = {}
        self.handles = []
        model = trainer.model
        self._hook_module(model, "forward")
        if getattr(model, "encoder", None) is not None:
            self._hook_module(model.encoder, "encoder")
        for opt in trainer.optimizers.values():
            self.handles.append(opt.register_step_pre_hook(lambda *a: self._start("optimizer")))
            self.handles.append(opt.register_step_post_hook(lambda *a: self._stop("optimizer")))

    def _hook_module(self, module: torch.nn.Module, phase: str) -> None:
        self.handles.append(module.register_forward_pre_hook(lambda *a: self._start(phase)))
        self.handles.append(module.register_forward_hook(lambda *a: self._stop(phase)))

    def _start(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        rf = torch.profiler.record_function(phase)
        rf.__enter__()
        self._open[phase] = (time.perf_counter(), rf)

    def _stop(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        t0, rf = self._open.pop(phase)
        rf.__exit__(None, None, None)
        self.totals[phase] += time.perf_counter() - t0

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.PHASES, 0.0)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def measure(
    config: str,
    *,
    steps: int,
    warmup: int,
    compiled: bool,
    device: str = "cpu",
    root: Optional[str] = None,
    trace: Optional[str] = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Time ``steps`` training steps after ``warmup`` untimed ones; see the module docstring."""
    with contextlib.ExitStack() as stack:
        root = root or stack.enter_context(tempfile.TemporaryDirectory())
        data = make_data(config, root)
        t0 = time.perf_counter()
        trainer = make_trainer(
            config, data, os.path.join(root, f"run-{config}-{compiled}-{time.time_ns()}"), compiled, device, overrides
        )
        stack.callback(trainer.close)
        it = iter(trainer.data.train_loader)

        def next_batch() -> dict:
            return {k: v.to(trainer.device, non_blocking=True) for k, v in next(it)[1].items()}

        for _ in range(warmup):
            trainer.train_step(next_batch())
        with FlopCounterMode(display=False) as fc:  # one more (untimed) step, counted
            trainer.train_step(next_batch())
        setup_s = time.perf_counter() - t0
        timer = None if compiled else PhaseTimer(trainer)  # hooks inside a compiled graph would break it
        prof = (
            stack.enter_context(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]))
            if trace
            else None
        )
        data_s = step_s = 0.0
        for _ in range(steps):
            t = time.perf_counter()
            batch = next_batch()
            t1 = time.perf_counter()
            trainer.train_step(batch)
            t2 = time.perf_counter()
            data_s += t1 - t
            step_s += t2 - t1
        if prof is not None:
            prof.stop()
            prof.export_chrome_trace(os.path.join(trace, f"trace-{config}-{'compiled' if compiled else 'eager'}.json"))
        if timer is not None:
            timer.remove()
    per_step = (data_s + step_s) / steps
    flops = float(fc.get_total_flops())
    split = {"data": data_s / steps, "step": step_s / steps}
    if timer is not None:
        ph = {k: v / steps for k, v in timer.totals.items()}
        split.update(
            {
                "encoder_forward": ph["encoder"],
                "core_forward": ph["forward"] - ph["encoder"],
                "optimizer": ph["optimizer"],
                "loss_backward_rest": step_s / steps - ph["forward"] - ph["optimizer"],
            }
        )
    return {
        "config": config,
        "mode": "compiled" if compiled else "eager",
        "seconds_per_step": per_step,
        "samples_per_s": trainer.cfg.global_batch_size / per_step,
        "flops_per_step_counted": flops,
        "flops_per_s": flops / per_step,
        "num_params": trainer.num_params,
        "setup_and_warmup_s": setup_s,
        "phases_s": split,
        "threads": torch.get_num_threads(),
        "batch": trainer.cfg.global_batch_size,
    }


def fp32_matmul_flops(m: int = 4224, k: int = 64, n: int = 256, iters: int = 50) -> float:
    """Achieved FLOP/s of an fp32 ``[m, k] x [k, n]`` CPU matmul at the current thread count (the default is the
    science step's largest GEMM: 64 samples x 66 tokens through the SwiGLU up-projection), best of 3 repeats."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    for _ in range(5):
        torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t)
    return 2 * m * k * n * iters / best


def run(
    config: str,
    *,
    steps: int,
    warmup: int,
    compile: str,
    device: str = "cpu",
    trace: Optional[str] = None,
    interleave: int = 1,
    batch: Optional[int] = None,
) -> dict[str, Any]:
    """Both modes (``compile``: eager / compiled / both), ``interleave`` rounds alternating them (a noisy machine
    is measured side by side); per mode the median of the rounds' s/step is reported. ``batch``: the global batch
    size (default: the config's)."""
    overrides = [] if batch is None else [f"global_batch_size={batch}"]
    modes = {"both": [False, True], "eager": [False], "compiled": [True]}[compile]
    out: dict[str, Any] = {"config": config, "device": str(resolve_device(device)), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as root:
        rounds: dict[str, list] = {}
        for _ in range(max(1, interleave)):
            for c in modes:
                r = measure(
                    config,
                    steps=steps,
                    warmup=warmup,
                    compiled=c,
                    device=device,
                    root=root,
                    trace=trace,
                    overrides=overrides,
                )
                rounds.setdefault(r["mode"], []).append(r)
                print(
                    f"[train_step] {config} {r['mode']:8s} {r['seconds_per_step'] * 1e3:8.1f} ms/step "
                    f"{r['samples_per_s']:8.1f} samples/s  {r['flops_per_s'] / 1e9:6.2f} GFLOP/s (counted)  "
                    + " ".join(f"{k} {v * 1e3:.1f}" for k, v in r["phases_s"].items())
                    + " ms",
                    flush=True,
                )
    for mode, rs in rounds.items():
        rs.sort(key=lambda r: r["seconds_per_step"])
        out[mode] = dict(rs[len(rs) // 2], rounds_s_per_step=[r["seconds_per_step"] for r in rs])
    if out["device"] == "cpu":
        peak = out["fp32_matmul_flops_per_s"] = fp32_matmul_flops()
        for mode in rounds:
            r = out[mode]
            r["floor_s_per_step"] = r["flops_per_step_counted"] / peak
            r["fraction_of_fp32_matmul"] = r["flops_per_s"] / peak
            print(
                f"[train_step] {config} {mode}: ceiling {peak / 1e9:.1f} GFLOP/s (fp32 matmul, "
                f"{torch.get_num_threads()} thread(s)); at identical FLOPs a step takes at least "
                f"{r['floor_s_per_step'] * 1e3:.1f} ms, so at most "
                f"{r['seconds_per_step'] / r['floor_s_per_step']:.2f}x "
                f"faster than this ({100 * r['fraction_of_fp32_matmul']:.0f}% of the ceiling now)",
                flush=True,
            )
    if "eager" in out and "compiled" in out:
        out["compiled_speedup"] = out["eager"]["seconds_per_step"] / out["compiled"]["seconds_per_step"]
    return out

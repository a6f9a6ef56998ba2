"""The README demo: build (if missing) a small dataset, train a tiny TRM, evaluate, print where things are.

    python -m training.demo                          # config/cfg_demo.yaml: 4x4 Sudoku, tiny TRM, CPU minutes
    python -m training.demo epochs=10 +run_name=quick  # Hydra-style overrides of cfg_demo.yaml

The dataset (``data_paths[0]``, default ``data/demo-sudoku4``) is generated with
``python -m dataset.build_sudoku_dataset --size 4`` when it does not exist. W&B runs offline unless an API
key / login exists (``wandb.mode=disabled`` turns it off). Exit status as pretrain.py.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, Sequence

import torch

from core.errors import user_errors
from dataset import build_sudoku_dataset
from training.config import known_keys, load_config
from training.loop import train

DEMO_DATA_ARGS = ["--generate-train", "2000", "--generate-test", "200", "--size", "4", "--num-aug", "20", "--seed", "0"]


def ensure_demo_dataset(path: str, progress: bool = True) -> bool:
    """Build the 4x4 Sudoku demo dataset at ``path`` unless it exists. Returns True when it was built."""
    if os.path.isfile(os.path.join(path, "train", "dataset.json")):
        return False
    print(f"[demo] building the demo dataset in {path} (4x4 Sudoku, seeded)", flush=True)
    build_sudoku_dataset.main(DEMO_DATA_ARGS + ["--output-dir", path] + ([] if progress else ["--no-progress"]))
    return True


def main(argv: Optional[Sequence[str]] = None) -> dict:
    overrides = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in overrides):
        print(__doc__)
        raise SystemExit(0)
    # The demo model is tiny: one thread is fastest (more threads only add synchronisation), unless the
    # user asked otherwise through OMP_NUM_THREADS.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.time()
    with user_errors(known_keys=known_keys):  # bad input (override key, occupied run dir, ...): one line, exit 1
        cfg = load_config("cfg_demo", overrides)
        ensure_demo_dataset(cfg.data_paths[0], progress=cfg.progress)
        summary = train(cfg)
    final = summary["final"]
    print("\n[demo] ---------------------------------------------------------------")
    print(f"[demo] finished in {time.time() - t0:.0f} s: {summary['stop_reason']}, {summary['steps']} steps")
    for k in ("train/exact_accuracy", "train/accuracy", "eval/all.exact_accuracy", "eval/all.accuracy"):
        if k in final:
            print(f"[demo]   {k:28s} {final[k]:.4f}")
    print(f"[demo] checkpoint : {summary['last_checkpoint']}")
    print(f"[demo] summary    : {os.path.join(summary['checkpoint_dir'], 'summary.json')}")
    wandb_dir = os.path.join(summary["checkpoint_dir"], "wandb")
    if os.path.isdir(wandb_dir):
        runs = sorted(d for d in os.listdir(wandb_dir) if d.startswith(("offline-run", "run-")))
        where = os.path.join(wandb_dir, runs[-1]) if runs else wandb_dir
        print(f"[demo] W&B run    : {where}" + ("   (upload: wandb sync " + where + ")" if "offline" in where else ""))
    else:
        print("[demo] W&B run    : disabled")
    status = int(summary.get("exit_status") or 0)
    if status:
        raise SystemExit(status)
    return summary


if __name__ == "__main__":
    main()

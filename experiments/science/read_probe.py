"""Encoder readout probe: can a demo encoder *read* which dihedral map its demos show, when it is told the answer?

The core probes (``experiments.science.probes``) ask whether the TRM core can *apply* a map it is told; this asks
the other half, with no core in the way: the encoder of the science recipe (``config/encoder/<name>.yaml`` with
``config/cfg_science.yaml``'s ``encoder:`` section) encodes the demo pairs of a puzzle, a linear head on its
context predicts the puzzle's map, and the two are trained together with cross-entropy (Adam) on fresh puzzles
every step. Held-out accuracy is measured on a fixed set of other puzzles (new grids, the same maps). Chance is
1 / number of maps. A recipe whose encoder cannot reach high accuracy here cannot be expected to hand the core the
rule through the science command's much weaker training signal.

    python -m experiments.science.read_probe                                        # the recipe's encoder
    python -m experiments.science.read_probe --encoder dihedral_views --steps 800
    python -m experiments.science.read_probe --maps 4 5 --json out.json             # two maps only

Each puzzle: ``--demos`` demo pairs of random grids (sides in ``--sizes``, 3 colours at density 0.5, top-left of
a ``--canvas-size`` canvas, as ETRM demos are) and their image under the puzzle's map
(``dataset.dihedral.dihedral_transform``). The recipe's encoder names the held-out map 0.85 / 0.98 of the time
after 3000 steps (seeds 0 / 1; 5695a84, docs/record/2026-11-25-pointer-rope.md); with dihedral views 1.000 from
step 100 (fe3d729, docs/record/2026-11-25-rule-readout-dihedral-views.md).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from core.io import write_json_atomic
from dataset.canvas import grid_to_canvas
from dataset.dihedral import dihedral_transform
from dataset.tokens import ARC_VOCAB_SIZE
from encoders import ENCODER_REGISTRY, build_encoder, hydra_defaults

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "config")


def recipe_encoder(name: str = "standard", overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The science recipe's encoder config: encoder ``name``'s defaults (its config class, as
    config/encoder/<name>.yaml composes them), then cfg_science.yaml's ``encoder:`` section, then ``overrides``
    (``key=value``, YAML values)."""
    if name not in ENCODER_REGISTRY:
        raise ValueError(f"unknown encoder {name!r} (registered: {', '.join(ENCODER_REGISTRY)})")
    cfg = OmegaConf.merge(
        hydra_defaults(name),
        OmegaConf.load(os.path.join(CONFIG_DIR, "cfg_science.yaml")).get("encoder", {}),
        OmegaConf.from_dotlist(list(overrides)),
    )
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def make_puzzles(
    rng: np.random.Generator, n: int, maps: Sequence[int], *, side: int, sizes: tuple[int, int], demos: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(demo_inputs, demo_labels [n, demos, side*side] int32, demo_mask [n, demos] bool, map index [n] long)."""
    di = np.zeros((n, demos, side * side), np.int32)
    dl = np.zeros_like(di)
    label = rng.integers(0, len(maps), n)
    for i in range(n):
        for j in range(demos):
            h, w = rng.integers(sizes[0], sizes[1] + 1, size=2)
            colours = rng.choice(np.arange(1, 10), 3, replace=False)
            g = np.where(rng.random((h, w)) < 0.5, rng.choice(colours, (h, w)), 0)
            di[i, j] = grid_to_canvas(g, size=side)
            dl[i, j] = grid_to_canvas(dihedral_transform(g, int(maps[label[i]])), size=side)
    return (
        torch.from_numpy(di),
        torch.from_numpy(dl),
        torch.ones(n, demos, dtype=torch.bool),
        torch.from_numpy(label).long(),
    )


def train_readout(
    encoder_cfg: dict[str, Any],
    *,
    maps: Sequence[int] = tuple(range(1, 8)),
    steps: int = 600,
    batch: int = 64,
    lr: float = 1e-3,
    side: int = 8,
    sizes: tuple[int, int] = (2, 6),
    demos: int = 3,
    num_eval: int = 512,
    eval_every: int = 100,
    seed: int = 0,
    hidden_size: int = 64,
    puzzle_emb_len: int = 2,
    log: bool = True,
) -> dict[str, Any]:
    """Train encoder + linear readout; returns the config, the curve (step, train loss / accuracy of the last
    batches, held-out accuracy) and the seconds taken."""
    if sizes[1] > side:
        raise ValueError(f"grid sides up to {sizes[1]} do not fit a {side}x{side} canvas")
    if len(maps) < 2 or any(not 0 <= m <= 7 for m in maps):
        raise ValueError(f"maps must be at least two dihedral map ids in 0..7, got {list(maps)}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    eval_set = make_puzzles(np.random.default_rng(seed + 10_000), num_eval, maps, side=side, sizes=sizes, demos=demos)
    enc = build_encoder(
        encoder_cfg,
        hidden_size=hidden_size,
        vocab_size=ARC_VOCAB_SIZE,
        seq_len=side * side,
        puzzle_emb_len=puzzle_emb_len,
        verbose=False,
    )
    head = nn.Linear(puzzle_emb_len * hidden_size, len(maps))
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], lr=lr)

    def logits(di, dl, dm):
        return head(enc(di, dl, dm).context.flatten(1))

    curve, seen, t0 = [], [], time.perf_counter()
    for step in range(1, steps + 1):
        di, dl, dm, y = make_puzzles(rng, batch, maps, side=side, sizes=sizes, demos=demos)
        enc.train()
        out = logits(di, dl, dm)
        loss = F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen.append((loss.item(), (out.argmax(-1) == y).float().mean().item()))
        if step % eval_every == 0 or step == steps:
            enc.eval()
            with torch.no_grad():
                acc = (
                    torch.cat(
                        [logits(*(t[i : i + 256] for t in eval_set[:3])).argmax(-1) for i in range(0, num_eval, 256)]
                    )
                    .eq(eval_set[3])
                    .float()
                    .mean()
                    .item()
                )
            tl, ta = (float(np.mean(v)) for v in zip(*seen))
            curve.append({"step": step, "train_loss": tl, "train_acc": ta, "heldout_acc": acc})
            seen = []
            if log:
                print(
                    f"[read_probe] step {step}/{steps} train loss {tl:.3f} acc {ta:.3f}  held-out acc {acc:.3f}",
                    flush=True,
                )
    return {
        "encoder": encoder_cfg,
        "maps": list(maps),
        "chance": 1 / len(maps),
        "steps": steps,
        "batch": batch,
        "lr": lr,
        "seed": seed,
        "curve": curve,
        "seconds": time.perf_counter() - t0,
        "num_params": sum(p.numel() for p in enc.parameters()),
    }


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", default="standard", help="a registered encoder (config/encoder/<name>.yaml)")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="encoder config keys on top of the recipe (e.g. pointer=identity)",
    )
    ap.add_argument("--maps", type=int, nargs="+", default=list(range(1, 8)), help="dihedral map ids (default 1..7)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--canvas-size", type=int, default=8)
    ap.add_argument("--sizes", type=int, nargs=2, default=(2, 6), metavar=("MIN", "MAX"))
    ap.add_argument("--demos", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    cfg = recipe_encoder(a.encoder, a.override)
    print(
        f"[read_probe] encoder {a.encoder} ({', '.join(a.override) or 'the recipe'}), maps {a.maps}, "
        f"{a.steps} steps of {a.batch} puzzles, lr {a.lr}, seed {a.seed}",
        flush=True,
    )
    res = train_readout(
        cfg,
        maps=a.maps,
        steps=a.steps,
        batch=a.batch,
        lr=a.lr,
        side=a.canvas_size,
        sizes=tuple(a.sizes),
        demos=a.demos,
        seed=a.seed,
    )
    last = res["curve"][-1]
    print(
        f"[read_probe] held-out accuracy {last['heldout_acc']:.3f} (chance {res['chance']:.3f}) after {a.steps} "
        f"steps, {res['seconds']:.0f} s, {res['num_params']:,} encoder parameters",
        flush=True,
    )
    if a.json:
        write_json_atomic(a.json, res)
    return res


if __name__ == "__main__":
    main()

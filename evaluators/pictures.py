"""PNG pictures of ARC predictions: the demonstration pairs, test input, ground truth and the top voted candidates."""
from __future__ import annotations

import os
import random
from typing import Any, Optional, Sequence

import numpy as np

# The standard ARC colour palette (colours 0..9).
ARC_PALETTE: tuple[str, ...] = (
    "#000000", "#0074D9", "#FF4136", "#2ECC40", "#FFDC00",
    "#AAAAAA", "#F012BE", "#FF851B", "#7FDBFF", "#870C25",
)


def _draw(ax, grid: Optional[list], title: str, color: str = "black") -> None:
    from matplotlib.colors import BoundaryNorm, ListedColormap

    ax.axis("on")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=8, color=color)
    if grid is None:
        ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        return
    arr = np.asarray(grid)
    cmap = ListedColormap(ARC_PALETTE)
    ax.imshow(arr, cmap=cmap, norm=BoundaryNorm(np.arange(-0.5, 10.5, 1), cmap.N), interpolation="nearest")
    h, w = arr.shape
    ax.set_xticks(np.arange(-0.5, w, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, h, 1), minor=True)
    ax.grid(which="minor", color="#555555", linewidth=0.3)
    ax.tick_params(which="minor", length=0)


def draw_puzzle(path: str, name: str, puzzle: dict, ranked: Sequence[Sequence[Any]], top_k: int = 2) -> str:
    """One PNG for one puzzle: its demonstration pairs first (what an ETRM encoder reads; input -> output side by
    side, several pairs per row), then a row per test input: input, ground truth, top-``top_k`` voted candidates
    (votes, mean q; green = correct, red = wrong)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    demos, tests = puzzle.get("train", []), puzzle["test"]
    ncols = max(2 + top_k, 2 * min(len(demos), 3))
    per_row = ncols // 2
    demo_rows = -(-len(demos) // per_row)
    fig, axes = plt.subplots(demo_rows + len(tests), ncols, figsize=(2 * ncols, 2.1 * (demo_rows + len(tests))),
                             squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for d, ex in enumerate(demos):
        r, c = divmod(d, per_row)
        _draw(axes[r][2 * c], ex["input"], f"demo {d}: input", "navy")
        _draw(axes[r][2 * c + 1], ex.get("output"), f"demo {d}: output", "navy")
    for i, ex in enumerate(tests):
        row, truth = axes[demo_rows + i], ex.get("output")
        cands = [c for c in (ranked[i] if i < len(ranked) else []) if c.grid is not None][:top_k]
        _draw(row[0], ex["input"], f"test {i}: input")
        _draw(row[1], truth, "ground truth")
        for j in range(top_k):
            if j < len(cands):
                c = cands[j]
                ok = truth is not None and np.array_equal(np.asarray(c.grid), np.asarray(truth))
                _draw(row[2 + j], c.grid, f"top-{j + 1}: {c.votes} votes, q={c.mean_q:.2f}", "green" if ok else "red")
            else:
                _draw(row[2 + j], None, f"top-{j + 1}")
    fig.suptitle(f"{name}: {len(demos)} demos, {len(tests)} test input(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def save_prediction_pictures(out_dir: str, ranked: dict, test_puzzles: dict, *, num_puzzles: int = 8,
                             seed: int = 0) -> list[str]:
    """Draw a seeded sample of ``num_puzzles`` evaluated puzzles into ``out_dir``; log them to W&B when a
    run is active. Returns the written paths."""
    names = sorted(ranked)
    if not names or num_puzzles <= 0:
        return []
    sample = sorted(random.Random(seed).sample(names, min(num_puzzles, len(names))))
    os.makedirs(out_dir, exist_ok=True)
    paths = [draw_puzzle(os.path.join(out_dir, n.replace(os.sep, "_") + ".png"), n, test_puzzles[n], ranked[n]) for n in sample]
    try:
        import wandb

        if wandb.run is not None:
            wandb.log({"ARC/pictures": [wandb.Image(p, caption=os.path.basename(p)) for p in paths]}, commit=False)
    except ImportError:  # pragma: no cover
        pass
    return paths

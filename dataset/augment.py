"""Augmentation of ARC puzzles: a dihedral transform plus a colour permutation (0 fixed), its exact inverse and its
string form in the identifiers, which copies a puzzle gets, and their canvases.

``Augmentation`` is the single-copy form: ``apply`` / ``invert`` a grid, ``name_for`` / ``parse_name`` the
identifier ``"<name>|||t<dihedral>|||<10-digit colour map>"`` of the published TRM identifiers.json. Translation
is applied at load time (training only, :func:`dataset.canvas.translate_batch`), re-drawn every epoch; it needs no
inverse because test examples are never translated.

``select_augmentations(puzzle, num_aug, seed)`` is the one rule the ARC builder (and the synthetic builder's
held-out-leak check, which replays it) uses: the identity plus up to ``num_aug`` distinct random copies, seeded by
``seed`` and the puzzle's name. ``encode_puzzle`` writes a puzzle's canvases under given augmentations
(vectorised per dihedral transform).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from core.io import read_json, write_json_atomic
from dataset.dihedral import dihedral_transform, inverse_dihedral_transform
from dataset.errors import DatasetError
from dataset.tokens import ARC_MAX_GRID, COLOR_OFFSET, EOS_ID, NUM_COLORS

# Separator of augmented puzzle names, as in the published TRM identifiers.json:
#   "<name>|||t<dihedral>|||<10-digit colour mapping>"
PUZZLE_ID_SEPARATOR = "|||"


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


@dataclass
class ArcPuzzle:
    """One original puzzle: demo pairs and test pairs (with solutions), grids as uint8 arrays."""

    subset: str
    name: str
    train: list[tuple[np.ndarray, np.ndarray]]
    test: list[tuple[np.ndarray, np.ndarray]]

    def to_json(self) -> dict:
        return {
            "train": [{"input": i.tolist(), "output": o.tolist()} for i, o in self.train],
            "test": [{"input": i.tolist(), "output": o.tolist()} for i, o in self.test],
        }


def _stable_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")


def _encode_into(dst: np.ndarray, grid: np.ndarray, dih: np.ndarray, luts: np.ndarray) -> None:
    """Write the canvases of ``grid`` under each augmentation into ``dst`` [A, N, N] (pre-filled with PAD;
    N = the canvas side, 30 for ARC). ``dih`` [A] dihedral ids, ``luts`` [A, 10] colour maps; vectorised per
    dihedral transform."""
    size = dst.shape[-1]
    for d in np.unique(dih):
        sel = np.nonzero(dih == d)[0]
        g = dihedral_transform(grid, int(d))
        h, w = g.shape
        block = (luts[sel] + COLOR_OFFSET)[:, g]  # [k, h, w]
        if len(sel) == len(dih):
            dst[:, :h, :w] = block
            if h < size:
                dst[:, h, :w] = EOS_ID
            if w < size:
                dst[:, :h, w] = EOS_ID
        else:
            dst[sel, :h, :w] = block
            if h < size:
                dst[sel, h, :w] = EOS_ID
            if w < size:
                dst[sel, :h, w] = EOS_ID


def _encode_many(grid: np.ndarray, augs: Sequence[Augmentation], canvas_size: int = ARC_MAX_GRID) -> np.ndarray:
    """Canvases [len(augs), canvas_size**2] (uint8) of ``grid`` under each augmentation (reference-equal to
    ``grid_to_canvas(aug.apply(grid), size=canvas_size)``)."""
    out = np.zeros((len(augs), canvas_size, canvas_size), dtype=np.uint8)
    dih = np.array([a.dihedral for a in augs], dtype=np.int64)
    luts = np.array([a.colour_map for a in augs], dtype=np.uint8)
    _encode_into(out, grid, dih, luts)
    return out.reshape(len(augs), canvas_size * canvas_size)


def _random_augmentations(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k random (dihedral [k], colour map [k, 10] with 0 fixed), drawn vectorised."""
    dih = rng.integers(0, 8, size=k)
    perm = rng.permuted(np.tile(np.arange(1, NUM_COLORS, dtype=np.uint8), (k, 1)), axis=1)
    return dih, np.concatenate([np.zeros((k, 1), np.uint8), perm], axis=1)


def _has_spatial_symmetry(grids: Sequence[np.ndarray]) -> bool:
    """True when some non-identity dihedral transform, followed by a colour permutation fixing 0, maps
    every grid of the puzzle onto itself (then different augmentations can coincide in more ways than
    by differing only on unused colours)."""
    y = np.concatenate([g.reshape(-1) for g in grids]).astype(np.int64)
    for e in range(1, 8):
        tg = [dihedral_transform(g, e) for g in grids]
        if any(t.shape != g.shape for t, g in zip(tg, grids)):
            continue
        x = np.concatenate([t.reshape(-1) for t in tg]).astype(np.int64)
        pairs = np.unique(x * NUM_COLORS + y)
        src, dst = pairs // NUM_COLORS, pairs % NUM_COLORS
        # a function (each x value one y value), injective, with 0 -> 0
        if (
            len(np.unique(src)) == len(src)
            and len(np.unique(dst)) == len(dst)
            and all(d == 0 for s_, d in zip(src, dst) if s_ == 0)
            and all(s_ == 0 for s_, d in zip(src, dst) if d == 0)
        ):
            return True
    return False


def select_augmentations(
    puzzle: ArcPuzzle, num_aug: int, seed: int, accept: Optional[Callable[[int, np.ndarray], bool]] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Identity + up to ``num_aug`` distinct random augmentations (seeded by ``seed`` and the puzzle name):
    (dihedral ids [A], colour maps [A, 10]); the identity is first.

    Two copies are duplicates when every grid of every pair is identical (shape and content, pitfall 19).
    Fast path (no spatial self-symmetry, the usual case): two augmentations coincide exactly when they have
    the same dihedral transform and agree on the colours the puzzle uses, so that is the key. Otherwise the
    encoded canvases (which encode shape and content) are hashed. At most ``5 * num_aug`` candidates.

    ``accept(dihedral, colour_map)``: asked about every new non-identity candidate; a refused one is skipped and
    the next candidate drawn in its place (the synthetic builder refuses copies that would show a held-out rule
    instance), so the puzzle can end with fewer copies when the candidates run out. None (the default) accepts
    every candidate: the draws are then exactly those without the argument."""
    rng = np.random.default_rng(_stable_seed(seed, puzzle.subset, puzzle.name))
    pairs = puzzle.train + puzzle.test
    grids = [g for pair in pairs for g in pair]
    used = np.unique(np.concatenate([g.reshape(-1) for g in grids]))
    used = used[used != 0]
    symmetric = _has_spatial_symmetry(grids)
    max_tries = max(num_aug * 5, 8)
    dih = np.zeros(1, np.int64)
    luts = np.arange(NUM_COLORS, dtype=np.uint8)[None]
    if symmetric:
        seen = {hashlib.blake2b(encode_puzzle(puzzle, dih, luts)[0].data, digest_size=16).digest()}
    else:
        seen = {(0, luts[0, used].tobytes())}
    tries, have = 0, 1
    dl, ll = [dih], [luts]
    while have < num_aug + 1 and tries < max_tries:
        k = min(num_aug + 1 - have, max_tries - tries)
        cd, cl = _random_augmentations(rng, k)
        tries += k
        if symmetric:
            can = encode_puzzle(puzzle, cd, cl)
            keys = [hashlib.blake2b(can[a].data, digest_size=16).digest() for a in range(k)]
        else:
            keys = [(d, key.tobytes()) for d, key in zip(cd.tolist(), cl[:, used])]
        keep = []
        for a, kk in enumerate(keys):
            if kk not in seen:
                seen.add(kk)
                if accept is None or accept(int(cd[a]), cl[a]):
                    keep.append(a)
        if keep:
            dl.append(cd[keep])
            ll.append(cl[keep])
            have += len(keep)
    return np.concatenate(dl), np.concatenate(ll)


def encode_puzzle(puzzle: ArcPuzzle, dih: np.ndarray, luts: np.ndarray, canvas_size: int = ARC_MAX_GRID) -> np.ndarray:
    """Canvases [A, 2, n_pairs, canvas_size**2] (uint8): axis 1 = input / output, demo pairs then test pairs."""
    pairs = puzzle.train + puzzle.test
    can = np.zeros((len(dih), 2, len(pairs), canvas_size, canvas_size), dtype=np.uint8)
    for j, (gi, go) in enumerate(pairs):
        _encode_into(can[:, 0, j], gi, dih, luts)
        _encode_into(can[:, 1, j], go, dih, luts)
    return can.reshape(len(dih), 2, len(pairs), canvas_size * canvas_size)


def choose_augmentations(puzzle: ArcPuzzle, num_aug: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`select_augmentations` + :func:`encode_puzzle`: (dihedral ids, colour maps, canvases)."""
    dih, luts = select_augmentations(puzzle, num_aug, seed)
    return dih, luts, encode_puzzle(puzzle, dih, luts)


def aug_names(name: str, dih: np.ndarray, luts: np.ndarray) -> list[str]:
    """TRM identifiers: the plain name for the identity, else "<name>|||t<d>|||<colour map digits>"."""
    digits = (luts + ord("0")).astype(np.uint8)
    ident = np.arange(NUM_COLORS, dtype=np.uint8)
    out = []
    for d, lut, dg in zip(dih.tolist(), luts, digits):
        if d == 0 and np.array_equal(lut, ident):
            out.append(name)
        else:
            out.append(f"{name}{PUZZLE_ID_SEPARATOR}t{d}{PUZZLE_ID_SEPARATOR}{dg.tobytes().decode()}")
    return out


# ----------------------------------------------------------------------------------------------
# Per-puzzle copy lists (the synthetic builder's sidecar <prefix>_augmentations.json)
# ----------------------------------------------------------------------------------------------
AUGMENTATION_LISTS_FORMAT = "augmentation-lists/v1"
AUGMENTATION_LISTS_SUFFIX = "_augmentations.json"


def write_augmentation_lists(path: str, lists: dict, num_aug: int, seed: int) -> None:
    """Write ``lists`` (puzzle name -> (dihedral ids [A], colour maps [A, 10]), the identity first) as the JSON
    that :func:`read_augmentation_lists` and ``python -m dataset.build_arc_dataset --augmentations`` read: every
    listed puzzle gets exactly those copies instead of :func:`select_augmentations`' draw."""
    puzzles = {
        name: [Augmentation(int(d), tuple(int(c) for c in lut)).tag() for d, lut in zip(dih, luts)]
        for name, (dih, luts) in lists.items()
    }
    write_json_atomic(
        path,
        {
            "format": AUGMENTATION_LISTS_FORMAT,
            "doc": "puzzle name -> its augmented copies, 't<dihedral>|||<colour map digits>', the identity first; "
            "the ARC builder gives each listed puzzle exactly these copies (built with this num_aug and seed)",
            "num_aug": num_aug,
            "seed": seed,
            "puzzles": puzzles,
        },
        compact=True,
    )


def read_augmentation_lists(path: str, num_aug: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The copy lists of :func:`write_augmentation_lists` (puzzle name -> (dihedral ids, colour maps)). They were
    chosen for one ``num_aug`` and ``seed`` (a leak-free choice holds only for those): a build with others is
    refused. Errors name the file and the puzzle."""
    data = read_json(path, DatasetError)
    if not isinstance(data, dict) or data.get("format") != AUGMENTATION_LISTS_FORMAT:
        raise DatasetError(f"--augmentations {path}: field format: expected {AUGMENTATION_LISTS_FORMAT!r}")
    if (data.get("num_aug"), data.get("seed")) != (num_aug, seed):
        raise DatasetError(
            f"--augmentations {path}: lists the copies of --num-aug {data.get('num_aug')} --seed {data.get('seed')}, "
            f"this build asks for --num-aug {num_aug} --seed {seed}; build with those (or --augmentations none)"
        )
    out = {}
    for name, tags in (data.get("puzzles") or {}).items():
        try:
            augs = [Augmentation.parse_name(f"x{PUZZLE_ID_SEPARATOR}{t}")[1] for t in tags]
        except (ValueError, TypeError) as e:
            raise DatasetError(f"--augmentations {path}: puzzle {name!r}: {e}") from None
        if not augs or not augs[0].is_identity or len(augs) > num_aug + 1 or len(set(augs)) != len(augs):
            raise DatasetError(
                f"--augmentations {path}: puzzle {name!r}: expected the identity first, then at most {num_aug} "
                f"distinct copies, got {tags[:3]}{'...' if len(tags) > 3 else ''}"
            )
        out[name] = (
            np.array([a.dihedral for a in augs], dtype=np.int64),
            np.array([a.colour_map for a in augs], dtype=np.uint8),
        )
    return out

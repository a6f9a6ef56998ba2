"""When puzzles show the same rule: a puzzle's augmented copy shows a *conjugate* rule instance (a flip seen through
a quarter turn is another flip; colour_map {1: 2} through a colour permutation pi is {pi(1): pi(2)}), which the
synthetic builder uses to keep held-out instances out of training also through augmentation and the rule labels
use to label every copy; a puzzle's demos determine its rule only when no simpler (or, for roll, no other) instance
explains them as well; and a puzzle shows a held-out instance *by behaviour* when that instance produces its pairs
exactly, whatever its own key (:class:`HeldOutBehaviour`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from dataset.breadth_families import BREADTH_FAMILIES, breadth_conjugate_params, breadth_rivals
from dataset.dihedral import D4_COMPOSE, D4_MATRIX, DIHEDRAL_INVERSE, dihedral_transform
from dataset.families import ALL_FAMILIES, family_apply, structure
from dataset.open_families import OPEN_FAMILIES, open_conjugate_params, open_rivals
from dataset.synthetic_rules import SHIFT_CELLS, SHIFT_FAMILIES, rule_key

_DIR_VECTORS = {"down": (1, 0), "up": (-1, 0), "left": (0, -1), "right": (0, 1)}


def conjugate_params(family: str, params: dict, dihedral: int, colour_map) -> Optional[dict]:
    """Parameters of the rule g . R . g^-1 that an augmented copy of a puzzle of instance R shows, where g is the
    ARC builder's augmentation (colour permutation ``colour_map`` with 0 fixed, then dihedral transform
    ``dihedral``, as :class:`dataset.augment.Augmentation`): the copy's pairs are (g(x), g(R(x))). None when that
    mapping is not an instance of the family (copy_pattern with mirrored tiles and an even repeat count along a
    reversed axis). ``tests/test_synthetic_leak.py`` checks every family against the mappings themselves."""
    if family in OPEN_FAMILIES:
        return open_conjugate_params(family, params, dihedral, colour_map)
    if family in BREADTH_FAMILIES:
        return breadth_conjugate_params(family, params, dihedral, colour_map)
    pi = [int(c) for c in colour_map]
    col = lambda c: None if c is None else pi[int(c)]  # noqa: E731
    rc = lambda r: None if r is None else [pi[int(r[0])], pi[int(r[1])]]  # noqa: E731
    m = D4_MATRIX[dihedral]
    swaps = m[0, 0] == 0  # the transform exchanges rows and columns
    if family == "colour_map":
        return {
            "map": {
                str(pi[int(a)]): pi[int(b)] for a, b in sorted(params["map"].items(), key=lambda kv: pi[int(kv[0])])
            }
        }
    if family == "flip_rotate":
        inv = DIHEDRAL_INVERSE[dihedral]
        return {
            "dihedral": D4_COMPOSE[dihedral][D4_COMPOSE[params["dihedral"]][inv]],
            "recolour": rc(params["recolour"]),
        }
    if family in SHIFT_FAMILIES:  # a shift seen through g is the shift g(dr, dc), wrapped or not
        dr, dc = (int(v) for v in m @ np.array([params["dr"], params["dc"]]))
        return {"dr": dr, "dc": dc}
    if family == "gravity":
        v = tuple(int(x) for x in m @ np.array(_DIR_VECTORS[params["direction"]]))
        return {"direction": next(d for d, u in _DIR_VECTORS.items() if u == v), "wall": col(params["wall"])}
    if family == "scale_up":
        ky, kx = (params["kx"], params["ky"]) if swaps else (params["ky"], params["kx"])
        return {"ky": ky, "kx": kx, "recolour": rc(params["recolour"])}
    if family == "fill_enclosed":
        out = {"border": col(params["border"]), "fill": col(params["fill"]), "noise": col(params["noise"])}
        return dict(out, recolour=rc(params["recolour"])) if "recolour" in params else out
    if family == "recolour_by_size":
        return {
            "src": col(params["src"]),
            "big": col(params["big"]),
            "small": col(params["small"]),
            "threshold": params["threshold"],
        }
    if family == "copy_pattern":
        ry, rx = (params["rx"], params["ry"]) if swaps else (params["ry"], params["rx"])
        out = {"ry": ry, "rx": rx, "mirror": params["mirror"], "recolour": rc(params["recolour"])}
        if params["mirror"]:  # mirrored tiling survives the transform only if the tile grid's ends match
            spatial = dict(params, recolour=None)
            probe = np.arange(1, 7, dtype=np.uint8).reshape(2, 3)  # no symmetry
            want = dihedral_transform(family_apply("copy_pattern", spatial)(probe), dihedral)
            got = family_apply("copy_pattern", dict(out, recolour=None))(dihedral_transform(probe, dihedral))
            if want.shape != got.shape or not np.array_equal(want, got):
                return None
        return out
    raise ValueError(f"unknown family {family!r} (known: {sorted(ALL_FAMILIES)})")


def in_training_orbit(rules: dict) -> dict[str, bool]:
    """Per held-out puzzle of a synthetic ``rules.json`` (id -> family, params, subset): True when a dihedral map of
    the whole puzzle (g . R . g^-1, any of the 8) turns its instance into a structure that a training puzzle shows.
    Such a puzzle is held out as drawn but not up to symmetry: a dihedral-equivariant reader, or a vote over its
    dihedral copies, answers it from a trained structure without reading anything new. The training puzzles' own
    structures suffice: a copy's structure is a dihedral map of its puzzle's, so it lies in the same orbit."""
    seen = {structure(r["family"], r["params"]) for r in rules.values() if r["subset"] == "training"}
    ident = list(range(10))

    def orbit(family: str, params: dict) -> bool:
        maps = (conjugate_params(family, params, g, ident) for g in range(8))
        return any(c is not None and structure(family, c) in seen for c in maps)

    return {p: orbit(r["family"], r["params"]) for p, r in rules.items() if r["subset"] == "evaluation"}


def simpler_variants(family: str, params: dict) -> list[dict]:
    """Instances of the family that drop or change one optional part of ``params`` (its recolour, wall, a
    colour_map entry, the mirroring, the size threshold). Demos that one of them also explains do not determine
    the rule: :func:`demos_determine_rule` rejects such puzzles (e.g. a recolour 5 -> 6 whose demos hold no 5)."""
    out = []
    if params.get("recolour") is not None:
        out.append(dict(params, recolour=None))
    if family == "gravity" and params["wall"] is not None:
        out.append(dict(params, wall=None))
    if family == "copy_pattern" and params["mirror"]:
        out.append(dict(params, mirror=False))
    if family == "recolour_by_size":
        out += [dict(params, threshold=t) for t in (2, 3, 4) if t != params["threshold"]]
    if family == "colour_map":
        changed = {a: b for a, b in params["map"].items() if int(a) != int(b)}
        out += [{"map": {k: v for k, v in changed.items() if k != a}} for a in changed]
    return out


def rival_instances(family: str, params: dict) -> list[tuple[str, dict]]:
    """(family, params) of the instances that the demos of ``params`` must rule out: its
    :func:`simpler_variants` and, for roll, the unwrapped shift (translate) with the same (dr, dc) and every other
    wrapped shift (on grids of h rows a roll by dr is one by dr - h: demos all of one height may not tell them
    apart)."""
    if family in OPEN_FAMILIES:
        return [(family, p) for p in open_rivals(family, params)]
    if family in BREADTH_FAMILIES:
        return [(family, p) for p in breadth_rivals(family, params)]
    out = [(family, p) for p in simpler_variants(family, params)]
    if family == "roll":
        out.append(("translate", {"dr": params["dr"], "dc": params["dc"]}))
        out += [
            ("roll", {"dr": sr * a, "dc": sc * b})
            for a, b in SHIFT_CELLS
            for sr in ((1, -1) if a else (1,))
            for sc in ((1, -1) if b else (1,))
            if (sr * a, sc * b) != (params["dr"], params["dc"])
        ]
    return out


def _maps_all(f, pairs) -> bool:
    return all((y := f(x)) is not None and y.shape == o.shape and np.array_equal(y, o) for x, o in pairs)


def demos_determine_rule(family: str, params: dict, demos: list) -> bool:
    """False when a :func:`rival_instances` instance maps every demo input to its output as well."""
    return not any(_maps_all(family_apply(f, p), demos) for f, p in rival_instances(family, params))


# ----------------------------------------------------------------------------------------------
# Leaks by behaviour: a held-out instance that produces a puzzle's pairs exactly
# ----------------------------------------------------------------------------------------------
def _changed_only(x: np.ndarray, y: np.ndarray, src_is_zero: bool, src: int, dst: tuple) -> bool:
    """The cells where y differs from x are exactly where x is ``src`` (0 with ``src_is_zero``: a subset of them)
    and become one of ``dst``: fill_enclosed's and recolour_by_size's footprint, a cheap test before their flood
    fill / components."""
    changed = x != y
    if not changed.any():
        return False
    if src_is_zero:
        if (x[changed] != 0).any():
            return False
    elif not np.array_equal(changed, x == src):
        return False
    return bool(np.isin(y[changed], dst).all())


class HeldOutBehaviour:
    """The held-out rule instances (any family) as mappings, to find one that produces a puzzle's pairs exactly:
    a training puzzle (or an augmented copy of it) whose every pair input some held-out instance maps to the
    pair's output is a leak even where its own rule has another key (a wrapped shift whose content never crosses
    an edge *is* the unwrapped shift; gravity without a wall is gravity with a wall colour the inputs lack).

    Cheap filters come first: the output shape each instance gives the first pair's input (same, transposed or
    a multiple), then, for the families applied cell by cell in Python, the first pair's colour counts (gravity
    moves cells, it keeps every colour's count) or the footprint of the change (fill_enclosed, recolour_by_size).
    """

    _FOOTPRINT = ("gravity", "fill_enclosed", "recolour_by_size")

    def __init__(self, instances: Sequence[tuple[str, dict]]):
        self.same: list = []  # instances whose output has the input's shape
        self.transposed: list = []  # ... the transposed shape (flip_rotate's transposing maps)
        self.multiple: dict[tuple[int, int], list] = {}  # (ky, kx) -> instances whose output is (ky h, kx w)
        self.free: list = []  # instances whose output shape the input shape does not fix (crops, counts)
        seen = set()
        for fam, params in instances:
            key = rule_key(fam, params)
            if key in seen:
                continue
            seen.add(key)
            entry = (key, fam, params, family_apply(fam, params))
            if fam in ("scale_up", "copy_pattern"):
                k = (params["ky"], params["kx"]) if fam == "scale_up" else (params["ry"], params["rx"])
                self.multiple.setdefault(k, []).append(entry)
            elif fam in ("crop_object", "count_to_bar") or (fam == "mirror_complete" and params["output"] == "patch"):
                self.free.append(entry)
            elif fam == "flip_rotate" and D4_MATRIX[params["dihedral"]][0, 0] == 0:
                self.transposed.append(entry)
            else:
                self.same.append(entry)

    def __len__(self) -> int:
        return len(self.same) + len(self.transposed) + len(self.free) + sum(map(len, self.multiple.values()))

    def _candidates(self, x: np.ndarray, y: np.ndarray) -> list:
        (h, w), (oh, ow) = x.shape, y.shape
        out = list(self.free)
        if (oh, ow) == (h, w):
            out += self.same
        if (oh, ow) == (w, h):
            out += self.transposed
        if oh % h == 0 and ow % w == 0:
            out += self.multiple.get((oh // h, ow // w), [])
        return out

    def realised_by(self, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> Optional[str]:
        """The key of a held-out instance that maps every input of ``pairs`` to its output, or None."""
        x0, y0 = pairs[0]
        counts = None
        for key, fam, p, f in self._candidates(x0, y0):
            if fam in self._FOOTPRINT:
                if fam == "gravity":
                    if counts is None:
                        counts = (np.bincount(x0.ravel(), minlength=10), np.bincount(y0.ravel(), minlength=10))
                    if not np.array_equal(*counts):
                        continue
                elif fam == "fill_enclosed":
                    if not p.get("recolour") and not _changed_only(x0, y0, True, 0, (p["fill"],)):
                        continue
                elif not _changed_only(x0, y0, False, p["src"], (p["big"], p["small"])):
                    continue
            if _maps_all(f, pairs):
                return key
        return None

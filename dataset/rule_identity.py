"""When puzzles show the same rule: a puzzle's augmented copy shows a *conjugate* rule instance (a flip seen through
a quarter turn is another flip; colour_map {1: 2} through a colour permutation pi is {pi(1): pi(2)}), which the
synthetic builder uses to keep held-out instances out of training also through augmentation and the rule labels
use to label every copy; and a puzzle's demos determine its rule only when no simpler instance of the family
explains them as well.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from dataset.dihedral import D4_COMPOSE, D4_MATRIX, DIHEDRAL_INVERSE, dihedral_transform
from dataset.synthetic_rules import FAMILIES, rule_apply

_DIR_VECTORS = {"down": (1, 0), "up": (-1, 0), "left": (0, -1), "right": (0, 1)}


def conjugate_params(family: str, params: dict, dihedral: int, colour_map) -> Optional[dict]:
    """Parameters of the rule g . R . g^-1 that an augmented copy of a puzzle of instance R shows, where g is the
    ARC builder's augmentation (colour permutation ``colour_map`` with 0 fixed, then dihedral transform
    ``dihedral``, as :class:`dataset.augment.Augmentation`): the copy's pairs are (g(x), g(R(x))). None when that
    mapping is not an instance of the family (copy_pattern with mirrored tiles and an even repeat count along a
    reversed axis). ``tests/test_synthetic_leak.py`` checks every family against the mappings themselves."""
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
    if family == "translate":
        dr, dc = (int(v) for v in m @ np.array([params["dr"], params["dc"]]))
        return {"dr": dr, "dc": dc, "wrap": params["wrap"]}
    if family == "gravity":
        v = tuple(int(x) for x in m @ np.array(_DIR_VECTORS[params["direction"]]))
        return {"direction": next(d for d, u in _DIR_VECTORS.items() if u == v), "wall": col(params["wall"])}
    if family == "scale_up":
        ky, kx = (params["kx"], params["ky"]) if swaps else (params["ky"], params["kx"])
        return {"ky": ky, "kx": kx, "recolour": rc(params["recolour"])}
    if family == "fill_enclosed":
        return {"border": col(params["border"]), "fill": col(params["fill"]), "noise": col(params["noise"])}
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
            want = dihedral_transform(rule_apply("copy_pattern", spatial)(probe), dihedral)
            got = rule_apply("copy_pattern", dict(out, recolour=None))(dihedral_transform(probe, dihedral))
            if want.shape != got.shape or not np.array_equal(want, got):
                return None
        return out
    raise ValueError(f"unknown family {family!r} (known: {sorted(FAMILIES)})")


def simpler_variants(family: str, params: dict) -> list[dict]:
    """Instances of the family that drop or change one optional part of ``params`` (its recolour, wall, wrap, a
    colour_map entry, the mirroring, the size threshold). Demos that one of them also explains do not determine
    the rule: :func:`demos_determine_rule` rejects such puzzles (e.g. a recolour 5 -> 6 whose demos hold no 5)."""
    out = []
    if params.get("recolour") is not None:
        out.append(dict(params, recolour=None))
    if family == "gravity" and params["wall"] is not None:
        out.append(dict(params, wall=None))
    if family == "translate" and params["wrap"]:
        out.append(dict(params, wrap=False))
    if family == "copy_pattern" and params["mirror"]:
        out.append(dict(params, mirror=False))
    if family == "recolour_by_size":
        out += [dict(params, threshold=t) for t in (2, 3, 4) if t != params["threshold"]]
    if family == "colour_map":
        changed = {a: b for a, b in params["map"].items() if int(a) != int(b)}
        out += [{"map": {k: v for k, v in changed.items() if k != a}} for a in changed]
    return out


def demos_determine_rule(family: str, params: dict, demos: list) -> bool:
    """False when a :func:`simpler_variants` instance maps every demo input to its output as well."""
    for p in simpler_variants(family, params):
        f = rule_apply(family, p)
        if all((y := f(x)) is not None and y.shape == o.shape and np.array_equal(y, o) for x, o in demos):
            return False
    return True

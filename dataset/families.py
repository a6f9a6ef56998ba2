"""Every rule family of the synthetic benchmark in one registry, in two groups, and each instance's *structure*.

- **covered** (:data:`dataset.synthetic_rules.FAMILIES`): shifts, dihedral maps, scales, tilings, settles, fills,
  colour and size lookups. ``trm_views`` holds a built-in candidate operator for each (docs/science.md): a model
  that answers them may be selecting among candidates rather than reading the rule.
- **open** (:data:`dataset.open_families.OPEN_FAMILIES`): rules written without looking at any model operator.

An instance's **structure** (:func:`structure`) is the part of its parameters that is more than colours: a dihedral
map, a (ky, kx) factor pair, a gravity direction and whether it has a wall, a size threshold, a shift vector, the
cycle type of a colour map, whether an optional recolour is on, an open family's direction / axis / criterion.
Benchmark v3 holds out whole structures per family (:func:`choose_heldout_structures`): a held-out instance differs
from every training instance in its structure, not only in colours.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Callable, Optional

import numpy as np

from dataset.breadth_families import BREADTH, BREADTH_FAMILIES, breadth_apply, breadth_structure
from dataset.open_families import OPEN_FAMILIES, open_rule_apply
from dataset.open_families import structure as open_structure
from dataset.synthetic_rules import FAMILIES, HEADLINE_FAMILIES, Grid, GridSpec, RuleInstance, rule_apply

COVERED = "covered"
OPEN = "open"
ALL_FAMILIES: dict[str, Callable[[np.random.Generator, GridSpec], RuleInstance]] = {**FAMILIES, **OPEN_FAMILIES}
# The groups the science report totals over: the covered headline families (roll, the wrapped shift, stays outside
# as before: dataset.synthetic_rules.HEADLINE_FAMILIES) and the open families.
GROUPS: dict[str, tuple[str, ...]] = {COVERED: HEADLINE_FAMILIES, OPEN: tuple(OPEN_FAMILIES)}


def family_group(family: str) -> str:
    """``"covered"``, ``"open"`` or ``"breadth"`` (training only: :mod:`dataset.breadth_families`)."""
    if family in BREADTH_FAMILIES:
        return BREADTH
    return OPEN if family in OPEN_FAMILIES else COVERED


def family_apply(family: str, params: dict) -> Callable[[Grid], Optional[Grid]]:
    """The mapping (input grid -> output grid, or None for an unsuitable input) of any family's instance (the
    training-only breadth families too)."""
    if family in BREADTH_FAMILIES:
        return breadth_apply(family, params)
    if family in OPEN_FAMILIES:
        return open_rule_apply(family, params)
    return rule_apply(family, params)


def _cycle_type(mapping: dict) -> list[int]:
    """Sorted lengths (longest first) of the non-trivial cycles of a colour permutation {"a": b}."""
    perm = {int(a): int(b) for a, b in mapping.items() if int(a) != int(b)}
    seen, lengths = set(), []
    for start in sorted(perm):
        if start in seen:
            continue
        n, c = 0, start
        while c not in seen and c in perm:
            seen.add(c)
            c, n = perm[c], n + 1
        lengths.append(n)
    return sorted(lengths, reverse=True)


def _covered_structure(family: str, p: dict) -> dict:
    on = lambda v: v is not None  # noqa: E731  (an optional colour part: on or off, its colours left out)
    if family == "colour_map":
        return {"cycles": _cycle_type(p["map"])}
    if family == "flip_rotate":
        return {"dihedral": p["dihedral"], "recolour": on(p["recolour"])}
    if family in ("translate", "roll"):
        return {"dr": p["dr"], "dc": p["dc"]}
    if family == "scale_up":
        return {"ky": p["ky"], "kx": p["kx"], "recolour": on(p["recolour"])}
    if family == "gravity":
        return {"direction": p["direction"], "wall": on(p["wall"])}
    if family == "fill_enclosed":
        return {"recolour": on(p.get("recolour"))}
    if family == "recolour_by_size":
        return {"threshold": p["threshold"]}
    if family == "copy_pattern":
        return {"ry": p["ry"], "rx": p["rx"], "mirror": p["mirror"], "recolour": on(p["recolour"])}
    raise ValueError(f"unknown family {family!r} (known: {sorted(ALL_FAMILIES)})")


def structure(family: str, params: dict) -> str:
    """The structure of an instance as a string key ``"<family>:<json>"``: its parameters with the colours left out
    (two instances that differ only in colours have the same structure)."""
    if family in OPEN_FAMILIES:
        return open_structure(family, params)
    if family in BREADTH_FAMILIES:
        return breadth_structure(family, params)
    return f"{family}:" + json.dumps(_covered_structure(family, params), sort_keys=True)


def structure_parts(key: str) -> dict:
    """The parameters of a :func:`structure` key."""
    return json.loads(key.split(":", 1)[1])


def structure_census(family: str, spec: GridSpec, draws: int = 400, seed: int = 0) -> Counter:
    """How often each structure of ``family`` is drawn by its generator (``draws`` instances, own seeded stream)."""
    rng = np.random.default_rng([seed, 0x57C, len(family), sum(map(ord, family))])
    return Counter(structure(family, ALL_FAMILIES[family](rng, spec).params) for _ in range(draws))


# Optional parts whose "off" is a special case of "on" (a gravity without a wall is one with a wall colour the grid
# lacks; a ray that stops at cells is one that never meets any): holding out "off" needs "on" held out as well, or
# the held-out puzzles are reproduced by trained instances (benchmark v3's reverse behaviour check).
_OPTIONAL_PARTS = ("recolour", "wall", "stop")


def generalisations(key: str) -> list[str]:
    """The structures of which every instance of structure ``key`` is (on suitable grids) also an instance: an
    optional part switched on, a colour map's single swap inside a double swap."""
    fam, parts = key.split(":", 1)[0], structure_parts(key)
    out = []
    for k in _OPTIONAL_PARTS:
        if parts.get(k) is False:
            out.append(f"{fam}:" + json.dumps(dict(parts, **{k: True}), sort_keys=True))
    if fam == "colour_map" and parts["cycles"] == [2]:
        out.append(f"{fam}:" + json.dumps({"cycles": [2, 2]}, sort_keys=True))
    return out


def _closure(key: str) -> set[str]:
    todo, out = [key], set()
    while todo:
        k = todo.pop()
        if k not in out:
            out.add(k)
            todo += generalisations(k)
    return out


def choose_heldout_structures(
    rng: np.random.Generator, family: str, spec: GridSpec, share: float = 0.25, census_seed: int = 0
) -> list[str]:
    """The structures of ``family`` benchmark v3 holds out: a seeded choice of structures, each with its
    :func:`generalisations`, taken until they cover about ``share`` of the generator's draws (at least one; at least
    one structure, and most of the draws, stay for training). A family with a single structure holds none out."""
    census = structure_census(family, spec, seed=census_seed)
    keys = sorted(census)
    if len(keys) < 2:
        return []
    total, held = sum(census.values()), set()
    mass = lambda ks: sum(census[k] for k in ks) / total  # noqa: E731
    for i in rng.permutation(len(keys)):
        grown = held | _closure(keys[i])  # with its generalisations (see generalisations())
        if mass(grown) > 2 * share or len(grown) >= len(keys):
            continue  # this would take most of the family (or all of it) from training
        held = grown
        if mass(held) >= share or len(held) >= max(1, len(keys) // 3):
            break
    if not held:  # every structure is too common alone: the rarest one (with its generalisations)
        held = _closure(min(keys, key=lambda k: (len(_closure(k)), census[k], k)))
    return sorted(held)


def novelty(key: str, trained: set[str]) -> str:
    """What is new about held-out structure ``key`` against the trained structures: the parts whose value no
    trained structure of the family has (``"new dihedral=5"``), else ``"new combination"`` (each part seen, never
    together)."""
    fam = key.split(":", 1)[0]
    mine = structure_parts(key)
    others = [structure_parts(t) for t in trained if t.split(":", 1)[0] == fam]
    seen = lambda k, v: any(json.dumps(o.get(k)) == json.dumps(v) for o in others)  # noqa: E731
    fresh = [f"{k}={json.dumps(v)}" for k, v in sorted(mine.items()) if not seen(k, v)]
    return "new " + ", ".join(fresh) if fresh else "new combination"

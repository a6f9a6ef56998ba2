"""Training puzzles of the training-only breadth families (:mod:`dataset.breadth_families`), added by the synthetic
builder's ``--breadth-families`` after its draw of the evaluated families is done: that draw (every held-out puzzle,
every other training puzzle, every copy list) stays byte for byte what it is without the option, and the breadth
puzzles come from their own seeded stream.

No breadth puzzle shows a held-out rule, in either direction: a breadth instance that produces the pairs of some
evaluation copy (the identity included) is refused before any puzzle of it is drawn (:func:`forbidden_instances`:
every instance of the family is tried against every evaluation copy); a puzzle whose pairs a held-out instance
produces, or whose augmented copy shows one, is refused or its copy replaced (:class:`LeakGuard`, as for the other
training puzzles); a puzzle with a kept copy whose conjugate instance is refused is redrawn.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from tqdm import tqdm

from dataset.augment import Augmentation
from dataset.breadth_families import BREADTH_FAMILIES, breadth_apply, breadth_instances
from dataset.build_options import bar_disable
from dataset.errors import DatasetError
from dataset.rule_grids import GridSpec, rule_key
from dataset.rule_identity import _maps_all, conjugate_params
from dataset.synthetic_heldout import IDENTITY_COPY, LeakGuard, _try_puzzle

log = logging.getLogger(__name__)


def check_breadth(families: Sequence[str], per_family: int) -> list[str]:
    """The ``--breadth-families`` names (``all``: every one), checked before the draw."""
    names = list(BREADTH_FAMILIES) if list(families) == ["all"] else list(families)
    for f in names:
        if f not in BREADTH_FAMILIES:
            raise DatasetError(
                f"--breadth-families: unknown training-only family {f!r} (known: all, {', '.join(BREADTH_FAMILIES)})"
            )
    if len(set(names)) != len(names):
        raise DatasetError(f"--breadth-families: a family named twice ({' '.join(names)})")
    if names and per_family < 1:
        raise DatasetError(f"--breadth-puzzles must be >= 1 with --breadth-families, got {per_family}")
    return names


def _evaluation_copies(test: list, lists: dict) -> list[list]:
    """The pairs (demos and tests) of every evaluation copy whose grids keep their shape (every breadth rule does)."""
    out = []
    for name, _, demo, tests in test:
        dih, luts = lists.get(name, IDENTITY_COPY)
        for d, lut in zip(dih.tolist(), luts):
            aug = Augmentation(int(d), tuple(int(c) for c in lut))
            pairs = [(aug.apply(x), aug.apply(y)) for x, y in demo + tests]
            if all(x.shape == y.shape for x, y in pairs):
                out.append(pairs)
    return out


def forbidden_instances(families: Sequence[str], test: list, lists: dict) -> set[str]:
    """Keys of the breadth instances (any of ``families``) that map every input of some evaluation copy to its
    output: no training puzzle and no training copy may show one."""
    copies = _evaluation_copies(test, lists)
    out = set()
    for fam in families:
        for p in breadth_instances(fam):
            f = breadth_apply(fam, p)
            if any(_maps_all(f, pairs) for pairs in copies):
                out.add(rule_key(fam, p))
    return out


def draw_breadth(
    families: Sequence[str],
    per_family: int,
    spec: GridSpec,
    guard: LeakGuard,
    test: list,
    lists: dict,
    *,
    first_index: int,
    prefix: str,
    seed: int,
    canvas_size: int,
    progress: bool,
    skip_refused: bool = False,
) -> tuple[list, dict]:
    """``per_family`` training puzzles of each breadth family (in the order given, from the seeded stream
    ``[seed, 0xB2EA]``) -> (puzzles as the builder's training puzzles, their copy lists). Names go on from
    ``first_index``. A family every instance of which is refused is an error naming it, or with ``skip_refused``
    (``--breadth-families all``) left out with a warning and counted in the leak counts. No families: nothing."""
    if not families:
        return [], {}
    rng = np.random.default_rng([seed, 0xB2EA])
    forbidden = forbidden_instances(families, test, lists)
    if forbidden:
        log.info("synthetic breadth: %d instances refused (they produce an evaluation copy's pairs)", len(forbidden))
    dead = [f for f in families if all(rule_key(f, p) in forbidden for p in breadth_instances(f))]
    if dead and not skip_refused:
        raise DatasetError(
            f"--breadth-families: every instance of {', '.join(dead)} produces the pairs of some evaluation copy (a "
            "held-out rule would be shown in training); leave it out"
        )
    for f in dead:
        log.warning("synthetic breadth: %s left out: every instance of it produces an evaluation copy's pairs", f)
        guard.counts[f"{f}: family left out (every instance produces an evaluation copy's pairs)"] += 1
    families = [f for f in families if f not in dead]
    out, new_lists = [], {}
    bar = tqdm(total=per_family * len(families), desc="synthetic breadth", unit="puzzle", disable=bar_disable(progress))
    for fam in families:
        made, fails = 0, 0
        while made < per_family:
            if fails > 500:
                raise DatasetError(
                    f"--breadth-families: family {fam!r} makes no further puzzle within the grid limits that avoids "
                    f"the held-out rules after {made} puzzles (--max-grid {spec.max_grid}); lower --breadth-puzzles"
                )
            rule = BREADTH_FAMILIES[fam](rng, spec)
            drawn = None if rule.key in forbidden else _try_puzzle(rng, rule, canvas_size)
            leak = "refused instance" if rule.key in forbidden else None
            if drawn is not None:
                leak = guard.puzzle_leak(rule, drawn[0] + drawn[1])
            name = f"{prefix}-train-{first_index + len(out):05d}-{fam}"
            copies = guard.copies(name, fam, rule.params, *drawn) if guard.num_aug and drawn and not leak else None
            if copies is not None:
                shown = (rule_key(fam, conjugate_params(fam, rule.params, d, lut)) for d, lut in zip(*copies))
                leak = "a copy shows a refused instance" if any(k in forbidden for k in shown) else None
            if leak:
                guard.counts[f"{fam}: puzzles redrawn by {leak}"] += 1
            if drawn is None or leak:
                fails += 1
                continue
            if copies is not None:
                new_lists[name] = copies
            out.append((name, {"family": fam, "params": rule.params, "key": rule.key}, *drawn))
            made, fails = made + 1, 0
            bar.update(1)
    bar.close()
    return out, new_lists

"""Rule labels: what a rule-readout head is asked to name (``encoder.rule_readout``, encoders.probes.RuleReadout,
docs/models.md): the slots (:data:`RULE_SLOTS`), one rule instance's classes in them (:func:`rule_targets`), and
the table of a built synthetic dataset, one row of classes per puzzle identifier (:func:`rule_label_table`).

The synthetic builder knows each puzzle's rule (``<prefix>_rules.json``: name -> family, params); the ARC builder
turns every puzzle into augmented copies (``identifiers_map.json``: identifier -> puzzle name, dihedral, colour
map). A copy under augmentation g of a puzzle of rule R is a puzzle of g . R . g^-1, so its labels are those of
:func:`dataset.rule_identity.conjugate_params` -- a flip shown through a quarter turn is another flip, colour_map
{1: 2} through a colour permutation pi is {pi(1): pi(2)}. Where the conjugate is not an instance of the family
(copy_pattern, see there) only the family is labelled.

Only the identifiers of the asked split are labelled (training: the training copies, never a puzzle of the test set,
even where a TRM-mode build shows its demo pairs in ``train/``); every other row (the blank id 0, evaluation
puzzles) is :data:`UNLABELLED` in every slot, so training labels cannot reach a held-out puzzle.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from core.io import read_json
from dataset.build_arc_dataset import read_identifiers_map
from dataset.errors import DatasetError
from dataset.families import ALL_FAMILIES
from dataset.open_families import CROP_CRITERIA, DIRECTIONS
from dataset.rule_identity import conjugate_params
from dataset.synthetic_rules import GRAVITY_DIRECTIONS

UNLABELLED = -100  # the cross-entropy ignore index

NO_COLOUR = 10  # the colour slots' class for "no such colour" (no recolour, no wall)
# slot -> number of classes; a rule instance fills the slots of its family and leaves the rest unlabelled
RULE_SLOTS: dict[str, int] = {
    "family": len(ALL_FAMILIES),  # the covered families first (their indices as before the open ones), then open
    "dihedral": 8,  # flip_rotate
    "dr": 7,
    "dc": 7,  # translate / roll (shift + 3; the family slot tells wrapped from unwrapped)
    "direction": len(GRAVITY_DIRECTIONS),  # gravity
    "repeat_y": 3,
    "repeat_x": 3,  # scale_up ky, kx / copy_pattern ry, rx (minus 1)
    "mirror": 2,  # copy_pattern
    "threshold": 3,  # recolour_by_size (minus 2)
    "colour_a": NO_COLOUR + 1,
    "colour_b": NO_COLOUR + 1,
    "colour_c": NO_COLOUR + 1,  # the family's colours
    **{f"lut_{c}": 10 for c in range(10)},  # colour_map: the colour each colour becomes
    # the open families' structural parts (dataset.open_families.STRUCTURE)
    "ray": len(DIRECTIONS),  # extend_lines' direction
    "stop": 2,  # extend_lines: a ray stops at another cell
    "axis": 2,  # mirror_complete: vertical, horizontal
    "output": 2,  # mirror_complete: full, patch
    "criterion": len(CROP_CRITERIA),  # crop_object
    "orientation": 2,  # connect_pairs rows / columns, count_to_bar row / column
    "which": 2,  # keep_extreme: largest, smallest
    "keep": 2,  # keep_extreme: keep it, remove it
    "unit": 2,  # count_to_bar: cells, objects
}


def rule_targets(family: str, params: Optional[dict]) -> dict[str, int]:
    """The :data:`RULE_SLOTS` labels of a rule instance (slot -> class); ``params=None`` labels the family only.
    Only what defines the mapping is labelled (not fill_enclosed's input-only noise colour). Colour slots:
    the recolour (from, to) of flip_rotate / scale_up / copy_pattern, gravity's wall, fill_enclosed's
    (border, fill), recolour_by_size's (src, big, small); :data:`NO_COLOUR` where the optional part is off."""
    if family not in ALL_FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {sorted(ALL_FAMILIES)})")
    out = {"family": list(ALL_FAMILIES).index(family)}
    if params is None:
        return out
    col = lambda c: NO_COLOUR if c is None else int(c)  # noqa: E731

    def recolour(rc):
        return {"colour_a": col(rc[0] if rc else None), "colour_b": col(rc[1] if rc else None)}

    p = params
    if family == "colour_map":
        out.update({f"lut_{c}": int(p["map"].get(str(c), c)) for c in range(10)})
    elif family == "flip_rotate":
        out.update(dihedral=int(p["dihedral"]), **recolour(p["recolour"]))
    elif family in ("translate", "roll"):
        out.update(dr=int(p["dr"]) + 3, dc=int(p["dc"]) + 3)
    elif family == "scale_up":
        out.update(repeat_y=int(p["ky"]) - 1, repeat_x=int(p["kx"]) - 1, **recolour(p["recolour"]))
    elif family == "gravity":
        out.update(direction=GRAVITY_DIRECTIONS[p["direction"]], colour_a=col(p["wall"]))
    elif family == "fill_enclosed":
        out.update(colour_a=col(p["border"]), colour_b=col(p["fill"]))
    elif family == "recolour_by_size":
        out.update(
            colour_a=col(p["src"]), colour_b=col(p["big"]), colour_c=col(p["small"]), threshold=int(p["threshold"]) - 2
        )
    elif family == "copy_pattern":
        out.update(
            repeat_y=int(p["ry"]) - 1,
            repeat_x=int(p["rx"]) - 1,
            mirror=int(bool(p["mirror"])),
            **recolour(p["recolour"]),
        )
    else:
        out.update(_open_targets(family, p, col))
    for slot, v in out.items():
        if not 0 <= v < RULE_SLOTS[slot]:
            raise ValueError(f"rule {family} {params}: slot {slot!r} = {v} is outside 0..{RULE_SLOTS[slot] - 1}")
    return out


_SIDE = {"rows": 0, "row": 0, "columns": 1, "column": 1}


def _open_targets(family: str, p: dict, col) -> dict[str, int]:
    """The open families' slots: their structure (``dataset.open_families.STRUCTURE``) and colours (colour_a, b, c:
    extend_lines' mark, line, block; mirror_complete's mask; crop_object's colour; outline's interior and ring;
    connect_pairs' segment; count_to_bar's colour; :data:`NO_COLOUR` where a part is off)."""
    if family == "extend_lines":
        stop = bool(p["stop"])
        return {
            "ray": list(DIRECTIONS).index(p["direction"]),
            "stop": int(stop),
            "colour_a": col(p["mark"]),
            "colour_b": col(p["line"]),
            "colour_c": col(p.get("block") if stop else None),
        }
    if family == "mirror_complete":
        axis, output = ["vertical", "horizontal"].index(p["axis"]), ["full", "patch"].index(p["output"])
        return {"axis": axis, "output": output, "colour_a": col(p["mask"])}
    if family == "crop_object":
        return {"criterion": list(CROP_CRITERIA).index(p["criterion"]), "colour_a": col(p.get("colour"))}
    if family == "outline":
        return {"colour_a": col(p["interior"]), "colour_b": col(p["ring"])}
    if family == "connect_pairs":
        return {"orientation": _SIDE[p["orientation"]], "colour_a": col(p["segment"])}
    if family == "keep_extreme":
        return {"which": ["largest", "smallest"].index(p["which"]), "keep": int(bool(p["keep"]))}
    assert family == "count_to_bar", family
    unit = ["cells", "objects"].index(p["unit"])
    return {"orientation": _SIDE[p["orientation"]], "unit": unit, "colour_a": col(p["colour"])}


def _read_rules(path: str) -> dict:
    if not os.path.isfile(path):
        raise DatasetError(f"rule labels {path}: no such file (the synthetic builder's <prefix>_rules.json)")
    rules = read_json(path, DatasetError)
    if not isinstance(rules, dict) or not rules:
        raise DatasetError(
            f"rule labels {path}: expected a non-empty object puzzle name -> {{'family': ..., 'params': ...}}"
        )
    for name, r in rules.items():
        fam = r.get("family") if isinstance(r, dict) else None
        if fam not in ALL_FAMILIES:
            raise DatasetError(
                f"rule labels {path}: puzzle {name!r}: field 'family' = {fam!r} is not a synthetic "
                f"family (known: {sorted(ALL_FAMILIES)})"
            )
        if not isinstance(r.get("params"), dict):
            raise DatasetError(
                f"rule labels {path}: puzzle {name!r}: field 'params' must be an object, got {r.get('params')!r}"
            )
    return rules


def _read_json_keys(path: str) -> list:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return list(json.load(f))


def rule_label_table(data_dir: str, rules_path: str, split: str = "train") -> np.ndarray:
    """int64 [num identifiers, len(RULE_SLOTS)]: the labels of every identifier of ``split`` of the dataset built in
    ``data_dir`` (its ``identifiers_map.json`` and ``<split>/`` directory), UNLABELLED elsewhere. Training uses
    ``train`` only; ``test`` is for measuring what an encoder reads on held-out puzzles
    (``experiments.science.readout``). Every puzzle of the split must have a rule in ``rules_path``; errors name
    the file and the puzzle."""
    rules = _read_rules(rules_path)
    ids = read_identifiers_map(data_dir)
    split_dir = os.path.join(data_dir, split)
    meta = os.path.join(split_dir, "dataset.json")
    if not os.path.isfile(meta):
        raise DatasetError(f"rule labels: {meta}: no such file (no {split!r} split in {data_dir})")
    with open(meta) as f:
        sets = json.load(f)["sets"]
    train_ids = np.concatenate([np.load(os.path.join(split_dir, f"{s}__puzzle_identifiers.npy")) for s in sets])
    # a build with the test puzzles' demo pairs in train/ (TRM mode) shows them under the test identifiers: the
    # training labels must still never name a held-out puzzle's rule
    held = set(_read_json_keys(os.path.join(data_dir, "test_puzzles.json"))) if split == "train" else set()
    slots = list(RULE_SLOTS)
    table = np.full((len(ids), len(slots)), UNLABELLED, dtype=np.int64)
    for i in np.unique(train_ids).tolist():
        entry = ids[i]
        if entry is None:
            continue
        name = entry["name"]
        if name in held:
            continue
        if name not in rules:
            raise DatasetError(
                f"rule labels {rules_path}: {split} puzzle {name!r} of {data_dir} has no rule "
                "(built from other puzzles?)"
            )
        fam, aug = rules[name]["family"], entry["augmentation"]
        params = conjugate_params(fam, rules[name]["params"], aug.dihedral, aug.colour_map)
        for slot, v in rule_targets(fam, params).items():
            table[i, slots.index(slot)] = v
    return table

"""Rule labels of a built synthetic dataset: one row of :data:`dataset.synthetic_rules.RULE_SLOTS` classes per
puzzle identifier, for the auxiliary rule-readout loss (``encoder.rule_readout``, docs/science.md).

The synthetic builder knows each puzzle's rule (``<prefix>_rules.json``: name -> family, params); the ARC builder
turns every puzzle into augmented copies (``identifiers_map.json``: identifier -> puzzle name, dihedral, colour
map). A copy under augmentation g of a puzzle of rule R is a puzzle of g . R . g^-1, so its labels are those of
:func:`dataset.synthetic_rules.conjugate_params` -- a flip shown through a quarter turn is another flip, colour_map
{1: 2} through a colour permutation pi is {pi(1): pi(2)}. Where the conjugate is not an instance of the family
(copy_pattern, see there) only the family is labelled.

Only the identifiers of the asked split are labelled (training: the training copies, never a puzzle of the test set,
even where a TRM-mode build shows its demo pairs in ``train/``); every other row (the blank id 0, evaluation
puzzles) is :data:`UNLABELLED` in every slot, so training labels cannot reach a held-out puzzle.
"""
from __future__ import annotations

import json
import os

import numpy as np

from dataset.build_arc_dataset import read_identifiers_map
from dataset.common import DatasetError
from dataset.synthetic_rules import FAMILIES, RULE_SLOTS, conjugate_params, rule_targets

UNLABELLED = -100  # the cross-entropy ignore index


def _read_rules(path: str) -> dict:
    if not os.path.isfile(path):
        raise DatasetError(f"rule labels {path}: no such file (the synthetic builder's <prefix>_rules.json)")
    with open(path) as f:
        try:
            rules = json.load(f)
        except json.JSONDecodeError as e:
            raise DatasetError(f"rule labels {path}: not valid JSON ({e})") from None
    if not isinstance(rules, dict) or not rules:
        raise DatasetError(f"rule labels {path}: expected a non-empty object puzzle name -> "
                           "{'family': ..., 'params': ...}")
    for name, r in rules.items():
        fam = r.get("family") if isinstance(r, dict) else None
        if fam not in FAMILIES:
            raise DatasetError(f"rule labels {path}: puzzle {name!r}: field 'family' = {fam!r} is not a synthetic "
                               f"family (known: {sorted(FAMILIES)})")
        if not isinstance(r.get("params"), dict):
            raise DatasetError(f"rule labels {path}: puzzle {name!r}: field 'params' must be an object, got "
                               f"{r.get('params')!r}")
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
            raise DatasetError(f"rule labels {rules_path}: {split} puzzle {name!r} of {data_dir} has no rule "
                               "(built from other puzzles?)")
        fam, aug = rules[name]["family"], entry["augmentation"]
        params = conjugate_params(fam, rules[name]["params"], aug.dihedral, aug.colour_map)
        for slot, v in rule_targets(fam, params).items():
            table[i, slots.index(slot)] = v
    return table

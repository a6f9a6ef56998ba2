"""The science command's settings: one typed, immutable object, built once -- from the command line by
:func:`experiments.science.cli.settings_from_args`, or in Python -- and passed to
:func:`experiments.science.run.run_science_command`.

    from experiments.science.settings import ScienceSettings
    from experiments.science.run import run_science_command
    run_science_command(ScienceSettings(out="runs/s", encoders=("standard", "control"), steps=2000))

Its field defaults are the command's defaults (the argparse options take them from here). :meth:`ScienceSettings.check`
validates the combination before any work (one-line :class:`ScienceError` naming the option).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from dataset.build_synthetic_dataset import default_max_grid
from dataset.errors import DatasetError
from dataset.families import ALL_FAMILIES
from dataset.synthetic_breadth import check_breadth
from dataset.synthetic_rules import BENCHMARK_VERSION
from experiments.science.common import CONTROL, ENCODERS, ScienceError
from training.config import CONFIG_DIR

DEFAULT_CONFIG = "cfg_science"
# synthetic-data defaults (the settings' None = these; with your own files they do not apply)
# (16 families, 9 covered and 7 open: 100 training puzzles and 20 held-out puzzles each, as the 8 families of
# benchmark v1 had)
SYNTHETIC_DEFAULTS = {"canvas_size": 8, "min_grid": 3, "num_train": 1600, "num_test": 320, "num_aug": 8}
# your own files: no colour / dihedral copies unless asked for (docs/science_command.md, "Augmentation can leak a
# held-out rule instance into training")
FILES_NUM_AUG = 0
TRAIN_FIT_PUZZLES = 160  # training puzzles the train-fit evaluation samples
# options of the synthetic families that do not apply to your own files (--input-file-prefix)
_SYNTHETIC_ONLY = (
    "families",
    "holdout_families",
    "train_only_families",
    "drop_training_families",
    "breadth_families",
    "max_grid",
    "min_grid",
    "num_train",
    "num_test",
)


@dataclass(frozen=True)
class ScienceSettings:
    """Everything ``python -m experiments.science`` is told (the synthetic-families command; ``--recolour`` is not
    here).

    ``input_file_prefix``: your kaggle-layout files instead of the synthetic families (``families``,
    ``holdout_families``, ``max_grid``, ``min_grid``, ``num_train``, ``num_test`` must then be left unset), grouped
    by ``groups_file`` or the id prefix; ``num_aug`` defaults to 8 for the synthetic families and to 0 for your
    files. ``no_train``: train nothing, evaluate what exists. ``curve``: also every kept checkpoint
    (:mod:`experiments.science.curve`). ``rule_readout``: weight of the auxiliary rule-readout loss (synthetic
    families only: the builder's rules.json labels the training puzzles; docs/models.md).
    ``halting_step``: also score every run at its Q head's halting step (always done for a run whose samples
    halt early), a second per-family table. ``command``: the command line recorded in science.json."""

    out: str  # output directory (data, runs, science.json, science.md)
    encoders: tuple[str, ...] = ("standard", CONTROL)  # runs (ENCODERS, CONTROL, or "all")
    families: Optional[tuple[str, ...]] = None  # rule families (None: all 16, covered and open)
    holdout_families: tuple[str, ...] = ()  # families never seen in training
    train_only_families: tuple[str, ...] = ()  # families seen in training only, never evaluated
    drop_training_families: tuple[str, ...] = ()  # the same draw without these families' training puzzles
    breadth_families: tuple[str, ...] = ()  # training-only rules (dataset/breadth_families.py) added to training
    steps: Optional[int] = None  # training steps (None: max_steps of the config)
    canvas_size: Optional[int] = None
    max_grid: Optional[int] = None
    min_grid: Optional[int] = None
    num_train: Optional[int] = None
    num_test: Optional[int] = None
    num_aug: Optional[int] = None
    seed: int = 0
    overrides: tuple[str, ...] = ()  # Hydra overrides of pretrain_encoder.py
    eval_overrides: tuple[str, ...] = ()  # overrides of evaluate.py
    config: str = DEFAULT_CONFIG  # training config name under config/
    command: str = ""
    input_file_prefix: Optional[str] = None
    groups_file: Optional[str] = None
    train_fit_puzzles: int = TRAIN_FIT_PUZZLES
    no_train: bool = False
    curve: bool = False
    rule_readout: float = 0.0
    halting_step: bool = False

    def __post_init__(self) -> None:  # sequences as tuples (lists from argparse or a caller)
        for f in (
            "encoders",
            "families",
            "holdout_families",
            "train_only_families",
            "drop_training_families",
            "breadth_families",
            "overrides",
            "eval_overrides",
        ):
            value = getattr(self, f)
            if value is not None and not isinstance(value, tuple):
                if isinstance(value, str):
                    raise ScienceError(f"{f}: a sequence of names, got the string {value!r}")
                object.__setattr__(self, f, tuple(value))

    @classmethod
    def default(cls, name: str) -> Any:
        """A field's default (the command-line option's default)."""
        return cls.__dataclass_fields__[name].default

    # -- checks before any work -------------------------------------------------------------------------
    def check(self) -> tuple[list[str], list[str]]:
        """Validate the options before any work -> (families incl. the held-out ones, run names)."""
        self._check_files_mode()
        if self.num_aug is not None and self.num_aug < 0:
            raise ScienceError(f"--num-aug must be >= 0, got {self.num_aug}")
        if self.train_fit_puzzles < 0:
            raise ScienceError(f"--train-fit-puzzles must be >= 0, got {self.train_fit_puzzles}")
        fams = list(self.families) if self.families else list(ALL_FAMILIES)
        for f in list(fams) + list(self.holdout_families):
            if f not in ALL_FAMILIES:
                raise ScienceError(
                    f"--families/--holdout-families: unknown family {f!r} (known: {', '.join(ALL_FAMILIES)})"
                )
        for f in self.holdout_families:
            if f not in fams:
                fams.append(f)
        for f in self.train_only_families:
            if f not in fams or f in self.holdout_families:
                raise ScienceError(f"--train-only-families: {f!r} must be one of --families and not held out")
        for f in self.drop_training_families:
            if f not in fams:
                raise ScienceError(f"--drop-training-families: {f!r} is not one of --families")
        if set(self.drop_training_families) >= set(fams) - set(self.holdout_families):
            raise ScienceError("--drop-training-families: every training family is dropped; nothing left to train on")
        try:
            check_breadth(self.breadth_families, 1)
        except DatasetError as e:
            raise ScienceError(str(e)) from None
        if self.breadth_families and self.rule_readout:
            raise ScienceError("--breadth-families and --rule-readout: the rule labels name the 16 evaluated families")
        names = list(ENCODERS) + [CONTROL] if "all" in self.encoders else list(dict.fromkeys(self.encoders))
        if self.steps is not None and self.steps <= 0:
            raise ScienceError(f"--steps must be > 0, got {self.steps}")
        if not os.path.exists(os.path.join(CONFIG_DIR, f"{self.config}.yaml")):
            raise ScienceError(f"--config {self.config}: no such file config/{self.config}.yaml")
        return fams, names

    def _check_files_mode(self) -> None:
        """Options of the synthetic data do not apply to your own files (and --groups only to them)."""
        if self.input_file_prefix is None:
            if self.groups_file is not None:
                raise ScienceError(
                    "--groups needs --input-file-prefix (the synthetic families are grouped by rule family)"
                )
            return
        given = [k for k in _SYNTHETIC_ONLY if getattr(self, k) not in (None, [], ())]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ScienceError(
                f"--input-file-prefix and {flag} are mutually exclusive ({flag} shapes the synthetic "
                "rule families; your files define the puzzles)"
            )

    # -- the data stage's settings ------------------------------------------------------------------------
    def synthetic_data(self, families: list[str]) -> dict[str, Any]:
        """The synthetic families' data settings (defaults filled in), recorded in data/settings.json."""
        d = SYNTHETIC_DEFAULTS
        canvas_size = d["canvas_size"] if self.canvas_size is None else self.canvas_size
        return {
            "families": families,
            "holdout_families": list(self.holdout_families),
            # recorded only when given (data of earlier commands, without it, stays the same data)
            **({"train_only_families": list(self.train_only_families)} if self.train_only_families else {}),
            **({"drop_training_families": list(self.drop_training_families)} if self.drop_training_families else {}),
            **({"breadth_families": list(self.breadth_families)} if self.breadth_families else {}),
            "canvas_size": canvas_size,
            "min_grid": d["min_grid"] if self.min_grid is None else self.min_grid,
            "max_grid": default_max_grid(canvas_size) if self.max_grid is None else self.max_grid,
            "num_train": d["num_train"] if self.num_train is None else self.num_train,
            "num_test": d["num_test"] if self.num_test is None else self.num_test,
            "num_aug": d["num_aug"] if self.num_aug is None else self.num_aug,
            "seed": self.seed,
            # the reserved held-out instances (never shown by a training puzzle or its augmented copies); data
            # built before them lack this key, so an old --out is refused, not mixed
            "heldout_puzzles_per_instance": 2,
            # the families' version (dataset.synthetic_rules.BENCHMARK_VERSION): data of another one is refused
            "benchmark": BENCHMARK_VERSION,
        }

    @property
    def files_num_aug(self) -> int:
        """Augmented copies of your own puzzles (none unless asked for)."""
        return FILES_NUM_AUG if self.num_aug is None else self.num_aug

"""The ARC TRM architecture the benchmarks time: ``arch=trm`` as Hydra composes it (the TRM config class's defaults
plus config/arch/trm.yaml's differences), so a change of trm.yaml reaches ``benchmarks.train_step`` and
``benchmarks.eval_throughput``; a benchmark states what it changes as Hydra overrides."""

from __future__ import annotations

from typing import Any, Sequence

from training.config import load_config


def arc_arch(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The composed ``arch=trm`` section as a plain dict with every key filled in; ``overrides``: Hydra overrides
    of it (``arch.halt_max_steps=8``)."""
    over = ["arch=trm", "data_paths=[benchmark]", *overrides]
    return load_config("cfg_pretrain", over).arch.model_dump(mode="json")

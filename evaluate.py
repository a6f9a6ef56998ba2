"""Evaluate one checkpoint on a built dataset: a thin Hydra entry point. ARC-format data (ARC-AGI, ConceptARC,
synthetic rules) gets voting pass@K over its augmented copies; every dataset (Sudoku and Maze too) gets the
per-copy exact / token accuracy and halting steps (``all.*``).

    python evaluate.py checkpoint=checkpoints/proj/run/step_1000.pt data_path=data/arc1-aug-1000
    python evaluate.py checkpoint=... data_path=... num_augmentations=64 halt_early=true batch_size=1024
    python evaluate.py checkpoint=trm_official.pt original_trm_checkpoint=true data_path=... \\
        arch.L_cycles=4 arch.H_cycles=3 [original_arch_config=all_config.yaml]
    torchrun --nproc-per-node 4 evaluate.py checkpoint=... data_path=...

Which scoring applies comes from the test split's dataset.json ``kind`` (:func:`uses_arc_voting`). Writes
``metrics.json`` (every metric) to ``output_dir``, and for ARC-format data also ``submission.json`` (Kaggle format),
``predictions.json`` and ``pictures/`` (demonstration pairs, test input, truth, top candidates); prints the headline
metrics (:func:`printed_metrics`). A failed call removes the output directories it created. Same inference path
and evaluator as the training loop's eval hook (docs/evaluation.md).

This file composes the Hydra config (``config/cfg_evaluate.yaml`` over the ConfigStore node ``evaluate_defaults``),
checks it (:func:`check_config`, also used by ``run_jobs.py --check``) and maps errors to one line; the body --
:class:`EvaluateConfig`, :func:`run` -- is ``training.evaluation`` (re-exported here).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

import hydra
import pydantic
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from core.errors import run_hydra_main, user_errors, validation_problems
from models import parse_arch_config
from training.evaluation import EvaluateConfig, EvaluateError, run, uses_arc_voting

__all__ = [
    "EvaluateConfig",
    "EvaluateError",
    "check_config",
    "config_from_hydra",
    "evaluate_defaults",
    "known_keys",
    "printed_metrics",
    "run",
    "uses_arc_voting",
]


def evaluate_defaults() -> dict[str, Any]:
    """The field defaults of :class:`EvaluateConfig` as Hydra's node (required keys are ``???``; arch comes
    from the arch group)."""
    return {
        k: ("???" if f.is_required() else f.get_default(call_default_factory=True))
        for k, f in EvaluateConfig.model_fields.items()
        if k != "arch"
    }


ConfigStore.instance().store(name="evaluate_defaults", node=evaluate_defaults())


def known_keys() -> list[str]:
    """The keys evaluate.py's config takes (for "did you mean …?" on a misspelt one, here and in
    ``run_jobs.py --check``)."""
    return list(EvaluateConfig.model_fields)


def printed_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics evaluate.py prints (metrics.json has them all): ARC pass@K and counts when ARC voting ran, every
    set's exact / token accuracy and mean halting steps, the example count and the time."""
    per_set = [
        k
        for k in metrics
        if k.rsplit(".", 1)[-1] in ("exact_accuracy", "accuracy", "steps") and not k.startswith(("ARC/", "eval/"))
    ]
    keys = (
        [k for k in metrics if k.startswith("ARC/pass@")]
        + ["ARC/num_puzzles", "ARC/num_test_inputs"]
        + sorted(per_set)
        + ["eval/num_examples", "eval/seconds"]
    )
    return {k: metrics[k] for k in keys if k in metrics}


def config_from_hydra(hcfg: Any) -> EvaluateConfig:
    """The composed Hydra config as a validated :class:`EvaluateConfig` (bad input: one-line EvaluateError)."""
    missing = [k for k in ("checkpoint", "data_path") if OmegaConf.is_missing(hcfg, k)]
    if missing:
        raise EvaluateError(
            " and ".join(f"{k}=" for k in missing) + " required (e.g. python evaluate.py "
            "checkpoint=checkpoints/<project>/<run> data_path=data/<built dataset>)"
        )
    raw = OmegaConf.to_container(hcfg, resolve=True)
    raw.pop("hydra", None)
    if isinstance(raw.get("arch"), dict):  # validated first: an error names the dotted arch.<key> (ArchConfigError)
        raw["arch"] = parse_arch_config(raw["arch"])
    try:
        return EvaluateConfig(**raw)
    except pydantic.ValidationError as e:
        problems = "; ".join(validation_problems(e))
        raise EvaluateError(f"config/cfg_evaluate.yaml: {problems}") from None


def check_config(hcfg: Any, overrides: Sequence[str] = ()) -> EvaluateConfig:
    """Everything evaluate.py checks in a composed config before any work (``run_jobs.py --check`` calls it for a
    queued line): the strict EvaluateConfig, and ``arch.*`` task overrides only with original_trm_checkpoint=true."""
    cfg = config_from_hydra(hcfg)
    arch_over = [o for o in overrides if o.lstrip("+~").startswith("arch")]
    if arch_over and not cfg.original_trm_checkpoint:
        raise EvaluateError(
            f"{arch_over}: arch overrides only apply with original_trm_checkpoint=true "
            "(our checkpoints carry their own architecture)"
        )
    return cfg


def _main() -> None:
    config_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")

    @hydra.main(config_path=config_dir, config_name="cfg_evaluate", version_base=None)
    def main(hcfg: DictConfig) -> None:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        with user_errors():  # bad input (a PlatformError): one line, exit 1; anything else keeps its traceback
            metrics = run(check_config(hcfg, list(HydraConfig.get().overrides.task)))
        if metrics:
            print(json.dumps(printed_metrics(metrics), indent=1))

    run_hydra_main(main, known_keys=known_keys)  # "did you mean …?" on a typo


if __name__ == "__main__":
    _main()

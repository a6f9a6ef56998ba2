"""A run's recipe: which encoder group and overrides a run of the table uses (:func:`run_plan`), the training
config it composes to (:func:`resolve_recipe`, validated before any work and recorded in run.json), and what of it
decides what a run learns (:func:`recipe_override`, :func:`_comparable`: a changed recipe is refused in the same
``--out``)."""

from __future__ import annotations

import json
from typing import Optional, Sequence

from core.errors import with_key_hint
from encoders import ENCODER_REGISTRY, EncoderConfigError
from experiments.science.common import CONTROL, ENCODERS, ScienceError
from models import ArchConfigError
from models.compat import normalise_arch
from training.config import CONFIG_DIR, ConfigError, PretrainConfig, known_keys, load_config

_PER_RUN_KEYS = (
    "data_paths",
    "data_paths_test",
    "checkpoint_path",
    "run_name",
    "project_name",
    "resume",
    "checkpoint_every",
    "checkpoint_keep",
    "checkpoint_every_eval",
    "rule_labels",
)


def run_plan(name: str) -> tuple[str, list[str]]:
    """(encoder group, extra Hydra overrides) of one run of the table."""
    if name == CONTROL:
        return "standard", ["encoder.zero_demos=true"]
    if name not in ENCODERS and name not in ENCODER_REGISTRY:  # a variant (e.g. dihedral_views) runs only if named
        variants = ", ".join(n for n in ENCODER_REGISTRY if n not in ENCODERS)
        raise ScienceError(
            f"--encoders: unknown run {name!r} (choose from {', '.join(ENCODERS + (CONTROL,))} or all, "
            f"or another registered encoder: {variants})"
        )
    return name, []


def recipe_record(cfg: PretrainConfig) -> dict:
    """The JSON record of a composed training config (every key, defaults filled in, the arch / encoder / health
    sections too) without the per-run paths and names."""
    rec = cfg.model_dump(mode="json")
    for k in _PER_RUN_KEYS:
        rec.pop(k, None)
    return json.loads(json.dumps(rec))


def recipe_override(o: str) -> bool:
    """Whether a Hydra override can change what a run learns (not a checkpoint-interval key)."""
    return o.split("=", 1)[0].lstrip("+~") not in _PER_RUN_KEYS


def _comparable(spec: Optional[dict]) -> Optional[dict]:
    """A run.json record without the keys that do not change a run (also in records written before they were
    left out), for the refuse-other-settings check."""
    if spec is None:
        return None
    spec = dict(spec, overrides=[o for o in spec.get("overrides", []) if recipe_override(o)])
    if isinstance(spec.get("recipe"), dict):
        spec["recipe"] = {k: v for k, v in spec["recipe"].items() if k not in _PER_RUN_KEYS}
        if isinstance(spec["recipe"].get("arch"), dict):  # a field added since the record was written = its default
            spec["recipe"]["arch"] = normalise_arch(spec["recipe"]["arch"])
    return spec


def resolve_recipe(config: str, name: str, steps: Optional[int], overrides: Sequence[str]) -> dict:
    """The training config a run will use (composed and validated now, so a bad override fails before any
    work), without the per-run paths and names; recorded in run.json so that a changed recipe is noticed."""
    encoder, extra = run_plan(name)
    over = [f"encoder={encoder}"] + ([f"max_steps={steps}"] if steps is not None else []) + extra + list(overrides)
    try:
        # the strict checks pretrain_encoder.py makes (the arch and encoder sections too, pitfall 8), before any work
        cfg = load_config(config, over, config_dir=CONFIG_DIR)
    except (ConfigError, ArchConfigError, EncoderConfigError) as e:
        raise ScienceError(f"config/{config}.yaml with {over}: {e}") from None
    except Exception as e:  # noqa: BLE001 - Hydra's override / composition errors, one line
        said = with_key_hint(str(e).splitlines()[0], known_keys())  # a misspelt key: the closest known one
        raise ScienceError(f"config/{config}.yaml with {over}: {type(e).__name__}: {said}") from None
    return recipe_record(cfg)

"""Evaluator registry. Protocol (docs/architecture.md §5):
``__init__(data_path, metadata, output_dir, **kwargs)``, ``required_outputs``, ``begin_eval()``,
``update(batch, outputs)``, ``result(save_path) -> Optional[dict[str, float]]``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

from core.errors import PlatformError
from core.registry import Registry
from evaluators.arc import ARCEvaluator, EvaluatorError

# name -> Entry(None, evaluator class) (configured by keyword arguments); the published TRM code's spelling
# (``evaluators: [{name: arc@ARC}]``) is an alias of the same evaluator
EVALUATOR_REGISTRY = Registry("evaluator", EvaluatorError, aliases={"arc@ARC": "arc"})
EVALUATOR_REGISTRY.register("arc")(ARCEvaluator)


def _spec_name_kwargs(spec: Any) -> tuple[str, dict]:
    if isinstance(spec, str):
        return spec, {}
    if hasattr(spec, "items"):  # dict or DictConfig
        d = dict(spec.items())
        if "name" not in d:
            raise EvaluatorError(f"evaluator spec {d!r} has no 'name' (choose from {sorted(EVALUATOR_REGISTRY)})")
        name = d.pop("name")
        return str(name), dict(d)
    raise EvaluatorError(f"evaluator spec must be a name or a mapping with 'name', got {spec!r}")


def build_evaluators(
    specs: Iterable[Union[str, Mapping[str, Any]]],
    *,
    data_path: Any,
    metadata: Any = None,
    output_dir: Optional[str] = None,
) -> list:
    """Build evaluators from ``specs`` (``"arc"`` or ``{"name": "arc", **kwargs}``).

    Raises on an unknown name and re-raises constructor errors naming the evaluator (pitfall 14)."""
    out = []
    for spec in specs or []:
        name, kwargs = _spec_name_kwargs(spec)
        cls = EVALUATOR_REGISTRY.entry(name).cls
        try:
            out.append(cls(data_path, metadata, output_dir, **kwargs))
        except (PlatformError, TypeError) as e:  # bad data / kwargs: one line; a bug keeps its traceback
            raise EvaluatorError(f"evaluator {name!r} could not be built: {type(e).__name__}: {e}") from e
    return out


__all__ = ["EVALUATOR_REGISTRY", "ARCEvaluator", "EvaluatorError", "build_evaluators"]

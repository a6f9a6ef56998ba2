"""Model registry: ``arch.name`` -> (strict pydantic config class, ACT model class).

``parse_arch_config`` is the discriminated union over the registered config classes (``name`` picks the class,
unknown or mistyped keys raise :class:`ArchConfigError` naming the dotted key, pitfall 8); it runs once, when
the training config is composed (``training.config.PretrainConfig.arch`` holds the validated model), and reads
a config written by an earlier version through ``models.legacy.upgrade_arch``.

A research variant (``models/variants/``) is one module and one line below; one that left is refused by
``models.legacy.REMOVED``. :func:`hydra_defaults` is every field of an architecture's config class at its default:
the Hydra node ``arch/defaults/<name>`` that ``config/arch/<name>.yaml`` starts from (the one source of defaults).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel
from torch import nn

from core.errors import PlatformError
from core.registry import Registry
from models.act import ACTModel, ArchConfig, LossConfig
from models.hrm import HRM, HRMConfig
from models.legacy import upgrade_arch
from models.losses import ACTLossHead
from models.transformer import TransformerBaseline, TransformerConfig
from models.trm import TRM, TRMConfig
from models.variants.trm_views import GridTRM, TRMGridConfig, TRMLocalConfig, TRMMemoryConfig, TRMViewsConfig


class ArchConfigError(PlatformError, ValueError):
    """Invalid ``arch`` config (unknown name, unknown key, bad value). The message names the field."""


# arch.name -> Entry(config class, ACT model class); a model class takes
# ``(config, *, vocab_size, seq_len, num_puzzle_identifiers, batch_size)``. One line per architecture:
ARCH_REGISTRY = Registry("arch", ArchConfigError)
ARCH_REGISTRY.register("trm", config=TRMConfig)(TRM)
ARCH_REGISTRY.register("hrm", config=HRMConfig)(HRM)
ARCH_REGISTRY.register("transformer", config=TransformerConfig)(TransformerBaseline)
# the grid core (models/variants/trm_views.py): one model, its components switched on by the config class
ARCH_REGISTRY.register("trm_grid", config=TRMGridConfig)(GridTRM)
ARCH_REGISTRY.register("trm_memory", config=TRMMemoryConfig)(GridTRM)
ARCH_REGISTRY.register("trm_local", config=TRMLocalConfig)(GridTRM)
ARCH_REGISTRY.register("trm_views", config=TRMViewsConfig)(GridTRM)


def _to_dict(cfg: Any) -> Dict[str, Any]:
    if isinstance(cfg, BaseModel):
        return cfg.model_dump()
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if not isinstance(cfg, Mapping):
        raise ArchConfigError(f"arch config must be a mapping, got {type(cfg).__name__}")
    return dict(cfg)


def parse_arch_config(arch_cfg: Any) -> ArchConfig:
    """Validate ``arch_cfg`` with the config class of ``arch_cfg['name']``; raise :class:`ArchConfigError`
    (``models.legacy.ArchRemovedError`` for a switch an earlier version had). An already validated config of a
    registered class is returned as it is."""
    if isinstance(arch_cfg, ArchConfig) and type(arch_cfg) in ARCH_REGISTRY.configs():
        return arch_cfg
    return ARCH_REGISTRY.parse(upgrade_arch(_to_dict(arch_cfg)), prefix="arch")


def hydra_defaults(name: str) -> Dict[str, Any]:
    """Every field of arch ``name``'s config class at its default, as plain data (the fields excluded from a dump,
    ``vocab_size`` / ``seq_len``, are not in it)."""
    return ARCH_REGISTRY.entry(name).config(name=name).model_dump(mode="json")


def build_model(
    arch_cfg: Any, *, vocab_size: int, seq_len: int, num_puzzle_identifiers: int, batch_size: int
) -> ACTModel:
    """Build the ACT model named by ``arch_cfg['name']`` (validated strictly). ``batch_size`` is the local
    (per-rank) batch size (the sparse puzzle embedding keeps a local buffer of that many rows)."""
    config = parse_arch_config(arch_cfg)
    model_cls = ARCH_REGISTRY.entry(config.name).cls  # type: ignore[attr-defined]
    return model_cls(
        config,
        vocab_size=vocab_size,
        seq_len=seq_len,
        num_puzzle_identifiers=num_puzzle_identifiers,
        batch_size=batch_size,
    )


def build_loss_head(model: nn.Module, arch_cfg: Any = None, **overrides: Any) -> ACTLossHead:
    """:class:`ACTLossHead` around ``model`` with the ``loss`` section of ``arch_cfg`` (default: the model's own
    config); keyword ``overrides`` (e.g. ``extra_loss_weights={"kl": 1e-3}``) replace fields."""
    if arch_cfg is None:
        loss_cfg = model.config.loss.model_dump()  # type: ignore[union-attr]
    else:
        loss_cfg = parse_arch_config(arch_cfg).loss.model_dump()  # type: ignore[attr-defined]
    loss_cfg.update(overrides)
    loss_cfg = LossConfig(**loss_cfg).model_dump()
    return ACTLossHead(model, **loss_cfg)

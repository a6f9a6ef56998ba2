"""Models: the architectures (TRM, HRM, a transformer baseline) behind one ACT interface, the loss head, the ETRM
wrapper that conditions a TRM core on a demo encoder, and the one inference rollout.

    model = build_model(arch_cfg, vocab_size=12, seq_len=900, num_puzzle_identifiers=N, batch_size=local_b)
    head  = build_loss_head(model, arch_cfg)          # ACTLossHead configured from arch_cfg["loss"]

``arch_cfg`` is a validated :class:`ArchConfig`, a plain dict or an OmegaConf DictConfig; an unknown or mistyped
key raises :class:`ArchConfigError` naming the key (pitfall 8). The registry lives in ``models.registry``; TRM's
research variants (the grid core: ``trm_grid``, ``trm_memory``, ``trm_views``) in ``models/variants/``. Hydra: every
architecture's class defaults are the node ``arch/defaults/<name>`` that ``config/arch/<name>.yaml`` starts from.
"""

from hydra.core.config_store import ConfigStore

from models.act import ACTCarry, ACTModel, ArchConfig, LossConfig
from models.hrm import HRM, HRMConfig
from models.legacy import ArchRemovedError
from models.losses import ACTLossHead
from models.registry import (
    ARCH_REGISTRY,
    ArchConfigError,
    build_loss_head,
    build_model,
    hydra_defaults,
    parse_arch_config,
)
from models.transformer import TransformerBaseline, TransformerConfig
from models.trm import TRM, TRMConfig
from models.variants.trm_views import GridTRM, TRMGridConfig, TRMLocalConfig, TRMMemoryConfig, TRMViewsConfig

for _name in ARCH_REGISTRY:
    ConfigStore.instance().store(group="arch/defaults", name=_name, node=hydra_defaults(_name))

__all__ = [
    "ARCH_REGISTRY",
    "ArchConfig",
    "ArchConfigError",
    "ArchRemovedError",
    "ACTCarry",
    "ACTModel",
    "ACTLossHead",
    "build_model",
    "build_loss_head",
    "hydra_defaults",
    "parse_arch_config",
    "TRM",
    "TRMConfig",
    "GridTRM",
    "TRMGridConfig",
    "TRMMemoryConfig",
    "TRMLocalConfig",
    "TRMViewsConfig",
    "HRM",
    "HRMConfig",
    "TransformerBaseline",
    "TransformerConfig",
    "LossConfig",
]

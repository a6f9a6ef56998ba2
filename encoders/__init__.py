"""Demonstration encoders for ETRM. ``ENCODER_REGISTRY[name] -> (config class, module class)``.

Modules: ``config`` (BaseEncoderConfig, the registry, parse / build, options removed since), ``interface``
(EncoderOutput, DemoEncoder), ``layers`` (attention, block, token packing), ``trunk`` (the per-demo trunk),
``heads`` (aggregation across demos, Gaussian bottleneck, context head), ``probes`` (rule readout, oracle and
zero-demo controls), ``stats`` (context statistics); one module per encoder: standard, variational, lpn, hybrid,
recurrent, and the variant dihedral_views.
"""

from hydra.core.config_store import ConfigStore

from . import dihedral_views, hybrid, lpn, recurrent, standard, variational  # noqa: F401  (registration)
from .config import (
    ENCODER_REGISTRY,
    BaseEncoderConfig,
    EncoderConfigError,
    RemovedOptionError,
    build_encoder,
    count_parameters,
    hydra_defaults,
    parse_encoder_config,
)
from .heads import gaussian_kl
from .interface import DemoEncoder, DemoMemory, EncoderOutput

# Hydra: every encoder's class defaults, the node `encoder/defaults/<name>` that config/encoder/<name>.yaml starts from
for _name in ENCODER_REGISTRY:
    ConfigStore.instance().store(group="encoder/defaults", name=_name, node=hydra_defaults(_name))

__all__ = [
    "ENCODER_REGISTRY",
    "BaseEncoderConfig",
    "DemoEncoder",
    "EncoderConfigError",
    "DemoMemory",
    "EncoderOutput",
    "RemovedOptionError",
    "build_encoder",
    "count_parameters",
    "gaussian_kl",
    "hydra_defaults",
    "parse_encoder_config",
]

"""Demonstration encoders for ETRM. ``ENCODER_REGISTRY[name] -> (config class, module class)``."""
from . import hybrid, lpn, recurrent, standard, variational  # noqa: F401  (registration)
from .base import (ENCODER_REGISTRY, BaseEncoderConfig, DemoEncoder, EncoderConfigError, EncoderOutput, build_encoder,
                   count_parameters, gaussian_kl, parse_encoder_config)

__all__ = ["ENCODER_REGISTRY", "BaseEncoderConfig", "DemoEncoder", "EncoderConfigError", "EncoderOutput",
           "build_encoder", "count_parameters", "gaussian_kl", "parse_encoder_config"]

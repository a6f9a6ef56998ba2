"""Demonstration encoders for ETRM. ``ENCODER_REGISTRY[name] -> (config class, module class)``."""
from .base import (ENCODER_REGISTRY, BaseEncoderConfig, DemoEncoder, EncoderConfigError, EncoderOutput,
                   build_encoder, count_parameters, gaussian_kl)
from . import standard, variational, lpn, hybrid, recurrent  # noqa: F401  (registration)

__all__ = ["ENCODER_REGISTRY", "BaseEncoderConfig", "DemoEncoder", "EncoderConfigError", "EncoderOutput",
           "build_encoder", "count_parameters", "gaussian_kl"]

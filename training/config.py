"""Validated training configuration.

``PretrainConfig`` is the strict (``extra="forbid"``) pydantic form of the Hydra config used by
``pretrain.py`` / ``pretrain_encoder.py``. Field names follow the published TRM commands so that e.g.
``arch=trm data_paths="[data/arc1]" arch.L_cycles=4 lr=1e-4 ema=True +run_name=x`` work unchanged.

The ``arch`` and ``encoder`` sections are typed: each is the validated config model of the class its ``name``
selects in its registry (``models.parse_arch_config`` / ``encoders.parse_encoder_config``, discriminated unions
over ``models.ARCH_REGISTRY`` / ``encoders.ENCODER_REGISTRY``), so an unknown key there fails when the config
is composed (pitfall 8) -- with its dotted name. ``health`` is ``training.health.HealthConfig``.

One source of defaults: every key's default is the field default below. ``config/cfg_pretrain.yaml`` composes
them (Hydra's ConfigStore node ``pretrain_defaults``, registered here from :class:`PretrainConfig`) with an
``arch`` group; the other ``config/cfg_*.yaml`` files are recipes that override some keys.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Optional

import pydantic
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from core.errors import PlatformError, validation_problems
from encoders import ENCODER_REGISTRY, BaseEncoderConfig, parse_encoder_config
from models import ARCH_REGISTRY, ArchConfig, parse_arch_config
from training.health import HealthConfig


class ConfigError(PlatformError, ValueError):
    """Invalid configuration; the message names the dotted key and the offending value."""


class _Strict(BaseModel):
    # allow_inf_nan=False: a float key set to inf / nan (lr=inf) is refused at validation, in one line
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class WandbConfig(_Strict):
    """W&B settings. ``auto``: online when an API key / login exists, otherwise offline."""

    mode: Literal["online", "offline", "disabled", "auto"] = "auto"
    entity: Optional[str] = None
    save_code: bool = True
    dir: Optional[str] = None  # default: the run's checkpoint dir
    # W&B group: null -> the queue line's id= (run_jobs.py sets TRM_JOB_ID), else the run name; the effective group
    # is stored with the run's config (with_wandb_group), so evaluate.py runs of a checkpoint join it (job_type eval)
    group: Optional[str] = None
    tags: list[str] = Field(default_factory=list)  # added to the automatic ones (arch, encoder, dataset)


class EvaluatorSpec(_Strict):
    """One evaluator of ``evaluators.EVALUATOR_REGISTRY``: ``{name: arc, kwargs: {...}}``."""

    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class PretrainConfig(_Strict):
    # --- what to train ---
    arch: SerializeAsAny[ArchConfig]  # the arch group's config class (models.parse_arch_config)
    data_paths: list[str] = Field(default_factory=lambda: ["data/arc1concept-aug-1000"])
    data_paths_test: list[str] = Field(default_factory=list)  # empty -> data_paths
    max_train_groups: Optional[int] = None
    # train only on groups whose puzzle name matches this regex (loader group_pattern; e.g. a curriculum stage)
    train_group_pattern: Optional[str] = None
    max_eval_groups: Optional[int] = None
    translate_augment: Optional[bool] = None  # None -> dataset metadata
    loss_type: Optional[str] = None  # overrides arch.loss.loss_type when set

    # --- schedule ---
    global_batch_size: int = 768
    epochs: int = 100000
    max_steps: Optional[int] = None  # optional cap on optimizer steps; 0: write the initial weights as step_0, stop
    eval_interval: Optional[int] = 10000  # in epochs (TRM semantics); None -> only at the end
    eval_interval_steps: Optional[int] = None  # overrides eval_interval when set
    min_eval_interval: int = 0  # first eval not before this many epochs (TRM)
    eval_at_end: bool = True
    eval_halt_early: bool = False

    # --- optimisation ---
    lr: float = 1e-4
    lr_min_ratio: float = 1.0
    lr_warmup_steps: int = 2000
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1
    puzzle_emb_lr: float = 1e-2
    puzzle_emb_weight_decay: float = 0.1
    grad_clip: Optional[float] = 1.0  # global norm after all-reduce; None/0 = off
    # AdamATan2 implementation (training.optim): auto = fused CUDA kernel if built, else Triton on CUDA, else torch
    optimizer_impl: Literal["auto", "fused", "triton", "torch"] = "auto"
    ema: bool = True
    ema_rate: float = 0.999

    # --- run bookkeeping ---
    seed: int = 0
    project_name: Optional[str] = None  # None -> "<data dir name>-ACT-torch"
    run_name: Optional[str] = None  # None -> "<arch>-<timestamp>-<random>"
    checkpoint_path: Optional[str] = None  # None -> checkpoints/<project_name>/<run_name>
    checkpoint_every: Optional[int] = None  # steps; None -> only at eval points and the end
    checkpoint_every_eval: bool = True  # TRM name: also checkpoint at every eval
    checkpoint_keep: Optional[int] = 3  # newest N step checkpoints kept; None = all
    resume: bool = False
    # resume refuses training data that differs from the checkpoint's (dataset.loader.PuzzleDataset.fingerprint);
    # true = continue on the new data anyway (recorded in summary.json warnings)
    resume_allow_data_change: bool = False
    load_checkpoint: Optional[str] = None  # weights-only init (fine-tuning)
    eval_save_outputs: list[str] = Field(default_factory=list)
    evaluators: list[EvaluatorSpec] = Field(default_factory=lambda: [EvaluatorSpec(name="arc")])

    # --- runtime ---
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: Optional[bool] = None  # None -> True on CUDA, False on CPU; true/false as asked on any device
    num_workers: int = 0
    log_interval: int = 10
    diag_interval: int = 100
    progress: bool = True
    wandb: WandbConfig = Field(default_factory=WandbConfig)

    # --- ETRM (semantics implemented by the encoder side; passed through) ---
    encoder: Optional[SerializeAsAny[BaseEncoderConfig]] = None  # the encoder group's config class
    encoder_cache: bool = False
    encoder_lr: Optional[float] = None  # None -> lr
    max_demos: Optional[int] = None
    load_pretrained_decoder: Optional[str] = None
    freeze_decoder_steps: int = 0
    # ETRM refuses training data whose train/ split holds the test puzzles' demo pairs (a TRM-mode build): that
    # would make held-out scores not few-shot. true = accept it anyway (e.g. to compare with TRM on equal data).
    allow_test_demos_in_train: bool = False
    # the synthetic builder's <prefix>_rules.json: labels of the auxiliary rule readout (encoder.rule_readout > 0;
    # dataset.rule_labels; the option: docs/models.md); training puzzles only, one data path
    rule_labels: Optional[str] = None
    early_stop: bool = False
    health: HealthConfig = Field(default_factory=HealthConfig)

    @pydantic.field_validator("arch", mode="before")
    @classmethod
    def _arch(cls, v: Any) -> ArchConfig:
        if isinstance(v, dict) and "name" not in v:
            raise ValueError("arch.name is missing (e.g. arch=trm)")
        return parse_arch_config(v)

    @pydantic.field_validator("encoder", mode="before")
    @classmethod
    def _encoder(cls, v: Any) -> Optional[BaseEncoderConfig]:
        return None if v is None else parse_encoder_config(v)

    # ------------------------------------------------------------------------------------------------
    @pydantic.field_validator("global_batch_size", "epochs", "log_interval", "diag_interval")
    @classmethod
    def _positive(cls, v: int, info) -> int:
        if v <= 0:
            raise ValueError(f"{info.field_name} must be > 0, got {v}")
        return v

    @pydantic.field_validator("lr", "puzzle_emb_lr")
    @classmethod
    def _non_negative(cls, v: float, info) -> float:
        if v < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v}")
        return v

    @pydantic.field_validator("ema_rate", "lr_min_ratio")
    @classmethod
    def _unit_interval(cls, v: float, info) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{info.field_name} must be in [0, 1], got {v}")
        return v

    @pydantic.field_validator("data_paths")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("data_paths must name at least one dataset directory")
        return v

    @pydantic.model_validator(mode="after")
    def _check_positive_or_null(self) -> "PretrainConfig":
        for k in ("max_steps", "eval_interval", "eval_interval_steps", "checkpoint_every", "checkpoint_keep"):
            v = getattr(self, k)
            if v is not None and (v < 0 if k == "max_steps" else v <= 0):
                raise ValueError(f"{k} must be > 0 or null, got {v}" + (" (or 0)" if k == "max_steps" else ""))
        enc = self.encoder
        what = (
            None
            if enc is None
            else (
                f"encoder.rule_readout={enc.rule_readout}"
                if enc.rule_readout > 0
                else "encoder.oracle_context=true"
                if enc.oracle_context
                else None
            )
        )
        if what and not self.rule_labels:
            raise ValueError(f"{what} needs rule_labels (the synthetic builder's <prefix>_rules.json)")
        if self.rule_labels and not what:
            raise ValueError(
                f"rule_labels={self.rule_labels!r} has no effect without an encoder with "
                "encoder.rule_readout > 0 or encoder.oracle_context=true"
            )
        if enc is not None and enc.oracle_demos and not enc.oracle_context:
            raise ValueError("encoder.oracle_demos=true shows the demos to the oracle control: it needs "
                             "encoder.oracle_context=true")  # fmt: skip
        if self.rule_labels and len(self.data_paths) != 1:
            raise ValueError(f"rule_labels needs exactly one data path, got data_paths={self.data_paths}")
        return self

    # ------------------------------------------------------------------------------------------------
    @property
    def test_paths(self) -> list[str]:
        return list(self.data_paths_test) if self.data_paths_test else list(self.data_paths)


def config_from_dict(raw: dict[str, Any], source: str = "config") -> PretrainConfig:
    """Validate a plain dict (e.g. from YAML) into a PretrainConfig; ConfigError names every bad key. The arch and
    encoder sections are validated first, so their errors (ArchConfigError / EncoderConfigError) name the dotted
    ``arch.*`` / ``encoder.*`` key."""
    raw = {k: v for k, v in dict(raw).items() if k != "hydra"}
    if isinstance(raw.get("arch"), dict) and "name" in raw["arch"]:
        raw["arch"] = parse_arch_config(raw["arch"])
    if raw.get("encoder") is not None:
        raw["encoder"] = parse_encoder_config(raw["encoder"])
    try:
        return PretrainConfig.model_validate(raw)
    except pydantic.ValidationError as e:
        raise ConfigError(f"invalid training config ({source}): " + "; ".join(validation_problems(e))) from None


def config_from_hydra(cfg: Any) -> PretrainConfig:
    """Validate a Hydra/OmegaConf DictConfig (resolved) into a PretrainConfig."""
    raw = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    return config_from_dict(raw, source="hydra config")


def load_config(
    config_name: str = "cfg_pretrain", overrides: Optional[list[str]] = None, config_dir: Optional[str] = None
) -> PretrainConfig:
    """Compose a config from ``config/`` with Hydra overrides (for tests, notebooks and scripts)."""
    if GlobalHydra.instance().is_initialized():  # e.g. called after a @hydra.main app in the same process
        GlobalHydra.instance().clear()
    config_dir = config_dir or CONFIG_DIR
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    return config_from_hydra(cfg)


def with_wandb_group(cfg: PretrainConfig, run_name: str) -> PretrainConfig:
    """``cfg`` with its effective W&B group in ``wandb.group``: the configured one, else the queue line's id
    (``TRM_JOB_ID``, set by run_jobs.py for a line with ``id=``), else ``run_name``. The training loop stores it
    with the config (checkpoints), so an evaluation joins the training run's group whatever its own environment."""
    if cfg.wandb.group:
        return cfg
    group = os.environ.get("TRM_JOB_ID") or run_name
    return cfg.model_copy(update={"wandb": cfg.wandb.model_copy(update={"group": group})})


CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")


def known_keys() -> list[str]:
    """Every dotted key a training config may set: the top-level fields (nested sections expanded), ``arch.*`` of
    every registered architecture and ``encoder.*`` of every registered encoder (for "did you mean" hints)."""

    def walk(prefix: str, cls: type[BaseModel]) -> list[str]:
        out = []
        for name, f in cls.model_fields.items():
            sub = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None
            out += walk(f"{prefix}{name}.", sub) if sub is not None else [f"{prefix}{name}"]
        return out

    keys = [k for k in walk("", PretrainConfig) if k.split(".")[0] not in ("arch", "encoder")]
    keys += sorted({k for c in ARCH_REGISTRY.configs() for k in walk("arch.", c)})
    keys += sorted({k for c in ENCODER_REGISTRY.configs() for k in walk("encoder.", c)})
    return keys


def pretrain_defaults() -> dict[str, Any]:
    """Every key's default (the field defaults of :class:`PretrainConfig`, ``arch`` left to the arch group), as the
    plain dict Hydra composes ``config/cfg_pretrain.yaml`` from."""
    fields = {k: f for k, f in PretrainConfig.model_fields.items() if k != "arch"}
    values = {k: (f.default_factory() if f.default_factory is not None else f.default) for k, f in fields.items()}
    return {
        k: (
            v.model_dump(mode="json")
            if isinstance(v, BaseModel)
            else [x.model_dump(mode="json") if isinstance(x, BaseModel) else x for x in v]
            if isinstance(v, list)
            else v
        )
        for k, v in values.items()
    }


ConfigStore.instance().store(name="pretrain_defaults", node=pretrain_defaults())

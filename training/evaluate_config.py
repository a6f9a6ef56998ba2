"""evaluate.py's validated config, :class:`EvaluateConfig` (its field defaults are the only defaults: evaluate.py
registers them with Hydra as ``evaluate_defaults``), and :class:`EvaluateError`, its one-line input error."""

from __future__ import annotations

from typing import Any, Literal, Optional

import pydantic
from pydantic import SerializeAsAny

from core.errors import PlatformError
from models import ArchConfig, parse_arch_config


class EvaluateError(PlatformError, ValueError):
    """Bad evaluate.py input; the message names the field and value."""


class EvaluateConfig(pydantic.BaseModel):
    """Validated evaluation config (unknown keys raise, pitfall 8). These field defaults are the only defaults:
    config/cfg_evaluate.yaml composes them (Hydra ConfigStore node ``evaluate_defaults``) with an arch group."""

    # allow_inf_nan=False: ttt_lr=inf (or nan) is refused here in one line, not after a whole evaluation
    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    checkpoint: str  # our checkpoint file / run dir, or an original TRM state-dict file
    data_path: str  # built dataset directory (test/; ARC-format data also identifiers.json, test_puzzles.json)
    # the architecture of an original TRM checkpoint (that format stores no config), validated by
    # models.parse_arch_config; only used with original_trm_checkpoint=true (our checkpoints carry their own)
    arch: Optional[SerializeAsAny[ArchConfig]] = None
    use_ema: bool = True  # EMA weights when the checkpoint has them
    original_trm_checkpoint: bool = False
    original_arch_config: Optional[str] = None  # original run's all_config.yaml: its arch is checked against arch
    allow_arch_mismatch: list[str] = []  # structural arch fields whose mismatch is accepted (e.g. [L_cycles])
    num_augmentations: Optional[int] = pydantic.Field(default=None, ge=1)  # first N augmented copies (None = all)
    # seeded subset of original puzzles (None = all), seeded by the checkpoint's training seed: the groups of that
    # run's max_eval_groups
    max_groups: Optional[int] = pydantic.Field(default=None, ge=1)
    halt_early: bool = False  # stop a batch when every sample halted by its Q head
    # ARC voting (pass@K over the augmented copies): None = when the data is ARC-format (its kind); false =
    # per-copy exact / token accuracy and halting steps only (e.g. probe data whose puzzle ids are rule ids)
    arc_voting: Optional[bool] = None
    # ETRM with an LPN-style encoder: gradient steps on the latent per query at test time (0 = off,
    # None = the checkpoint's encoder.search_steps). See docs/models.md.
    latent_search_steps: Optional[int] = pydantic.Field(default=None, ge=0)
    latent_search_lr: Optional[float] = pydantic.Field(default=None, gt=0)
    # test-time training on each test puzzle's own demonstration pairs before it is predicted (models/ttt.py,
    # evaluators/ttt.py): gradient steps (0 = off), their learning rate, what is fitted (context: an offset on ETRM's
    # encoder output; embedding: a free context / TRM: a fresh puzzle embedding from the trained mean; all: every
    # weight, one copy per puzzle copy, restored afterwards; gather: only the core's learned gather forms, at ttt_lr,
    # one copy per puzzle copy as all, the context not fitted), and the augmented copies of each puzzle that are
    # fitted and voted (None: every copy the data has; K: the original + K, like num_augmentations=K+1).
    # ttt_pool (ttt_params=all or gather): one fit per puzzle on the demos of all its augmented copies in the batch
    # (each copy keeps its own context / embedding), instead of one fit per copy
    ttt_steps: int = pydantic.Field(default=0, ge=0)
    ttt_lr: float = pydantic.Field(default=1e-2, gt=0)
    ttt_weight_lr: float = pydantic.Field(default=1e-4, gt=0)  # ttt_params=all: the learning rate of the weights
    ttt_params: Literal["context", "embedding", "all", "gather"] = "context"
    ttt_augment: Optional[int] = pydantic.Field(default=None, ge=0)
    ttt_pool: bool = False
    batch_size: Optional[int] = pydantic.Field(default=None, ge=1)  # global; None = the checkpoint's (original: 256)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    autocast: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | none | bf16 | fp16
    compile: bool = False  # torch.compile the model (CUDA)
    num_workers: int = pydantic.Field(default=0, ge=0)
    output_dir: Optional[str] = None  # None = <checkpoint dir>/evaluate/<checkpoint name>
    pass_ks: list[int] = [1, 2, 5, 10, 100, 1000]
    strict_decode: bool = True  # False = the published max-area crop decoder
    rank_malformed: bool = False
    num_pictures: int = pydantic.Field(default=8, ge=0)
    submission_k: int = pydantic.Field(default=10, ge=1)
    progress: bool = True
    seed: int = 0
    # W&B run of the evaluation (metrics, prediction table, pictures): None = the training run's project (none for
    # an original TRM checkpoint: no W&B run)
    wandb_project: Optional[str] = None
    wandb_run_name: Optional[str] = None
    # auto: WANDB_MODE, else the training run's wandb.mode (offline / disabled as it was), else online with an API
    # key / login and offline without (as training)
    wandb_mode: str = "auto"
    # an encoder.oracle_context run (the science control whose context is the true rule): the synthetic builder's
    # rules.json, whose labels of the evaluated puzzles (each augmented copy's conjugate) become the context
    rule_labels: Optional[str] = None

    @pydantic.field_validator("arch", mode="before")
    @classmethod
    def _arch(cls, v: Any) -> Optional[ArchConfig]:
        return None if v is None else parse_arch_config(v)

"""Encoder configuration: :class:`BaseEncoderConfig` (the fields every encoder shares), the registry
(``encoder=<name>``), :func:`parse_encoder_config` / :func:`build_encoder`, and each registered encoder's Hydra
defaults (so that ``config/encoder/<name>.yaml`` holds only what differs from its class).

A new encoder (or variant) is one module: a config subclass and a module class registered by one line,
``@ENCODER_REGISTRY.register("<name>", config=<Config>)`` (encoders/dihedral_views.py is an example), plus its
two-line option file ``config/encoder/<name>.yaml``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import pydantic
from omegaconf import DictConfig, OmegaConf
from torch import nn

from core.errors import PlatformError
from core.registry import Registry

from .probes import ProbeConfig


class EncoderConfigError(PlatformError, ValueError):
    """Bad encoder configuration; the message names the encoder and the field."""


class RemovedOptionError(PlatformError):
    """A config or checkpoint uses an encoder option that was removed (:data:`REMOVED`). Not a ValueError on
    purpose: raised while pydantic validates a stored training config (a checkpoint being loaded), it passes
    through unwrapped, so the entry point reports it as one line."""


class BaseEncoderConfig(ProbeConfig):
    """Fields shared by every encoder (and the science probes / controls of :class:`encoders.probes.ProbeConfig`).
    Unknown keys raise (pitfall 8)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str
    hidden_size: int = 512  # encoder width (independent of the decoder hidden size)
    num_layers: int = 2  # per-demo transformer layers
    num_heads: int = 8
    expansion: float = 4.0  # SwiGLU expansion
    norm_eps: float = 1e-5
    # cross-demo aggregation: learned queries attend over the per-demo embeddings ("cross_attention"), a masked
    # mean of them ("mean"), or learned queries attend over every non-PAD token of every valid demo ("tokens":
    # no per-demo pooling, so which cell changed to what stays visible to the queries). The encoders whose recipe
    # is "tokens" (standard, variational, recurrent) set that as their own default: on the recolour check, held-out
    # 0.92 with "tokens" against 0.55 with pooled demos at 2000 steps (50842d3,
    # docs/record/2026-11-23-recolour-ablations.md).
    aggregation: Literal["cross_attention", "mean", "tokens"] = "cross_attention"
    # how a demo pair becomes tokens: "sequence" = input canvas then output canvas (2*S tokens, segment embedding);
    # "aligned" = one token per canvas cell, input-colour embedding + output-colour embedding (S tokens, a cell's
    # change is visible locally)
    pair_layout: Literal["sequence", "aligned"] = "aligned"
    num_queries: Optional[int] = None  # None = puzzle_emb_len (one query per context token)
    # optional learned scale / gate on the context (pitfall 10): "none" | "scalar" (one learned scale)
    # | "gate" (per context token sigmoid gate) | "norm" (each context token RMS-normalised to the scale of a token
    # embedding, times context_scale_init: the context cannot outgrow the decoder's own inputs)
    context_scale: Literal["none", "scalar", "gate", "norm"] = "none"
    context_scale_init: float = 1.0
    # crop the all-PAD tail of the demo canvases before encoding (exact: masked tokens have no effect)
    crop_padding: bool = True
    # run the per-demo blocks on the non-PAD tokens only (exact, like crop_padding, but per demo): projections,
    # norms and SwiGLU see each real token once, attention runs per bucket of demos of similar length
    # (TokenPacking). False = every demo padded to the batch's (cropped) canvas length, the reference path.
    pack_tokens: bool = True
    # add learned embeddings of each cell's offsets from the edges of the input grid and of the output grid
    # (core.ops.grid_coordinates; square canvases): where a cell sits in each grid, so a token can tell where
    # cells moved and not only which colour became which (with the core's offsets: the 8 families went from 0.019 to
    # 0.10 held-out at 2000 steps; 1fd0952, docs/record/2026-11-25-grid-relative-positions.md)
    grid_coords: bool = False
    # pointer RoPE in the per-demo self-attention (core.ops.apply_pointer_rope; square canvases): each query of each
    # head is rotated to the cell it points at -- a learned linear map of its offsets from the *input* grid's edges,
    # starting at the identity -- and each key sits at its offset from the input grid's top-left corner, so a head
    # can compare an output cell with the input cell a flip / rotation / shift sends to it (docs/models.md).
    # null = off.
    pointer: Optional[Literal["identity"]] = None
    # recompute each per-demo block in the backward pass (saves activation memory on full 30x30 ARC demos)
    activation_checkpointing: bool = False

    @pydantic.model_validator(mode="after")
    def _check(self):
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"encoder {self.name}: hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        if self.pointer is not None and (
            (self.hidden_size // self.num_heads) % 4 or self.hidden_size // self.num_heads < 8
        ):
            raise ValueError(
                f"encoder {self.name}: pointer={self.pointer} needs a head dimension (hidden_size / "
                f"num_heads) divisible by 4 and at least 8, got {self.hidden_size // self.num_heads}"
            )
        if self.num_layers < 0:
            raise ValueError(f"encoder {self.name}: num_layers must be >= 0, got {self.num_layers}")
        return self


# name -> Entry(config class, module class); filled by @ENCODER_REGISTRY.register(name, config=...) in the encoder
# modules (each encoder is one module and one registry line)
ENCODER_REGISTRY = Registry("encoder", EncoderConfigError)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def parse_encoder_config(cfg: "dict | BaseEncoderConfig") -> BaseEncoderConfig:
    """The validated config of ``cfg["name"]``'s encoder (strict: an unknown or unused key raises
    :class:`EncoderConfigError` naming it and listing the valid keys): the discriminated union over the registry,
    keyed by ``name``. An already validated config of a registered class is returned as it is. A config written
    before an option was removed or moved (every checkpoint stores every field) is read by
    :func:`upgrade_encoder_config`: kept options load, removed ones are refused in one line."""
    if isinstance(cfg, BaseEncoderConfig) and type(cfg) in ENCODER_REGISTRY.configs():
        return cfg
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, pydantic.BaseModel):
        cfg = cfg.model_dump()
    return ENCODER_REGISTRY.parse(upgrade_encoder_config(dict(cfg)), prefix="encoder")


def build_encoder(
    cfg: "dict | BaseEncoderConfig",
    *,
    hidden_size: int,
    vocab_size: int,
    seq_len: int,
    puzzle_emb_len: int,
    verbose: bool = True,
) -> nn.Module:
    """Build an encoder (a :class:`encoders.interface.DemoEncoder`) from its config (``cfg["name"]`` = registry
    key; a dict is validated). Unknown keys raise."""
    config = parse_encoder_config(cfg)
    name = config.name
    module_cls = ENCODER_REGISTRY.entry(name).cls
    if puzzle_emb_len <= 0:
        raise EncoderConfigError(
            f"encoder {name!r}: puzzle_emb_len must be > 0 (the context replaces the "
            f"puzzle-embedding prefix), got {puzzle_emb_len}"
        )
    enc = module_cls(
        config, hidden_size=hidden_size, vocab_size=vocab_size, seq_len=seq_len, puzzle_emb_len=puzzle_emb_len
    )
    if verbose:
        print(
            f"[encoder] {name}: {count_parameters(enc):,} trainable parameters "
            f"(width {config.hidden_size}, {config.num_layers} layers, context {puzzle_emb_len}x{hidden_size})"
        )
    return enc


def hydra_defaults(name: str) -> dict[str, Any]:
    """Every field of encoder ``name``'s config class at its default, as plain data: the Hydra node
    ``encoder/defaults/<name>`` that ``config/encoder/<name>.yaml`` starts from (the one source of defaults); the
    probe / control fields last (``--cfg job`` lists the encoder's own fields first)."""
    values = ENCODER_REGISTRY.entry(name).config(name=name).model_dump(mode="json")
    probes = [k for k in values if k in ProbeConfig.model_fields]
    return {**{k: v for k, v in values.items() if k not in probes}, **{k: values[k] for k in probes}}


# ----------------------------------------------------------------------------------------------------------------
# Options removed or moved. Every checkpoint stores every field of its encoder config, so a config written before
# a change still names them: at their old default they are dropped, a moved option is translated, and a removed
# one is refused in one line that names why (the measurement, its commit and its record file under docs/record/)
# and the last commit that has it.
# ----------------------------------------------------------------------------------------------------------------
LAST_COMMIT_WITH_REMOVED = "0b65cd7"  # context_codes, pointer=dihedral, dihedral_views as a field
REMOVED = {  # key -> why (the measurement, its commit and its record file)
    "context_codes": "measured negative: map probe at 1500 steps: context_codes=32 train exact 0.017 / fresh pass@1 "
    "0.00, with the rule readout 0.04 / 0.02, against 0.17 / 0.11 for context_scale=norm with the "
    "readout (fb9c5ed, docs/record/2026-11-25-context-size-steps-halting.md)",
    "pointer=dihedral": "measured negative: flip_rotate alone 0.00 held-out and fit as without it, and slower (717 s "
    "against 641 s); encoder readout probe 0.56 / 0.88 against 0.85 / 0.98 without it (3000 "
    "steps, seeds 0 / 1; 5695a84, docs/record/2026-11-25-pointer-rope.md)",
}


def upgrade_encoder_config(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (an encoder config mapping) in today's form: ``context_codes: 0`` and ``dihedral_views: false`` (the
    old defaults) are dropped, ``name: standard`` with ``dihedral_views: true`` becomes ``name: dihedral_views``
    (the variant, encoders/dihedral_views.py; the same parameters), and a removed option in use raises
    :class:`RemovedOptionError`."""
    raw = dict(raw)
    codes = raw.pop("context_codes", 0)
    if codes not in (0, None):
        _removed(f"encoder.context_codes={codes} was removed ({REMOVED['context_codes']})")
    if raw.get("pointer") == "dihedral":
        _removed(f"encoder.pointer=dihedral was removed ({REMOVED['pointer=dihedral']})")
    if "dihedral_views" in raw:
        views, name = _on(raw.pop("dihedral_views")), raw.get("name")
        if views and name == "standard":
            raw["name"] = "dihedral_views"
        elif views and name != "dihedral_views":
            _removed(
                f"encoder.dihedral_views=true with encoder={name} is no longer available (dihedral views are the "
                f"encoder dihedral_views: the standard encoder with them)"
            )
        elif not views and name == "dihedral_views":
            raise EncoderConfigError(
                "encoder.dihedral_views=false contradicts encoder=dihedral_views (choose "
                "encoder=standard for no dihedral views)"
            )
    return raw


def _on(value: Any) -> bool:
    return value in (True, 1, "true", "True")


def _removed(what: str) -> None:
    raise RemovedOptionError(f"{what}; a config or checkpoint that uses it needs commit {LAST_COMMIT_WITH_REMOVED}")

"""Compatibility: original TRM checkpoints, and architecture-config checks for every load (pitfall 10).

Original TRM checkpoint layout
------------------------------
The published TRM code saves ``torch.save(train_state.model.state_dict(), path)`` where the model is
``ACTLossHead(TinyRecursiveReasoningModel_ACTV1)``, usually wrapped by ``torch.compile`` (which adds an
``_orig_mod.`` prefix). Keys (``<P>`` = ``_orig_mod.`` or empty, ``i`` = layer index)::

    <P>model.inner.embed_tokens.embedding_weight                 [vocab, hidden]
    <P>model.inner.lm_head.weight                                [vocab, hidden]
    <P>model.inner.q_head.weight / .bias                         [2, hidden] / [2]
    <P>model.inner.puzzle_emb.weights                            [num_puzzle_identifiers, puzzle_emb_ndim]  (buffer)
    <P>model.inner.embed_pos.embedding_weight                    [seq + P, hidden]        (pos_encodings=learned)
    <P>model.inner.H_init / .L_init                              [hidden]                 (buffers, often bf16)
    <P>model.inner.L_level.layers.i.self_attn.qkv_proj.weight    [3 * hidden, hidden]
    <P>model.inner.L_level.layers.i.self_attn.o_proj.weight      [hidden, hidden]
    <P>model.inner.L_level.layers.i.mlp_t.gate_up_proj.weight    (mlp_t only, instead of self_attn)
    <P>model.inner.L_level.layers.i.mlp_t.down_proj.weight
    <P>model.inner.L_level.layers.i.mlp.gate_up_proj.weight      [2 * inter, hidden]
    <P>model.inner.L_level.layers.i.mlp.down_proj.weight         [hidden, inter]

Our :class:`models.trm.TRM` uses the same module names under ``inner.``, so loading is: strip every
``_orig_mod.`` and the leading ``model.``, check names and shapes, cast dtypes, copy. The checkpoint does
not contain the recursion depth (H_cycles, L_cycles), so pass the run's config (its ``all_config.yaml``
``arch`` section) as ``original_arch`` to have it checked too.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterable, Mapping, Optional, Union

import torch
from torch import nn

from core.errors import PlatformError
from models.registry import ARCH_REGISTRY, _to_dict, parse_arch_config

# Every field of the architecture's config class is compared (structural: a mismatch is refused unless allowed), but
# these: run-time choices, never compared (dtype, exploration, eval-halting, the loss; vocab_size / seq_len are
# statements about the data, checked against it) ...
RUNTIME_FIELDS = frozenset(
    {"forward_dtype", "halt_exploration_prob", "halt_early_in_eval", "loss", "vocab_size", "seq_len"}
)
# ... and behavioural ones, which change the computation but not the meaning of the weights: a mismatch only warns.
BEHAVIOURAL_FIELDS = frozenset({"halt_max_steps", "no_ACT_continue"})


def compared_fields(cfg: Mapping[str, Any]) -> list:
    """The fields :func:`check_arch_compat` compares for a config of this name: every field of its config class (of
    every registered class for an unknown name, e.g. a removed one) minus :data:`RUNTIME_FIELDS`."""
    configs = ARCH_REGISTRY.configs()
    if cfg.get("name") in ARCH_REGISTRY:
        configs = [ARCH_REGISTRY.entry(cfg["name"]).config]
    fields = dict.fromkeys(f for c in configs for f in c.model_fields)
    return [f for f in fields if f not in RUNTIME_FIELDS]


class ArchMismatchError(PlatformError, ValueError):
    """A stored architecture config disagrees with the model's on a structural field."""


def _as_dict(cfg: Any) -> Dict[str, Any]:
    return _to_dict(cfg)


def normalise_arch(cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """Fill defaults through the registered config class when possible (so a missing key = its default: a config
    written before a field existed reads as that field at its default; one written before its variant had a
    module reads as that variant, models.legacy)."""
    d = dict(cfg)
    try:
        return parse_arch_config(d).model_dump(mode="json")
    except PlatformError:  # an unknown name or key, a removed switch: compare what is there
        return d


def check_arch_compat(stored: Any, current: Any, *, allow: Iterable[str] = (), context: str = "checkpoint") -> None:
    """Refuse a load whose stored architecture config differs from the current one on a structural field: any field
    of the config class (:func:`compared_fields`: a variant's own fields too, e.g. ``memory_read``) but the run-time
    and behavioural ones.

    Raises :class:`ArchMismatchError` naming every differing field with both values (e.g.
    ``L_cycles: checkpoint has 4, model has 6``) unless the field is in ``allow``; behavioural differences
    (halt_max_steps, no_ACT_continue) and allowed ones are reported with ``warnings.warn``.
    """
    s, c = normalise_arch(_as_dict(stored)), normalise_arch(_as_dict(current))
    allow = set(allow)
    refused, warned = [], []
    for key in dict.fromkeys(compared_fields(s) + compared_fields(c)):
        if key not in s and key not in c:
            continue
        sv, cv = s.get(key, "<missing>"), c.get(key, "<missing>")
        if sv == cv or cv is None:  # None: a size the model fills at build time (memory_width from the encoder)
            continue
        line = f"{key}: {context} has {sv!r}, model has {cv!r}"
        if key not in BEHAVIOURAL_FIELDS and key not in allow:
            refused.append(line)
        else:
            warned.append(line)
    if warned:
        warnings.warn(f"architecture differs from the {context} (allowed): " + "; ".join(warned), stacklevel=2)
    if refused:
        raise ArchMismatchError(
            f"architecture of the {context} does not match the model: "
            + "; ".join(refused)
            + " (pass allow=[...] to override deliberately)"
        )


def original_arch_to_ours(arch: Mapping[str, Any]) -> Dict[str, Any]:
    """Translate the ``arch`` section of an original TRM ``all_config.yaml`` into our ``trm`` config dict."""
    arch = dict(arch)
    out: Dict[str, Any] = {"name": "trm"}
    keys = (
        "hidden_size",
        "num_heads",
        "expansion",
        "L_layers",
        "H_layers",
        "H_cycles",
        "L_cycles",
        "puzzle_emb_ndim",
        "puzzle_emb_len",
        "pos_encodings",
        "mlp_t",
        "rope_theta",
        "rms_norm_eps",
        "halt_max_steps",
        "halt_exploration_prob",
        "no_ACT_continue",
        "forward_dtype",
    )
    for k in keys:
        if k in arch:
            out[k] = arch[k]
    loss = arch.get("loss")
    if isinstance(loss, Mapping) and "loss_type" in loss:
        out["loss"] = {"loss_type": loss["loss_type"]}
    return out


def normalise_original_keys(state_dict: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Strip ``_orig_mod.`` (anywhere) and the loss head's leading ``model.``: result keys start with ``inner.``."""
    out = {}
    for key, value in state_dict.items():
        k = key.replace("_orig_mod.", "")
        if k.startswith("model."):
            k = k[len("model.") :]
        out[k] = value
    return out


def _target_model(model: nn.Module) -> nn.Module:
    inner_owner = model
    if not hasattr(inner_owner, "inner") and hasattr(inner_owner, "model"):  # an ACTLossHead
        inner_owner = inner_owner.model
    if not hasattr(inner_owner, "inner"):
        raise TypeError(f"expected an ACT model (with .inner) or a loss head around one, got {type(model).__name__}")
    return inner_owner


def load_original_trm_checkpoint(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike, Mapping[str, torch.Tensor]],
    *,
    original_arch: Optional[Mapping[str, Any]] = None,
    allow: Iterable[str] = (),
    strict: bool = True,
) -> Dict[str, list]:
    """Load a state dict written by the original TRM code into our TRM (or a loss head around it).

    ``checkpoint``: a path to the ``torch.save`` file or the state dict itself. ``original_arch``: the ``arch``
    section of the run's ``all_config.yaml``; when given, it is checked with :func:`check_arch_compat` against
    the model's config (L_cycles 4 vs 6 is refused unless ``allow=["L_cycles"]``). Shape mismatches always
    raise (naming key and both shapes); with ``strict`` missing or unexpected keys raise too.
    Returns ``{"loaded": [...], "missing": [...], "unexpected": [...]}``.
    """
    target = _target_model(model)
    if original_arch is not None:
        check_arch_compat(
            original_arch_to_ours(_as_dict(original_arch)),
            target.config,
            allow=allow,
            context="original TRM checkpoint",
        )
    if isinstance(checkpoint, (str, os.PathLike)):
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    else:
        state = checkpoint
    src = normalise_original_keys(state)
    own = target.state_dict()
    missing = [k for k in own if k not in src]
    unexpected = [k for k in src if k not in own]
    bad_shapes = [
        f"{k}: checkpoint {tuple(src[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in src and tuple(src[k].shape) != tuple(own[k].shape)
    ]
    if bad_shapes:
        raise ArchMismatchError("original TRM checkpoint does not fit the model: " + "; ".join(bad_shapes))
    if strict and (missing or unexpected):
        raise ArchMismatchError(
            f"original TRM checkpoint keys do not match the model: missing {missing}, unexpected {unexpected}"
        )
    with torch.no_grad():
        for k, v in src.items():
            if k in own:
                own[k].copy_(v.to(own[k].dtype))
    return {"loaded": [k for k in own if k in src], "missing": missing, "unexpected": unexpected}

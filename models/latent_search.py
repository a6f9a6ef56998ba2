"""Test-time latent search for the ``lpn`` encoder (an evaluation option, Latent-Program-Network style).

Starting from the encoder's mean latent ``z0`` of a puzzle's demos, a shared offset ``delta`` is optimised by
gradient steps so that the decoder, conditioned on the context of the latent, reproduces each demo's output
from its input. Leave-one-out (default): demo ``j`` is predicted from ``z_loo_j + delta`` where ``z_loo_j`` is
the mean latent of the OTHER demos (never from a latent that has seen demo j); the query is then predicted
from ``z0 + delta``. Without leave-one-out every demo uses ``z0 + delta``. The decoder weights are not changed.

Enable it at evaluation: ``encoder.search_steps=N`` (and ``encoder.search_lr``) in the run config, or set
``model.latent_search_steps = N`` on a loaded ETRM before ``evaluators.inference.evaluate``; it runs only in
eval mode, once per query (when the ACT slot is (re)filled), and works under ``torch.inference_mode``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from dataset.tokens import PAD_ID
from models.act import ACTModel
from models.rollout import halt_max_steps, rollout

IGNORE = -100


def _decoder_logits(model, inputs: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """Decode ``inputs`` [n, S] with the ETRM core and a fixed prefix ``context`` through the one ACT rollout
    (models.rollout: each sample's logits frozen at its halting step, ``halt_max_steps`` in plain evaluation);
    returns logits [n, S, V] with gradient into ``context`` through the step that produced them."""
    n = inputs.shape[0]
    data = {"inputs": inputs, "puzzle_identifiers": torch.zeros(n, dtype=torch.int32, device=inputs.device)}
    carry = ACTModel.refill(model, ACTModel.initial_carry(model, data), data)
    r = rollout(lambda c: ACTModel.step(model, c, prefix_context=context), carry,
                max_steps=max(1, halt_max_steps(model)), keep=("logits",), detach=False)
    return r.outputs["logits"]


def latent_search_context(model, demo_inputs: torch.Tensor, demo_labels: torch.Tensor, demo_mask: torch.Tensor, *,
                          steps: int, lr: float = 0.1, leave_one_out: bool = True,
                          rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Context [b, L, hidden] for each sample after ``steps`` Adam steps of latent search (see module doc).
    ``model`` is an ETRM whose encoder is ``lpn``. ``rows`` (bool [b]) restricts the search to those samples
    (others get the plain encoder context)."""
    enc = model.encoder
    if not hasattr(enc, "encode_latent"):
        raise TypeError(f"latent search needs the lpn encoder, got {type(enc).__name__}")
    with torch.inference_mode(False), torch.enable_grad():
        di, dl, dm = demo_inputs.clone(), demo_labels.clone(), demo_mask.clone().bool()
        params = [p for p in model.parameters()]
        flags = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad_(False)
        try:
            with torch.no_grad():
                pairs_valid = dm & ((di != PAD_ID) | (dl != PAD_ID)).any(-1)
                z0, _ = enc.encode_latent(di, dl, dm)  # [b, Z] (mean in eval)
                ctx0 = enc.context_from_latent(z0)
                if steps <= 0:
                    return ctx0
                b, D, S = di.shape
                # per-demo latents for leave-one-out: encode each demo alone
                z_each, _ = enc.encode_latent(di.reshape(b * D, 1, S), dl.reshape(b * D, 1, S),
                                              pairs_valid.reshape(b * D, 1))
                z_each = z_each.view(b, D, -1)
                cnt = pairs_valid.sum(-1, keepdim=True).float()  # [b, 1]
                tot = (z_each * pairs_valid.unsqueeze(-1)).sum(1)  # [b, Z]
                if leave_one_out:
                    denom = (cnt - 1).clamp_min(1).unsqueeze(-1)
                    z_start = (tot.unsqueeze(1) - z_each) / denom  # [b, D, Z]
                    z_start = torch.where((cnt > 1).unsqueeze(-1), z_start, z0.unsqueeze(1).expand_as(z_start))
                else:
                    z_start = z0.unsqueeze(1).expand(b, D, -1)
                sel = pairs_valid if rows is None else pairs_valid & rows.view(-1, 1)
                flat = sel.flatten().nonzero().squeeze(-1)
                labels = dl.reshape(b * D, S).long().index_select(0, flat)
                labels = torch.where(labels == PAD_ID, torch.full_like(labels, IGNORE), labels)
                inputs = di.reshape(b * D, S).index_select(0, flat)
                owner = torch.arange(b, device=di.device).repeat_interleave(D).index_select(0, flat)
                z_start = z_start.reshape(b * D, -1).index_select(0, flat)
            if flat.numel() == 0:
                return ctx0
            delta = torch.zeros_like(z0, requires_grad=True)
            opt = torch.optim.Adam([delta], lr=lr)
            for _ in range(steps):
                ctx = enc.context_from_latent(z_start + delta.index_select(0, owner))
                logits = _decoder_logits(model, inputs, ctx)
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                       ignore_index=IGNORE, reduction="sum") / max(1, labels.shape[0])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            with torch.no_grad():
                ctx = enc.context_from_latent(z0 + delta)
                if rows is not None:
                    ctx = torch.where(rows.view(-1, 1, 1), ctx, ctx0)
                return ctx.detach()
        finally:
            for p, f in zip(params, flags):
                p.requires_grad_(f)

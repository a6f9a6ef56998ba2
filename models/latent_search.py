"""Test-time latent search for the ``lpn`` encoder (an evaluation option, Latent-Program-Network style): the
``context`` case of test-time training (``models.ttt``) in the encoder's latent space, run inside the ETRM forward.

Starting from the encoder's mean latent ``z0`` of a puzzle's demos, a per-sample offset ``delta`` is fitted by
gradient steps so that the decoder, conditioned on the context of the latent, reproduces each demo's output from
its input. Leave-one-out (default): demo ``j`` is predicted from ``z_loo_j + delta`` where ``z_loo_j`` is the
latent of the OTHER demos (never from a latent that has seen demo j); a core that reads the demo memory
(``reads_memory``) decodes demo j with the memory of the same other demos. The query is then predicted from
``z0 + delta``. The decoder weights are not changed.

Enable it at evaluation: ``encoder.search_steps=N`` (and ``encoder.search_lr``) in the run config, or set
``model.latent_search_steps = N`` on a loaded ETRM before ``evaluators.inference.evaluate``; it runs only in
eval mode, once per query (when the ACT slot is (re)filled), and works under ``torch.inference_mode``.
``evaluate.py ttt_steps=N ttt_params=context`` runs the same fit from outside the model, for every encoder.
"""

from __future__ import annotations

from typing import Optional

import torch

from models.ttt import demo_set, fit, frozen_weights, loo_demos


def latent_search_context(
    model,
    demo_inputs: torch.Tensor,
    demo_labels: torch.Tensor,
    demo_mask: torch.Tensor,
    *,
    steps: int,
    lr: float = 0.1,
    leave_one_out: bool = True,
    rows: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Context [b, L, hidden] for each sample after ``steps`` Adam steps of latent search (see module doc).
    ``model`` is an ETRM whose encoder is ``lpn``. ``rows`` (bool [b]) restricts the search to those samples
    (others get the plain encoder context)."""
    enc = model.encoder
    if not enc.capabilities.latent_search:
        raise TypeError(f"latent search needs the lpn encoder, got {type(enc).__name__}")
    with torch.inference_mode(False), torch.enable_grad(), frozen_weights(model):
        batch = {
            "demo_inputs": demo_inputs.clone(),
            "demo_labels": demo_labels.clone(),
            "demo_mask": demo_mask.clone().bool(),
        }
        with torch.no_grad():
            z0, _ = enc.encode_latent(batch["demo_inputs"], batch["demo_labels"], batch["demo_mask"])
            ctx0 = enc.context_from_latent(z0)
        demos = demo_set(batch, rows)
        if steps <= 0 or demos.n == 0:
            return ctx0
        visible = loo_demos(batch, demos, leave_one_out)  # each pair's latent start and, for a memory core, memory
        with torch.no_grad():
            z_start, _ = enc.encode_latent(*visible)
        res = fit(
            model,
            demos,
            torch.zeros_like(z0),
            lambda th: enc.context_from_latent(z_start + th.index_select(0, demos.owner)),
            steps=steps,
            lr=lr,
            visible=visible,
        )
        with torch.no_grad():
            ctx = enc.context_from_latent(z0 + res.theta)
            if rows is not None:
                ctx = torch.where(rows.view(-1, 1, 1), ctx, ctx0)
            return ctx.detach()

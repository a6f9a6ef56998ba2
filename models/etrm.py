"""ETRM: the TRM core whose puzzle-embedding prefix is replaced by a neural encoding of the demo pairs.

``ETRM(core, encoder)`` (an :class:`models.act.ACTModel`; built from a training config by
``training.build.build_etrm_model``): the ACT wrapper of the core's config and inner model (submodule ``inner``, so
parameter names match TRM checkpoints; its ACT step is every architecture's, :meth:`models.act.ACTModel.step`)
plus ``encoder`` (so the encoder's parameters are named ``encoder.*`` for the loop's optimizer groups and gradient
norms). What the encoder does beyond giving a context (a recurrent state, a KL, per-cell memory, latent search, the
rule probes) is read from its declared ``encoder.capabilities`` (encoders.interface.EncoderCapabilities); whether
the core reads the demo memory from ``core.reads_memory`` (models.act.IOStem.reads_memory).

One ACT step (``forward(carry, batch)``)::

    carry = refill(carry, batch)               # halted slots take new data; z_E reset to its init for them
    enc   = encoder(carry.current_data demos)  # every step by default (encoder gets gradient every step)
    carry', outputs = step(carry, prefix_context=enc.context)
    outputs["kl"] = enc.kl (per sample, unweighted); outputs["encoder_context"] = context

In eval mode a non-recurrent encoder's context depends only on the slot's demos (posterior mean, no dropout), so
it is computed when a slot is (re)filled and reused (with its KL) at the slot's later steps: the encoder runs once
per refill instead of ``halt_max_steps`` times per evaluation batch. Training always re-encodes.

``encoder_cache=True`` (ablation, pitfall 2): the context computed at a slot's first step is stored detached
and reused for its later steps, so the encoder gets gradient only from the first step of each sample.
The recurrent encoder's z_E is stored detached in the carry but the fresh z_E that produces this step's
context is never detached (pitfall 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from core.nn import compile_boundary
from encoders import DemoEncoder, DemoMemory, EncoderOutput
from encoders.stats import context_statistics
from models.act import ACTCarry, ACTModel
from models.latent_search import latent_search_context

DEMO_KEYS = ("demo_inputs", "demo_labels", "demo_mask")
# outputs the loop should request (loss head ``return_keys``) for :meth:`ETRM.diagnostics`
DIAGNOSTIC_KEYS = ("encoder_context", "encoder_sample_mask", "kl")


@dataclass
class ETRMCarry(ACTCarry):
    """ACT carry plus the encoder's state: ``z_E`` (recurrent encoder, detached) and ``cached_context``
    (``encoder_cache=True``, detached). With the recurrent encoder the carry is (z_E, z_H, z_L)."""

    z_E: Optional[torch.Tensor] = None
    cached_context: Optional[torch.Tensor] = None
    cached_kl: Optional[torch.Tensor] = None  # eval only: the per-sample KL that goes with cached_context

    @classmethod
    def extend(cls, base: ACTCarry, **encoder_state) -> "ETRMCarry":
        """The ACT fields of ``base`` (an :class:`ACTCarry`, not an ETRMCarry) plus the given encoder fields."""
        return cls(**vars(base), **encoder_state)


class ETRM(ACTModel):
    DIAGNOSTIC_KEYS = DIAGNOSTIC_KEYS  # the outputs diagnostics() reads (the loop asks the loss head for them)

    def __init__(self, core: ACTModel, encoder: DemoEncoder, *, encoder_cache: bool = False) -> None:
        super().__init__(core.config, core.inner)  # the core's parts: its config and inner model (and ACT step)
        if core.puzzle_emb is not None:
            raise ValueError("ETRM core must be built with puzzle_emb_ndim=0 (the encoder provides the prefix)")
        if core.puzzle_emb_len <= 0:
            raise ValueError("ETRM core needs puzzle_emb_len > 0 prefix positions for the encoder context")
        caps = encoder.capabilities
        if encoder_cache and caps.recurrent:
            raise ValueError(
                "encoder_cache=true is incompatible with the recurrent encoder (it refines z_E every ACT step)"
            )
        self.encoder = encoder
        self.encoder_cache = bool(encoder_cache)
        self.halt_early_in_eval = core.halt_early_in_eval
        # a core that reads the demos cell by cell (arch=trm_memory) gets the encoder's DemoMemory every step
        if self.reads_memory and not caps.gives_memory:
            cfg = encoder.cfg
            raise ValueError(
                f"arch={core.config.name} reads the demos' per-cell states, but encoder {cfg.name} (aggregation="
                f"{cfg.aggregation}, pair_layout={cfg.pair_layout}) does not give them: use pair_layout=aligned (one "
                f"token per demo cell)"
            )
        self._last_diag: Optional[tuple] = None
        # lpn test-time latent search at evaluation (0 = off; evaluate.py may set both); see models/latent_search.py
        self.latent_search_steps = caps.search_steps
        self.latent_search_lr = caps.search_lr

    # -- properties --------------------------------------------------------------------------------
    @property
    def kl_weight(self) -> float:
        return self.encoder.capabilities.kl_weight

    @property
    def rule_readout_weight(self) -> float:
        return self.encoder.capabilities.rule_readout

    @property
    def extra_loss_weights(self) -> Dict[str, float]:
        """Per-sample extra loss terms in ``outputs`` and their weights (the loss head adds w * outputs[k])."""
        # the oracle control is told the rule: its encoder does not run, so there is no KL term
        gives_kl = self.kl_weight > 0 and not self.encoder.capabilities.rule_oracle
        w = {"kl": self.kl_weight} if gives_kl else {}
        if self.rule_readout_weight > 0:
            w["rule_readout"] = self.rule_readout_weight
        w.update(self.aux_loss_weights)  # the core's own terms (trm_views' gather_fit)
        return w

    @property
    def extra_metric_keys(self) -> Tuple[str, ...]:
        """Per-sample outputs the loss head logs (summed) without adding them to the loss."""
        return ("rule_exact",) if self.rule_readout_weight > 0 else ()

    # -- carry ---------------------------------------------------------------------------------------
    def initial_carry(self, batch: Dict[str, torch.Tensor]) -> ETRMCarry:
        missing = [k for k in DEMO_KEYS if k not in batch]
        if missing:
            raise KeyError(
                f"ETRM needs encoder-mode batches; missing keys {missing} (build the dataset with demos and "
                f"load it with encoder_mode=True)"
            )
        base = super().initial_carry(batch)
        b, device = batch["inputs"].shape[0], batch["inputs"].device
        z_E = None
        if self.encoder.capabilities.recurrent:
            z_E = torch.zeros_like(self.encoder.initial_state(b, device).detach())
        cached = None
        if self.encoder_cache:
            p = next(self.inner.parameters())
            cached = torch.zeros(b, self.puzzle_emb_len, self.hidden_size, device=device, dtype=p.dtype)
        return ETRMCarry.extend(base, z_E=z_E, cached_context=cached)

    def refill(self, carry: ETRMCarry, batch: Dict[str, torch.Tensor]) -> ETRMCarry:
        base = super().refill(carry, batch)
        return ETRMCarry.extend(base, z_E=carry.z_E, cached_context=carry.cached_context, cached_kl=carry.cached_kl)

    def _reuses_eval_context(self) -> bool:
        """Eval with a non-recurrent encoder: the context of a slot depends only on its demos (posterior mean, no
        dropout), so it is computed when the slot is (re)filled and reused at its later ACT steps."""
        return (
            not self.training
            and not self.encoder.training
            and not self.encoder.capabilities.recurrent
            and not self.reads_memory  # the per-cell memory is not cached: the encoder runs at every step
        )

    # -- encoding -----------------------------------------------------------------------------------
    def encode(self, carry: ETRMCarry):
        """Context for the (refilled) carry's current data. Returns (EncoderOutput, context)."""
        data = carry.current_data
        for k in DEMO_KEYS:
            if k not in data:
                raise KeyError(f"ETRM batch is missing {k!r}; the dataset must be loaded with encoder_mode=True")
        if (
            self._reuses_eval_context() and carry.cached_context is not None and not bool(carry.halted.any())
        ):  # eval, no slot refilled: same demos, same context
            return EncoderOutput(context=carry.cached_context, kl=carry.cached_kl), carry.cached_context
        state = None
        if self.encoder.capabilities.recurrent:
            b = data["inputs"].shape[0]
            init = self.encoder.initial_state(b, data["inputs"].device)  # carries gradient to z_init
            prev = carry.z_E if carry.z_E is not None else torch.zeros_like(init)
            state = torch.where(carry.halted.view(-1, 1, 1), init, prev.to(init.dtype))
        if self.encoder.capabilities.rule_oracle:  # science control: the true rule, told
            return self._oracle_context(data)
        out = self.encoder(data["demo_inputs"], data["demo_labels"], data["demo_mask"], state=state)
        if self.reads_memory and out.memory is None:  # an encoder that pools before aggregating: one more trunk pass
            out.memory = self._demo_memory(data)
        ctx = out.context
        if not self.training and self.latent_search_steps > 0:
            return out, self._search_context(carry, ctx)
        if self.encoder_cache:
            prev = carry.cached_context if carry.cached_context is not None else torch.zeros_like(ctx)
            # fresh (with gradient) only for slots that were just (re)filled; stored detached for the rest
            ctx = torch.where(carry.halted.view(-1, 1, 1), ctx, prev.to(ctx.dtype))
        return out, ctx

    @compile_boundary
    def _stash_diag(self, ctx: torch.Tensor, mask: torch.Tensor) -> None:
        self._last_diag = (ctx, mask)

    def _search_context(self, carry: ETRMCarry, ctx: torch.Tensor) -> torch.Tensor:
        """Eval only: latent search once per query (when its slot is refilled), reused for its later steps."""
        data = carry.current_data
        fresh = carry.halted
        prev = carry.cached_context if carry.cached_context is not None else ctx
        if bool(fresh.any()):
            found = latent_search_context(
                self,
                data["demo_inputs"],
                data["demo_labels"],
                data["demo_mask"],
                steps=self.latent_search_steps,
                lr=self.latent_search_lr,
                rows=fresh,
            )
            prev = torch.where(fresh.view(-1, 1, 1), found.to(ctx.dtype), prev.to(ctx.dtype))
        return prev

    def forward(
        self, carry: ETRMCarry, batch: Dict[str, torch.Tensor], prefix_context: Optional[torch.Tensor] = None
    ) -> Tuple[ETRMCarry, Dict[str, torch.Tensor]]:
        if prefix_context is not None and self.training:
            raise ValueError(
                "ETRM computes its own prefix_context from the demos in training; a given one (a "
                "test-time-trained context, models.ttt) applies in evaluation only"
            )
        if not isinstance(carry, ETRMCarry):
            raise TypeError("ETRM.forward needs the carry from ETRM.initial_carry")
        carry = self.refill(carry, batch)
        if prefix_context is not None:  # evaluation with a test-time-trained context for these rows
            kl = prefix_context.new_zeros(prefix_context.shape[0], dtype=torch.float32) if self.kl_weight > 0 else None
            data = carry.current_data
            memory = self._demo_memory(data) if self.reads_memory else None
            enc, ctx = EncoderOutput(context=prefix_context, kl=kl, memory=memory), prefix_context
        else:
            enc, ctx = self.encode(carry)
        new, outputs = self.step(carry, prefix_context=ctx, memory=enc.memory if self.reads_memory else None)
        outputs["encoder_context"] = ctx
        outputs["encoder_sample_mask"] = carry.current_data["demo_mask"].any(-1)
        # fallback for diagnostics() when the loss head does not return these outputs (runs eagerly)
        self._stash_diag(ctx.detach(), outputs["encoder_sample_mask"])
        if self.rule_readout_weight > 0:
            outputs["rule_readout"], outputs["rule_exact"] = self._rule_readout(ctx, carry.current_data)
        if enc.kl is not None:
            # with encoder_cache the KL belongs to the first step only (the later steps reuse that encoding)
            outputs["kl"] = (
                torch.where(carry.halted, enc.kl, torch.zeros_like(enc.kl)) if self.encoder_cache else enc.kl
            )
        reuse = self._reuses_eval_context()
        new_carry = ETRMCarry.extend(
            new,
            z_E=None if enc.state is None else enc.state.detach(),
            cached_context=ctx.detach() if (self.encoder_cache or reuse) else None,
            cached_kl=enc.kl.detach() if (enc.kl is not None and reuse) else None,
        )
        return new_carry, outputs

    def _demo_memory(self, data: Dict[str, torch.Tensor]) -> DemoMemory:
        """The per-cell states of the batch's demos (``DemoEncoder.demo_memory``)."""
        return self.encoder.demo_memory(data["demo_inputs"], data["demo_labels"], data["demo_mask"])

    def _oracle_context(self, data: Dict[str, torch.Tensor]):
        """``encoder.oracle_context``: the embedding of the sample's rule labels (zeros without labels, e.g. in
        evaluation); the encoder gives no context. A core that reads the demo memory gets an empty one (told, not
        shown), or with ``encoder.oracle_demos`` the demos' memory as a read run gets it (told and shown)."""
        targets = data.get("rule_targets")
        b, p = data["inputs"].shape[0], next(self.inner.parameters())
        ctx = (
            p.new_zeros(b, self.puzzle_emb_len, self.hidden_size)
            if targets is None
            else self.encoder.rule_oracle(targets).to(p.dtype)
        )
        memory = None
        if self.reads_memory and self.encoder.cfg.oracle_demos:  # told and shown
            memory = self._demo_memory(data)
        elif self.reads_memory:  # told, not shown
            memory = DemoMemory.empty(b, self.encoder.cfg.hidden_size, p.device, p.dtype)
        return EncoderOutput(context=ctx, memory=memory), ctx

    def _rule_readout(self, ctx: torch.Tensor, data: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """The auxiliary rule-readout loss and exactness per sample (encoders.probes.RuleReadout); zero for batches
        without ``rule_targets`` (evaluation: the labels exist for training puzzles only)."""
        targets = data.get("rule_targets")
        if targets is None:
            zero = ctx.new_zeros(ctx.shape[0], dtype=torch.float32)
            return zero, zero
        return self.encoder.rule_head(ctx, targets)

    # -- diagnostics (outside the compiled forward; pitfall 18) --------------------------------------
    @torch.no_grad()
    def diagnostics(self, outputs: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """Encoder-health statistics of the last step's context (docs/metrics.md), measured at the scale the
        decoder sees it: ``context * sqrt(hidden)`` (the decoder's input-embedding scale, token embeddings have
        std ~1 there), over the samples that have at least one demo."""
        ctx, mask = outputs.get("encoder_context"), outputs.get("encoder_sample_mask")
        if ctx is None and self._last_diag is not None:
            ctx, mask = self._last_diag
        if ctx is None:
            return {}
        if mask is not None and int(mask.sum()) == 0:
            mask = None
        stats = context_statistics(ctx.float() * self.inner.embed_scale, mask)
        gain = self.encoder.context_gain()
        if gain is not None:
            stats["train/encoder_context_scale"] = gain
        return stats

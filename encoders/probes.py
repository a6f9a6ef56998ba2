"""The science instruments any encoder can carry, off by default: a probe loss and two controls
(docs/models.md; what they measured: fe3d729, docs/record/2026-11-25-rule-readout-dihedral-views.md). They are not
part of a demo encoder: an encoder's own code never reads them except :class:`ProbeConfig`'s ``zero_demos``, which
the trunk applies to its input.

* ``rule_readout: W`` -- the auxiliary rule readout (:class:`RuleReadout`): a linear head on the context names the
  rule of every training sample; ``models.etrm.ETRM`` adds ``W`` times its loss (needs the training config's
  ``rule_labels``).
* ``oracle_context: true`` -- the control at the upper end (:class:`RuleOracle`): the context is a learned
  embedding of the sample's true rule labels; ETRM does not run the encoder (needs ``rule_labels``).
  With ``oracle_demos: true`` the core also reads the demo memory (told and shown).
* ``zero_demos: true`` -- the control at the lower end: every demo is replaced by zeros (all PAD), so the encoder
  sees no demonstration.

The heads are built by :func:`attach_probes` (``DemoEncoder.__init__``) outside the encoder's random stream, so an
encoder initialises the same with or without them (runs with and without a probe compare).
"""

from __future__ import annotations

import math

import pydantic
import torch
import torch.nn.functional as F
from torch import nn

from core.nn import trunc_normal_init_
from dataset.rule_labels import RULE_SLOTS


class ProbeConfig(pydantic.BaseModel):
    """The probe / control fields of every encoder config (``encoder.rule_readout``, ``encoder.oracle_context``,
    ``encoder.zero_demos``). Unknown keys raise (pitfall 8)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    # auxiliary rule readout (docs/models.md): weight of a loss that asks a linear head on the context to name the
    # rule (dataset.rule_labels.RULE_SLOTS) of each training sample; needs the training config's rule_labels (the
    # synthetic builder's rules.json). 0 = off (no head). A diagnostic, not a lever: on the 8 families at 2000 steps
    # held-out 0.06 with it against 0.10 without (fe3d729, docs/record/2026-11-25-rule-readout-dihedral-views.md).
    rule_readout: float = pydantic.Field(default=0.0, ge=0.0)
    # science control, the upper bound: the context is a learned embedding of the sample's true rule labels
    # (RULE_SLOTS, from rule_labels; training batches only, zeros where there are none, e.g. evaluation). Measures
    # whether the core can apply a rule it is told through the ETRM path (told flip_rotate's rule, token accuracy
    # 0.64 at step 1500, 0.87 at 3000: 2c67f3c, docs/record/2026-11-25-rule-readout-dihedral-views.md)
    oracle_context: bool = False
    # with oracle_context: the core also reads the demos as a read run does (the per-cell demo memory, and through it
    # the counted form), so the probe is told the rule *and* shown its demos; only the context is the rule labels'.
    # Without it the oracle core gets an empty memory (told, not shown)
    oracle_demos: bool = False
    # science control, the lower bound: replace every demo by zeros (all PAD) -> the encoder sees no demonstration
    zero_demos: bool = False


def attach_probes(encoder: nn.Module, cfg: ProbeConfig, puzzle_emb_len: int, hidden_size: int) -> None:
    """Set ``encoder.rule_head`` (:class:`RuleReadout` or None) and ``encoder.rule_oracle`` (:class:`RuleOracle`
    or None), drawn from a forked random stream: the rest of the encoder initialises as it would without them."""
    encoder.rule_head = encoder.rule_oracle = None
    with torch.random.fork_rng(devices=[]):
        if cfg.rule_readout > 0:
            encoder.rule_head = RuleReadout(puzzle_emb_len * hidden_size)
        if cfg.oracle_context:
            encoder.rule_oracle = RuleOracle(puzzle_emb_len, hidden_size)


class RuleReadout(nn.Module):
    """Auxiliary rule readout: a linear head on the flattened context that names the rule of the sample in every
    slot of :data:`dataset.rule_labels.RULE_SLOTS` (family, dihedral map, shift, colours, ...). Its loss is
    the mean cross-entropy over the sample's labelled slots (targets -100 elsewhere), computed in fp32; it
    reaches the encoder only, through the context the core also reads."""

    def __init__(self, d_in: int):
        super().__init__()
        self.sizes = list(RULE_SLOTS.values())
        self.proj = nn.Linear(d_in, sum(self.sizes))

    def forward(self, context: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context [b, P, D], targets int [b, len(RULE_SLOTS)] -> (per-sample loss [b], per-sample exact [b]:
        every labelled slot named right; False for a sample without labels)."""
        if targets.shape != (context.shape[0], len(self.sizes)):
            raise ValueError(f"rule targets {tuple(targets.shape)} must be [batch, {len(self.sizes)}]")
        valid = targets >= 0
        losses, right = [], []
        for j, lg in enumerate(self.slot_logits(context)):
            t = targets[:, j]
            losses.append(F.cross_entropy(lg, t.clamp_min(0), reduction="none") * valid[:, j])
            right.append((lg.argmax(-1) == t) | ~valid[:, j])
        labelled = valid.sum(-1)
        loss = torch.stack(losses, -1).sum(-1) / labelled.clamp_min(1)
        exact = torch.stack(right, -1).all(-1) & (labelled > 0)
        return loss, exact.detach().float()

    def slot_logits(self, context: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per slot, the fp32 logits [b, classes] of contexts [b, P, D] (fp32 under bf16 autocast too)."""
        with torch.autocast(context.device.type, enabled=False):
            logits = F.linear(context.flatten(1).float(), self.proj.weight.float(), self.proj.bias.float())
        return torch.split(logits, self.sizes, dim=-1)

    def predict(self, context: torch.Tensor) -> torch.Tensor:
        """The class the head names in every slot: long [b, len(RULE_SLOTS)]."""
        return torch.stack([lg.argmax(-1) for lg in self.slot_logits(context)], -1)


class RuleOracle(nn.Module):
    """``encoder.oracle_context``: the context of a sample is the sum of learned embeddings of its rule labels
    (one table row per class of every :data:`dataset.rule_labels.RULE_SLOTS` slot; unlabelled slots add
    nothing), [b, P, hidden], at the scale of a token embedding (the core multiplies by sqrt(hidden))."""

    def __init__(self, puzzle_emb_len: int, hidden_size: int):
        super().__init__()
        sizes = list(RULE_SLOTS.values())
        self.register_buffer("offsets", torch.tensor([0] + sizes[:-1]).cumsum(0), persistent=False)
        self.shape = (puzzle_emb_len, hidden_size)
        self.table = nn.Parameter(
            trunc_normal_init_(
                torch.empty(sum(sizes), puzzle_emb_len * hidden_size), 1.0 / math.sqrt(hidden_size), std_of="normal"
            )
        )

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        valid = (targets >= 0).unsqueeze(-1)
        rows = self.table[(targets.clamp_min(0) + self.offsets).long()]  # [b, slots, P * hidden]
        return (rows * valid).sum(1).view(targets.shape[0], *self.shape)

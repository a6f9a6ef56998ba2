"""Test-time training (TTT): fit a model to each test puzzle's own demonstration pairs, then predict its test
inputs. The one implementation of gradient steps at test time (the ``lpn`` encoder's latent search is its
``context`` case in the encoder's latent space).

What is fitted (``params``):

* ``context`` (ETRM): a per-sample offset ``delta`` added to what the encoder gives. Leave-one-out (default): demo
  ``j`` is predicted from the encoding of the OTHER demos plus ``delta``, so the fit never sees the answer it is
  scored on; the test input is then predicted from the encoding of all demos plus ``delta``. For an encoder with a
  latent (``encode_latent`` / ``context_from_latent``: lpn) the offset lives in that latent.
* ``embedding``: a free per-sample prefix, the context itself. TRM: a puzzle never seen in training gets a fresh
  embedding initialised from the mean of the trained ones (rows that training moved off TRM's zero init), fitted
  on its demos: the honest few-shot protocol for a puzzle-embedding model. ETRM: starts from the encoder's context.
* ``all`` (done by :class:`WeightsSnapshot` + :func:`fit`): every weight of the model as well (ETRM: encoder and
  core; TRM: the core and a fresh embedding), one copy of the model per fitted group, restored afterwards.
* ``gather``: only the core's learned gather forms (``arch.grid_gather``: each form's bilinear map and null logit,
  :data:`GATHER_PARAMS`), per fitted group as ``all`` and restored afterwards; the context and every other weight
  stay as trained. The fit can then only change *which cell each output cell reads*: a map, not a memory of the
  demos' answers.

Everything here works on a batch of samples at once: per-sample tensors are fitted side by side, and each sample's
loss is normalised by its own number of demos, so a batch gives what fitting each sample alone gives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch
import torch.nn.functional as F

from dataset.tokens import IGNORE_LABEL_ID, PAD_ID
from models.act import ACTModel
from models.rollout import halt_max_steps, rollout

TTTParams = Literal["context", "embedding", "all", "gather"]
GATHER_PARAMS = ("gather.forms", "gather.null")  # ``gather``: the parameters whose names end so are fitted
WEIGHT_FITS = ("all", "gather")  # the ``params`` that fit model weights: one fit per puzzle copy, restored after
DEMO_KEYS = ("demo_inputs", "demo_labels", "demo_mask")


@dataclass(frozen=True)
class TTTSettings:
    steps: int = 0  # gradient steps per fitted group (0 = off)
    lr: float = 1e-2  # of the fitted per-sample tensor (context offset / embedding)
    weight_lr: float = 1e-4  # ``all``: of the model's weights
    params: TTTParams = "context"
    leave_one_out: bool = True  # ETRM: demo j predicted from the other demos' encoding
    pool: bool = False  # ``all`` / ``gather``: one fit per puzzle over the demos of all its copies (not one per copy)

    def __post_init__(self) -> None:
        if self.pool and not self.fits_weights:
            raise ValueError(
                f"pooling the augmented copies (ttt_pool) fits shared weights, so it needs ttt_params=all or gather; "
                f"with ttt_params={self.params} each copy's own tensor is fitted alone"
            )

    @property
    def fits_weights(self) -> bool:
        """Whether model weights are fitted (one copy per fitted group, restored after it): ``all``, ``gather``."""
        return self.params in WEIGHT_FITS


@dataclass
class DemoSet:
    """The valid demonstration pairs of a batch, flattened: ``n`` pairs, each owned by one sample (row)."""

    inputs: torch.Tensor  # [n, S]
    labels: torch.Tensor  # [n, S] (padding -> IGNORE_LABEL_ID)
    owner: torch.Tensor  # [n] the sample (row of the batch) whose demo it is
    slot: torch.Tensor  # [n] its demo slot j
    per_row: torch.Tensor  # [b] number of demos of each sample (float)

    @property
    def n(self) -> int:
        return int(self.inputs.shape[0])


@dataclass
class FitResult:
    theta: torch.Tensor  # the fitted per-sample tensor [b, ...] (detached)
    fit_before: torch.Tensor  # [b] fraction of each sample's demos predicted exactly before the first step
    fit_after: torch.Tensor  # [b] ... after the last step
    steps: int
    seconds: float


def demo_set(batch: dict, rows: Optional[torch.Tensor] = None) -> DemoSet:
    """The valid demo pairs of ``batch`` (an encoder-mode batch: ``demo_inputs`` [b, D, S], ``demo_labels``,
    ``demo_mask`` [b, D]); ``rows`` (bool [b]) keeps those samples' demos only. Tensors are cloned, so they can
    take part in autograd even when the batch was made under ``torch.inference_mode``."""
    missing = [k for k in DEMO_KEYS if k not in batch]
    if missing:
        raise KeyError(
            f"test-time training needs the demonstration pairs in the batch; missing {missing} (load the "
            f"evaluation data with encoder_mode=True)"
        )
    di, dl, dm = (batch[k].clone() for k in DEMO_KEYS)
    b, D, S = di.shape
    valid = dm.bool() & ((di != PAD_ID) | (dl != PAD_ID)).any(-1)
    if rows is not None:
        valid = valid & rows.view(-1, 1)
    flat = valid.flatten().nonzero().squeeze(-1)
    labels = dl.reshape(b * D, S).long().index_select(0, flat)
    return DemoSet(
        inputs=di.reshape(b * D, S).index_select(0, flat),
        labels=torch.where(labels == PAD_ID, torch.full_like(labels, IGNORE_LABEL_ID), labels),
        owner=torch.arange(b, device=di.device).repeat_interleave(D).index_select(0, flat),
        slot=torch.arange(D, device=di.device).repeat(b).index_select(0, flat),
        per_row=valid.sum(-1).float(),
    )


def loo_demos(batch: dict, demos: DemoSet, leave_one_out: bool) -> tuple[torch.Tensor, ...]:
    """Per demo pair, its sample's demos as the encoder's input: [n, D, S] inputs / labels and [n, D] mask, with the
    pair's own slot masked out when ``leave_one_out``."""
    di, dl, dm = (batch[k].clone().index_select(0, demos.owner) for k in DEMO_KEYS)
    mask = dm.bool()
    if leave_one_out:
        mask = mask & ~F.one_hot(demos.slot, mask.shape[1]).bool()
    return di, dl, mask


def decode_logits(
    model: ACTModel, inputs: torch.Tensor, prefix: torch.Tensor, demos: Optional[tuple] = None, memory=None
) -> torch.Tensor:
    """Logits [n, S, V] of ``inputs`` decoded with the prefix context ``prefix`` [n, P, H] through the one ACT
    rollout (``halt_max_steps`` steps, each sample's logits frozen at its halting step), with gradient. A core
    that reads the demo memory (``reads_memory``, arch=trm_memory) also gets the memory of ``demos`` (the
    (inputs, labels, mask) each row may see: :func:`loo_demos`): ``memory`` when given (encoded once, weights
    frozen), else encoded here (an ``all`` fit's encoder weights act on it)."""
    n = inputs.shape[0]
    data = {"inputs": inputs, "puzzle_identifiers": torch.zeros(n, dtype=torch.int32, device=inputs.device)}
    if model.reads_memory:
        if demos is None:
            raise ValueError("decode_logits: a core that reads the demo memory needs the demos each row may see")
        data.update(zip(DEMO_KEYS, demos))
        memory = model.encoder.demo_memory(*demos) if memory is None else memory
    carry = ACTModel.refill(model, ACTModel.initial_carry(model, data), data)
    r = rollout(
        lambda c: model.step(c, prefix_context=prefix, memory=memory),
        carry,
        max_steps=max(1, halt_max_steps(model)),
        keep=("logits",),
        detach=False,
    )
    return r.outputs["logits"]


def demo_loss(logits: torch.Tensor, demos: DemoSet) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, exact [n]): each pair's mean token cross-entropy, each sample's pairs averaged (a sample's loss does
    not depend on what else is in the batch), summed over samples; exact = every labelled token right."""
    labels = demos.labels
    tok = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE_LABEL_ID, reduction="none")
    counted = labels != IGNORE_LABEL_ID
    per_pair = tok.sum(-1) / counted.sum(-1).clamp_min(1)
    loss = (per_pair / demos.per_row.index_select(0, demos.owner).clamp_min(1)).sum()
    exact = ((logits.argmax(-1) == labels) | ~counted).all(-1)
    return loss, exact


def per_row_fraction(values: torch.Tensor, demos: DemoSet, b: int) -> torch.Tensor:
    tot = torch.zeros(b, device=values.device).index_add_(0, demos.owner, values.float())
    return torch.where(demos.per_row > 0, tot / demos.per_row.clamp_min(1), torch.full_like(tot, float("nan")))


def fit(
    model: ACTModel,
    demos: DemoSet,
    theta0: torch.Tensor,
    prefix_of: Callable[[torch.Tensor], torch.Tensor],
    *,
    steps: int,
    lr: float,
    extra_params: tuple = (),
    extra_lr: Optional[float] = None,
    visible: Optional[tuple] = None,
    encoder_fixed: bool = False,
) -> FitResult:
    """Adam on ``theta`` (per-sample, [b, ...], starting at ``theta0``) and ``extra_params`` (``all``: the model's
    weights, at ``extra_lr``) so that ``decode_logits(model, demos.inputs, prefix_of(theta))`` reproduces the demo
    labels. ``prefix_of`` maps theta to the [n, P, H] prefix of every demo pair; ``visible``: the demos each pair
    may see (:func:`loo_demos`; a core that reads the demo memory needs them); ``encoder_fixed``: no fitted weight
    is the encoder's (``gather``), so the memory is encoded once, as when only ``theta`` is fitted. Runs with
    gradients enabled even inside ``torch.inference_mode``; theta is fp32 whatever the autocast dtype, and autocast's
    cache of cast weights is cleared after every update (it would otherwise serve the weights of the first step to
    every later one)."""
    t0 = time.perf_counter()
    b = theta0.shape[0]
    with torch.inference_mode(False), torch.enable_grad():
        theta = theta0.detach().float().clone().requires_grad_(True)
        groups = [{"params": [theta]}]
        if extra_params:
            groups.append({"params": list(extra_params), "lr": lr if extra_lr is None else extra_lr})
        opt = torch.optim.Adam(groups, lr=lr)
        before = after = torch.full((b,), float("nan"), device=theta0.device)
        memory = None  # a memory core's memory of the visible demos: constant unless the encoder is fitted too
        if visible is not None and (encoder_fixed or not extra_params) and model.reads_memory and demos.n:
            with torch.no_grad():
                memory = model.encoder.demo_memory(*visible)
        for i in range(steps + 1):
            if demos.n == 0:
                break
            logits = decode_logits(model, demos.inputs, prefix_of(theta), visible, memory)
            loss, exact = demo_loss(logits, demos)
            if i == 0:
                before = per_row_fraction(exact.detach(), demos, b)
            after = per_row_fraction(exact.detach(), demos, b)
            if i == steps:
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.clear_autocast_cache()
    return FitResult(
        theta=theta.detach(), fit_before=before, fit_after=after, steps=steps, seconds=time.perf_counter() - t0
    )


class WeightsSnapshot:
    """The model's trainable weights, copied so that ``restore()`` puts them back exactly (``all``: nothing learned
    on one puzzle reaches another); ``only``: the parameters whose names end with one of these (``gather``), an
    error when the model has none."""

    def __init__(self, model: torch.nn.Module, only: Optional[tuple[str, ...]] = None):
        named = list(model.named_parameters())
        if only is not None:
            named = [(n, p) for n, p in named if n.endswith(only)]
            if not named:
                raise ValueError(
                    f"this model has no parameter named *{' or *'.join(only)}: ttt_params=gather fits the core's "
                    f"learned gather (arch.grid_gather=true, e.g. arch=trm_gather)"
                )
        self.params = [p for _, p in named]
        self.saved = [p.detach().clone() for p in self.params]
        self.flags = [p.requires_grad for p in self.params]

    def trainable(self) -> list[torch.nn.Parameter]:
        for p in self.params:
            p.requires_grad_(True)
        return self.params

    def restore(self) -> None:
        with torch.no_grad():
            for p, s, f in zip(self.params, self.saved, self.flags):
                p.copy_(s)
                p.requires_grad_(f)
                p.grad = None
        torch.clear_autocast_cache()  # no cast copy of the fitted weights survives


class frozen_weights:
    """Context manager: no gradient into the model's weights (``context`` / ``embedding``)."""

    def __init__(self, model: torch.nn.Module):
        self.params = [p for p in model.parameters()]

    def __enter__(self):
        self.flags = [p.requires_grad for p in self.params]
        for p in self.params:
            p.requires_grad_(False)
        return self

    def __exit__(self, *exc) -> None:
        for p, f in zip(self.params, self.flags):
            p.requires_grad_(f)


def embedding_init(model: ACTModel, ids: torch.Tensor) -> torch.Tensor:
    """TRM: the starting prefix [b, P, H] of each sample: its puzzle's embedding when training moved it off the zero
    init, else (a puzzle never seen in training) the mean of the trained rows; laid out as the model lays the
    embedding out (padded to P * H)."""
    w = model.puzzle_emb.weights.detach().float()
    trained = w.abs().sum(-1) > 0
    mean = w[trained].mean(0) if bool(trained.any()) else w.new_zeros(w.shape[-1])
    rows = w.index_select(0, ids.clone().long())
    rows = torch.where(trained.index_select(0, ids.clone().long()).view(-1, 1), rows, mean)
    P, H = model.puzzle_emb_len, model.hidden_size
    return F.pad(rows, (0, P * H - rows.shape[-1])).view(-1, P, H)


__all__ = [
    "TTTSettings",
    "DemoSet",
    "FitResult",
    "demo_set",
    "loo_demos",
    "decode_logits",
    "demo_loss",
    "fit",
    "WeightsSnapshot",
    "GATHER_PARAMS",
    "WEIGHT_FITS",
    "frozen_weights",
    "embedding_init",
]

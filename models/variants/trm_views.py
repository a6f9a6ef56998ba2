"""The grid core: TRM whose cells know their grid, read the demos cell by cell, and hold the test input's grid views.

One model class (:class:`GridTRM`), three arch names, each a config that switches components on
(:mod:`models.variants.views_parts`):

================  ===================================================================================================
``trm_grid``      every canvas cell's token embedding is averaged with learned embeddings of its offsets from the top,
                  bottom, left and right edge of its input grid: ``(token + grid) / sqrt(2)``
                  (:class:`~models.variants.views_parts.GridCoordEmbedding`, ``inner.embed_grid``)
``trm_memory``    + the demo memory: every cell cross-attends to the encoder's per-cell demo states
                  (:class:`~models.variants.views_parts.MemoryRead`, ``inner.memory_read``), beside the pooled
                  context slots; ETRM only, with an encoder that gives the memory (``gives_memory``)
``trm_local``     + generic grid layers in every latent update: each cell's 3 x 3 neighbourhood and the running max
                  along the four directions of its row and column (:class:`~models.variants.views_parts.GridOps`,
                  ``inner.grid_ops``); no operator written to a rule family; ``grid_gather``: + a learned gather
                  keyed by the cells' offsets from the grid's edges (:class:`~models.variants.gather.GridGather`,
                  ``inner.gather``), no map listed
``trm_views``     + the test input's grid views (:class:`~models.variants.views_parts.InputViews`, ``inner.views``):
                  every cell also holds, for every view v of ``views`` (``core.ops.view_sources``: dihedral maps,
                  shifts, rolls, scalings, tilings, settles), an embedding of the input colour v sends to it, mixed by
                  per-sample weights ``softmax_v(gate(mean context slot) + s * match_v)`` where ``match_v`` is how well
                  v explains the demos the encoder saw; optional per-cell counts (``cell_features``) and demo lookups
                  (``demo_lookup``)
================  ===================================================================================================

One supervision step (:meth:`GridTRMInner.forward`), ``x`` the input embedding (+ the views' embedding on the grid
cells), ``read(h)`` the memory read of ``h`` (zero without memory)::

    once:  x = x + read(x)
    repeat H_cycles times (all but the last without gradient):
        inj = z_H + x;  cycle: inj = inj + read(inj)
        repeat L_cycles times:  z_L = net(z_L, inj)      (step: inj + read(z_L + inj))
        z_H = net(z_H, z_L)

``memory_read`` (``once`` | ``cycle`` | ``step``) places the read; the memory's keys and values are projected once
per supervision step. Square canvas only. ``memory_width`` (the encoder's width) is filled from the encoder when
null (:meth:`TRMMemoryConfig.for_encoder`). The memory, view, count and lookup fields default to what
config/cfg_science.yaml trains (it sets only the sizes); which option was measured against which is in docs/record/
and docs/science.md, and retired options are refused with the measurement that retired them
(``models.legacy.REMOVED``).
"""

from __future__ import annotations

from typing import List, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from encoders.interface import DemoMemory
from models.trm import TRM, TRMConfig, TRMInner
from models.variants.gather import GridGather
from models.variants.views_parts import (
    CellFeatures,
    DemoLookup,
    GridCoordEmbedding,
    GridOps,
    InputViews,
    MemoryRead,
)

ViewKind = Literal["dihedral", "shift", "roll", "scale", "tile", "settle"]
CellCount = Literal["object_size", "rays"]  # CellFeatures' kinds (trm_local's and trm_views' cell_features)


class TRMGridConfig(TRMConfig):
    """TRM's fields; the grid offsets have no switch (they are what this variant is)."""

    name: Literal["trm_grid"] = "trm_grid"  # type: ignore[assignment]


class MemoryFields(BaseModel):
    """Where the core reads the demo memory and the memory's sizes."""

    model_config = ConfigDict(extra="forbid")
    # once (per supervision step, from x) | cycle (per H cycle, from z_H + x) | step (every L step, from z_L + z_H + x)
    memory_read: Literal["once", "cycle", "step"] = "cycle"
    memory_width: Optional[int] = Field(None, gt=0)  # the encoder's width; null: filled from the encoder
    memory_max_demos: int = Field(16, gt=0)  # demo-slot embeddings (a batch with more demo slots is refused)

    def for_encoder(self, encoder_hidden_size: int):
        """This config with ``memory_width`` filled from the encoder it reads (when null)."""
        if self.memory_width is not None:
            return self
        return self.model_copy(update={"memory_width": int(encoder_hidden_size)})


class TRMMemoryConfig(MemoryFields, TRMGridConfig):
    """``trm_grid``'s fields plus the memory's (:class:`MemoryFields`)."""

    name: Literal["trm_memory"] = "trm_memory"  # type: ignore[assignment]


class TRMLocalConfig(TRMMemoryConfig):
    """``trm_memory``'s fields plus generic grid layers (:class:`~models.variants.views_parts.GridOps`) in every
    latent update: no operator written to a rule family."""

    name: Literal["trm_local"] = "trm_local"  # type: ignore[assignment]
    # neighbours: each cell's 3 x 3 neighbourhood; rays: the running max along each of the four directions
    grid_ops: List[Literal["neighbours", "rays"]] = Field(["neighbours", "rays"], min_length=1)
    grid_ops_width: int = Field(16, gt=0)  # channels per neighbour / per direction
    # the output projection's init std as a multiple of the default (LeCun); 0: the layers start as a no-op, the core
    # as trm_memory, and the layers grow from the first update (measured better than 1: docs/science.md)
    grid_ops_out_init: float = Field(0.0, ge=0)
    # the same kind of layers (one pass, its own weights) over each grid's colour and offset embedding, added to the
    # embedding of every cell of the test input *and* of every demo input cell the memory keys: a cell's key then
    # says what surrounds it, so a test cell can find the demo cells in the same local role. Output projection
    # started at zero (the core starts as without it)
    cell_descriptor: bool = False
    # a learned gather over the test input's cells keyed by position only (gather.GridGather): per cell and head,
    # attention whose logits are a state-gated mix of ``gather_maps`` learned bilinear forms of the two cells' offsets
    # from the grid's edges (a flip, a shift, a scaling is one form; none is listed), reading the source's colour. In
    # every latent update, beside the grid layers; output projection started at zero
    grid_gather: bool = False
    gather_maps: int = Field(8, gt=0)
    gather_heads: int = Field(2, gt=0)
    gather_width: int = Field(16, gt=0)  # the colour embedding each head reads
    gather_scale: float = Field(10.0, gt=0)  # the logits are this times the forms (GridGather)
    # the gate also gets a learned scale times how well each form explains the demos up to a recolouring
    # (GridGather.match): the demos select the form; false: the cell's state alone chooses
    gather_match: bool = True
    # + one form counted from each sample's own demos (models/variants/demo_form.py): every demo output cell votes
    # for the demo input cells of its colour, per pair of edge-offset slots; any block-wise map the demos show, held
    # out or not, is read without being learned (the gate chooses it, with its leave-one-out match on the demos)
    gather_demo_form: bool = False
    gather_demo_form_rounds: int = Field(0, ge=0)  # refinement rounds of the count (demo_form.demo_tables)
    # the count's target cells placed by the grid with the input's height and width swapped where the sample's demos
    # show outputs shaped as their inputs' transposes (an axis swap: a quarter turn, a transpose), else by the input's
    # (demo_form.frame_slots / frame_allowed); false: always the input's, which misreads axis swaps of non-square grids
    gather_demo_form_frame: bool = False
    # the counted read brings its source's colour as the sample's demos map it there (GridGather.demo_colours: per
    # source colour, the colours the demo outputs show where the count reads it; itself where none): a flip or a
    # scaling that also recolours reads the recoloured colour; false: the source's own colour
    gather_demo_form_colour: bool = False
    # the count over the cells' colour roles too (the grid's commonest colour or another; demo_form.role_tokens), and
    # per sample the count whose read, recoloured as the demos show, reproduces more demo output cells is kept
    # (demo_form.reproduced): a rule that recolours in place is counted from its roles
    gather_demo_form_roles: bool = False
    # an auxiliary loss on the forms alone, from the demos (GridGather.copy_nll / fit_loss): the forms that best read
    # each demo output cell off a demo input cell of its colour (responsibility softmax(-tau * nll), held fixed) are
    # pulled to read them all, so the forms become the maps the training puzzles' demos show without waiting for the
    # answer's loss to reach them through the core (``gather_fit`` per sample, weight ``gather_fit_weight``; 0: off)
    gather_fit_weight: float = Field(0.0, ge=0)
    gather_fit_tau: float = Field(1.0, gt=0)
    # generic per-cell counts (CellFeatures, trm_views' own field): object_size (cells in the cell's same-colour
    # 4-connected object, 1-9+) and rays (non-background cells beyond it up to each edge, 0-7+), embedded and added to
    # the colour embedding of the test input and of the demo inputs the memory keys; none written to a rule family or
    # a generator's range. Drawn from a forked stream: every other weight starts as without them. [] = none
    cell_features: List[CellCount] = []

    @model_validator(mode="after")
    def _gather_fit_needs_the_gather(self):
        if self.gather_demo_form and not self.grid_gather:
            raise ValueError("gather_demo_form=true adds a form to the learned gather: it needs grid_gather=true")
        if self.gather_demo_form_frame and not self.gather_demo_form:
            raise ValueError("gather_demo_form_frame=true places the counted form's cells: needs gather_demo_form=true")
        if self.gather_demo_form_colour and not self.gather_demo_form:
            raise ValueError("gather_demo_form_colour=true maps the counted read's colour: needs gather_demo_form=true")
        if self.gather_demo_form_roles and not self.gather_demo_form:
            raise ValueError("gather_demo_form_roles=true counts colour roles too: needs gather_demo_form=true")
        if self.gather_fit_weight > 0 and not self.grid_gather:
            raise ValueError(
                f"gather_fit_weight={self.gather_fit_weight} fits the learned gather's forms to the demos: it needs "
                f"grid_gather=true"
            )
        return self


class TRMViewsConfig(TRMMemoryConfig):
    """``trm_memory``'s fields plus the views', the cell counts' and the lookups' (defaults: the recipe's)."""

    name: Literal["trm_views"] = "trm_views"  # type: ignore[assignment]
    # dihedral: the 8 maps; shift: the 48 shifts by up to 3 cells (content moved, background in); roll: wrapped;
    # scale: each cell a ky x kx block; tile: the grid repeated ry x rx times, plain or mirrored (factors 1-3);
    # settle: the non-background cells fall in one of 4 directions, stopped by the grid's edge or a wall colour (none
    # or 1-9): 40 views that depend on the colours (core.ops.settle_sources)
    views: List[ViewKind] = Field(["dihedral", "shift", "roll", "scale", "tile", "settle"], min_length=1)
    # the gate's context term is this times the gate projection's output (a larger scale sharpens it sooner)
    views_gate_scale: float = Field(1.0, gt=0)
    # match: softmax(context term + s * match), s learned from views_match_scale; tiebreak: the match alone keeps the
    # views within 1e-4 of the best match and the context term chooses among them (no s)
    views_gate: Literal["match", "tiebreak"] = "match"
    views_match_scale: float = Field(10.0, gt=0)
    # how a view's match with a demo is scored (InputViews.match): agree (of the cells it draws, those the output has)
    # or explain (of the output's cells, those it explains up to a recolouring)
    views_match: Literal["agree", "explain"] = "agree"
    # which table embeds the colour a view sends: kind (one per kind of view) or shared (one for every view)
    views_embed: Literal["kind", "shared"] = "kind"
    # per-cell counts added to every grid cell's colour embedding, of the test input and of the demo inputs the memory
    # keys (CellFeatures): object_size (cells in its same-colour 4-connected object) and rays (non-background cells
    # beyond it up to each edge). [] = none
    cell_features: List[CellCount] = ["object_size", "rays"]
    # per test cell, an embedding of what the demo cells with its key became (DemoLookup; one table per key): colour
    # (the cell's colour) and object (its colour and object size). [] = none
    demo_lookup: List[Literal["colour", "object"]] = ["colour", "object"]


class GridTRMInner(TRMInner):
    """TRM's inner model with the components its config names (see the module docstring); the parameter names are
    those of the subclass chain this module replaced (``inner.embed_grid``, ``inner.memory_read``, ``inner.views``,
    ``inner.demo_lookup``, ``inner.cell_features``), created in the same order (the same initial weights per seed)."""

    def __init__(self, config: TRMConfig, **kw) -> None:
        super().__init__(config, **kw)  # TRM's stem and net; build_positions adds embed_grid
        side = self.embed_grid.side
        self.reads_memory = isinstance(config, MemoryFields)  # models.etrm.ETRM passes the DemoMemory to forward()
        self.memory_read: Optional[MemoryRead] = None
        self.views: Optional[InputViews] = None
        self.demo_lookup: Optional[nn.ModuleList] = None
        self.cell_features: Optional[CellFeatures] = None
        self.grid_ops: Optional[GridOps] = None
        self.descriptor: Optional[GridOps] = None
        self.gather: Optional[GridGather] = None
        std, dtype = self.embed_init_std, self.forward_dtype
        if self.reads_memory:
            if config.memory_width is None:
                raise ValueError(
                    f"arch={config.name}: memory_width is null; the model is built inside an ETRM, which fills it "
                    f"from the encoder's hidden_size (training.build.build_etrm_model)"
                )
            self.memory_read = MemoryRead(
                config.hidden_size,
                config.num_heads,
                config.memory_width,
                side,
                config.memory_max_demos,
                self.vocab_size,
                init_std=std,
                cast_to=dtype,
            )
        if isinstance(config, TRMViewsConfig):
            self.views = InputViews(
                side,
                self.vocab_size,
                config.hidden_size,
                config.views,
                init_std=std,
                cast_to=dtype,
                gate_scale=config.views_gate_scale,
                match_scale=config.views_match_scale if config.views_gate == "match" else None,
                match_kind=config.views_match,
                embed=config.views_embed,
                tiebreak=config.views_gate == "tiebreak",
            )
            if config.demo_lookup:
                size_max = {"colour": 0, "object": CellFeatures.SIZE_MAX}
                self.demo_lookup = nn.ModuleList(
                    DemoLookup(side, self.vocab_size, config.hidden_size, size_max[k], std, dtype)
                    for k in config.demo_lookup
                )
            if config.cell_features:
                self.cell_features = CellFeatures(side, config.hidden_size, config.cell_features, std, dtype)
        if isinstance(config, TRMLocalConfig):
            self.grid_ops = GridOps(
                side, config.hidden_size, config.grid_ops, config.grid_ops_width, self.puzzle_emb_len
            )
            with torch.no_grad():
                self.grid_ops.out_proj.weight.mul_(config.grid_ops_out_init)
            if config.cell_descriptor:  # drawn from a forked stream: every other weight starts as without it
                with torch.random.fork_rng(devices=[]):
                    self.descriptor = GridOps(side, config.hidden_size, config.grid_ops, config.grid_ops_width, 0)
                with torch.no_grad():
                    self.descriptor.out_proj.weight.zero_()
            if config.grid_gather:  # drawn from a forked stream too
                with torch.random.fork_rng(devices=[]):
                    self.gather = GridGather(
                        side,
                        config.hidden_size,
                        self.vocab_size,
                        config.gather_maps,
                        config.gather_heads,
                        config.gather_width,
                        self.puzzle_emb_len,
                        config.gather_scale,
                        config.gather_match,
                        config.gather_demo_form_rounds if config.gather_demo_form else None,
                        config.gather_demo_form_frame,
                        config.gather_demo_form_colour,
                        config.gather_demo_form_roles,
                    )
            if config.cell_features:
                with torch.random.fork_rng(devices=[]):
                    self.cell_features = CellFeatures(side, config.hidden_size, config.cell_features, std, dtype)

    def build_positions(self, config) -> None:
        """TRM's positions, then ``embed_grid``: the four offset tables."""
        super().build_positions(config)
        self.embed_grid = GridCoordEmbedding(
            self.canvas_side(f"arch={config.name} (grid offsets)"),
            self.hidden_size,
            self.embed_init_std,
            self.forward_dtype,
        )

    def token_embeddings(self, inputs: torch.Tensor) -> torch.Tensor:
        """The colour and grid-offset embedding (the variance kept), plus with ``cell_descriptor`` the cell's local
        descriptor and with ``cell_features`` its counts: of the test input here and, through the memory's keys, of
        every demo input cell."""
        x = 0.707106781 * (super().token_embeddings(inputs) + self.embed_grid(inputs))
        if self.descriptor is not None:  # trm_local, cell_descriptor: what surrounds the cell in its grid
            x = x + self.descriptor(x)
        if self.cell_features is None:
            return x
        return (x + self.cell_features(inputs).to(x.dtype)) * (1 + self.cell_features.num_tables) ** -0.5

    @property
    def aux_loss_weights(self) -> dict[str, float]:
        """``{"gather_fit": w}`` with ``gather_fit_weight`` w > 0 (the demo-fit loss of the gather's forms)."""
        w = float(getattr(self.config, "gather_fit_weight", 0.0))
        return {"gather_fit": w} if w > 0 else {}

    @staticmethod
    def visible_demos(batch, memory: DemoMemory) -> torch.Tensor:
        """[b, D] bool: the demo slots each row's memory holds (none for the zero-demo control; leave-one-out at test
        time masks the demo being fitted)."""
        b, D = batch["demo_inputs"].shape[:2]
        valid = torch.zeros(b, D, device=batch["demo_inputs"].device).scatter_reduce(
            1, memory.demo.expand(b, -1), memory.mask.float(), "amax"
        )
        return valid > 0

    def embed_inputs(self, batch, prefix_context: Optional[torch.Tensor], memory: DemoMemory) -> torch.Tensor:
        """The input embedding of a step; with views, the grid cells also get the gated views and the lookups."""
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)
        if self.views is None:
            return x
        valid = self.visible_demos(batch, memory)
        match = self.views.match(batch["demo_inputs"], batch["demo_labels"], valid)
        views = self.views(batch["inputs"], prefix_context, match)
        for lookup in self.demo_lookup or ():
            views = views + lookup(batch["inputs"], batch["demo_inputs"], batch["demo_labels"], valid)
        P = self.puzzle_emb_len
        return torch.cat((x[:, :P], x[:, P:] + (self.embed_scale * views).to(x.dtype)), dim=1)

    def recursion(self, z_H, z_L, x, cos_sin, read, gather=None):
        """One outer cycle with the memory read where ``memory_read`` puts it (see the module docstring);
        ``gather(h)``: the learned gather's read of the state (``grid_gather``), beside the grid layers."""
        where = self.config.memory_read
        inj = z_H + x
        if where == "cycle":
            inj = inj + read(inj)
        for _ in range(self.config.L_cycles):
            step = inj + read(z_L + inj) if where == "step" else inj
            if self.grid_ops is not None:  # trm_local: the grid layers of the state this update reads
                local = self.grid_ops(z_L + step)
                if gather is not None:
                    local = local + gather(z_L + step)
                step = step + local
            z_L = self.L_level(z_L, step, cos_sin)
        z_H = self.L_level(z_H, z_L, cos_sin)
        return z_H, z_L

    def forward(self, carry, batch, prefix_context: Optional[torch.Tensor] = None, memory: Optional[DemoMemory] = None):
        if self.memory_read is None:  # trm_grid: TRM's step on these embeddings
            return super().forward(carry, batch, prefix_context)
        if memory is None:
            raise ValueError(
                f"arch={self.config.name} reads the demonstrations' per-cell states: run it as an ETRM "
                f"(pretrain_encoder.py) whose encoder gives them (aggregation=tokens, pair_layout=aligned)"
            )
        cos_sin = self.cos_sin(batch["inputs"])
        x = self.embed_inputs(batch, prefix_context, memory)
        kv = self.memory_read.keys(memory, batch["demo_inputs"], batch["demo_labels"], self.token_embeddings, x.dtype)
        read = lambda h: self.memory_read(h, kv)  # noqa: E731
        if self.config.memory_read == "once":
            x = x + read(x)
        gather, aux = None, {}
        if self.gather is not None:
            # the forms' scores on the demos (one pass over them): the match for the gate, the demo-fit loss
            kinds = ("match",) * (self.gather.match_scale is not None) + ("copy_nll",) * bool(self.aux_loss_weights)
            visible = self.visible_demos(batch, memory)
            mapped = self.gather.demo_colour  # the colour table from the same pass over the demos
            got = self.gather.demo_scores(batch["demo_inputs"], batch["demo_labels"], visible, kinds, mapped)
            demos, form, colours = got if mapped else (*got, None)
            scores = dict(zip(kinds, demos))
            tables = self.gather.tables(batch["inputs"], scores.get("match"), form, colours)  # once per step
            gather = lambda h: self.gather(h, tables)  # noqa: E731
            if "copy_nll" in scores:
                aux["gather_fit"] = GridGather.fit_loss(scores["copy_nll"], self.config.gather_fit_tau)
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self.recursion(z_H, z_L, x, cos_sin, read, gather)
        z_H, z_L = self.recursion(z_H, z_L, x, cos_sin, read, gather)  # the only cycle with gradient
        logits, q_halt, q_continue = self.heads(z_H)
        new = type(carry)(z_H=z_H.detach(), z_L=z_L.detach())
        return (new, logits, (q_halt, q_continue), aux) if aux else (new, logits, (q_halt, q_continue))


class GridTRM(TRM):
    """The ACT model of ``trm_grid``, ``trm_memory`` and ``trm_views`` (the config says which components it has)."""

    inner_cls = GridTRMInner

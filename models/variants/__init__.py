"""Research variants of TRM, each one module beside the paper's ``models/trm.py`` (as the published TRM keeps
``trm_singlez`` / ``trm_hier6`` beside ``trm.py``) and one line in ``models/registry.py``:

==================  ===========================================================================================
``arch=trm_grid``   grid-relative positions: each cell's token embedding also gets learned embeddings of its
                    offsets from its input grid's edges (the pooled science recipe before the demo memory)
``arch=trm_pointer``  pointer RoPE on top of ``trm_grid``: each attention query is rotated to the cell a learned,
                    context-chosen linear map of its grid offsets names (docs/record/2026-11-25-pointer-rope.md)
``arch=trm_memory``  demo memory on top of ``trm_grid``: every cell cross-attends to the encoder's per-cell demo
                    states (the science recipe; docs/record/2026-11-27-demo-memory.md); ``arch=trm_pointer_memory``:
                    the same on ``trm_pointer``
``arch=trm_views``  ``trm_memory`` plus the test input's 8 dihedral views per cell, gated per sample by the context
==================  ===========================================================================================

A variant subclasses ``TRMConfig`` (its ``name`` and extra fields), ``TRMInner`` (overriding the stem's hooks,
``models.act.IOStem``: ``build_positions``, ``cos_sin``, ``token_embeddings``, ``attention``) and ``TRM``
(``inner_cls``), keeping the parameter names of the model it extends. Arch configs written before a variant had
its own module (``name: trm`` with ``grid_coords`` / ``pos_encodings: pointer``) are read as it by
``models.legacy``.
"""

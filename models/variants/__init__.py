"""Research variants of TRM, beside the paper's ``models/trm.py`` (as the published TRM keeps ``trm_singlez`` /
``trm_hier6`` beside ``trm.py``), each registered in ``models/registry.py``. Each states the question it asks; it
leaves the code when the question is answered against it (docs/architecture.md, "Variants and removal"), and
``models.legacy.REMOVED`` then refuses its configs and checkpoints in one line naming the measurement.

==================  ===========================================================================================
``arch=trm_grid``   does a cell that knows its offsets from its grid's edges apply spatial rules? (grid offsets)
``arch=trm_memory`` what does the core read of the demos cell by cell, without family candidates? (+ demo memory;
                    the no-candidate baseline)
``arch=trm_local``  do generic grid layers (3 x 3 neighbourhood, running max along rows and columns) let a core
                    without family candidates learn local and directional rules? (+ grid layers)
``arch=trm_views``  does a core given the test input's grid views, chosen by their match with the demos, apply the
                    rule it reads? (+ grid views, cell counts, demo lookups; the candidates' baseline)
==================  ===========================================================================================

All four are one model (``trm_views.GridTRM``) whose config class switches its components on
(``views_parts``: grid offsets, memory read, grid layers, views, counts, lookups; ``views_ops``: the per-cell counts).
"""

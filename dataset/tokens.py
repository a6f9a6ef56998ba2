"""Token layout of every canvas dataset (identical to the published TRM ARC builder)::

    0  PAD   (outside the grid; ignored in the loss)
    1  EOS   (the row just below and the column just right of the grid; supervised)
    2..11    colours 0..9

A grid of shape (h, w) is written into the top-left of a 30x30 canvas (optionally shifted by a translation offset
at load time), flattened row-major to 900 tokens (:mod:`dataset.canvas`). Builders accept a smaller canvas
(``--canvas-size N``: N*N tokens, ``DatasetMetadata.grid_size = N``); the encoders' ``size`` argument is the side.
"""

from __future__ import annotations

PAD_ID = 0
EOS_ID = 1
COLOR_OFFSET = 2
NUM_COLORS = 10
ARC_VOCAB_SIZE = COLOR_OFFSET + NUM_COLORS  # 12
ARC_MAX_GRID = 30
ARC_SEQ_LEN = ARC_MAX_GRID * ARC_MAX_GRID  # 900

# Label value ignored by the loss (torch cross_entropy ignore_index).
IGNORE_LABEL_ID = -100

"""The ETRM science pipeline: does a demonstration encoder infer a rule it never saw, from the demos alone?

``python -m experiments.science --out DIR`` runs the 8-family
experiment through the user-facing commands (``--input-file-prefix P``: on your own kaggle-layout puzzles);
``--recolour`` runs the older in-process recolour check. Modules:

* :mod:`experiments.science.common`: names and helpers shared by the stages and the report (``ScienceError``, the
  runs, the logged subprocess);
* :mod:`experiments.science.recolour`: the recolour check (dataset writer, training recipe, held-out accuracy);
* :mod:`experiments.science.data`: the data stage (synthetic families or your files, the groups, the train-fit set);
* :mod:`experiments.science.run`: the command's stages (build the data, train, evaluate; resume and cut-short rules);
* :mod:`experiments.science.report`: the per-family table (science.json / science.md);
* :mod:`experiments.science.cli`: the argparse command (``__main__`` runs it).
"""

"""The ETRM science pipeline: does a demonstration encoder infer a rule it never saw, from the demos alone?

``python -m experiments.science --out DIR`` (also ``python -m encoders.science``, its old name) runs the 8-family
experiment through the user-facing commands; ``--recolour`` runs the older in-process recolour check. Modules:

* :mod:`experiments.science.common`: names shared by the stages and the report (``ScienceError``, the runs);
* :mod:`experiments.science.recolour`: the recolour check (dataset writer, training recipe, held-out accuracy);
* :mod:`experiments.science.run`: the command's stages (build the data, train, evaluate; resume rules);
* :mod:`experiments.science.report`: the per-family table (science.json / science.md);
* :mod:`experiments.science.cli`: the argparse command (``__main__`` runs it).
"""

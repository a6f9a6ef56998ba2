"""Experiments built on the platform (the top layer: may import core, dataset, encoders, models, evaluators and
training): the job queue (``experiments/queue/``, driven by ``run_jobs.py``) and the ETRM science pipeline
(``experiments/science/``, ``python -m experiments.science``)."""

"""Moved: the ETRM science pipeline is the package ``experiments.science`` (experiments/science/: ``recolour``,
``run``, ``report``, ``cli``); import it from there.

``python -m encoders.science ...`` still works as an alias: it runs ``python -m experiments.science`` with the
same arguments. It does not import ``experiments`` (a package above this one): ``runpy`` runs the command by name.
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("experiments.science", run_name="__main__", alter_sys=True)

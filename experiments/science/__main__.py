"""``python -m experiments.science``: the science command (:mod:`experiments.science.cli`)."""

from experiments.science.cli import main

if __name__ == "__main__":
    main()

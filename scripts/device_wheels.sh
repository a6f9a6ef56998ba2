#!/usr/bin/env bash
# Fill .whl/ (git-ignored via .git/info/exclude) with what scripts/device_check.sh installs on a lent GPU machine,
# whose image has torch / numpy / triton / matplotlib but no hydra, omegaconf or pydantic and no network:
# the project's pure-Python dependencies as Python 3.12 wheels, and the adam-atan2 sdist with what its setup.py
# needs to build the fused CUDA backend there (setuptools_scm, vcs-versioning, packaging).
#   bash scripts/device_wheels.sh        # then: device run "bash scripts/device_check.sh 550", carry [".whl"]
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=$(git rev-parse --git-path info/exclude)  # also in a worktree, where .git is a file
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
mkdir -p .whl
PY=${PYTHON:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hydra-core==1.3.8 omegaconf==2.3.1 pydantic==2.14.4 pydantic_core==2.50.5 typing-inspection==0.4.5 \
  annotated-types==0.8.0 typing_extensions==4.16.0 pyyaml==6.0.4 \
  setuptools_scm==10.3.4 vcs-versioning==2.6.0 'packaging>=26.2'
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3   # sdist only on PyPI: pure Python
"$PY" -m pip download -q --no-deps --no-binary :all: -d .whl adam-atan2==0.0.3
ls -la .whl && du -sh .whl

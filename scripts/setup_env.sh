#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the project (editable) and test extras.
# On machines that ship a local CPU wheel of torch (pip find-links), that wheel is used, so no
# multi-GB CUDA download happens; elsewhere pip resolves torch from the index as usual.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRM_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing dependencies (first run only)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  TORCH_SPEC="torch"
  # Prefer the CPU wheel pinned on this machine image if present (keeps installs small and offline-friendly).
  for w in /opt/wheels/torch-*.whl; do
    [ -e "$w" ] && TORCH_SPEC="torch==$(basename "$w" | cut -d- -f2 | cut -d+ -f1)"
  done
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  touch "$STAMP"
fi

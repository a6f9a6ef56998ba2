#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the project (editable) and test extras.
# On machines that ship a local CPU wheel of torch (pip find-links), that wheel is used, so no
# multi-GB CUDA download happens; elsewhere pip resolves torch from the index as usual.
#
#   bash scripts/setup_env.sh          set up (first run / after a pyproject.toml change only)
#   bash scripts/setup_env.sh --cuda   also build the fused AdamATan2 CUDA kernel (adam-atan2) when a GPU, a CUDA
#                                      build of torch and nvcc are present; says which optimizer implementation
#                                      imports afterwards. Without --cuda, a machine with a GPU gets a hint.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRM_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
CUDA=0
for a in "$@"; do
  case "$a" in
    --cuda) CUDA=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "[setup] unknown argument $a (only --cuda)" >&2; exit 2 ;;
  esac
done
STAMP="$VENV/.installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
VPY="$VENV/bin/python"
report_impl() {  # one line: the AdamATan2 implementations this environment can run
  (cd "$ROOT" && "$VPY" -c 'from training.optim import available_implementations as a; print("[setup] AdamATan2 implementations available here:", ", ".join(a()), "(auto: fused, else triton, for CUDA parameters; torch otherwise)")') || true
}
if [ ! -x "$VPY" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
installed=0
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing dependencies (first run only)"
  "$VPY" -m pip install -q --upgrade pip
  TORCH_SPEC="torch"
  # Prefer the CPU wheel pinned on this machine image if present (keeps installs small and offline-friendly).
  for w in /opt/wheels/torch-*.whl; do
    [ -e "$w" ] && TORCH_SPEC="torch==$(basename "$w" | cut -d- -f2 | cut -d+ -f1)"
  done
  "$VPY" -m pip install -q "$TORCH_SPEC"
  "$VPY" -m pip install -q -e "$ROOT[test]"
  touch "$STAMP"
  installed=1
fi

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
backend_ok() { "$VPY" -c 'import torch, adam_atan2_backend' >/dev/null 2>&1; }

if [ "$CUDA" = 1 ]; then
  if ! has_gpu; then
    echo "[setup] --cuda: no NVIDIA GPU here (nvidia-smi); the fused kernel is not built"
  elif backend_ok; then
    echo "[setup] --cuda: the fused adam-atan2 backend already imports"
  elif ! "$VPY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)'; then
    echo "[setup] --cuda: WARNING: the torch in $VENV is not a working CUDA build ($("$VPY" -c 'import torch; print(torch.__version__)'));" \
         "install one (https://pytorch.org/get-started/locally/), then run --cuda again" >&2
  else
    NVCC="$(command -v nvcc || true)"
    if [ -z "$NVCC" ]; then
      for d in "${CUDA_HOME:-}" /usr/local/cuda; do
        if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then NVCC="$d/bin/nvcc"; export CUDA_HOME="$d"; break; fi
      done
    fi
    if [ -z "$NVCC" ]; then
      echo "[setup] --cuda: WARNING: no nvcc (CUDA toolkit) found on PATH, in CUDA_HOME or /usr/local/cuda: the fused" \
           "kernel cannot be compiled; the Triton kernel is used on CUDA instead" >&2
    else
      echo "[setup] --cuda: building the fused adam-atan2 kernel with $NVCC against torch $("$VPY" -c 'import torch; print(torch.__version__)') (a few minutes)"
      # --no-build-isolation: build against THIS torch (an isolated build has no torch and silently skips the
      # CUDA extension); --no-cache-dir / --force-reinstall: never reuse a wheel built without it.
      "$VPY" -m pip install -q setuptools setuptools_scm wheel ninja
      if ! "$VPY" -m pip install --no-build-isolation --no-cache-dir --force-reinstall --no-deps adam-atan2; then
        echo "[setup] --cuda: WARNING: building adam-atan2 failed (see above)" >&2
      fi
      if backend_ok; then
        echo "[setup] --cuda: fused adam-atan2 backend built and importable"
      else
        echo "[setup] --cuda: WARNING: adam-atan2 installed but its CUDA backend does not import:" \
             "$("$VPY" -c 'import torch, adam_atan2_backend' 2>&1 | tail -1)" >&2
      fi
    fi
  fi
  report_impl
elif [ "$installed" = 1 ]; then
  report_impl
  if has_gpu && ! backend_ok; then
    echo "[setup] an NVIDIA GPU is present: 'bash scripts/setup_env.sh --cuda' builds the fused AdamATan2 kernel"
  fi
fi

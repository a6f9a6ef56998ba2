#!/usr/bin/env bash
# Set up (if needed) and run the embedded default end to end on a CPU: build a small dataset if missing,
# train a tiny TRM, evaluate, and print where the checkpoint, summary and W&B offline run are.
# Extra arguments are Hydra overrides, e.g. `bash scripts/demo.sh epochs=20`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" PYTHONUNBUFFERED=1
exec "${TRM_VENV:-$ROOT/.venv}/bin/python" -m training.demo "$@"

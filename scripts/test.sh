#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Exit status: 0 only when tests ran and all passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" || { echo "[test] set-up failed"; exit 1; }
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" WANDB_MODE=disabled PYTHONUNBUFFERED=1
"${TRM_VENV:-$ROOT/.venv}/bin/python" -m pytest -q tests "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "[test] pytest collected no tests: failing"; exit 1; fi
exit "$rc"

#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Exit status: 0 only when tests ran and all passed.
#   bash scripts/test.sh [pytest args]          the whole suite (tests/)
#   bash scripts/test.sh PATH... [pytest args]  only the given test files / directories / node ids
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" || { echo "[test] set-up failed"; exit 1; }
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" WANDB_MODE=disabled PYTHONUNBUFFERED=1
# run tests/ unless an argument names a test path (a file, directory or node id such as tests/test_x.py::name)
targets=(tests)
for a in "$@"; do
    case "$a" in -*) continue ;; esac
    if [ -e "${a%%::*}" ]; then targets=(); break; fi
done
VPY="${TRM_VENV:-$ROOT/.venv}/bin/python"
# style first (seconds): ruff's lint and its format check, pinned in pyproject.toml; the layer rule is a test
# (tests/test_layers.py). TRM_SKIP_STYLE=1 skips them for a quick targeted run.
if [ "${TRM_SKIP_STYLE:-0}" != 1 ]; then
    "$VPY" -m ruff check . || { echo "[test] ruff check failed (ruff check --fix . fixes the import order)"; exit 1; }
    "$VPY" -m ruff format --check . || { echo "[test] ruff format --check failed (run: ruff format .)"; exit 1; }
fi
"$VPY" -m pytest -q "${targets[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "[test] pytest collected no tests: failing"; exit 1; fi
exit "$rc"

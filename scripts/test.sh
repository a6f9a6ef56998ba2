#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Exit status: 0 only when tests ran and all passed.
#   bash scripts/test.sh [pytest args]          the whole suite (tests/)
#   bash scripts/test.sh PATH... [pytest args]  only the given test files / directories / node ids
# Runs on both cores: pytest-xdist, TRM_TEST_WORKERS processes (default 2; 0 = in this process), each test file
# kept on one worker (its module fixtures are built once). The science floors (learning-threshold claims) are their
# own command: python -m experiments.science.floors --out DIR (.ci/run runs both).
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
workers="${TRM_TEST_WORKERS:-2}"
xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadfile)
start=$(date +%s)
"$VPY" -m pytest -q "${xdist[@]}" "${targets[@]}" "$@"
rc=$?
echo "[test] pytest exit status $rc after $(( $(date +%s) - start )) s on $workers worker(s)"
if [ "$rc" -eq 5 ]; then echo "[test] pytest collected no tests: failing"; exit 1; fi
exit "$rc"

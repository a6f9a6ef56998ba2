#!/usr/bin/env bash
# What a lent GPU is used for, in one call of the device tool (its machine is bare and held for minutes only):
#
#   bash scripts/device_check.sh [BUDGET_S]        # BUDGET_S: wall seconds for everything (default 560)
#
# Prepared here with `bash scripts/device_wheels.sh` (fills .whl/), run there with .whl carried.
#
# 1. environment: the project's pure-Python dependencies from wheels carried in .whl/ (the machine has torch,
#    numpy, triton, matplotlib but no hydra / omegaconf / pydantic, and no network); the adam-atan2 package's CUDA
#    backend is built in the background from its sdist in .whl/ when there (scripts/setup_env.sh --cuda does
#    the same on a machine of your own);
# 2. the science step's speed on the otherwise idle GPU (benchmarks.train_step --config science; BENCH_MODES=both
#    also times eager), which also sets the step count of 3;
# 3. the 8-family science command on the GPU's budget (docs/science.md, "The 8 families on one H100"), runs side
#    by side (RUNS below), each one cut to the deadline and its last checkpoint evaluated if it does not finish;
# 4. meanwhile, the CUDA tests: tests/test_cuda.py (training step on CUDA vs CPU, fp32 and bf16, eager and
#    compiled), the CUDA / Triton / fused optimizer tests and the pinned-memory loader test.
#
# Everything lands in $OUT (or ./device-out): device.log, bench-science.json, tests.log, science.tgz (run
# outputs without checkpoints: a checkpoint holds the batch-sized ACT carry, 21 MB at batch 512).
set -uo pipefail
BUDGET=${1:-560}
START=$(date +%s)
OUT=${OUT:-device-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/device.log") 2>&1
left() { echo $((BUDGET - ($(date +%s) - START))); }
until_deadline_less() { local t=$(( $(left) - $1 )); echo $(( t > 10 ? t : 10 )); }  # a timeout, never <= 0
say() { echo "[device $(($(date +%s) - START))s] $*"; }
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2

# 1. environment
if [ -z "${SKIP_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { say "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi -L || true
python3 -c "import torch, triton, hydra, pydantic; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA', 'triton', triton.__version__)" || exit 1
AA_PID=
if ls .whl/adam_atan2-*.tar.gz >/dev/null 2>&1; then
  (MAX_JOBS=6 timeout 200 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site-aa \
     .whl/adam_atan2-*.tar.gz > "$OUT/adam-atan2-build.log" 2>&1 && echo built >> "$OUT/adam-atan2-build.log") &
  AA_PID=$!
fi

# 2. the science step on the idle GPU, compiled (batch 64): checks compilation, sets the step count of 3
# (H100, 2026-11-26: eager 0.226 s/step, compiled 0.044; docs/training.md)
say "benchmark: science step"
timeout 120 python3 -m benchmarks.train_step --config science --device cuda --compile ${BENCH_MODES:-compiled} \
  --steps 20 --warmup 5 --json "$OUT/bench-science.json" | grep '^\[train_step\]'

# 3. the science runs, side by side (each: NAME|its science-command options). The 2026-11-26 lease ran four
# (batch 64; batch 512 on seeds 0 and 1; the batch-512 control): the batch-512 standard runs were cut at
# 1337 / 1396 of 1500 steps before their evaluation; now two runs, their schedule sized to finish.
RUNS=(
  "b512|--encoders standard --override global_batch_size=512 --override lr=2e-3"
  "b512-ctl|--encoders control --override global_batch_size=512 --override lr=2e-3"
)
EVAL_S=130  # after training: a cut-short run's final evaluation (2 x evaluate.py) and the packing
STEPS=$(python3 - "$OUT/bench-science.json" "$(left)" "$EVAL_S" <<'EOF'
import json, sys
path, left, eval_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
try:
    s_step = json.load(open(path))["compiled"]["seconds_per_step"]
except (OSError, ValueError, KeyError):
    s_step = 0.05
# measured 2026-11-26 (summary.json wall times): a batch-512 standard run beside 2-3 others, 0.29-0.31 s/step, =
# 6.8x the idle compiled batch-64 step (0.044); its zero-demo control 0.040 s/step. Sized on that measured ratio
# (with the default two runs the GPU is less shared, so they should finish early: the rest of the lease is unused)
per_step = s_step * 6.8
print(max(200, int((left - eval_s - 60) / per_step) // 100 * 100))  # 60 s: data, start-up, compilation
EOF
)
STEPS=${STEPS_OVERRIDE:-${STEPS:-1000}}  # a dry run elsewhere: STEPS_OVERRIDE=8
say "science: ${#RUNS[@]} runs side by side, compiled, $STEPS steps"
mkdir -p runs
for r in "${RUNS[@]}"; do
  name=${r%%|*}; opts=${r#*|}
  # cut at the deadline (SIGTERM: the loop stops with a checkpoint), then that checkpoint is evaluated
  # shellcheck disable=SC2086
  (timeout "$(until_deadline_less "$EVAL_S")" python3 -m experiments.science --out "runs/gpu-$name" --steps "$STEPS" $opts \
     --override compile=true > "runs/gpu-$name.log" 2>&1 \
   || timeout "$(until_deadline_less 25)" python3 -m experiments.science --out "runs/gpu-$name" --steps "$STEPS" \
     --no-train $opts --override compile=true >> "runs/gpu-$name.log" 2>&1) &
done

# 4. the CUDA tests, beside the runs
say "tests"
[ -n "$AA_PID" ] && wait "$AA_PID"
[ -d /tmp/site-aa ] && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site-aa
# one process is fine: tests/test_optim_triton.py puts the compiled kernel back after its interpreted tests, and
# the CUDA Triton test asserts that it runs the compiled one
timeout "$(until_deadline_less 60)" python3 -m pytest -q -s -p no:cacheprovider tests/test_cuda.py tests/test_optim.py \
  tests/test_optim_triton.py tests/test_dataset_loader.py -k "cuda or triton or fused or pinned" \
  > "$OUT/tests.log" 2>&1
say "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep '^\[cuda\]' "$OUT/tests.log"

while [ "$(left)" -gt 30 ] && jobs -r | grep -q .; do sleep 2; done  # the deadline wins: pack what exists
pkill -TERM -f "runs/gpu-" 2>/dev/null; sleep 2  # the science commands and their training / evaluate.py children
say "science done"
for r in "${RUNS[@]}"; do
  name=${r%%|*}
  grep -h -E 'it/s|s/step|trained|cut short|Error|error' "runs/gpu-$name.log" | tail -3
  [ -f "runs/gpu-$name/science.md" ] && sed -n '1,40p' "runs/gpu-$name/science.md" | grep -E '^\|' | head -14
done
tar czf "$OUT/science.tgz" --exclude='*.pt' --exclude='data/raw' --exclude='data/built' --exclude='data/fit' \
  runs/gpu-*
ls -la "$OUT"
say "end"

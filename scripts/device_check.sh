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
# 2. with BENCH=1, the science step's speed on the otherwise idle GPU (benchmarks.train_step --config science;
#    BENCH_MODES=both also times eager);
# 3. the 8-family science command (batch 512: two seeds and the zero-demo control) on the GPU's budget
#    (batch 512 reached 0.26 / 0.27 held-out in ~1100 steps, 6.5 minutes, on two seeds: 1f9e2ad,
#    docs/record/2026-11-26-h100-batch-512.md), runs side by side (RUNS below), each one cut to the
#    deadline and its last checkpoint evaluated if it does not finish;
# 4. meanwhile, the CUDA tests: tests/test_cuda.py (training step on CUDA vs CPU, fp32 and bf16, eager and
#    compiled), the CUDA / Triton / fused optimizer tests and the pinned-memory loader test.
#
# Everything lands in $OUT (or ./device-out): device.log, tests.log, bench-science.json (BENCH=1), science.tgz (run
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

# 2. the science step on the idle GPU, compiled (batch 64), with BENCH=1 (H100, 2026-11-26: eager 0.226 s/step,
# compiled 0.044; 3b5a585, docs/record/2026-11-26-h100-science-step.md). Off by default: measured once, and its
# minute is worth more to the runs.
if [ -n "${BENCH:-}" ]; then
  say "benchmark: science step"
  timeout 120 python3 -m benchmarks.train_step --config science --device cuda --compile ${BENCH_MODES:-compiled} \
    --steps 20 --warmup 5 --json "$OUT/bench-science.json" | grep '^\[train_step\]'
fi

# 3. the science runs, side by side (each: NAME|its science-command options). The first lease (2026-11-26) ran
# four (batch 64; batch 512 on seeds 0 and 1; the batch-512 control) and cut the batch-512 standard runs at
# 1337 / 1396 of 1500 steps before their evaluation (0.29-0.31 s/step beside three others). Now the same 1500-step
# schedule for both seeds and the control, without the batch-64 run; a run still going at the deadline is cut
# (SIGTERM: the loop writes a checkpoint) and that checkpoint evaluated, so the per-family table exists either way.
RUNS=(
  "b512|--encoders standard --override global_batch_size=512 --override lr=2e-3"
  "b512-s1|--encoders standard --seed 1 --override seed=1 --override global_batch_size=512 --override lr=2e-3"
  "b512-ctl|--encoders control --override global_batch_size=512 --override lr=2e-3"
)
EVAL_S=60  # after training: a cut-short run's final evaluation and the packing (41 s on the 2nd lease, 2026-11-26:
           # evaluate.py 2-3 s per set on the GPU; 130 before, which left the runs 90 s short)
STEPS=${STEPS_OVERRIDE:-1500}  # a dry run elsewhere: STEPS_OVERRIDE=8
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

# 4. the CUDA tests, beside the runs (TESTS=0 skips them)
say "tests"
if [ "${TESTS:-1}" != 0 ]; then
[ -n "$AA_PID" ] && wait "$AA_PID"
[ -d /tmp/site-aa ] && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site-aa
# one process is fine: tests/test_optim_triton.py puts the compiled kernel back after its interpreted tests, and
# the CUDA Triton test asserts that it runs the compiled one
timeout "$(until_deadline_less 60)" python3 -m pytest -q -s -p no:cacheprovider tests/test_cuda.py tests/test_optim.py \
  tests/test_optim_triton.py tests/test_dataset_loader.py -k "cuda or triton or fused or pinned" \
  > "$OUT/tests.log" 2>&1
say "tests exit $?: $(tail -1 "$OUT/tests.log")"
grep '^\[cuda\]' "$OUT/tests.log"
fi

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

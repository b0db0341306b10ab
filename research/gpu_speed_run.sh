#!/bin/bash
# Issue #15 on one H100: the dual-loop GRPO step with the shared-prompt loss pass, image-prefix partner passes and
# merged-LoRA decoding (docs/speed.md), in the realistic bench mode, plus as many scaling points as fit.
# Run from the repository root AFTER installing the GPU wheels (nothing is installed here):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   BUDGET_S=420 bash research/gpu_speed_run.sh
# Stages, in priority order, each under `timeout` and inside the BUDGET_S wall-clock budget of this script:
#   A  4b, B=8, G=8, T=128, both loops, forced [SEG], captions of 32-128 tokens, host-stored partner/reference,
#      1 warm-up + 2 timed iterations, the generate() baseline (1 iteration), one profiled iteration, then 4b scaling
#      points in the same process (decode with unmerged LoRA, G=16, T=256, 13 tiles, G=4, T=64, 1 tile; 1 warm-up +
#      1 timed iteration each) while fewer than 160 s have passed since the bench started
#   B  8b (does it fit 80 GB with host-stored partner/reference?), 1 + 1 iterations
#   C  1b, 1 + 2 iterations
#   D  the loop-2 mask-action measurement (helper H7), if benchmarks/mask_action.py exists
# Every JSON/log goes to work_dirs/speed_run/ and comes back as $OUT/speed_run.tgz; $OUT/summary.txt holds the table
# printed last; the stage-A JSON is also copied to $OUT/rl_step_4b.json.
set -u
START=$(date +%s)
BUDGET_S=${BUDGET_S:-420}
OUT=${OUT:-$PWD/out_speed}
WORK=$PWD/work_dirs/speed_run
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
BENCH="python3 -m projects.llava_sam2.rl_train.cli bench rl-step"
REAL=${REAL:-"--batch 8 --num-generations 8 --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu"}
# presets of stages A, B, C (a CPU dry run of this script: PRESET_A=tiny PRESET_B=tiny PRESET_C=tiny REAL="...")
PRESET_A=${PRESET_A:-4b} PRESET_B=${PRESET_B:-8b} PRESET_C=${PRESET_C:-1b}
MASK_ACTION_MODULE=projects/llava_sam2/rl_train/benchmarks/mask_action.py
MASK_ACTION_S=${MASK_ACTION_S:-80}
# >>> H7 slot: the 1b mask-action measurement's flags (after --preset 1b); the lead fills them in. Write its files
# under work_dirs/speed_run/ (relative to the repository root) so that they come back in speed_run.tgz <<<
MASK_ACTION_ARGS=${MASK_ACTION_ARGS:-}
STAGES=${STAGES:-ABCD}  # the stages to run (e.g. ACD: no 8b point, its time goes to the 4b run)
# stage A's scaling points (bench --sweep) and how long after the bench's start it may still begin one
SWEEP=${SWEEP:-"backend=fast_adapters G=16 T=256 tiles=13 G=4 T=64 tiles=1"}
SWEEP_UNTIL_S=${SWEEP_UNTIL_S:-160}
A_CAP_S=${A_CAP_S:-240}

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
reserve_d() { if [ -f "$MASK_ACTION_MODULE" ] && wants D; then echo "$MASK_ACTION_S"; else echo 0; fi; }
wants() { [[ "$STAGES" == *"$1"* ]]; }
budget_of() { if wants "$1"; then echo "$2"; else echo 0; fi; }
# run_stage NAME CAP_S MIN_S CMD...: run CMD under timeout min(CAP_S, time left - what later stages keep)
run_stage() {
  local name=$1 cap=$2 min=$3; shift 3
  local t=$(( $(left) - KEEP ))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt "$min" ]; then echo "stage $name skipped: ${t}s left" | tee -a "$WORK/stages.txt"; return; fi
  echo "stage $name: timeout ${t}s: $*" | tee -a "$WORK/stages.txt"
  local s0=$(date +%s)
  timeout --kill-after=10 "$t" "$@" > "$WORK/$name.log" 2>&1
  echo "stage $name: rc=$? wall=$(( $(date +%s) - s0 ))s" | tee -a "$WORK/stages.txt"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$WORK/gpu.txt" 2>&1

# A: the acceptance run (priority a), then 4b scaling points while its time lasts (priority b)
KEEP=$(( $(budget_of B 80) + $(budget_of C 35) + $(reserve_d) ))  # the least that stages B, C and D need
wants A && run_stage A_4b "$A_CAP_S" 150 $BENCH --preset $PRESET_A $REAL --warmup 1 --iters 2 --baselines generate --baseline-warmup 0 \
  --baseline-iters 1 --profile "$WORK/rl_step_4b_profile.json" --profile-top 60 \
  --sweep "$SWEEP" --sweep-warmup 1 --sweep-iters 1 \
  --time-limit-s "$SWEEP_UNTIL_S" --json "$WORK/rl_step_4b.json"
cp "$WORK/rl_step_4b.json" "$OUT/rl_step_4b.json" 2>/dev/null

# B: 8b with host-stored partner and reference (does it fit 80 GB?)
KEEP=$(( $(budget_of C 35) + $(reserve_d) ))
wants B && run_stage B_8b 120 80 $BENCH --preset $PRESET_B $REAL --warmup 1 --iters 1 --baselines '' --json "$WORK/rl_step_8b.json"

# C: 1b
KEEP=$(reserve_d)
wants C && run_stage C_1b 60 35 $BENCH --preset $PRESET_C $REAL --warmup 1 --iters 2 --baselines '' --json "$WORK/rl_step_1b.json"

# D: >>> H7 slot <<< the lead's 1b mask-action measurement (runs only if the module exists)
KEEP=0
if [ -f "$MASK_ACTION_MODULE" ] && wants D; then
  run_stage D_mask_action "$MASK_ACTION_S" 30 python3 -m projects.llava_sam2.rl_train.benchmarks.mask_action \
    --preset 1b $MASK_ACTION_ARGS
else
  echo "stage D_mask_action skipped: not in STAGES=$STAGES or $MASK_ACTION_MODULE missing" | tee -a "$WORK/stages.txt"
fi

python3 - "$WORK" > "$WORK/summary.txt" 2>&1 <<'PY'
import glob, json, os, sys
work = sys.argv[1]
print(open(os.path.join(work, "gpu.txt")).read().strip())
print(open(os.path.join(work, "stages.txt")).read().strip())
row = "{:<30} {:>8} {:>10} {:>12} {:>9} {:>7} {:>6} {:>7}"
print(row.format("run", "step s", "rollout/s", "policy tok/s", "peak GiB", "no_seg", "tiles", "T"))
for stage in ("4b", "8b", "1b"):
    path = os.path.join(work, f"rl_step_{stage}.json")
    if not os.path.exists(path):
        print(f"{stage:<30} no result (stage skipped or killed before its first measurement)")
        continue
    r = json.load(open(path))
    if "seconds_per_iteration" not in r:
        print(f"{stage:<30} no result (killed during the first measurement)")
        continue
    runs = [(f"{stage} ours", r)] + [(f"{stage} {k}", v) for k, v in r.get("baselines", {}).items()]
    runs += [(f"{stage} sweep {k}", v) for k, v in r.get("sweep", {}).items()]
    for name, v in runs:
        if "error" in v or "seconds_per_iteration" not in v:
            print(f"{name:<30} {v.get('error', 'not finished')[:90]}")
            continue
        print(row.format(name[:30], f"{v['seconds_per_iteration']:.2f}", f"{v['rollouts_per_s']:.2f}",
                         f"{v['policy_caption_tokens_per_s']:.0f}", f"{v['peak_gib']:.1f}",
                         f"{v['tokens_per_iteration'].get('partner_no_seg', float('nan')):.0f}",
                         v.get("n_tiles", r.get("n_tiles")), v.get("max_new_tokens", r.get("max_new_tokens"))))
    step = r["seconds_per_iteration"]
    shares = sorted(((k, s / step) for k, s in r["seconds"].items() if "/" in k and not k.endswith("_total")
                     or k in ("encode", "logprob_backward", "optimizer", "ema_partner", "rewards")),
                    key=lambda kv: -kv[1])
    print(f"  {stage} ({r['device']}) phase shares: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares[:9]))
    if stage == "4b":
        print(f"  {stage} acceptance: {r['rollouts_per_s']:.2f} rollouts/s (goal >= 10), "
              f"peak {r['peak_gib']:.1f} GiB (goal <= 60), "
              f"partner_no_seg {r['tokens_per_iteration'].get('partner_no_seg')}")
PY
if [ -f "$WORK/D_mask_action.log" ]; then
  { echo "--- D_mask_action.log (last 20 lines)"; tail -n 20 "$WORK/D_mask_action.log"; } >> "$WORK/summary.txt"
fi
tar czf "$OUT/speed_run.tgz" -C "$PWD/work_dirs" speed_run
cp "$WORK/summary.txt" "$OUT/summary.txt"
cat "$WORK/summary.txt"

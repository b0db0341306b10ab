# session 13, speed round 3: the decode graphs captured without emptying the allocator caches (GraphedCall), measured
# in the bare 4b decode and inside the 4b step, with the compiled decode and partial checkpointing as sweep points
# (one H100, one call < 10 min). Env: DECODE_S (0 skips the decode), STEP_S, SWEEP, MODES, STEP_EXTRA.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
CLI="python3 -m projects.llava_sam2.rl_train.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ "${DECODE_S:-170}" != 0 ] && timeout -s INT ${DECODE_S:-170} $CLI bench decode --lm 4b --batch 8 --num-generations 8 \
  --prompt-len 1850 --new-tokens 128 --repeats 3 --keep-going --check-scope variants --profile-steps 70 --check-tokens 72 \
  --modes ${MODES:-fast+pad+fuse+split,fast_compiled+pad+fuse+split} --json $OUT/decode.json > $OUT/decode.log 2>&1
echo decode rc=$?
TORCH_LOGS=recompiles timeout -s INT ${STEP_S:-380} $CLI bench rl-step --preset 4b --batch 8 --num-generations 8 \
  --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region --warmup 1 --iters 3 \
  --baselines '' ${STEP_EXTRA:-} --sweep "${SWEEP-backend=fast_fused_split_compiled keep=8}" --sweep-warmup 1 \
  --sweep-iters 3 --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
p = os.path.join(o, "decode.json")
if os.path.exists(p):
    r = json.load(open(p))
    for m, v in r["modes"].items():
        pr = r.get("profile", {}).get(m, {})
        print(f"{m:32s} {v['tokens_per_s']:8.0f} tok/s wall {v['wall_s']:.3f} step {v['decode_step_ms']:.2f} ms "
              f"prefill {v['prefill_s']:.3f} first {v['first_call_s']:.1f} dev {pr.get('device_ms_per_step', 0):.2f}")
p = os.path.join(o, "step.json")
if os.path.exists(p):
    r = json.load(open(p))
    pts = [("main", r)] + list(r.get("sweep", {}).items())
    for lab, s in pts:
        print(lab, s.get("seconds_per_iteration"), s.get("rollouts_per_s"), s.get("iteration_step_s"), "peak", s.get("peak_gib"))
        print("   ", {k.replace("rollout/", ""): round(v, 3) for k, v in sorted(s.get("seconds", {}).items())})
PY
grep -iE "recompil|error|Traceback" $OUT/step.log | head -20

# session 13, speed round 3, one H100, one call (< 10 min): the bare 4b decode (compiled split step by default), then
# the issue's step command with the bench's CUDA defaults (= the released-size configs) and generate() in the same
# process, with sweep points after it. Env: DECODE_S (0 skips the decode), MODES, SWEEP, STEP_S, STEP_EXTRA, CHECK_SINGLE.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
CLI="python3 -m projects.llava_sam2.rl_train.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ "${DECODE_S:-170}" != 0 ] && timeout -s INT ${DECODE_S:-170} $CLI bench decode --lm 4b --batch 8 --num-generations 8 --prompt-len 1850 --new-tokens 128 \
  --repeats 3 --keep-going --check-scope variants --profile-steps 70 --check-tokens 72 \
  --modes ${MODES:-fast_compiled+pad+fuse+split} \
  --json $OUT/decode.json > $OUT/decode.log 2>&1; echo decode rc=$?
python3 - <<'PY'
import json, os
p = os.path.join(os.environ["OUT"], "decode.json")
if os.path.exists(p):
    r = json.load(open(p))
    for m, v in r["modes"].items():
        pr = r.get("profile", {}).get(m, {}); c = r.get("check", {}).get(m, {})
        print(f"{m:40s} {v['tokens_per_s']:7.0f} tok/s step {v['decode_step_ms']:.2f} ms prefill {v['prefill_s']:.3f} "
              f"first {v['first_call_s']:.1f}s peak {v['peak_gib']:.1f} kern {pr.get('kernels_per_step', 0):.0f} "
              f"dev {pr.get('device_ms_per_step', 0):.2f} greedy/seeded/first {c.get('greedy_tokens_equal_fast')} "
              f"{c.get('sampled_tokens_equal_fast')} {c.get('greedy_first_token_equal_fast')}")
    print("errors", r.get("errors"))
PY
timeout -s INT ${STEP_S:-380} $CLI bench rl-step --preset 4b --batch 8 --num-generations 8 --max-new-tokens 128 \
  --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region --warmup 1 --iters 3 \
  --baselines generate --baseline-iters 1 ${STEP_EXTRA:-} \
  --sweep "${SWEEP-keep=8}" --sweep-warmup 1 --sweep-iters 3 \
  --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
grep -v "^\s*$" $OUT/step.log | tail -8
python3 - <<'PY'
import json, os
p = os.path.join(os.environ["OUT"], "step.json")
if os.path.exists(p):
    r = json.load(open(p))
    print("main", r.get("decode_backend"), r.get("compile_loss_layers"), r.get("seconds_per_iteration"),
          r.get("rollouts_per_s"), r.get("iteration_step_s"), "peak", r.get("peak_gib"))
    for k, v in sorted(r.get("seconds", {}).items()):
        print(f"   {k:48s} {v:.3f}")
PY
if [ -n "$CHECK_SINGLE" ]; then
  timeout -s INT 200 $CLI check gpu --only single --iters 4 --work-dir /tmp/gcheck > $OUT/check.log 2>&1; echo check rc=$?; cp /tmp/gcheck/check.json $OUT/ 2>/dev/null
  tail -5 $OUT/check.log
fi

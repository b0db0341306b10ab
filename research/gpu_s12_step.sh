# session 12, issue #28: the shared-prefix attention kernels in the bare decode and inside the 4b step (one H100)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
CLI="python3 -m projects.llava_sam2.rl_train.cli"
[ -n "$TUNE" ] && { timeout -s INT 100 python3 research/prefix_attention_tune.py > $OUT/tune.log 2>&1; echo tune rc=$?; sort -t: -k2 -n $OUT/tune.log | head -3; head -1 $OUT/tune.log; }
[ -z "$SKIP_DECODE" ] && timeout -s INT 170 $CLI bench decode --lm 4b --batch 8 --num-generations 8 --prompt-len 1850 --new-tokens 128 --repeats 3 \
  --keep-going --check-scope variants --modes fast_compiled+pad+fuse+split,fast+pad+fuse+split --profile-steps 70 \
  --check-tokens 72 --json $OUT/dS.json > $OUT/S.log 2>&1; echo S rc=$?
timeout -s INT ${STEP_S:-400} $CLI bench rl-step --preset 4b --batch 8 --num-generations 8 --max-new-tokens 128 --force-seg \
  --caption-lengths 32,128 --storage cpu --mask-policy region --warmup 1 --iters 3 --baselines '' \
  --decode-backend ${BACKEND:-fast_fused_split} --compile-loss-layers --profile $OUT/prof.json \
  --sweep "${SWEEP:-backend=fast_fused_sdpa,loss=eager}" --sweep-warmup 1 --sweep-iters 2 --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
p = os.path.join(o, "dS.json")
if os.path.exists(p):
    r = json.load(open(p))
    for m, v in r["modes"].items():
        pr = r.get("profile", {}).get(m, {})
        print(f"{m:32s} {v['tokens_per_s']:8.0f} tok/s step {v['decode_step_ms']:.2f} ms prefill {v['prefill_s']:.3f} dev {pr.get('device_ms_per_step', 0):.2f}")
        for k in pr.get("top", [])[:5]: print(f"     {k['us']:8.0f} us {k['launches']:5.0f} {k['name'][:90]}")
PY
grep -v "^\s*$" $OUT/step.log | tail -45

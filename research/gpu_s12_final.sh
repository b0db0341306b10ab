# One H100, one call (< 10 min): the bare 4b decode (MODES), then the step command with the bench's CUDA defaults
# (= the released-size configs), generate() in the same process, and sweep points after it. Env: DECODE_S (0 skips the
# decode), MODES, STEP_S, STEP_EXTRA, SWEEP, SWEEP_ITERS, CHECK_SINGLE. Written in session 12 (its default sweep point
# is that session's previous defaults); session 13 ran it with MODES=fast_compiled+pad+fuse+split SWEEP=keep=8
# SWEEP_ITERS=3.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
CLI="python3 -m projects.llava_sam2.rl_train.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ "${DECODE_S:-170}" != 0 ] && timeout -s INT ${DECODE_S:-170} $CLI bench decode --lm 4b --batch 8 --num-generations 8 --prompt-len 1850 --new-tokens 128 \
  --repeats 3 --keep-going --check-scope variants --profile-steps 70 --check-tokens 72 \
  --modes ${MODES:-fast+pad+fuse+split,fast_compiled+pad+fuse+split} \
  --json $OUT/decode.json > $OUT/decode.log 2>&1; echo decode rc=$?
timeout -s INT ${STEP_S:-380} $CLI bench rl-step --preset 4b --batch 8 --num-generations 8 --max-new-tokens 128 \
  --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region --warmup 1 --iters 3 \
  --baselines generate --baseline-iters 1 ${STEP_EXTRA:-} \
  --sweep "${SWEEP-backend=fast_fused_sdpa,loss=eager}" --sweep-warmup 1 --sweep-iters ${SWEEP_ITERS:-2} \
  --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
grep -v "^\s*$" $OUT/step.log | tail -8
python3 research/gpu_summary.py $OUT
if [ -n "$CHECK_SINGLE" ]; then
  timeout -s INT 200 $CLI check gpu --only single --iters 4 --work-dir /tmp/gcheck > $OUT/check.log 2>&1; echo check rc=$?; cp /tmp/gcheck/check.json $OUT/ 2>/dev/null
  tail -5 $OUT/check.log
fi

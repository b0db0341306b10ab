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
python3 research/gpu_summary.py $OUT
grep -iE "recompil|error|Traceback" $OUT/step.log | head -20

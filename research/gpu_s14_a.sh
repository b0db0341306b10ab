# The 4b step command as a new user runs it (bench defaults, generate() in the same run), plus optional sweep
# points, on one H100 in one call < 10 min (~4 min with the baseline). Session 14 ran it with the layer-graph
# experiment's sweep points (removed since; docs/benchmarks.md "Round 6"). Env: STEP_S, SWEEP, BASELINES, STEP_EXTRA.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
CLI="python3 -m projects.llava_sam2.rl_train.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -s INT ${STEP_S:-440} $CLI bench rl-step --preset 4b --batch 8 --num-generations 8 \
  --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region --warmup 1 --iters 3 \
  --baselines "${BASELINES-generate}" --baseline-iters 1 ${STEP_EXTRA:-} --sweep "${SWEEP-}" --sweep-warmup 1 \
  --sweep-iters 3 --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
python3 research/gpu_summary.py $OUT
grep -iE "recompil|error|Traceback" $OUT/step.log | head -20

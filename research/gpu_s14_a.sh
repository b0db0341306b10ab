# session 14, speed round 3: the grouped passes' layer loop replayed from CUDA graphs (layer_graphs.py). One H100,
# one call < 10 min: the graphs' values against the eager loop (research/layer_graphs_gpu_check.py), then the issue's
# 4b step command with the bench's CUDA defaults (graphs on) and generate() in the same run, with a graphs=off point.
# Env: CHECK_S (0 skips the check), CHECK_ARGS, STEP_S, SWEEP, BASELINES, STEP_EXTRA.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
CLI="python3 -m projects.llava_sam2.rl_train.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ "${CHECK_S:-100}" != 0 ] && timeout -s INT ${CHECK_S:-100} python3 -m research.layer_graphs_gpu_check ${CHECK_ARGS:-} \
  > $OUT/graphs_check.log 2>&1
echo check rc=$?
cat $OUT/graphs_check.log | grep -E '^\{|Error|error' | head -20
timeout -s INT ${STEP_S:-440} $CLI bench rl-step --preset 4b --batch 8 --num-generations 8 \
  --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region --warmup 1 --iters 3 \
  --baselines "${BASELINES-generate}" --baseline-iters 1 ${STEP_EXTRA:-} --sweep "${SWEEP-graphs=off}" --sweep-warmup 1 \
  --sweep-iters 3 --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
python3 research/gpu_summary.py $OUT
grep -iE "recompil|error|Traceback|layer graphs" $OUT/step.log | head -20

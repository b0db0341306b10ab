# Session 15's record run on one H100: the issue's 4b step command as a new user runs it (bench defaults, generate()
# in the same run), then the 8b point with the same settings (one timed iteration, no baseline). Env: STEP_S, BIG_S.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
BENCH="python3 -m projects.llava_sam2.rl_train.cli bench rl-step"
REAL="--batch 8 --num-generations 8 --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -s INT ${STEP_S:-300} $BENCH --preset 4b $REAL --warmup 1 --iters 3 --baselines generate --baseline-iters 1 \
  --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
timeout -s INT ${BIG_S:-240} $BENCH --preset 8b $REAL --warmup 1 --iters 1 --baselines '' --json $OUT/step_8b.json \
  > $OUT/step_8b.log 2>&1
echo 8b rc=$?
python3 research/gpu_summary.py $OUT
grep -iE "recompil|error|Traceback" $OUT/step.log $OUT/step_8b.log | head -20

# Session 16, second H100 call: the prefill paths side by side (research/decode_probe.py prefill), the bare 4b decode
# as the issue measures it (the shipped mode, with its checks), then the 4b step command with generate().
# Env: PREFILL_S, DECODE_S, STEP_S.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -s INT ${PREFILL_S:-100} python3 research/decode_probe.py prefill > $OUT/prefill.log 2>&1
echo prefill rc=$?; grep '^{' $OUT/prefill.log; grep -E "Error|Traceback" $OUT/prefill.log | head -5
timeout -s INT ${DECODE_S:-170} python3 -m projects.llava_sam2.rl_train.cli bench decode --lm 4b --batch 8 \
  --num-generations 8 --new-tokens 128 --modes fast_compiled+pad+fuse+split --json $OUT/decode.json > $OUT/decode.log 2>&1
echo decode rc=$?; tail -4 $OUT/decode.log
BENCH="python3 -m projects.llava_sam2.rl_train.cli bench rl-step"
REAL="--batch 8 --num-generations 8 --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu --mask-policy region"
timeout -s INT ${STEP_S:-270} $BENCH --preset 4b $REAL --warmup 1 --iters 3 --baselines generate --baseline-iters 1 \
  --json $OUT/step.json > $OUT/step.log 2>&1
echo step rc=$?
python3 research/gpu_summary.py $OUT
grep -iE "recompil|error|Traceback" $OUT/step.log | head -10

# session 13: the decode graphs' capture, A/B in two processes of one call (torch.cuda.graph vs GraphedCall's pooled
# capture), each the step command without baselines; then the bare compiled decode with the tail-block skip.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
STEP="--preset 4b --batch 8 --num-generations 8 --max-new-tokens 128 --force-seg --caption-lengths 32,128 --storage cpu
  --mask-policy region --warmup 1 --iters 3 --baselines ''"
for arm in ${ARMS:-torch pooled}; do
  eval timeout -s INT ${STEP_S:-210} python3 research/graph_capture_ab.py $arm -- $STEP ${STEP_EXTRA:-} \
    --json $OUT/step_$arm.json > $OUT/step_$arm.log 2>&1
  echo "$arm rc=$?"
done
[ "${DECODE_S:-130}" != 0 ] && timeout -s INT ${DECODE_S:-130} python3 -m projects.llava_sam2.rl_train.cli bench decode \
  --lm 4b --batch 8 --num-generations 8 --prompt-len 1850 --new-tokens 128 --repeats 3 --keep-going \
  --check-scope variants --profile-steps 70 --check-tokens 72 --modes ${MODES:-fast_compiled+pad+fuse+split} \
  --json $OUT/decode.json > $OUT/decode.log 2>&1; echo decode rc=$?
python3 research/gpu_summary.py $OUT
for arm in ${ARMS:-torch pooled}; do grep -E "Error|Traceback" $OUT/step_$arm.log | head -3; done

# `sa2va-rl check gpu` on a 2-GPU host (nvidia-h100-x2), one config per call: the released-size step
# (gpu_smoke_1b.py: split decode, eager loss layers) by default, or CONFIG=projects/llava_sam2/configs/rl/
# gpu_smoke_1b_compiled_loss.py ONLY=ddp,zero2 ITERS=4 for the compiled loss-pass layers (each check ~160 s with its
# compiles). Copies check.json and the tail of each check's log to $OUT. Env: CONFIG, ONLY, ITERS, CHECK_S.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
(cd .devrun/nltk_data/corpora && python3 -m zipfile -e wordnet.zip .) ; export NLTK_DATA=$PWD/.devrun/nltk_data
nvidia-smi --query-gpu=name --format=csv,noheader
ONLY=${ONLY:-single,ddp,zero2,parity}
timeout -s INT ${CHECK_S:-560} python3 -m projects.llava_sam2.rl_train.cli check gpu --only $ONLY --iters ${ITERS:-6} \
  ${CONFIG:+--config $CONFIG} --work-dir /tmp/gc > $OUT/check.log 2>&1
echo check rc=$?
cp /tmp/gc/check.json $OUT/ 2>/dev/null
for c in ${ONLY//,/ }; do [ -f /tmp/gc/$c.log ] && tail -c 20000 /tmp/gc/$c.log > $OUT/$c.log; done
grep -E '^\{"check"' $OUT/check.log | cut -c1-300
grep -A8 "^check " $OUT/check.log

# Session 16's probe of the bare 4b decode call on one H100 (research/decode_probe.py): its phases, the prefill under
# each SDPA backend, the decode step's GEMM shapes. Env: PHASES_S, PREFILL_S, GEMM_S.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for part in phases prefill gemm; do
  limit_var=$(echo ${part}_S | tr a-z A-Z)
  timeout -s INT ${!limit_var:-200} python3 research/decode_probe.py $part > $OUT/$part.log 2>&1
  echo $part rc=$?
  grep '^{' $OUT/$part.log
  grep -E "Error|Traceback" $OUT/$part.log | head -5
done

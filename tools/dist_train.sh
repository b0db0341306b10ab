#!/usr/bin/env bash
# Multi-process training through torchrun, as upstream Sa2VA's tools/dist.sh:
#
#   tools/dist_train.sh CONFIG NGPUS [xtuner train args]
#
# Environment: DEEPSPEED=<xtuner name | json path> adds `--deepspeed` (e.g. deepspeed_zero2, or
# projects/llava_sam2/configs/rl/deepspeed_zero2_cpu.json on a CPU-only machine); unset = plain DDP.
# NNODES, NODE_RANK, MASTER_ADDR, PORT for multi-node runs; PYTHON picks the interpreter.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 CONFIG NGPUS [xtuner train args]" >&2
  exit 2
fi
CONFIG=$1
NGPUS=$2
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
DS_ARGS=()
if [ -n "${DEEPSPEED:-}" ]; then
  DS_ARGS=(--deepspeed "$DEEPSPEED")
fi
exec "$PYTHON" -m torch.distributed.run \
  --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
  --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
  --nproc_per_node="$NGPUS" \
  "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "${DS_ARGS[@]}" "$@"

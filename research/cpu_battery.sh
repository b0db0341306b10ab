#!/bin/bash
# CPU experiments of the demo (issue #12) side by side on the lent GPU machine's 16 cores (one thread each; the GPU is
# not used). PLAN is a file of lines "NAME COMMAND...": every COMMAND runs from the repository root as its own
# process, its output in work_dirs/battery/NAME.log; all start at once (the demo pipelines start their own
# 1-thread subprocesses). After the last one (or at KILL_AFTER_S) the small outputs (reports, stage records, metrics,
# text dependence, training scalars, margins) come back as $OUT/battery.tgz; checkpoints and images stay.
# POST (optional): one command run after them all, before the outputs are packed (e.g. a report over their runs).
# Usage (after the wheel install and PYTHONPATH export of docs/benchmarks.md, WordNet zipped under $NLTK_ROOT):
#   bash research/cpu_battery.sh research/plans/PLAN.txt KILL_AFTER_S NLTK_ROOT
set -u
PLAN=$1
KILL=${2:-540}
NLTK_ROOT=${3:-$PWD/nltk_data}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NLTK_DATA=$NLTK_ROOT CUDA_VISIBLE_DEVICES=""
(cd "$NLTK_ROOT/corpora" && python3 -m zipfile -e wordnet.zip .)
LOGS=work_dirs/battery
mkdir -p "$LOGS"
START=$(date +%s)
while read -r name cmd; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  ( s0=$(date +%s); timeout --kill-after=5 "$KILL" bash -c "$cmd" > "$LOGS/$name.log" 2>&1
    echo "$name rc=$? wall=$(( $(date +%s) - s0 ))s" >> "$LOGS/status.txt" ) &
done < "$PLAN"
( while sleep 60; do echo "$(( $(date +%s) - START ))s load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOGS/load.txt"; done ) &
LOADER=$!
wait $(jobs -p | grep -v "^$LOADER$")
kill $LOADER 2>/dev/null
if [ -n "${POST:-}" ]; then bash -c "$POST" > "$LOGS/post.log" 2>&1; echo "post rc=$?" >> "$LOGS/status.txt"; fi
cat "$LOGS/status.txt"
cd work_dirs && find . \( -path ./battery -o -name report.md -o -path "*/stages/*.json" -o -name metrics.json \
  -o -name text_dependence.json -o -name scalars.json -o -name margins.json -o -name "*.log" \) -size -5M -print0 \
  | tar czf "$OUT/battery.tgz" --null -T - 2>/dev/null
ls -la "$OUT"

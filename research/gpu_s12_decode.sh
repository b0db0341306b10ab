python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
B="python3 -m projects.llava_sam2.rl_train.cli bench decode --lm 4b --batch 8 --num-generations 8 --prompt-len 1850 --new-tokens 128 --repeats 3 --keep-going --check-scope variants"
timeout -s INT 200 $B --modes fast,fast+pad+fuse+sdpa,fast+pad+fuse+split --profile-steps 8 --check-tokens 16 --json $OUT/dG.json > $OUT/G.log 2>&1; echo G rc=$?
timeout -s INT 250 $B --modes fast_compiled+pad+fuse+split,fast_compiled+pad+fuse --profile-steps 70 --check-tokens 72 --json $OUT/dC.json > $OUT/C.log 2>&1; echo C rc=$?
python3 - <<'PY'
import json, os
for f in ("dG.json", "dC.json"):
    p = os.path.join(os.environ["OUT"], f)
    if not os.path.exists(p): print("missing", f); continue
    r = json.load(open(p))
    for m, v in r["modes"].items():
        pr = r.get("profile", {}).get(m, {}); ch = r.get("check", {}).get(m, {})
        print(f"{m:32s} {v['tokens_per_s']:8.0f} tok/s step {v['decode_step_ms']:.2f} ms first {v['first_call_s']:.1f}s peak {v['peak_gib']:.1f} kern {pr.get('kernels_per_step', 0):.0f} dev {pr.get('device_ms_per_step', 0):.2f} check {ch}")
        for k in pr.get("top", [])[:6]: print(f"     {k['us']:8.0f} us {k['launches']:5.0f} {k['name'][:90]}")
    print("errors", r.get("errors"))
PY
tail -5 $OUT/G.log $OUT/C.log

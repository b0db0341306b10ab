"""Print what a device call's `bench decode` / `bench rl-step` JSON files hold, one block per file (used by the
research/gpu_*.sh scripts at the end of a call: only the output's tail comes back quickly).

    python3 research/gpu_summary.py $OUT
"""
import glob
import json
import os
import sys


def decode_rows(report: dict) -> None:
    for mode, v in report["modes"].items():
        prof, check = report.get("profile", {}).get(mode, {}), report.get("check", {}).get(mode, {})
        print(f"{mode:36s} {v['tokens_per_s']:7.0f} tok/s wall {v['wall_s']:.3f} step {v['decode_step_ms']:.2f} ms "
              f"prefill {v['prefill_s']:.3f} first {v['first_call_s']:.1f}s peak {v['peak_gib']:.1f} "
              f"kern {prof.get('kernels_per_step', 0):.0f} dev {prof.get('device_ms_per_step', 0):.2f} "
              f"greedy/seeded/first {check.get('greedy_tokens_equal_fast')} {check.get('sampled_tokens_equal_fast')} "
              f"{check.get('greedy_first_token_equal_fast')}")
        for kernel in prof.get("top", [])[:6]:
            print(f"     {kernel['us']:8.0f} us {kernel['launches']:5.0f} {kernel['name'][:80]}")
    print("errors", report.get("errors"))


def step_rows(report: dict) -> None:
    points = [("main", report)] + list(report.get("sweep", {}).items())
    for label, s in points:
        print(label, s.get("decode_backend"), s.get("compile_loss_layers"), s.get("seconds_per_iteration"),
              s.get("rollouts_per_s"), s.get("iteration_step_s"), "peak", s.get("peak_gib"))
        for key, value in sorted(s.get("seconds", {}).items()):
            print(f"   {key:48s} {value:.3f}")
    for name, b in report.get("baselines", {}).items():
        print("baseline", name, b.get("seconds_per_iteration"), b.get("rollouts_per_s"))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ["OUT"]
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        report = json.load(open(path))
        print("==", os.path.basename(path))
        if "modes" in report:
            decode_rows(report)
        elif "seconds" in report:
            step_rows(report)

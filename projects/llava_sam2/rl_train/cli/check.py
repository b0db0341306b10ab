"""``sa2va-rl check gpu``: check an install on a GPU host, every launch path, in one command.

    sa2va-rl check gpu                         # 1b smoke config: 1 GPU, DDP x2, ZeRO-2 x2, parity, resume
    sa2va-rl check gpu --preset 4b --only scaling   # rollouts/s and peak memory per GPU on 1 and 2 GPUs
    sa2va-rl check gpu --cpu                   # the same matrix on CPU processes (tiny config, gloo)

Nothing is downloaded: ``configs/rl/gpu_smoke_{1b,4b}.py`` train a random-weights Sa2VA of that shape on shapes
prompts at 448 px, with the GPU configs' precision (bf16 weights, fp32 trained tensors, AMP's bf16 autocast),
EMA partner, KL reference and loop 2's METEOR + LLM judge, the judge served by the project's local OpenAI-compatible
stub server. Each check is a separate launch of ``sa2va-rl train`` (torchrun for several processes), as a user runs
it:

* ``single``: one GPU, no DeepSpeed (MMEngine's ``AmpOptimWrapper``); ``ddp``: plain DDP over NCCL; ``zero2``:
  DeepSpeed ZeRO-2 (``--deepspeed deepspeed_zero2``). ``--iters`` (10) iterations each, a checkpoint halfway and at
  the end.
* ``parity``: one GRPO update of the same global batch on 1 and on 2 ranks, for every ``loss_type``
  (``engine/parity.py``): equal loss and gradient norm within ``--parity-rel`` (bnpo differs by definition).
* ``resume``: each training run of the invocation resumed from its halfway checkpoint (iteration 5 of 10) into a
  new work dir; the later iterations (6-10) must equal the uninterrupted run's within ``--resume-rel``.
* ``scaling`` (not in the default set): the same config, 5 iterations on 1 GPU and on every GPU (DDP); seconds
  per iteration after the first two, rollouts/s (2 loops x B x G per GPU) and MMEngine's peak memory per GPU.

It prints a table and writes ``WORK_DIR/check.json``; every launch's log is in ``WORK_DIR/<check>.log``. The exit
code is 1 if any check failed. The tolerances and why they are what they are: docs/gpu.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

PROG = "sa2va-rl check"
PACKAGE = "projects.llava_sam2.rl_train"
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "rl"
DEFAULT_CHECKS = ("single", "ddp", "zero2", "parity", "resume")
ALL_CHECKS = DEFAULT_CHECKS + ("scaling",)
LOGGED = ("loss", "grad_norm", "mask_to_caption/reward_mean", "caption_to_mask/reward_mean")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def judge_stub_server():
    """The project's OpenAI-compatible stub server in a child process; yields its base URL. Its answers vary with
    the prompt, so a random-weights model's loop 2 gets non-constant rewards (a non-zero loss to compare)."""
    proc = subprocess.Popen([sys.executable, "-m", f"{PACKAGE}.benchmarks.openai_stub_server", "--answers", "varied"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("READY "):
            raise RuntimeError(f"{PROG}: the judge stub server did not start (said {line!r})")
        yield line.split(" ", 1)[1]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


class Launcher:
    """Runs ``sa2va-rl train`` launches of one config, each with its own work dir and log."""

    def __init__(self, config: Path, work_dir: Path, env: dict[str, str], cpu: bool, iters: int,
                 deterministic: bool = False) -> None:
        self.config, self.work_dir, self.env, self.cpu, self.iters = config, work_dir, env, cpu, iters
        self.deterministic = deterministic
        # a checkpoint halfway and at the end: the resume check restarts from the first
        self.checkpoint_options = (f"default_hooks.checkpoint.interval={max(1, iters // 2)}",)

    def train(self, name: str, nproc: int, *, deepspeed: str | None = None, resume: Path | None = None,
              options: tuple[str, ...] = ()) -> tuple[int, Path, float]:
        """Launch one run; returns (exit code, its work dir, wall seconds)."""
        work = self.work_dir / name
        shutil.rmtree(work, ignore_errors=True)
        # window 1: MMEngine logs every *loss* / *time* / *grad_norm* key as the mean of its last 10 values by
        # default, which would average the warm-up into the step time
        args = [str(self.config), "--work-dir", str(work), "--cfg-options", f"train_cfg.max_iters={self.iters}",
                "log_processor.window_size=1", *options,
                *(["randomness.deterministic=True"] if self.deterministic else [])]
        if deepspeed:
            args += ["--deepspeed", deepspeed]
        if resume:
            args += ["--resume", str(resume)]
        if nproc == 1:
            cmd = [sys.executable, "-m", f"{PACKAGE}.cli", "train", *args]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   f"--master_port={free_port()}", "-m", f"{PACKAGE}.cli", "train", *args, "--launcher", "pytorch"]
        env = dict(self.env)
        if nproc == 1 and not self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        start = time.time()
        code = run_logged(cmd, self.work_dir / f"{name}.log", env)
        return code, work, time.time() - start


def run_logged(cmd: list[str], log: Path, env: dict[str, str]) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode


def logged_scalars(work: Path) -> dict[int, dict[str, float]]:
    """Iteration -> the scalars MMEngine's LoggerHook wrote (``<timestamp>/vis_data/scalars.json``; the newest
    launch in ``work``)."""
    files = sorted(work.glob("*/vis_data/scalars.json"))
    if not files:
        return {}
    rows = {}
    for line in files[-1].read_text().splitlines():
        row = json.loads(line)
        if "iter" in row:
            rows[int(row["iter"])] = row
    return rows


def checkpoint_at(work: Path, iteration: int) -> Path | None:
    path = work / f"iter_{iteration}.pth"  # a file (one process, DDP) or a directory (DeepSpeed)
    return path if path.exists() else None


def compare_resumed(full: dict[int, dict], resumed: dict[int, dict], iters: range,
                    rel: float) -> tuple[bool, float, str]:
    """(ok, largest relative difference, what differs) over the resumed iterations ``iters`` and ``LOGGED``."""
    worst, problem = 0.0, ""
    for it in iters:
        if it not in full or it not in resumed:
            return False, math.inf, f"iteration {it} missing ({'resumed' if it in full else 'uninterrupted'} run)"
        for key in LOGGED:
            if key not in full[it]:
                continue
            a, b = float(full[it][key]), float(resumed[it].get(key, math.nan))
            diff = 0.0 if a == b else abs(a - b) / max(abs(a), abs(b), 1e-12)
            if not diff <= worst:
                worst, problem = diff, f"{key} at iteration {it}: {a:.6g} vs {b:.6g}"
    return worst <= rel, worst, problem


def train_check(launcher: Launcher, name: str, nproc: int, deepspeed: str | None) -> dict:
    code, work, seconds = launcher.train(name, nproc, deepspeed=deepspeed, options=launcher.checkpoint_options)
    scalars = logged_scalars(work)
    finite = bool(scalars) and all(math.isfinite(float(row.get("loss", math.nan))) for row in scalars.values())
    ok = code == 0 and len(scalars) == launcher.iters and finite
    last = scalars.get(launcher.iters, {})
    return {"check": name, "ok": ok, "exit_code": code, "iterations": len(scalars), "wall_s": round(seconds, 1),
            "s_per_iter": _median_time(scalars), "memory_mb": last.get("memory"),
            "loss_last": last.get("loss"), "detail": "" if ok else f"see {launcher.work_dir / (name + '.log')}"}


def _median_time(scalars: dict[int, dict], skip: int = 2) -> float | None:
    times = sorted(float(row["time"]) for it, row in scalars.items() if it > skip and "time" in row)
    return round(times[len(times) // 2], 3) if times else None


def resume_check(launcher: Launcher, of: str, nproc: int, deepspeed: str | None, rel: float) -> dict:
    name, half = f"resume_{of}", launcher.iters // 2
    full_work = launcher.work_dir / of
    start = checkpoint_at(full_work, half)
    if start is None:
        return {"check": name, "ok": False, "detail": f"no iteration-{half} checkpoint in {full_work} (run {of} first)"}
    code, work, seconds = launcher.train(name, nproc, deepspeed=deepspeed, resume=start,
                                         options=launcher.checkpoint_options)
    ok, worst, problem = compare_resumed(logged_scalars(full_work), logged_scalars(work),
                                         range(half + 1, launcher.iters + 1), rel)
    return {"check": name, "ok": code == 0 and ok, "exit_code": code, "wall_s": round(seconds, 1),
            "max_rel_diff": worst, "detail": problem}


def parity_check(work_dir: Path, env: dict, preset: str, nproc: int, cpu: bool, rel: float) -> dict:
    from ..engine.parity import compare, launch

    out = work_dir / "parity.json"
    out.unlink(missing_ok=True)
    args = ["--preset", preset, "--batch", str(2 * nproc)]
    if not cpu:
        args += ["--device", "cuda", "--amp", "bfloat16", "--image-size", "448"]
    start = time.time()
    code = launch(out, nproc, args, work_dir / "parity.log", env)
    if code != 0 or not out.exists():
        return {"check": "parity", "ok": False, "exit_code": code, "detail": f"see {work_dir / 'parity.log'}"}
    rows = compare(json.loads(out.read_text()), rel=rel)
    failed = [row["case"] for row in rows if not row["ok"]]
    worst = max((row[f"{k}_rel_diff"] for row in rows if row["expected_equal"] for k in ("loss", "grad_norm")),
                default=0.0)
    return {"check": "parity", "ok": not failed, "exit_code": code, "wall_s": round(time.time() - start, 1),
            "max_rel_diff": worst, "cases": rows, "detail": f"failed: {failed}" if failed else ""}


def scaling_check(launcher: Launcher, gpus: int, batch: int, generations: int) -> list[dict]:
    rows = []
    for nproc in sorted({1, gpus}):
        name = f"scaling_{nproc}gpu"
        code, work, seconds = launcher.train(name, nproc, options=("default_hooks.checkpoint.interval=1000",))
        scalars = logged_scalars(work)
        step = _median_time(scalars)
        memory = max((float(row.get("memory", 0)) for row in scalars.values()), default=None)
        per_gpu = 2 * batch * generations / step if step else None
        rows.append({"check": name, "ok": code == 0 and step is not None, "exit_code": code, "gpus": nproc,
                     "s_per_iter": step, "rollouts_per_s_per_gpu": per_gpu and round(per_gpu, 2),
                     "rollouts_per_s": per_gpu and round(per_gpu * nproc, 2), "peak_memory_mb_per_gpu": memory,
                     "wall_s": round(seconds, 1)})
    if len(rows) == 2 and rows[0]["rollouts_per_s_per_gpu"] and rows[1]["rollouts_per_s_per_gpu"]:
        rows[1]["efficiency"] = round(rows[1]["rollouts_per_s_per_gpu"] / rows[0]["rollouts_per_s_per_gpu"], 3)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'check':<16}{'ok':<6}{'iters':>6}{'s/iter':>9}{'max rel diff':>14}  detail")
    for row in rows:
        diff = row.get("max_rel_diff")
        print(f"{row['check']:<16}{('yes' if row['ok'] else 'NO'):<6}{str(row.get('iterations', '')):>6}"
              f"{str(row.get('s_per_iter') or ''):>9}{(f'{diff:.2e}' if diff is not None else ''):>14}  "
              f"{row.get('detail', '')}")
        if "rollouts_per_s" in row:
            print(f"{'':<16}{row['gpus']} GPU(s): {row['rollouts_per_s']} rollouts/s "
                  f"({row['rollouts_per_s_per_gpu']} per GPU), peak {row['peak_memory_mb_per_gpu']} MB per GPU"
                  + (f", efficiency {row['efficiency']}" if "efficiency" in row else ""))


def gpu(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} gpu", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--preset", default="1b", choices=("1b", "4b"), help="size of the smoke config")
    parser.add_argument("--config", type=Path, default=None,
                        help="train config to launch (default: configs/rl/gpu_smoke_<preset>.py, with --cpu "
                             "configs/rl/check_tiny_cpu.py)")
    parser.add_argument("--gpus", type=int, default=2, help="processes of the multi-GPU checks")
    parser.add_argument("--iters", type=int, default=10, help="iterations per training check (>= 2)")
    parser.add_argument("--only", default=",".join(DEFAULT_CHECKS),
                        help=f"comma-separated checks out of {','.join(ALL_CHECKS)}")
    parser.add_argument("--work-dir", type=Path, default=Path("work_dirs/gpu_check"))
    parser.add_argument("--parity-rel", type=float, default=None,
                        help="relative tolerance of parity (default 2e-2 on GPU: bf16; 2e-5 with --cpu: fp32)")
    parser.add_argument("--resume-rel", type=float, default=None,
                        help="relative tolerance of resume (default 0: bit-exact, which deterministic training gives "
                             "on GPUs and CPUs alike)")
    parser.add_argument("--cpu", action="store_true", help="run the checks on CPU processes (tiny config, gloo)")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                        help="train with torch's deterministic algorithms (MMEngine randomness.deterministic, "
                             "CUBLAS_WORKSPACE_CONFIG=:4096:8), the default on GPUs: the resumed iterations are then "
                             "compared exactly; without it nondeterministic backward kernels (atomics) make any two "
                             "runs drift apart after the first step (the scaling check never uses it)")
    args = parser.parse_args(argv)
    checks = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(checks) - set(ALL_CHECKS))
    if unknown:
        parser.error(f"--only: unknown checks {unknown}; choose from {list(ALL_CHECKS)}")
    import torch

    if not args.cpu and torch.cuda.device_count() < (args.gpus if set(checks) - {"single"} else 1):
        print(f"{PROG} gpu: {torch.cuda.device_count()} GPU(s) visible, the checks {checks} need {args.gpus}; "
              "use --gpus N, --only single, or --cpu.", file=sys.stderr)
        return 2
    preset = "tiny" if args.cpu else args.preset
    config = args.config or CONFIG_DIR / ("check_tiny_cpu.py" if args.cpu else f"gpu_smoke_{args.preset}.py")
    parity_rel = args.parity_rel if args.parity_rel is not None else (2e-5 if args.cpu else 2e-2)
    resume_rel = args.resume_rel if args.resume_rel is not None else 0.0
    deepspeed = str(CONFIG_DIR / "deepspeed_zero2_cpu.json") if args.cpu else "deepspeed_zero2"
    deterministic = not args.cpu if args.deterministic is None else args.deterministic
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with judge_stub_server() as judge_url:
        env = {**os.environ, "JUDGE_BASE_URL": judge_url, "JUDGE_MODEL": "stub", "PYTHONUNBUFFERED": "1",
               "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "stub")}
        if deterministic:
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        launcher = Launcher(config, args.work_dir, env, args.cpu, args.iters, deterministic)
        for check in checks:
            print(f"{PROG} gpu: {check} ...", flush=True)
            if check == "single":
                rows.append(train_check(launcher, "single", 1, None))
            elif check == "ddp":
                rows.append(train_check(launcher, "ddp", args.gpus, None))
            elif check == "zero2":
                rows.append(train_check(launcher, "zero2", args.gpus, deepspeed))
            elif check == "parity":
                rows.append(parity_check(args.work_dir, env, preset, args.gpus, args.cpu, parity_rel))
            elif check == "resume":  # each training check of this invocation
                for of, nproc, of_deepspeed in (("single", 1, None), ("ddp", args.gpus, None),
                                                ("zero2", args.gpus, deepspeed)):
                    if of in checks:
                        rows.append(resume_check(launcher, of, nproc, of_deepspeed, resume_rel))
            elif check == "scaling":
                from mmengine.config import Config

                cfg = Config.fromfile(str(config))
                scaling = Launcher(config, args.work_dir, env, args.cpu, 5)  # speed: never deterministic
                rows += scaling_check(scaling, args.gpus, cfg.train_dataloader.batch_size,
                                      cfg.train_cfg.algorithm.config.num_generations)
            print(json.dumps(rows[-1], default=str)[:400], flush=True)
    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    result = {"device": device, "config": str(config), "preset": preset, "rows": rows, "deterministic": deterministic,
              "tolerances": {"parity_rel": parity_rel, "resume_rel": resume_rel}}
    (args.work_dir / "check.json").write_text(json.dumps(result, indent=1, default=str))
    print_table(rows)
    print(f"\n{device}; JSON: {args.work_dir / 'check.json'}; logs: {args.work_dir}/<check>.log")
    return 0 if all(row["ok"] for row in rows) else 1


COMMANDS = {"gpu": (f"{PACKAGE}.cli.check", "check an install on a GPU host: every launch path, parity, resume")}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gpu"]:
        return gpu(argv[1:])
    from .main import run_command

    return run_command(COMMANDS, argv, PROG, "Install checks.")


if __name__ == "__main__":
    sys.exit(main())

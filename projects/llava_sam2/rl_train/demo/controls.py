"""Controls and the multi-seed study of the demo, so that a gain means something (issue #6, item 3).

    sa2va-rl demo-controls --work-dir work_dirs/demo_controls [--seeds 0 1 2] [demo settings ...]

1. Seeds: the whole demo pipeline (``sa2va-rl demo``) once per seed in ``WORK_DIR/seed<k>``: SFT-only (control a)
   against SFT + GRPO, on the same held-out split.
2. Controls, each started from seed ``--seeds[0]``'s SFT checkpoint, trained, exported and evaluated on the same
   split (``WORK_DIR/seed<k>/controls/<name>``):

   * ``sft_more``      (b) SFT continued for the CPU time of the RL run, instead of RL (same trainable set as RL);
   * ``loop1_only``    (c) GRPO with loop 2 switched off (``caption_to_mask_weight=0``);
   * ``loop2_only``    (c) GRPO with loop 1 switched off (``mask_to_caption_weight=0``);
   * ``mask_<policy>`` (d) GRPO with each loop-2 mask policy (the demo's default policy is the main RL run).

3. ``WORK_DIR/report.md``: every system against SFT-only (paired bootstrap CIs, figures), the training-reward
   curves of the mask policies, the per-seed goal table and the caption-drift check.

Finished steps are skipped when run again (same bookkeeping as the demo). Takes longer than the demo itself:
about (1 + number of controls / 2) demo runs of CPU time on 2 cores.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from projects.llava_sam2.rl_train.cli.settings import settings_from_args
from projects.llava_sam2.rl_train.demo.jobs import Job, JobError, run_jobs
from projects.llava_sam2.rl_train.demo.pipeline import (
    CONFIG_DIR, SYSTEMS, DemoSettings, banner, build_parser, eval_command, is_finished, read_stages, rl_options,
    run_demo, schedule_options, subprocess_env, train_and_export, write_marker)

PROG = "sa2va-rl demo-controls"

MASK_POLICIES = ("bernoulli", "gaussian_seg", "multimask")
SFT_CONTINUE_CONFIG = str(CONFIG_DIR / "sft_continue_shapes_cpu.py")


def default_mask_policy(s: DemoSettings) -> str:
    from mmengine.config import Config

    return Config.fromfile(s.rl_config).train_cfg.algorithm.config.mask_policy


def sft_more_iters(s: DemoSettings) -> int:
    """Iterations of continued SFT that cost the RL run's CPU time (from the seed's stage records)."""
    stages = read_stages(s)
    sft_train, rl_train = stages["sft"]["commands"][0], stages["rl"]["commands"][0]
    per_iter = sft_train["cpu_s"] / _last_iter(s.path("sft"))
    return max(2, round(rl_train["cpu_s"] / per_iter))


def _last_iter(work_dir: Path) -> int:
    """The iteration number of ``work_dir``'s last checkpoint (``iter_<n>.pth``)."""
    name = Path((work_dir / "last_checkpoint").read_text().strip()).stem
    return int(name.split("_")[-1])


def control_specs(s: DemoSettings) -> dict[str, tuple[str, list[str]]]:
    """name -> (config, --cfg-options) of every control run on seed ``s.seed``'s SFT checkpoint."""
    base = rl_options(s)
    algo = "train_cfg.algorithm.config"
    specs = {
        "sft_more": (SFT_CONTINUE_CONFIG, [
            f"randomness.seed={s.seed}", f"model.pretrained_path={s.path('sft/hf')}",
            f"train_dataloader.dataset.pretrained_path={s.path('sft/hf')}",
            f"train_dataloader.dataset.region_dataset.ann_file={s.path('data/train/annotations.json')}",
            *schedule_options(sft_more_iters(s))]),
        "loop1_only": (s.rl_config, [*base, f"{algo}.caption_to_mask_weight=0.0"]),
        "loop2_only": (s.rl_config, [*base, f"{algo}.mask_to_caption_weight=0.0"]),
    }
    default = default_mask_policy(s)
    for policy in MASK_POLICIES:
        if policy != default:
            specs[f"mask_{policy}"] = (s.rl_config, [*base, f"{algo}.mask_policy={policy}"])
    return specs


def control_fingerprint(s: DemoSettings, config: str, options: list[str]) -> str:
    """A control is redone when its config, options or the SFT run it starts from change."""
    values = json.dumps({"config": config, "options": options, "sft": s.fingerprint("sft"),
                         "eval": s.fingerprint("eval_sft")}, sort_keys=True)
    return hashlib.sha1(values.encode()).hexdigest()[:12]


def control_label(name: str, default_policy: str) -> str:
    labels = {"sft_more": "SFT + more SFT (RL's CPU time)", "loop1_only": "GRPO loop 1 only",
              "loop2_only": "GRPO loop 2 only"}
    return labels.get(name, f"GRPO, mask policy {name.removeprefix('mask_')}")


def run_controls(s: DemoSettings, force: bool = False) -> dict[str, str]:
    """Train + export + evaluate every control (two at a time); returns label -> evaluation directory."""
    default = default_mask_policy(s)
    jobs, runs, prints = [], {}, {}
    for name, (config, options) in control_specs(s).items():
        key = f"controls/{name}"
        runs[control_label(name, default)] = str(s.path("eval", key))
        prints[name] = control_fingerprint(s, config, options)
        if not force and is_finished(s, f"control_{name}", prints[name]):
            print(f"-- control {name}: finished earlier, skipped")
            continue
        jobs.append(Job(name, [*train_and_export(s, key, config, options),
                               eval_command(s, key, control_label(name, default))]))
    for start in range(0, len(jobs), 2):  # one core each
        pair = jobs[start:start + 2]
        banner("controls: " + " + ".join(job.name for job in pair))
        run_jobs(pair, env=subprocess_env())
        for job in pair:
            write_marker(s, f"control_{job.name}", {"commands": job.seconds,
                                                     "cpu_s": round(sum(c["cpu_s"] for c in job.seconds), 1)},
                         prints[job.name])
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(PROG, __doc__.splitlines()[0])
    parser.set_defaults(work_dir="work_dirs/demo_controls")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="demo seeds; the controls start from the first seed's SFT checkpoint")
    args = parser.parse_args(argv)
    seeds, root = args.seeds, Path(args.work_dir).resolve()
    settings = settings_from_args(DemoSettings, args, work_dir=root)
    per_seed = {seed: DemoSettings(**{**settings.__dict__, "work_dir": root / f"seed{seed}", "seed": seed})
                for seed in seeds}
    try:
        for seed, s in per_seed.items():
            banner(f"seed {seed}: the demo pipeline")
            run_demo(s, force=args.force)
        runs = {SYSTEMS["sft"]: str(per_seed[seeds[0]].path("eval/sft")),
                SYSTEMS["rl"]: str(per_seed[seeds[0]].path("eval/rl"))}
        runs.update(run_controls(per_seed[seeds[0]], force=args.force))
    except JobError as error:
        print(f"\ncontrols FAILED: {error}", file=sys.stderr)
        return error.returncode
    from projects.llava_sam2.rl_train.demo.controls_report import write_controls_report

    write_controls_report(root, runs, per_seed, policy_runs={
        p: per_seed[seeds[0]].path("rl" if p == default_mask_policy(settings) else f"controls/mask_{p}")
        for p in MASK_POLICIES})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Controls and the multi-seed study of the demo, so that a gain means something.

    sa2va-rl demo-controls --work-dir work_dirs/demo_controls [--seeds 0 1 2] [--every-seed loop1_only] \\
        [--controls NAME ...] [demo settings ...]

1. Seeds: the demo pipeline (``sa2va-rl demo``) once per seed in ``WORK_DIR/seed<k>``: the starting model (control
   a: the committed pretrained tiny Sa2VA, evaluated once, it has no seed) against it + GRPO, on the same held-out
   split, with the text-dependence measure of both.
2. Controls, each started from the same checkpoint as the demo's GRPO run, trained, exported and evaluated on the
   same split (``WORK_DIR/seed<k>/controls/<name>``; :func:`control_specs`):

   * ``sft_more``       (b) SFT (``sft_shapes_cpu.py``, the GRPO run's trainable set and step size) for the
                        iteration time of the GRPO run, instead of GRPO, on the paired training scenes of the demo's
                        domain: in the domain demo this is the **oracle** (paired target data, which GRPO never sees);
   * ``source_sft``     the same SFT for the same iterations on paired *source* scenes (the data the starting model was
                        pretrained on; only when the demo adapts to a target domain): what equal compute buys without
                        target data;
   * ``loop1_only``     (c) GRPO with loop 2 switched off (``caption_to_mask_weight=0``): it can change the model
                        only through its captions, so its effect shows in the caption-driven cycle IoU and in
                        caption METEOR vs GT;
   * ``loop2_only``     (c) GRPO with loop 1 switched off (``mask_to_caption_weight=0``);
   * ``mask_<variant>`` (d) GRPO with each loop-2 mask action of MASK_VARIANTS that differs from the config's;
   * ``kl_on`` / ``kl_off`` (e) GRPO with the KL term switched on (beta = KL_BETA) or off, whichever the config
                        does not do.

   Controls named in ``--every-seed`` run on every seed, the others on the first seed only.
3. ``WORK_DIR/report.md`` (controls_report.py): the per-seed goal table, the controls against the starting model
   (paired bootstrap CIs), loop 1 alone per seed, the text-dependence changes, the training-reward curves of the
   mask variants and the CPU seconds of every run.

``--video``: the video demo (demo/video.py) once per seed, then ``WORK_DIR/report.md`` with the table of every seed's
paired differences and their mean ± std; the video demo has no controls (GRPO is compared with the start model).

Finished steps are skipped when run again (same bookkeeping as the demo). Cost: one GRPO run + one evaluation per
control and seed, ``--jobs`` processes at a time (default 2).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from projects.llava_sam2.rl_train.cli.settings import settings_from_args
from projects.llava_sam2.rl_train.demo.controls_report import write_controls_report
from projects.llava_sam2.rl_train.demo.jobs import Job, JobError, run_jobs
from projects.llava_sam2.rl_train.demo.pipeline import (
    DemoSettings, banner, build_parser, eval_command, is_finished, read_stages, rl_options, run_demo, sft_options,
    subprocess_env, text_command, train_and_export, write_marker)
from projects.llava_sam2.rl_train.demo.summary import KL_BETA, control_label

PROG = "sa2va-rl demo-controls"
ALGO = "train_cfg.algorithm.config"
# loop-2 mask actions compared in control (d): name -> GRPOConfig values (grpo/mask_policy.py, grpo/losses.py;
# docs/mask_action.md); the one the config already uses is the demo's own run and is not repeated. ``bernoulli`` is
# the demo's earlier action as it was measured: pooled 4 x 4 cells with one ratio per cell.
MASK_VARIANTS = {
    "region": {"mask_policy": "region", "mask_importance_sampling_level": "sequence", "mask_length_norm": "sqrt"},
    "bernoulli": {"mask_policy": "bernoulli", "mask_importance_sampling_level": "token"},
    "gaussian_seg": {"mask_policy": "gaussian_seg"},
    "multimask": {"mask_policy": "multimask"},
}
SOURCE_TRAIN = "data/source_train"  # paired source-domain scenes of control source_sft (written when needed)
SFT_PROBE_ITERS = 20  # iterations of the SFT run that measures SFT's time per iteration for control (b)


def algorithm_config(s: DemoSettings) -> dict:
    """The GRPO config's ``train_cfg.algorithm.config`` with the demo's --rl-options applied."""
    from mmengine.config import Config

    cfg = Config.fromfile(s.rl_config)
    options = [o for o in s.rl_options if o.startswith(ALGO + ".")]
    if options:
        cfg.merge_from_dict(_parse_options(options))
    return dict(cfg.train_cfg.algorithm.config)


def _parse_options(options: list[str]) -> dict:
    """``key=value`` --cfg-options as ``sa2va-rl train`` reads them (MMEngine's DictAction on an argparse option)."""
    import argparse

    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default={})
    return parser.parse_args(["--cfg-options", *options]).cfg_options if options else {}


def mask_variant_name(config: dict) -> str | None:
    """The MASK_VARIANTS entry the GRPO config matches, None when it matches none."""
    for name, values in MASK_VARIANTS.items():
        if all(config.get(k) == v for k, v in values.items()):
            return name
    return None


def control_specs(s: DemoSettings, sft_iters: int | None = None) -> dict[str, tuple[str, list[str]]]:
    """name -> (config, --cfg-options) of every control on seed ``s.seed`` (``sft_iters``: control (b)'s length;
    None leaves it out)."""
    base, config = rl_options(s), algorithm_config(s)
    specs = {}
    if sft_iters is not None:
        specs["sft_more"] = (s.sft_config, sft_options(s, start=s.rl_start, iters=sft_iters))
        if s.world["domain"] == "target":
            specs["source_sft"] = (s.sft_config, sft_options(s, start=s.rl_start, iters=sft_iters,
                                                             data=SOURCE_TRAIN))
    specs["loop1_only"] = (s.rl_config, [*base, f"{ALGO}.caption_to_mask_weight=0.0"])
    specs["loop2_only"] = (s.rl_config, [*base, f"{ALGO}.mask_to_caption_weight=0.0"])
    default = mask_variant_name(config)
    for name, values in MASK_VARIANTS.items():
        if name != default:
            specs[f"mask_{name}"] = (s.rl_config, [*base, *(f"{ALGO}.{k}={v}" for k, v in values.items())])
    kl = "kl_off" if config.get("beta", 0.0) > 0 else "kl_on"
    specs[kl] = (s.rl_config, [*base, f"{ALGO}.beta={0.0 if kl == 'kl_off' else KL_BETA}"])
    return specs


def control_fingerprint(s: DemoSettings, config: str, options: list[str]) -> str:
    """A control is redone when its config, options, the run it starts from or the evaluation settings change."""
    values = json.dumps({"config": config, "options": options, "sft": s.fingerprint("sft"),
                         "eval": s.fingerprint("eval_base")}, sort_keys=True)
    return hashlib.sha1(values.encode()).hexdigest()[:12]


def _iteration_seconds(work_dir: Path) -> list[float]:
    """MMEngine's per-iteration ``time`` (seconds, startup excluded) of a training run."""
    from projects.llava_sam2.rl_train.evaluation.plots import find_scalars, read_scalars

    return [float(row["time"]) for row in read_scalars(find_scalars(str(work_dir))) if "time" in row]


def sft_more_iters(s: DemoSettings) -> int:
    """Iterations of SFT that take the GRPO run's training time: Σ GRPO iteration times / mean SFT iteration time,
    the latter from a probe run of SFT_PROBE_ITERS iterations (its first 2 left out: warm-up)."""
    probe = s.path("controls/sft_probe")
    # every iteration logged (the SFT config logs every 10th: 2 rows of 20, none left after the warm-up)
    options = [*sft_options(s, start=s.rl_start, iters=SFT_PROBE_ITERS), "default_hooks.logger.interval=1"]
    if not is_finished(s, "control_sft_probe", control_fingerprint(s, s.sft_config, options)):
        job = Job("sft_probe", train_and_export(s, "controls/sft_probe", s.sft_config, options)[:1])
        run_jobs([job], env=subprocess_env())
        write_marker(s, "control_sft_probe", {"commands": job.seconds}, control_fingerprint(s, s.sft_config, options))
    sft = _iteration_seconds(probe)[2:]
    rl = _iteration_seconds(s.path("rl"))
    if not sft or not rl:
        raise RuntimeError(f"control sft_more: no per-iteration times to compare (SFT probe {probe}: {len(sft)} "
                           f"after the warm-up, GRPO run {s.path('rl')}: {len(rl)}); check their logger interval")
    return max(2, round(sum(rl) / (sum(sft) / len(sft))))


def write_source_train(s: DemoSettings) -> None:
    """The paired source-domain training scenes of control ``source_sft`` (same split, seed and count as the demo's
    ``train``), written once."""
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

    inputs = {"train_samples": s.train_samples, "data_seed": s.data_seed, "image_size": s.image_size}
    fingerprint = hashlib.sha1(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
    if is_finished(s, "control_source_train", fingerprint):
        return
    world = ShapesWorld("train", s.train_samples, s.data_seed, image_size=s.image_size)
    world.write_coco(str(s.path(SOURCE_TRAIN)), all_objects=s.all_objects)
    write_marker(s, "control_source_train", {"scenes": s.train_samples}, fingerprint)


def control_job(s: DemoSettings, name: str, config: str, options: list[str]) -> Job:
    """Train + export + evaluate (+ text dependence) one control."""
    key = f"controls/{name}"
    checkpoint = str(s.path(key, "hf"))
    return Job(name, [*train_and_export(s, key, config, options), eval_command(s, checkpoint, key, control_label(name)),
                      *text_command(s, checkpoint, key)])


def run_controls(s: DemoSettings, names: list[str], force: bool = False, jobs_at_once: int = 2) -> dict[str, Path]:
    """Train, export and evaluate the controls ``names`` on seed ``s.seed`` (``jobs_at_once`` at a time, one core
    each); returns name -> its evaluation directory."""
    sft_iters = sft_more_iters(s) if {"sft_more", "source_sft"} & set(names) else None
    if "source_sft" in names:
        write_source_train(s)
    specs = {n: spec for n, spec in control_specs(s, sft_iters).items() if n in names}
    jobs, prints = [], {}
    for name, (config, options) in specs.items():
        prints[name] = control_fingerprint(s, config, options)
        if not force and is_finished(s, f"control_{name}", prints[name]):
            print(f"-- seed {s.seed} control {name}: finished earlier, skipped")
            continue
        jobs.append(control_job(s, name, config, options))
    for start in range(0, len(jobs), jobs_at_once):
        batch = jobs[start:start + jobs_at_once]
        banner(f"seed {s.seed} controls: " + " + ".join(job.name for job in batch))
        run_jobs(batch, env=subprocess_env())
        for job in batch:
            write_marker(s, f"control_{job.name}", {"commands": job.seconds,
                                                     "cpu_s": round(sum(c["cpu_s"] for c in job.seconds), 1)},
                         prints[job.name])
    return {name: s.path("eval", "controls", name) for name in specs}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(PROG, __doc__.splitlines()[0])
    parser.set_defaults(work_dir="work_dirs/demo_controls")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="demo seeds")
    parser.add_argument("--controls", nargs="*", default=None,
                        help="controls to run (default: all of control_specs; none: only the seeds)")
    parser.add_argument("--every-seed", nargs="*", default=["loop1_only"],
                        help="controls run on every seed (the others on the first seed only)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="controls trained side by side, one process (one core) each")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: write the report from the evaluations already on disk (e.g. after per-seed "
                             "runs side by side)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs}; at least 1 control must run at a time")
    seeds, root = args.seeds, Path(args.work_dir).resolve()
    settings = settings_from_args(DemoSettings, args, work_dir=root)
    per_seed = {seed: DemoSettings(**{**settings.__dict__, "work_dir": root / f"seed{seed}", "seed": seed})
                for seed in seeds}
    first = per_seed[seeds[0]]
    if settings.video:
        return video_seeds(root, per_seed, args, parser)
    names = list(control_specs(first, 0)) if args.controls is None else list(args.controls)
    unknown = sorted(set(names) - set(control_specs(first, 0)))
    if unknown:
        parser.error(f"--controls: unknown {unknown}; choose from {sorted(control_specs(first, 0))}")
    controls: dict[int, dict[str, Path]] = {}
    if args.report_only:
        return write_report_only(root, per_seed, names, args.every_seed, seeds[0], first)
    try:
        for seed, s in per_seed.items():
            banner(f"seed {seed}: the demo pipeline")
            run_demo(s, force=args.force)
        for seed, s in per_seed.items():
            wanted = names if seed == seeds[0] else [n for n in names if n in args.every_seed]
            controls[seed] = run_controls(s, wanted, force=args.force, jobs_at_once=args.jobs) if wanted else {}
    except JobError as error:
        print(f"\ncontrols FAILED: {error}", file=sys.stderr)
        return error.returncode
    write_controls_report(root, per_seed, controls, default_variant=mask_variant_name(algorithm_config(first)))
    return 0


def video_seeds(root: Path, per_seed: dict, args, parser) -> int:
    """``--video``: the video demo once per seed and the seed table (no controls: the video demo compares GRPO with
    the start model only)."""
    from projects.llava_sam2.rl_train.demo.video import write_seeds_report

    if args.controls:
        parser.error(f"--controls {' '.join(args.controls)}: the video demo has no controls; leave --controls out")
    if not args.report_only:
        try:
            for seed, s in per_seed.items():
                banner(f"seed {seed}: the video demo pipeline")
                run_demo(s, force=args.force)
        except JobError as error:
            print(f"\nvideo seeds FAILED: {error}", file=sys.stderr)
            return error.returncode
    write_seeds_report(root, {seed: s.work_dir for seed, s in per_seed.items()})
    return 0


def write_report_only(root: Path, per_seed: dict, names: list[str], every_seed: list[str], first_seed: int,
                      first: DemoSettings) -> int:
    """The report of runs already on disk: each seed's evaluations and the controls whose evaluation exists."""
    missing = [str(s.path("eval", key)) for s in per_seed.values() for key in ("base", "rl")
               if not (s.path("eval", key) / "metrics.json").is_file()]
    if missing:
        print(f"controls --report-only: no evaluation in {missing[:3]}; run the seeds first", file=sys.stderr)
        return 1
    controls = {seed: {name: s.path("eval", "controls", name)
                       for name in (names if seed == first_seed else [n for n in names if n in every_seed])
                       if (s.path("eval", "controls", name) / "metrics.json").is_file()}
                for seed, s in per_seed.items()}
    write_controls_report(root, per_seed, controls, default_variant=mask_variant_name(algorithm_config(first)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The embedded demo: the pretrained tiny Sa2VA -> dual-loop GRPO -> held-out evaluation -> report, on a CPU.

By default the demo is a domain adaptation: the committed tiny Sa2VA was pretrained on the source shapes
world; GRPO adapts it to the target domain (``--target-shift``: the same scenes and vocabulary with shifted pixels,
data/shapes.py ``DomainShift``) from unpaired target data only (loop 1: regions without text; loop 2: texts
without masks, on other images), and every evaluation scores the target domain's held-out ``--eval-split``
(``test`` for reporting; ``val`` while choosing settings). ``--target-shift 0 --rl-data paired`` is the same-domain
demo of earlier sessions (paired source data, ``grpo_shapes_cpu.py``). ``--video`` runs the same pipeline on moving
shapes clips (demo/video.py: the data, config, start checkpoint, evaluation tasks and report of the video demo).

    sa2va-rl demo --work-dir work_dirs/demo            # what `make demo` runs
    sa2va-rl demo --work-dir work_dirs/demo --force    # run every stage again
    sa2va-rl demo --help                               # every setting (DemoSettings)

The demo starts, as a user starts from a released Sa2VA, from the committed text-aware tiny Sa2VA
(``assets/tiny_shapes_pretrained``, built by ``sa2va-rl pretrain-tiny``). Stages (each one function; a finished stage
leaves ``WORK_DIR/stages/<stage>.json`` and is skipped when the demo runs again with the same settings, so an
interrupted demo resumes at the stage it was in):

1. ``data``      the procedural shapes world, written as COCO-style files, so training and evaluation go through the
                 real-data loader (``CocoRegionDataset``): ``train`` (paired, the SFT data), ``rl_regions`` +
                 ``rl_texts`` (the two unpaired halves of the training scenes) and ``eval`` (the held-out split);
2. ``sft``       optional (``--sft-iters N``, off by default): ``sa2va-rl train configs/rl/demo/sft_shapes_cpu.py``
                 from the starting checkpoint, then ``sa2va-rl export`` -> ``WORK_DIR/sft/hf``;
3. ``rl``        ``sa2va-rl train configs/rl/demo/grpo_shapes_cpu.py`` (GRPOLoop, both cycle loops) from the
                 starting checkpoint (or the SFT export), then export -> ``WORK_DIR/rl/hf``; alongside it, on the
                 other core,
   ``eval_base`` ``sa2va-rl evaluate`` + the text-dependence measure of the model GRPO starts from;
4. ``eval_rl``   ``sa2va-rl evaluate`` of the RL result on the same samples, and beside it
   ``text_rl``   its text-dependence measure on the same scenes;
5. ``report``    ``WORK_DIR/report.md`` + PNGs (reward curves per loop, before/after examples) and the summary.

Every command runs as a subprocess through the project's CLI (``python -m projects.llava_sam2.rl_train.cli``), so a
failure stops the demo with that command's exit code and the tail of its log (all logs: ``WORK_DIR/logs/``). The
configs are read from the checkout this package lives in (``projects/llava_sam2/configs/rl/demo``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from projects.llava_sam2.rl_train.cli.settings import add_settings_arguments, settings_from_args
from projects.llava_sam2.rl_train.demo.jobs import TQDM_PROGRESS, TRAIN_PROGRESS, Command, Job, JobError, run_jobs

PROG = "sa2va-rl demo"
REPO_ROOT = Path(__file__).resolve().parents[4]  # the checkout: projects/llava_sam2/rl_train/demo/pipeline.py
CLI = ("-m", "projects.llava_sam2.rl_train.cli")  # `sa2va-rl` without the console script
TEXT_DEPENDENCE = ("-m", "projects.llava_sam2.rl_train.evaluation.text_dependence")
CONFIG_DIR = REPO_ROOT / "projects/llava_sam2/configs/rl/demo"
PRETRAINED = REPO_ROOT / "projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained"
VIDEO_PRETRAINED = REPO_ROOT / "projects/llava_sam2/rl_train/assets/tiny_video_pretrained"
VIDEO_CONFIG = "grpo_shapes_video_cpu.py"  # the video demo's GRPO (unpaired SA-V masklets + MeViS texts)
VIDEO_FIELDS = ("video", "num_frames", "video_mllm_frames")
# mode-dependent defaults of the fields left at 0: (images, video)
MODE_DEFAULTS = {"train_samples": (2000, 80), "val_samples": (200, 48)}
LISTENER = ("-m", "projects.llava_sam2.rl_train.evaluation.listener")
RL_DATA = {"unpaired": "grpo_shapes_unpaired_cpu.py", "paired": "grpo_shapes_cpu.py"}  # --rl-data -> its config
# stages of a row run side by side, one process (core) each
PIPELINE = (("data",), ("sft",), ("rl", "eval_base"), ("eval_rl", "text_rl"), ("report",))
_EVAL = ("val_samples", "eval_batch_size", "eval_max_new_tokens", "text_scenes", "listener_checkpoint",
         "video_mllm_frames")
# stage -> (settings it reads, stages it starts from): a finished stage is redone when its fingerprint changes
STAGE_INPUTS = {
    "data": (("data_seed", "train_samples", "val_samples", "image_size", "all_objects", "rl_train_samples",
              "target_shift", "rl_data", "eval_split", "video", "num_frames"), ()),
    "sft": (("seed", "start_checkpoint", "sft_config", "sft_iters", "sft_options"), ("data",)),
    "rl": (("seed", "rl_config", "rl_iters", "rl_options", "video_mllm_frames"), ("sft", "data")),
    "eval_base": (_EVAL, ("sft", "data")),
    "eval_rl": (_EVAL, ("rl",)),
    "text_rl": (_EVAL, ("rl",)),
    "report": (("num_examples",), ("eval_base", "eval_rl", "text_rl")),
}


def check_video_settings(s) -> None:
    """The settings the video demo cannot honour raise, saying what to change."""
    problems = [message for broken, message in (
        (s.rl_data != "unpaired", f"rl_data={s.rl_data!r}: the video demo trains on unpaired clips only"),
        (s.sft_iters != 0, f"sft_iters={s.sft_iters}: the demo SFT config is image-only; use 0"),
        (s.all_objects, "all_objects: the video writers annotate the target of each clip; leave it off"),
        (s.num_frames < 1 or not 1 <= s.video_mllm_frames <= s.num_frames,
         f"need 1 <= video_mllm_frames ({s.video_mllm_frames}) <= num_frames ({s.num_frames})")) if broken]
    if problems:
        raise ValueError("demo --video: " + "; ".join(problems))


@dataclass
class DemoSettings:
    """What the demo runs; a finished stage stays valid while the fields it reads are unchanged (STAGE_INPUTS)."""

    work_dir: Path
    video: bool = False
    """the video demo (demo/video.py): moving shapes clips; loop 1 on SA-V-layout masklets without text, loop 2 on
    MeViS-layout expressions without masks, evaluation on held-out MeViS-layout clips (video cycle tasks, J&F)."""
    num_frames: int = 6
    """video demo: frames per clip (every frame goes to SAM2)."""
    video_mllm_frames: int = 3
    """video demo: frames of each clip the language model sees, in GRPO and in the evaluation (upstream: 5)."""
    seed: int = 0
    """training seed: LoRA init, data order, RL sampling (the data and the held-out split stay the same)."""
    data_seed: int = 0
    """shapes-world seed of the train and held-out splits."""
    target_shift: float = 1.0
    """pixel-shift strength of the target domain the demo adapts to (data/shapes.py DomainShift; chosen on the val
    split, docs/demo.md); 0 = the source domain itself (the same-domain demo of earlier sessions)."""
    rl_data: str = "unpaired"
    """GRPO's data: 'unpaired' (loop 1 on region-only scenes, loop 2 on text-only scenes: the two halves of the
    training scenes) or 'paired' (every training scene with its mask and texts)."""
    eval_split: str = "test"
    """held-out split every evaluation scores: 'test' (reporting) or 'val' (choosing settings)."""
    train_samples: int = 0
    """training scenes (GRPO prompts, and SFT items when --sft-iters > 0); 0: 2000 (images) or 80 clips (video)."""
    val_samples: int = 0
    """held-out scenes (of --eval-split) scored by every evaluation task; 0: 200 (images; >= 200 for the bootstrap
    CIs) or 48 clips (video: its evaluation costs ~2 s of CPU per clip and system)."""
    image_size: int = 128
    """side of the shapes images (video: frames) in pixels."""
    all_objects: bool = False
    """annotate every object of a training scene (RefCOCO-style), not only its target."""
    rl_train_samples: int = 0
    """RL prompts: the first N training scenes (written as ``data/rl_train``); 0 = all training scenes."""
    start_checkpoint: str = ""
    """HF-layout Sa2VA checkpoint (with its tokenizer) the demo starts from; empty: the committed text-aware tiny model
    (video: the video-pretrained one, assets/tiny_video_pretrained)."""
    sft_config: str = str(CONFIG_DIR / "sft_shapes_cpu.py")
    """SFT config of the optional sft stage."""
    rl_config: str = ""
    """GRPO config (stage rl); empty: grpo_shapes_unpaired_cpu.py for --rl-data unpaired, grpo_shapes_cpu.py for
    paired, grpo_shapes_video_cpu.py for --video."""
    sft_iters: int = 0
    """SFT iterations on the demo task before GRPO; 0 = no SFT, GRPO starts from start_checkpoint (docs/demo.md: a
    short SFT did not help)."""
    rl_iters: int = 0
    """GRPO iterations; 0 keeps the config's."""
    sft_options: list[str] = field(default_factory=list)
    """extra --cfg-options of the SFT run (e.g. optim_wrapper.optimizer.lr=1e-4)."""
    rl_options: list[str] = field(default_factory=list)
    """extra --cfg-options of the RL run."""
    eval_batch_size: int = 16
    """held-out samples per evaluation batch."""
    eval_max_new_tokens: int = 24
    """longest generated answer in the evaluation."""
    text_scenes: int = 200
    """held-out scenes with >= 2 objects of the text-dependence measure (evaluation/text_dependence.py) and of
    listener accuracy (evaluation/listener.py); 0 skips both."""
    listener_checkpoint: str = str(PRETRAINED)
    """the frozen listener of listener accuracy (the starting model, never trained)."""
    num_examples: int = 4
    """held-out samples per before/after example figure."""

    def __post_init__(self):
        for name, defaults in MODE_DEFAULTS.items():
            if not getattr(self, name):
                setattr(self, name, defaults[self.video])
        if not self.start_checkpoint:
            self.start_checkpoint = str(VIDEO_PRETRAINED if self.video else PRETRAINED)
        if self.video:
            check_video_settings(self)
        if self.rl_data not in RL_DATA:
            raise ValueError(f"demo: rl_data={self.rl_data!r}; use one of {RL_DATA}")
        if self.eval_split not in ("val", "test"):
            raise ValueError(f"demo: eval_split={self.eval_split!r}; use 'val' (choosing settings) or 'test'")
        if self.target_shift < 0:
            raise ValueError(f"demo: target_shift={self.target_shift} must be >= 0")
        if self.rl_data == "unpaired" and self.rl_train_samples > self.train_samples:
            raise ValueError(f"demo: rl_train_samples={self.rl_train_samples} > train_samples={self.train_samples}; "
                             "the unpaired RL sets reuse the training scenes' images")
        if not self.rl_config:
            self.rl_config = str(CONFIG_DIR / (VIDEO_CONFIG if self.video else RL_DATA[self.rl_data]))

    @property
    def world(self) -> dict:
        """ShapesWorld keywords of the demo's domain (source when target_shift is 0)."""
        if self.target_shift == 0:
            return {"domain": "source"}
        return {"domain": "target", "shift": self.target_shift}

    def fingerprint(self, stage: str) -> str:
        """Hash of the settings ``stage`` depends on, through its upstream stages (STAGE_INPUTS)."""
        fields, upstream = STAGE_INPUTS[stage]
        if stage == "sft" and not self.sft_iters:  # no training: only the checkpoint matters, not the seed
            fields = ("start_checkpoint", "sft_iters")
        # the video fields count only in video mode, so image runs keep the fingerprints they were recorded with
        values = {k: str(getattr(self, k)) for k in fields if self.video or k not in VIDEO_FIELDS}
        values.update({f"<{u}>": self.fingerprint(u) for u in upstream})
        return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]

    def path(self, *parts: str) -> Path:
        return self.work_dir.joinpath(*parts)

    @property
    def rl_start(self) -> str:
        """The checkpoint GRPO starts from (and the baseline it is compared with)."""
        return str(self.path("sft/hf")) if self.sft_iters else self.start_checkpoint

    @property
    def systems(self) -> dict[str, str]:
        """Report names of the two evaluated systems: eval key -> name."""
        base = "pretrained + SFT" if self.sft_iters else "pretrained"
        return {"base": base, "rl": f"{base} + GRPO"}


# ---- stages ----------------------------------------------------------------------------------------------------


def stage_data(s: DemoSettings) -> dict:
    """Write the demo's domain as ``annotations.json`` + PNGs: the paired training scenes (``train``), the held-out
    split (``eval``) and the RL prompts: the two unpaired halves of the RL scenes (``rl_regions``: masks only;
    ``rl_texts``: captions and expressions only; their images are ``train``'s) or, paired, the first
    ``rl_train_samples`` training scenes (``rl_train``)."""
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

    if s.video:
        from projects.llava_sam2.rl_train.demo.video import stage_data_video

        return stage_data_video(s)
    files = {}
    splits = [("train", "train", s.train_samples, 0, "paired", s.all_objects, True),
              ("eval", s.eval_split, s.val_samples, 0, "paired", False, True)]
    rl_scenes = s.rl_train_samples or s.train_samples
    if s.rl_data == "unpaired":  # disjoint halves of the RL scenes: no image has both a region and a text
        half = rl_scenes // 2
        splits += [("rl_regions", "train", half, 0, "regions", s.all_objects, False),
                   ("rl_texts", "train", rl_scenes - half, half, "texts", s.all_objects, False)]
    elif s.rl_train_samples:  # the first scenes of the train split (same seed, same scenes)
        splits.append(("rl_train", "train", s.rl_train_samples, 0, "paired", s.all_objects, True))
    for name, split, count, start, keep, all_objects, write_images in splits:
        world = ShapesWorld(split, count, s.data_seed, image_size=s.image_size, start=start, **s.world)
        files[name] = world.write_coco(str(s.path("data", name)), all_objects=all_objects, keep=keep,
                                       write_images=write_images)
        print(f"  {name}: {count} {s.world['domain']} scenes of {split!r} ({keep}) -> {files[name]}")
    return {"annotations": files}


def stage_no_sft(s: DemoSettings) -> dict:
    """``--sft-iters 0``: nothing to train; GRPO starts from the starting checkpoint."""
    print(f"  no SFT (--sft-iters 0): GRPO starts from {s.start_checkpoint}")
    return {"skipped": True, "start": s.start_checkpoint}


def schedule_options(iters: int) -> list[str]:
    """--cfg-options that set a run's length and rescale its warm-up + cosine schedule (warm-up = 1/30 of the run,
    at least 1 iteration); none for ``iters == 0``."""
    if iters == 0:
        return []
    if iters < 2:
        raise ValueError(f"demo: iterations={iters}; a run needs at least 2 (warm-up + cosine), or 0 for the config's.")
    warmup = max(1, iters // 30)
    return [f"train_cfg.max_iters={iters}", f"param_scheduler.0.end={warmup}", f"param_scheduler.1.begin={warmup}",
            f"param_scheduler.1.end={iters}", f"default_hooks.checkpoint.interval={iters}"]


def _python() -> list[str]:
    return [sys.executable]


def train_and_export(s: DemoSettings, name: str, config: str, options: list[str]) -> list[Command]:
    """``sa2va-rl train CONFIG``, then ``sa2va-rl export`` of its last checkpoint (same options: the same model)."""
    work = s.path(name)
    train = Command([*_python(), *CLI, "train", config, "--work-dir", str(work), "--cfg-options", *options],
                    s.path("logs", f"{name.replace('/', '_')}_train.log"), TRAIN_PROGRESS, "train")
    export = Command([*_python(), *CLI, "export", config, str(work), "--save-path", str(work / "hf"),
                      "--cfg-options", *options], s.path("logs", f"{name.replace('/', '_')}_export.log"), None,
                     "export")
    return [train, export]


def sft_options(s: DemoSettings, start: str | None = None, iters: int | None = None, data: str = "data/train"
                ) -> list[str]:
    """The SFT run's --cfg-options: seed, the checkpoint it starts from (model and processor), the training scenes
    (``data``: a data directory of the work dir), length, extras."""
    start = start or s.start_checkpoint
    return [f"randomness.seed={s.seed}", f"model.pretrained_path={start}",
            f"train_dataloader.dataset.pretrained_path={start}",
            f"train_dataloader.dataset.region_dataset.ann_file={s.path(data, 'annotations.json')}",
            *schedule_options(s.sft_iters if iters is None else iters), *s.sft_options]


def rl_split(s: DemoSettings) -> str:
    """Data directory of the paired RL prompts."""
    return "data/rl_train" if s.rl_train_samples else "data/train"


def rl_data_options(s: DemoSettings) -> list[str]:
    """--cfg-options pointing the GRPO config's dataset at the demo's files (both unpaired halves, or the paired
    set)."""
    if s.video:
        from projects.llava_sam2.rl_train.demo.video import rl_video_options

        return rl_video_options(s)
    if s.rl_data == "paired":
        return [f"train_dataloader.dataset.ann_file={s.path(rl_split(s), 'annotations.json')}"]
    return [f"train_dataloader.dataset.{half}.{key}={value}" for half in ("regions", "texts")
            for key, value in (("ann_file", s.path(f"data/rl_{half}", "annotations.json")),
                               ("image_root", s.path("data/train")))]


def rl_options(s: DemoSettings) -> list[str]:
    """The RL run's --cfg-options: seed, the checkpoint to start from, the training scenes, length, extras."""
    return [f"randomness.seed={s.seed}", f"model.pretrained_path={s.rl_start}", *rl_data_options(s),
            *schedule_options(s.rl_iters), *s.rl_options]


def sft_job(s: DemoSettings) -> Job:
    return Job("sft", train_and_export(s, "sft", s.sft_config, sft_options(s)))


def rl_job(s: DemoSettings) -> Job:
    return Job("rl", train_and_export(s, "rl", s.rl_config, rl_options(s)))


def eval_command(s: DemoSettings, checkpoint: str, key: str, label: str) -> Command:
    """``sa2va-rl evaluate`` of the HF checkpoint on the held-out split, into ``WORK_DIR/eval/<key>``."""
    if s.video:
        from projects.llava_sam2.rl_train.demo.video import video_eval_arguments

        return Command([*_python(), *CLI, "evaluate", "--checkpoint", checkpoint, *video_eval_arguments(s),
                        "--out", str(s.path("eval", key)), "--system", label],
                       s.path("logs", f"eval_{key.replace('/', '_')}.log"), TQDM_PROGRESS, "evaluate")
    argv = [*_python(), *CLI, "evaluate", "--checkpoint", checkpoint,
            "--dataset", "coco", "--ann-file", str(s.path("data/eval/annotations.json")),
            "--name", f"shapes_{s.world['domain']}_{s.eval_split}",
            "--num-samples", str(s.val_samples), "--out", str(s.path("eval", key)), "--system", label,
            "--batch-size", str(s.eval_batch_size), "--max-new-tokens", str(s.eval_max_new_tokens)]
    return Command(argv, s.path("logs", f"eval_{key.replace('/', '_')}.log"), TQDM_PROGRESS, "evaluate")


def world_arguments(s: DemoSettings) -> list[str]:
    """The held-out scenes' flags of the scene-level measures (same split, domain and seed as the evaluation)."""
    shift = ["--shift", str(s.target_shift)] if s.world["domain"] == "target" else []
    return ["--seed", str(s.data_seed), "--split", s.eval_split, "--domain", s.world["domain"], *shift,
            "--image-size", str(s.image_size), "--batch-size", str(s.eval_batch_size)]


def text_command(s: DemoSettings, checkpoint: str, key: str) -> list[Command]:
    """The text-dependence measure (own vs other-text IoU on ``text_scenes`` held-out multi-object scenes of the
    evaluation's split and domain) and listener accuracy (the frozen listener segments the system's captions), into
    ``WORK_DIR/eval/<key>/{text_dependence,listener}.json``; none when ``text_scenes`` is 0."""
    if not s.text_scenes or s.video:  # scene-level measures of the image world
        return []
    tag = key.replace('/', '_')
    text = [*_python(), *TEXT_DEPENDENCE, "--checkpoint", checkpoint, "--scenes", str(s.text_scenes),
            *world_arguments(s), "--json", str(s.path("eval", key, "text_dependence.json"))]
    listener = [*_python(), *LISTENER, "--checkpoint", checkpoint, "--listener", s.listener_checkpoint,
                "--scenes", str(s.text_scenes), *world_arguments(s), "--max-new-tokens", str(s.eval_max_new_tokens),
                "--json", str(s.path("eval", key, "listener.json"))]
    return [Command(text, s.path("logs", f"text_{tag}.log"), None, "text dependence"),
            Command(listener, s.path("logs", f"listener_{tag}.log"), None, "listener accuracy")]


def eval_base_job(s: DemoSettings) -> Job:
    label = s.systems["base"]
    return Job("eval_base", [eval_command(s, s.rl_start, "base", label), *text_command(s, s.rl_start, "base")])


def stage_report(s: DemoSettings) -> dict:
    """report.md + PNGs (``sa2va-rl report``'s writer) with the demo summary on top; prints the summary."""
    from projects.llava_sam2.rl_train.demo.summary import summarize_demo

    names = s.systems
    if s.video:
        from projects.llava_sam2.rl_train.demo.video import video_report

        return video_report(s, read_stages(s))
    return summarize_demo(s.work_dir, {names[k]: s.path("eval", k) for k in ("base", "rl")}, names["base"],
                          rl_work_dir=s.path("rl"), num_examples=s.num_examples, stages=read_stages(s))


LOCAL_STAGES = {"data": stage_data, "report": stage_report}
JOB_STAGES = {"sft": sft_job, "rl": rl_job, "eval_base": eval_base_job,
              "eval_rl": lambda s: Job("eval_rl", [eval_command(s, str(s.path("rl/hf")), "rl", s.systems["rl"])]),
              "text_rl": lambda s: Job("text_rl", text_command(s, str(s.path("rl/hf")), "rl"))}


def local_stage(s: DemoSettings, stage: str):
    """The in-process function of ``stage``, or None when it runs as subprocess jobs."""
    if stage == "sft" and not s.sft_iters:
        return stage_no_sft
    return LOCAL_STAGES.get(stage)


# ---- stage bookkeeping -----------------------------------------------------------------------------------------


def marker(s: DemoSettings, stage: str) -> Path:
    return s.path("stages", f"{stage}.json")


def read_stages(s: DemoSettings) -> dict[str, dict]:
    """The finished stages' records (outputs, commands, wall/CPU seconds), in pipeline order."""
    out = {}
    for row in PIPELINE:
        for stage in row:
            if marker(s, stage).is_file():
                out[stage] = json.loads(marker(s, stage).read_text())
    return out


def is_finished(s: DemoSettings, stage: str, fingerprint: str | None = None) -> bool:
    """True if ``stage`` finished with the current inputs (``fingerprint`` for stages outside STAGE_INPUTS)."""
    path = marker(s, stage)
    expected = fingerprint or s.fingerprint(stage)
    return path.is_file() and json.loads(path.read_text()).get("fingerprint") == expected


def write_marker(s: DemoSettings, stage: str, record: dict, fingerprint: str | None = None) -> None:
    marker(s, stage).parent.mkdir(parents=True, exist_ok=True)
    record = {"stage": stage, "fingerprint": fingerprint or s.fingerprint(stage), **record}
    marker(s, stage).write_text(json.dumps(record, indent=1))


def banner(text: str) -> None:
    print(f"\n{'=' * 100}\n== {text}\n{'=' * 100}", flush=True)


def run_row(s: DemoSettings, row: tuple[str, ...], force: bool, only=None) -> bool:
    """Run the stages of one pipeline row (side by side when several); returns True if anything ran."""
    row = tuple(stage for stage in row if only is None or stage in only)
    pending = [stage for stage in row if force or not is_finished(s, stage)]
    for stage in row:
        if stage not in pending:
            print(f"-- {stage}: finished earlier, skipped (--force runs it again)")
    if not pending:
        return False
    banner(" + ".join(pending) + (" (side by side, one core each)" if len(pending) > 1 else ""))
    start = time.perf_counter()
    for stage in [p for p in pending if local_stage(s, p)]:
        cpu = time.process_time()
        outputs = local_stage(s, stage)(s)
        write_marker(s, stage, {"outputs": outputs, "wall_s": round(time.perf_counter() - start, 1),
                                "cpu_s": round(time.process_time() - cpu, 1)})
    jobs = [JOB_STAGES[p](s) for p in pending if not local_stage(s, p)]
    for job in [job for job in jobs if not job.commands]:  # text_rl with --text-scenes 0
        write_marker(s, job.name, {"skipped": True, "wall_s": 0.0, "cpu_s": 0.0})
    jobs = [job for job in jobs if job.commands]
    if jobs:
        run_jobs(jobs, env=subprocess_env())
        for job in jobs:
            wall, cpu = (round(sum(c[key] for c in job.seconds), 1) for key in ("wall_s", "cpu_s"))
            write_marker(s, job.name, {"commands": job.seconds, "wall_s": wall, "cpu_s": cpu})
    return True


def subprocess_env(threads: int = 1) -> dict:
    """One intra-op thread per process: the tiny model's ops gain nothing from a second thread, and the demo runs
    two processes side by side on two cores (OpenMP spin-waiting makes oversubscription very slow). The checkout
    goes first on PYTHONPATH, before what the caller had there (an environment installed with --target)."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONPATH=path)
    env.setdefault("NLTK_DATA", str(REPO_ROOT / ".cache/nltk_data"))
    return env


def run_demo(s: DemoSettings, force: bool = False, stop_after: str | None = None, only=None) -> dict[str, dict]:
    """Run the pipeline (stages already finished with the same settings are skipped); returns the stage records.

    ``only``: run just these stages (the CI test runs data, sft and rl); ``stop_after``: stop after that stage's row.
    """
    start = time.perf_counter()
    invalidated = force
    for row in PIPELINE:
        invalidated = run_row(s, row, invalidated, only) or invalidated  # a re-run stage invalidates later ones
        if stop_after in row:
            break
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s (this invocation); work dir {s.work_dir}")
    return read_stages(s)


# ---- CLI -------------------------------------------------------------------------------------------------------


def build_parser(prog: str = PROG, description: str | None = None) -> argparse.ArgumentParser:
    """--work-dir, --force, --stop-after and one flag per DemoSettings field (its docstring is the help)."""
    parser = argparse.ArgumentParser(prog=prog, description=description or __doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="work_dirs/demo", help="outputs, logs and stage records")
    parser.add_argument("--force", action="store_true", help="run every stage again")
    parser.add_argument("--stop-after", choices=[s for row in PIPELINE for s in row],
                        help="stop after the pipeline row holding this stage")
    add_settings_arguments(parser, DemoSettings, skip=("work_dir",))
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[DemoSettings, argparse.Namespace]:
    args = build_parser().parse_args(argv)
    return settings_from_args(DemoSettings, args, work_dir=Path(args.work_dir).resolve()), args


def main(argv: list[str] | None = None) -> int:
    settings, args = parse_args(argv)
    os.environ.update(subprocess_env())  # the in-process stages (data, report) follow the same rules
    try:
        run_demo(settings, force=args.force, stop_after=args.stop_after)
    except JobError as error:
        print(f"\ndemo FAILED: {error}", file=sys.stderr)
        return error.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())

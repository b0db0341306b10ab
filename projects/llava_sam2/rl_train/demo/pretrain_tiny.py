"""Pretrain the tiny Sa2VA on the shapes world so that it reads its text.

    python -m projects.llava_sam2.rl_train.demo.pretrain_tiny --out DIR --seed 0 --device cuda [--help]

The demo trains the ``tiny`` preset, and from random init it is text-blind (docs/demo.md). A
released Sa2VA starts from a pretrained InternVL and SAM2; this tool gives the tiny one the same kind of start,
on ``ShapesWorld('train')`` and ``ShapesVideoWorld('train')`` only (the ``'val'`` streams are the held-out
splits), in up to four stages (``demo/pretrain_stages.py``, each measured in docs/demo.md, "The pretrained tiny
model"):

1. ``sam``: promptable segmentation of the tiny SAM2 (clicks, boxes and, optionally, attribute prompts in the
   ``[SEG]`` slot), encoders trained;
2. ``lm``: next-token pretraining of the tiny LLM on the shapes-world phrases (optional);
3. ``joint``: Sa2VA SFT of every weight on referring segmentation (every object of a scene in one batch, each
   with its own text) and region captioning (the region as region tokens, or drawn into the image with
   ``--region-input drawn``), with SAM's IoU-head loss and, optionally, the attribute teacher;
4. ``video``: video RES on moving-shapes clips through SAM2's memory propagation, which trains the memory modules
   the image stages never reach (optional; usually a continuation of an image-trained checkpoint, ``--init``).

DIR gets the checkpoint in the HF layout (``save_pretrained`` + the tokenizer; loads with
``load_pretrained``), ``pretrain_log.json`` (settings, command, per-stage losses, held-out curves, final
held-out text dependence / RES / captioning / video J&F, the weights' sha256) and nothing else.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cli.settings import add_settings_arguments, settings_from_args
from ..model.checkpoints.hf_checkpoint import load_pretrained, save_pretrained
from ..model.network.presets import build_preset
from ..model.network.sa2va import Sa2VAModel
from ..model.text.drawn_region import REGION_INPUTS, SHAPES_WORLD_OUTLINE
from ..model.text.processor import Sa2VAProcessor
from ..model.text.tokenizer import load_tiny_tokenizer, load_tokenizer
from .pretrain_data import StageBatches, VideoBatch, loader
from .pretrain_stages import (AttributePrompt, JointWeights, joint_step, lm_step, run_stage, sam_step,
                              trainable_encoders, video_step)

EVAL_TASKS = ("res", "caption", "cycle_iou", "cycle_caption")
STAGES = ("sam", "lm", "joint", "video")


@dataclass
class PretrainSettings:
    """Every knob of the recipe; the string under each field is its ``--help`` line (``cli/settings.py``)."""

    # run
    out: str = ""
    """output directory (created): HF checkpoint, tokenizer, pretrain_log.json"""
    seed: int = 0
    """seed of the weights, the training scenes and every random choice"""
    init: str = ""
    """start from this HF-layout checkpoint (with its tokenizer) instead of random weights, e.g. to continue an
    earlier run; '' = the tiny preset at random init"""
    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1 ..."""
    threads: int = 1
    """torch CPU threads"""
    num_workers: int = 0
    """DataLoader processes that build batches ahead (0: in this process)"""
    time_limit_s: float = 0.0
    """training time budget, shared out over the stages still to run in proportion to their steps: a stage that
    would not fit plans fewer steps (timed over its steps 10-30; logged as planned_steps) and stops at its
    share; 0: no limit"""
    log_every: int = 50
    """print a JSON loss row every N steps"""
    # data
    scenes_per_batch: int = 24
    """training scenes per batch (stage joint: every object of each is a row)"""
    image_sizes: tuple[int, ...] = (128, 224)
    """sides of the rendered training scenes, alternating (the demo renders 128 px, the model reads 224)"""
    group_by_scene: bool = True
    """joint stage: every object of a scene in the batch, each with its own text (off: one object per scene,
    about as many rows)"""
    captions_per_scene: int = 1
    """joint stage: region-caption rows per scene"""
    region_input: str = "native"
    """how a caption row (and the held-out caption / cycle tasks) shows its region: 'native' (region tokens) or
    'drawn' (its outline drawn into a copy of the scene, white, with no region tokens; model/text/drawn_region.py)"""
    # stage 1: promptable segmentation of the tiny SAM2
    sam_steps: int = 1500
    """stage sam: steps (0 skips it)"""
    sam_lr: float = 2e-3
    """stage sam: AdamW peak learning rate"""
    attribute_share: float = 0.34
    """stage sam: share of prompts that are attribute prompts in the [SEG] slot (0: clicks and boxes only)"""
    # stage 2: language
    lm_steps: int = 0
    """stage lm: steps of next-token pretraining on shapes-world phrases (0 skips it)"""
    lm_lr: float = 1e-3
    """stage lm: AdamW peak learning rate"""
    # stage 3: joint Sa2VA SFT
    joint_steps: int = 3000
    """stage joint: steps (0 skips it)"""
    joint_lr: float = 1e-3
    """stage joint: AdamW peak learning rate"""
    warmup_steps: int = 100
    """linear learning-rate warm-up of every stage, then cosine to 0.1x"""
    mask_loss_weight: float = 1.0
    """joint: weight of loss_mask + loss_dice (1 = upstream's sum)"""
    iou_loss_weight: float = 1.0
    """joint: weight of SAM's IoU-head loss (0 = upstream SFT loss)"""
    seg_lm_weight: float = 1.0
    """joint: LM-loss weight of the token predicted from [SEG] (1 = upstream)"""
    teacher_weight: float = 1.0
    """joint: initial weight of MSE([SEG] prompt, attribute prompt of its text), decaying linearly to 0; needs
    stage sam with attribute prompts"""
    num_points: int = 1024
    """joint and video: PointRend points per mask (per frame) of the SFT mask loss (64x64 logits)"""
    # stage 4: video RES with SAM2 memory propagation
    video_steps: int = 0
    """stage video: steps (0 skips it)"""
    video_lr: float = 3e-4
    """stage video: AdamW peak learning rate"""
    clips_per_batch: int = 8
    """stage video: ShapesVideoWorld('train') clips per video batch (every object of each is a row)"""
    video_frames: int = 16
    """stage video: frames per training clip (the first min(5, T) go to the language model, all to SAM2)"""
    video_image_size: int = 128
    """stage video: side of the rendered training and held-out clips"""
    image_share: float = 0.25
    """stage video: share of its steps that are joint image batches instead (spread evenly; 0: video only)"""
    # evaluation (held-out ShapesWorld('val'), never trained on)
    eval_every: int = 0
    """joint: held-out text dependence every N steps (0: none during training)"""
    curve_scenes: int = 48
    """held-out multi-object scenes of each curve point"""
    eval_scenes: int = 200
    """held-out scenes of the final evaluation (0 skips it)"""
    eval_image_size: int = 128
    """side of the held-out scenes (the demo renders 128 px)"""
    eval_tasks: tuple[str, ...] = ("res", "caption")
    """final evaluation tasks, of ('res', 'caption', 'cycle_iou', 'cycle_caption') (caption scores need WordNet)"""
    video_eval_clips: int = 100
    """held-out ShapesVideoWorld('val', seed=0) clips of the final video RES J&F (run when stage video ran; 0 skips
    it)"""

    def __post_init__(self) -> None:
        self.image_sizes = tuple(int(s) for s in self.image_sizes)
        self.eval_tasks = tuple(self.eval_tasks)
        if not self.out:
            raise ValueError("PretrainSettings.out: give the output directory (--out DIR)")
        counts = {k: getattr(self, k) for k in ("sam_steps", "lm_steps", "joint_steps", "video_steps", "warmup_steps",
                                                "eval_every", "eval_scenes", "num_workers", "captions_per_scene",
                                                "video_eval_clips")}
        if any(v < 0 for v in counts.values()) or not any(counts[f"{k}_steps"] for k in STAGES):
            raise ValueError(f"PretrainSettings: step/scene counts must be >= 0 and at least one stage must run, got "
                             f"{counts}")
        for name in ("sam_lr", "lm_lr", "joint_lr", "video_lr", "scenes_per_batch", "clips_per_batch", "video_frames",
                     "curve_scenes", "num_points", "threads", "log_every"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PretrainSettings.{name}={getattr(self, name)}: must be > 0")
        for name in ("mask_loss_weight", "iou_loss_weight", "seg_lm_weight", "teacher_weight", "time_limit_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"PretrainSettings.{name}={getattr(self, name)}: must be >= 0")
        if not 0 <= self.image_share < 1:
            raise ValueError(f"PretrainSettings.image_share={self.image_share}: a share in [0, 1)")
        if not 0 <= self.attribute_share <= 1:
            raise ValueError(f"PretrainSettings.attribute_share={self.attribute_share}: a share in [0, 1]")
        if self.teacher_weight > 0 and self.joint_steps and not (self.sam_steps and self.attribute_share > 0):
            raise ValueError("PretrainSettings.teacher_weight > 0 needs the attribute prompts of stage sam "
                             "(sam_steps > 0 and attribute_share > 0); set --teacher-weight 0 otherwise")
        if not self.image_sizes or min(self.image_sizes, default=0) < 32 or min(self.eval_image_size,
                                                                                  self.video_image_size) < 32:
            raise ValueError(f"PretrainSettings: image_sizes={self.image_sizes} / eval_image_size="
                             f"{self.eval_image_size} / video_image_size={self.video_image_size}: sides of at least "
                             "32 px")
        if self.region_input not in REGION_INPUTS:
            raise ValueError(f"PretrainSettings.region_input={self.region_input!r}: expected one of {REGION_INPUTS}")
        unknown = [t for t in self.eval_tasks if t not in EVAL_TASKS]
        if unknown:
            raise ValueError(f"PretrainSettings.eval_tasks: {unknown} not in {EVAL_TASKS}")
        torch.device(self.device)  # raises on a malformed device string


def build_tiny(seed: int, device: str, init: str = ""):
    """The tiny preset at random init (seeded) or the checkpoint ``init``, its tokenizer bound, and the processor
    the loops use."""
    torch.manual_seed(seed)
    if init:
        tokenizer = load_tokenizer(init)
        model = load_pretrained(init, torch_dtype=torch.float32).to(device)
    else:
        tokenizer = load_tiny_tokenizer()
        model = Sa2VAModel(build_preset("tiny", vocab_size=len(tokenizer))).to(device)
    model.bind_tokenizer(tokenizer)
    processor = Sa2VAProcessor.from_config(tokenizer, model.config, empty_region="dilate_to_one_cell",
                                           region_outline=SHAPES_WORLD_OUTLINE)
    return model, tokenizer, processor


def _batches(stage: str, processor, s: PretrainSettings, steps: int):
    return loader(StageBatches(stage, processor, seed=s.seed, steps=steps, scenes_per_batch=s.scenes_per_batch,
                               image_sizes=s.image_sizes, attribute_share=s.attribute_share,
                               group_by_scene=s.group_by_scene, captions_per_scene=s.captions_per_scene,
                               clips_per_batch=s.clips_per_batch, video_frames=s.video_frames,
                               video_image_size=s.video_image_size, image_share=s.image_share,
                               region_input=s.region_input),
                  s.num_workers)


def train(model, processor, s: PretrainSettings) -> list[dict]:
    """Run the stages in place; returns their logs."""
    from ..evaluation.text_dependence import held_out_scenes, measure, model_segmenter

    steps = {stage: getattr(s, f"{stage}_steps") for stage in STAGES}
    start = time.perf_counter()

    def budget(stage: str) -> float:
        """The stage's share of the time left: left · steps / Σ steps of this and the later stages."""
        if not s.time_limit_s:
            return 0.0
        later = list(steps)[list(steps).index(stage):]
        left = max(1.0, s.time_limit_s - (time.perf_counter() - start))
        return left * steps[stage] / max(1, sum(steps[k] for k in later))
    common = dict(warmup=s.warmup_steps, log_every=s.log_every)
    sam = model.grounding_encoder.sam2_model
    attribute_prompt = AttributePrompt(model.config.sam_hidden_dim).to(model.device)
    curve = held_out_scenes(s.curve_scenes, image_size=s.eval_image_size) if s.eval_every else []

    def curve_point(step: int) -> dict:
        result = measure(model_segmenter(model, processor), curve, n_resamples=100)
        return {f"heldout_{k}": round(getattr(result, k).value, 4)
                for k in ("own_iou", "other_iou", "gap", "identical_share")}

    weights = JointWeights(s.mask_loss_weight, s.iou_loss_weight, s.seg_lm_weight, s.teacher_weight, s.num_points)
    points = torch.Generator(device=model.device).manual_seed(s.seed)
    sam_params = [*sam.image_encoder.parameters(), *sam.sam_prompt_encoder.parameters(),
                  *sam.sam_mask_decoder.parameters(), *attribute_prompt.parameters()]
    logs = []
    model.train()
    with trainable_encoders(model):
        logs.append(run_stage("sam", _batches("sam", processor, s, s.sam_steps),
                              lambda batch, _: sam_step(model, attribute_prompt, batch), sam_params,
                              steps=s.sam_steps, lr=s.sam_lr, time_budget_s=budget("sam"), **common))
        attribute_prompt.requires_grad_(False)
        logs.append(run_stage("lm", _batches("lm", processor, s, s.lm_steps), lambda batch, _: lm_step(model, batch),
                              list(model.language_model.parameters()), steps=s.lm_steps, lr=s.lm_lr,
                              time_budget_s=budget("lm"), **common))
        teacher = attribute_prompt if s.teacher_weight > 0 else None
        logs.append(run_stage(
            "joint", _batches("joint", processor, s, s.joint_steps),
            lambda batch, progress: joint_step(model, teacher, batch, weights, 1 - progress, points),
            list(model.parameters()), steps=s.joint_steps, lr=s.joint_lr, time_budget_s=budget("joint"),
            on_log=curve_point, eval_every=s.eval_every, **common))

        def video_or_image_step(batch, _):
            if isinstance(batch, VideoBatch):
                return video_step(model, batch, weights, points)
            return joint_step(model, None, batch, weights, 0.0, points)
        logs.append(run_stage("video", _batches("video", processor, s, s.video_steps), video_or_image_step,
                              list(model.parameters()), steps=s.video_steps, lr=s.video_lr,
                              time_budget_s=budget("video"), **common))
    model.eval()
    return [log.to_dict() for log in logs]


def save(model, tokenizer, out: Path) -> dict[str, str]:
    """``save_pretrained`` (CPU, float32) + the tokenizer; returns the sha256 of each weights file."""
    device = model.device
    save_pretrained(model.to("cpu"), out)
    tokenizer.save_pretrained(str(out))
    model.to(device)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.safetensors"))}


def evaluate_held_out(model, processor, s: PretrainSettings, held_out: dict, write) -> None:
    """Video RES J&F on ``video_eval_clips`` clips of ``ShapesVideoWorld('val', seed=0)`` (when stage video ran),
    text dependence on ``eval_scenes`` multi-object scenes, then ``eval_tasks`` on ``eval_scenes`` samples of
    ``ShapesWorld('val', seed=0)`` (the demo's held-out stream), at ``eval_image_size``; fills ``held_out`` and
    calls ``write()`` after each part (a failing part leaves the earlier ones on disk)."""
    from ..data.shapes import ShapesWorld
    from ..evaluation.tasks import EvalConfig, evaluate
    from ..evaluation.text_dependence import text_dependence

    if s.video_steps and s.video_eval_clips:
        held_out["video_res"] = video_held_out(model, processor, s.video_eval_clips, s.video_image_size,
                                               s.video_frames)
        print(json.dumps({"held_out_video_res": held_out["video_res"]}), flush=True)
        write()
    if not s.eval_scenes:
        return
    held_out["text_dependence"] = text_dependence(model, processor, num_scenes=s.eval_scenes,
                                                  image_size=s.eval_image_size).to_dict()
    write()
    if s.eval_tasks:
        world = ShapesWorld("val", s.eval_scenes, 0, image_size=s.eval_image_size)
        tasks = evaluate(model, processor, world, s.eval_tasks,
                         EvalConfig(batch_size=32, show_progress=False, region_input=s.region_input))
        held_out["tasks"] = {name: {k: v.to_dict() for k, v in task.metrics.items()} for name, task in tasks.items()}
        write()


def video_held_out(model, processor, clips: int, image_size: int, num_frames: int) -> dict:
    """``video_res`` (``evaluation/video_tasks.py``) on the first ``clips`` clips of ``ShapesVideoWorld('val',
    seed=0)``: each metric's estimate and CI as a dict."""
    from ..data.shapes_video import ShapesVideoWorld
    from ..evaluation.video_tasks import evaluate_video_res

    world = ShapesVideoWorld("val", clips, 0, image_size=image_size, num_frames=num_frames)
    result = evaluate_video_res(model, processor, world)
    return {"clips": clips, "image_size": image_size, "num_frames": num_frames,
            **{name: estimate.to_dict() for name, estimate in result.metrics.items()}}


def pretrain(s: PretrainSettings, argv: list[str] | None = None) -> dict:
    """Build, train, save and evaluate; returns (and writes) the log."""
    start = time.perf_counter()
    torch.set_num_threads(s.threads)
    if torch.device(s.device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, processor = build_tiny(s.seed, s.device, s.init)
    stages = train(model, processor, s)
    train_s = time.perf_counter() - start
    fingerprint = save(model, tokenizer, out)
    log = {"command": "python -m projects.llava_sam2.rl_train.demo.pretrain_tiny " + " ".join(argv or []),
           "settings": dataclasses.asdict(s), "device": _device_name(s.device), "torch": torch.__version__,
           "python": platform.python_version(), "train_seconds": round(train_s, 1), "sha256": fingerprint,
           "stages": stages}
    log["held_out"] = {}

    def write() -> None:
        log["wall_seconds"] = round(time.perf_counter() - start, 1)
        (out / "pretrain_log.json").write_text(json.dumps(log, indent=1))

    write()
    evaluate_held_out(model, processor, s, log["held_out"], write)
    write()
    return log


def _device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.processor() or platform.machine()})"


def build_parser() -> argparse.ArgumentParser:
    """``--help`` from the string under each settings field (``cli/settings.py``)."""
    parser = argparse.ArgumentParser(prog="sa2va-rl pretrain-tiny", description=__doc__.splitlines()[0])
    add_settings_arguments(parser, PretrainSettings)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(PretrainSettings, args)
    except ValueError as err:
        print(f"pretrain_tiny: {err}", file=sys.stderr)
        return 2
    log = pretrain(settings, argv)
    print(json.dumps({"out": settings.out, "train_seconds": log["train_seconds"], "sha256": log["sha256"],
                      "held_out": log.get("held_out", {}).get("text_dependence"),
                      "held_out_video_res": log.get("held_out", {}).get("video_res")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

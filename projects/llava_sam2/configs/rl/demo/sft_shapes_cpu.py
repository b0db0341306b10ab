# Demo SFT on the shapes world, on CPU, from the committed text-aware tiny Sa2VA (assets/tiny_shapes_pretrained), with
# XTuner's own TrainLoop and our model's SFT loss (LM cross-entropy + mask BCE + Dice). It is the trainable set and
# step size of the GRPO run (grpo_shapes_cpu.py: a fresh LoRA r=16, mlp1, SAM2 mask decoder, text_hidden_fcs;
# embeddings and encoders frozen), so the two differ only in their objective. Two uses:
#
# * the optional short SFT of `sa2va-rl demo --sft-iters N` (off by default: the pretrained model already does the
#   demo's tasks; docs/demo.md);
# * control (b) of `sa2va-rl demo-controls`: SFT for the CPU time of the GRPO run, instead of GRPO.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/demo/sft_shapes_cpu.py --work-dir work_dirs/demo/sft \
#       --cfg-options train_dataloader.dataset.region_dataset.ann_file=work_dirs/demo/data/train/annotations.json
#
# The model and its processor are read from `pretrained_path` (set both when you start from another checkpoint).
from mmengine.config import read_base

with read_base():
    from .._base_.datasets.coco_regions import coco_region_dataset
    from .._base_.sa2va_sft_base import *  # noqa: F401,F403
    from .._base_.cpu_runtime import *  # noqa: F401,F403  last: fp32 OptimWrapper, gloo, seed 0

from mmengine.dataset import DefaultSampler
from xtuner.engine.runner import TrainLoop

from projects.llava_sam2.rl_train.engine.builders import region_sft_dataset
from projects.llava_sam2.rl_train.model.text.processor import sft_collate

PRETRAINED = "projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained"  # relative to the checkout (`make demo`)

# ---- model: the pretrained tiny Sa2VA, a fresh LoRA (zero at start: "adapter off" is the pretrained model) -------
model.update(  # noqa: F405
    pretrained_path=PRETRAINED, preset=None, torch_dtype=None, gradient_checkpointing=False,
    lora=dict(r=16, lora_alpha=32, lora_dropout=0.0), train_embeddings=False,
    processor_cfg=dict(empty_region="dilate_to_one_cell"),  # a small shape can cover less than one region cell
    # mask-loss points per mask: 19% of 64x64 logits, upstream's fraction; SAM's IoU-head loss as in pretraining
    sft_loss_cfg=dict(num_points=784, iou_loss_weight=1.0),
)

# ---- data: the shapes world written by `sa2va-rl demo` (stage "data"; it passes its own work dir) ---------------
coco_region_dataset.update(ann_file="work_dirs/demo/data/train/annotations.json", image_root=None,
                           name="shapes_train")
train_dataloader = dict(
    batch_size=8, num_workers=0,
    dataset=dict(type=region_sft_dataset, region_dataset=coco_region_dataset, pretrained_path=PRETRAINED,
                 processor_cfg=dict(empty_region="dilate_to_one_cell"), tasks=("caption", "segment"),
                 # the questions and the answer the RL loops and the evaluation use (RefCOCOg caption eval question;
                 # RES eval question with "Sure, [SEG].")
                 caption_questions=("<image>\nPlease give me a short description of the region in the picture "
                                    "marked by region1.",),
                 seg_questions=("<image>\n Please segment {class_name} in this image.",),
                 answers=("Sure, [SEG].",),
                 max_length=512),
    sampler=dict(type=DefaultSampler, shuffle=True),
    collate_fn=dict(type=sft_collate),
)

# ---- optimisation: the GRPO run's step size ---------------------------------------------------------------------
max_iters = 100
train_cfg = dict(type=TrainLoop, max_iters=max_iters)
param_scheduler = [
    dict(type=LinearLR, start_factor=0.1, by_epoch=False, begin=0, end=3),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=3, end=max_iters),  # noqa: F405
]
optim_wrapper.optimizer.update(lr=5e-4, weight_decay=0.0)  # noqa: F405

# ---- runtime --------------------------------------------------------------------------------------------------
default_hooks.logger.update(interval=10)  # noqa: F405
default_hooks.checkpoint.update(interval=max_iters, max_keep_ckpts=1)  # noqa: F405  one checkpoint, at the end

# Demo stage 2: SFT of a tiny Sa2VA on the shapes world, on CPU, with XTuner's own TrainLoop and our model's SFT
# loss (LM cross-entropy + mask BCE + Dice). `sa2va-rl demo` runs it after writing the shapes world as COCO-style
# files, so the data goes through the real-data loader (CocoRegionDataset):
#
#   sa2va-rl train projects/llava_sam2/configs/rl/demo/sft_shapes_cpu.py --work-dir work_dirs/demo/sft \
#       --cfg-options train_dataloader.dataset.region_dataset.ann_file=work_dirs/demo/data/train/annotations.json
#
# The GRPO demo config (grpo_shapes_cpu.py) inherits the model, data and optimizer settings of this file and starts
# from its exported checkpoint. Sizes, steps and learning rate were chosen by measurement (docs/demo.md).
from mmengine.config import read_base

with read_base():
    from .._base_.datasets.coco_regions import coco_region_dataset
    from .._base_.sa2va_sft_base import *  # noqa: F401,F403
    from .._base_.cpu_runtime import *  # noqa: F401,F403  last: fp32 OptimWrapper, gloo, seed 0

from mmengine.dataset import DefaultSampler
from xtuner.engine.runner import TrainLoop

from projects.llava_sam2.rl_train.engine.builders import region_sft_dataset
from projects.llava_sam2.rl_train.model.processor import sft_collate

# ---- model: the tiny preset (random init from randomness.seed), the upstream SFT trainable set -----------------
# LoRA r=32 on a 128-wide LLM is close to full rank; train_embeddings: the tiny vocabulary's embeddings and LM head
# start random, so SFT trains them (upstream SFT does too). No gradient checkpointing or bf16 on CPU.
model.update(  # noqa: F405
    pretrained_path=None, preset="tiny", torch_dtype=None, gradient_checkpointing=False,
    lora=dict(r=32, lora_alpha=64, lora_dropout=0.0), train_embeddings=True,
    processor_cfg=dict(empty_region="dilate_to_one_cell"),  # a small shape can cover less than one region cell
    sft_loss_cfg=dict(num_points=784),  # mask-loss points per mask: 19% of 64x64 logits, upstream's fraction
)

# ---- data: the shapes world written by `sa2va-rl demo` (stage "data"; it passes its own work dir) ---------------
coco_region_dataset.update(ann_file="work_dirs/demo/data/train/annotations.json", image_root=None,
                           name="shapes_train")
train_dataloader = dict(
    batch_size=8, num_workers=0,
    dataset=dict(type=region_sft_dataset, region_dataset=coco_region_dataset, preset="tiny",
                 processor_cfg=dict(empty_region="dilate_to_one_cell"), tasks=("caption", "segment"),
                 # one question + answer per task, the ones the RL loops and the evaluation use (RefCOCOg caption
                 # eval question; RES eval question with "Sure, [SEG]."): a tiny LLM trained from scratch does not
                 # generalise across paraphrases, and a varying answer prefix changes the [SEG] state
                 caption_questions=("<image>\nPlease give me a short description of the region in the picture "
                                    "marked by region1.",),
                 seg_questions=("<image>\n Please segment {class_name} in this image.",),
                 answers=("Sure, [SEG].",),
                 max_length=512),
    sampler=dict(type=DefaultSampler, shuffle=True),
    collate_fn=dict(type=sft_collate),
)

# ---- optimisation ---------------------------------------------------------------------------------------------
max_iters = 800
train_cfg = dict(type=TrainLoop, max_iters=max_iters)
warmup_iters = max_iters // 30
param_scheduler = [
    dict(type=LinearLR, start_factor=0.05, by_epoch=False, begin=0, end=warmup_iters),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=1e-4, by_epoch=False, begin=warmup_iters, end=max_iters),  # noqa: F405
]
# a tiny model from scratch takes a far larger learning rate than upstream's 4e-5 for a pretrained one
optim_wrapper.optimizer.update(lr=1e-3, weight_decay=0.0)  # noqa: F405

# ---- runtime --------------------------------------------------------------------------------------------------
default_hooks.logger.update(interval=10)  # noqa: F405
default_hooks.checkpoint.update(interval=max_iters, max_keep_ckpts=1)  # noqa: F405  one checkpoint, at the end
# randomness (seed 0, cpu_runtime.py) also rebuilds the frozen random weights on export (`sa2va-rl export`)

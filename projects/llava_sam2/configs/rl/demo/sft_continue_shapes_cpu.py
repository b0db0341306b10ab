# Demo control (b): continue SFT from the demo's SFT checkpoint for the CPU time the GRPO run takes, instead of RL.
# Same start (the exported SFT model), same trainable set and learning rate as grpo_shapes_cpu.py (a fresh LoRA r=16,
# mlp1, SAM2 mask decoder, text_hidden_fcs; embeddings frozen), same training scenes; only the objective differs.
# `sa2va-rl demo-controls` sets the iterations from the measured CPU time of the RL run.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/demo/sft_continue_shapes_cpu.py \
#       --work-dir work_dirs/demo_controls/seed0/controls/sft_more \
#       --cfg-options model.pretrained_path=work_dirs/demo/sft/hf train_dataloader.dataset.pretrained_path=...
from mmengine.config import read_base

with read_base():
    from .sft_shapes_cpu import *  # noqa: F401,F403

model.update(pretrained_path="work_dirs/demo/sft/hf", preset=None, train_embeddings=False,  # noqa: F405
             lora=dict(r=16, lora_alpha=32, lora_dropout=0.0))
train_dataloader.dataset.update(pretrained_path="work_dirs/demo/sft/hf", preset=None)  # noqa: F405  its processor
optim_wrapper.optimizer.update(lr=5e-4)  # noqa: F405  the GRPO run's
max_iters = 150
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=0.1, by_epoch=False, begin=0, end=5),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=5, end=max_iters),  # noqa: F405
]
default_hooks.checkpoint.update(interval=max_iters)  # noqa: F405

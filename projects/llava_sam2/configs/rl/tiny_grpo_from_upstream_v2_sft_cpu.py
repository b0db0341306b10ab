# Dual-loop GRPO that starts from an upstream codebase-v2 Sa2VA SFT run (projects/sa2va, the InternVL3 family), on
# CPU (README "From your Sa2VA SFT run to RL", docs/upstream.md "Codebase v2 SFT runs").
#
# The model comes from the SFT config (upstream_sft/sa2va_in30_tiny_sft.py stands for yours): its LoRA, freeze flags,
# template, special tokens, base InternVL path and SAM2 weights, plus `pretrained_pth`, the SFT checkpoint RL starts
# from (an XTuner iter_*.pth or a DeepSpeed checkpoint directory). Only the loop, hooks and RL settings are ours
# (_base_/sa2va_grpo_base.py). Paths are relative to the working directory, as upstream's ./pretrained:
#
#   python -m projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run --root . --codebase v2  # tiny "SFT"
#   python tools/train.py projects/llava_sam2/configs/rl/tiny_grpo_from_upstream_v2_sft_cpu.py --work-dir work_dirs/rl
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.shapes_regions import region_collate_fn, shapes_region_dataset
    from ._base_.sa2va_grpo_base import *  # noqa: F401,F403
    # your SFT config: its model dict and template (yours: e.g. a v2 checkout's projects/sa2va/configs/sa2va_in30_8b.py)
    from .upstream_sft.sa2va_in30_tiny_sft import model as sft_model
    from .upstream_sft.sa2va_in30_tiny_sft import template as sft_template

from mmengine.optim import OptimWrapper

# the SFT result RL starts from (.pth file or DeepSpeed directory); the SFT config's own pretrained_pth, if set, is
# the weights that SFT started from and is read as well
pretrained_pth = './work_dirs/sa2va_in30_tiny_sft/iter_2.pth'

model = dict(
    type=Sa2VATrainModel,  # noqa: F405
    upstream_sft=dict(
        sft_model=sft_model,  # LoRA, freeze flags, special tokens, base path, SAM2 ckpt_path
        template=sft_template,
        pretrained_pth=pretrained_pth,
        lora_mode='keep',  # keep: RL continues the SFT adapter | merge: fold it in, RL trains a fresh `lora`
    ),
    lora=dict(r=8, lora_alpha=16, lora_dropout=0.05),  # used by lora_mode='merge' only
    train_embeddings=False,
    gradient_checkpointing=False,
    torch_dtype=None,
    processor_cfg=dict(empty_region='dilate_to_one_cell'),  # tiny shapes can cover less than one region cell
)

# small groups, short captions and partner answers (as tiny_grpo_cycle_cpu.py)
train_cfg.algorithm.config.update(num_generations=2, max_completion_length=6)  # noqa: F405
train_cfg.algorithm.update(seg_answer_max_tokens=4)  # noqa: F405
max_iters = 2
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=1),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=1, end=max_iters),  # noqa: F405
]
shapes_region_dataset.update(num_samples=8, image_size=64)
train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False,  # noqa: F405
                        dataset=shapes_region_dataset, collate_fn=region_collate_fn)

# CPU runtime: fp32 optimizer wrapper (AmpOptimWrapper needs CUDA), gloo, a checkpoint every iteration
optim_wrapper = dict(type=OptimWrapper, optimizer=optim_wrapper.optimizer,  # noqa: F405
                     clip_grad=optim_wrapper.clip_grad, accumulative_counts=1)  # noqa: F405
default_hooks.checkpoint.update(interval=1)  # noqa: F405
default_hooks.rollout_logging.update(interval=1, max_prompts=2, max_rollouts=2)  # noqa: F405
env_cfg.update(dist_cfg=dict(backend='gloo'))  # noqa: F405
randomness = dict(seed=0)

# Dual-loop GRPO (mask -> caption -> mask', caption -> mask -> caption') that starts from an upstream codebase-v2 Sa2VA SFT run of the Qwen-VL
# family (projects/sa2va, arch_type='qwen'), on CPU (docs/upstream.md "Codebase v2 SFT runs").
#
# The model comes from the SFT config (upstream_sft/sa2va_qwen3vl_tiny_sft.py stands for yours, e.g. a v2 checkout's
# projects/sa2va/configs/sa2va_qwenvl3/sa2va_qwen3_4b.py): its LoRA (kept: RL continues the SFT adapter), freeze
# flags, template, special tokens, base Qwen-VL path and SAM2 weights, plus `pretrained_pth`, the SFT checkpoint RL
# starts from (an XTuner iter_*.pth or a DeepSpeed checkpoint directory); it loads into Sa2VAQwenModel. The loop,
# hooks and data are tiny_grpo_from_upstream_sft_cpu.py's; loop 1 gives the policy the region drawn into the image
# (this family has no region tokens), loop 2 a Bernoulli mask policy (the region policy needs the InternVL family's
# region-token grid); both are rewarded by IoU. Paths are relative to the working directory, as upstream's ./pretrained; the
# tests write a tiny run there (tests/qwen_sft_fixtures.py).
from mmengine.config import read_base

with read_base():
    from .tiny_grpo_from_upstream_sft_cpu import *  # noqa: F401,F403
    # your SFT config: its model dict and template
    from .upstream_sft.sa2va_qwen3vl_tiny_sft import model as qwen_sft_model
    from .upstream_sft.sa2va_qwen3vl_tiny_sft import template as qwen_sft_template

# the SFT result RL starts from (.pth file or DeepSpeed directory)
pretrained_pth = './work_dirs/sa2va_qwen3vl_tiny_sft/iter_2.pth'
# assigned, not updated: an update would merge the InternVL SFT model's keys into the Qwen-VL one
model["upstream_sft"]["sft_model"] = qwen_sft_model  # noqa: F405
model["upstream_sft"]["template"] = qwen_sft_template  # noqa: F405
model["upstream_sft"]["pretrained_pth"] = pretrained_pth  # noqa: F405
# the Qwen image processor's pixel budget: a 64 px shape image becomes a few merged patches
model["processor_cfg"] = dict(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)  # noqa: F405
train_cfg.algorithm.config.update(mask_to_caption_weight=1.0, caption_to_mask_weight=1.0,  # noqa: F405
                                  mask_policy="bernoulli", seg_noise_std=1.0)
train_cfg.algorithm.update(use_partner_captions=True)  # noqa: F405
# loop 1: the region drawn into the image, the partner's mask' of the caption scored by IoU; loop 2: IoU of the
# policy's mask (the caption reward needs a judge or WordNet, which this tiny example leaves out)
train_cfg.algorithm.rewards = dict(mask_to_caption=[dict(type=IoUReward, weight=1.0)],  # noqa: F405
                                   caption_to_mask=[dict(type=IoUReward, weight=1.0)])

# Demo control, not a method: loop 2 rewarded by the IoU of the sampled mask with the GROUND-TRUTH mask
# instead of METEOR of the partner's caption. No GT-free loop-2 reward can carry more information about the mask than
# this one, so its held-out gain bounds what any loop-2 reward (METEOR, a judge, a reward network) can add at the
# demo's budget (60 iterations x 4 prompts x G = 8, the same step size and KL). Everything else is grpo_shapes_cpu.py.
#
#   sa2va-rl demo --work-dir work_dirs/exp_oracle --seed 0 \
#       --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_oracle_iou_cpu.py
#   # the same with a mask action that resolves the mask finer than the partner's 8 x 8 region cells:
#   #   --rl-options train_cfg.algorithm.config.mask_policy=bernoulli
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.rewards import IoUReward  # noqa: E402

train_cfg.algorithm.rewards.caption_to_mask = [dict(type=IoUReward, weight=1.0)]  # noqa: F405  IoU(mask, gt_mask)
train_cfg.algorithm.update(use_partner_captions=False)  # noqa: F405  the reward does not read the partner's caption

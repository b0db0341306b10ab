# A probe of the demo: loop 2's reward adds a GT-free mask-quality term, the reward network's predicted
# Dice of each sampled mask (docs/prompt_rl.md, `sa2va-rl prompt-rl reward-net --mask-input binary` trained on the
# same pretrained checkpoint), to METEOR of the partner's caption. METEOR does not change when a mask's boundary
# moves a little; the reward network sees the mask itself. Everything else is the demo's grpo_shapes_cpu.py.
# Measured (research/LOG.md, 3 seeds): no better than the default (cycle IoU +0.011..+0.018 at weight 1,
# -0.001..+0.022 at weight 3), loop 2's training reward does not rise, and the text gap shrinks beyond CI on 2-3 seeds.
#
#   sa2va-rl demo --rl-config projects/llava_sam2/configs/rl/demo/grpo_shapes_reward_net_cpu.py \
#       --rl-options train_cfg.algorithm.rewards.caption_to_mask.1.checkpoint=RUN_DIR/reward_net
from mmengine.config import read_base

with read_base():
    from .grpo_shapes_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.prompt_rl.reward import RewardNetDiceReward  # noqa: E402
from projects.llava_sam2.rl_train.rewards import MeteorReward  # noqa: E402

reward_net_path = "work_dirs/prompt_rl_pretrained/reward_net"  # research/prompt_rl_from_checkpoint.sh output
train_cfg.algorithm.rewards.caption_to_mask = [  # noqa: F405
    dict(type=MeteorReward, weight=1.0),  # METEOR(partner's caption of the policy's mask, gt_caption)
    dict(type=RewardNetDiceReward, checkpoint=reward_net_path, weight=1.0),  # predicted Dice of the policy's mask
]

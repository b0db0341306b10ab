# Reward-guided fine-tuning on CPU (docs/prompt_rl.md): GRPO's caption -> mask loop alone, scored by the learned
# GT-free reward `reward_net_dice` (prompt_rl/reward.py) instead of a caption cycle. Each step grounds B captions,
# samples G stochastic masks per caption (Bernoulli mask policy), scores every mask with the reward network from
# the image and the mask only, and takes the clipped GRPO step on the mask log-probabilities.
#
# Inputs come from the prompt-RL pipeline (docs/prompt_rl.md): the tiny segmenter and the trained reward network.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/tiny_grpo_reward_net_cpu.py \
#       --work-dir work_dirs/prompt_rl/grpo \
#       --cfg-options model.pretrained_path=work_dirs/prompt_rl/segmenter \
#                     train_cfg.algorithm.rewards.caption_to_mask.0.checkpoint=work_dirs/prompt_rl/reward_net
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.shapes_regions import region_collate_fn, shapes_region_dataset
    from ._base_.sa2va_grpo_base import *  # noqa: F401,F403
    from ._base_.cpu_runtime import *  # noqa: F401,F403  fp32 OptimWrapper, gloo, seed 0
    from ._base_.tiny_model_cpu import *  # noqa: F401,F403  the tiny model's CPU settings, LoRA r=8

from projects.llava_sam2.rl_train.prompt_rl.reward import RewardNetDiceReward

segmenter_path = "work_dirs/prompt_rl/segmenter"  # `sa2va-rl prompt-rl segmenter` output (or any Sa2VA checkpoint)
reward_net_path = "work_dirs/prompt_rl/reward_net"  # `sa2va-rl prompt-rl reward-net` output (--mask-input binary)

model.update(pretrained_path=segmenter_path, preset=None)  # noqa: F405
model.lora.update(lora_dropout=0.0)  # noqa: F405

train_cfg.algorithm.config.update(  # noqa: F405
    num_generations=4,  # G masks per caption
    mask_to_caption_weight=0.0,  # loop 1 off: this run studies the learned mask reward alone
    caption_to_mask_weight=1.0,
    beta=0.0,  # no KL term: the reference pass would double the cost of this short CPU run
    # the mask action docs/prompt_rl.md measured (pooled Bernoulli cells, per-cell ratio); the reward net scores the
    # mask itself, not the partner's region cells, so the region policy's argument does not carry over unmeasured
    mask_policy="bernoulli", mask_pool=4, mask_importance_sampling_level="token",
)
train_cfg.algorithm.update(  # noqa: F405
    rewards=dict(caption_to_mask=[dict(type=RewardNetDiceReward, checkpoint=reward_net_path, weight=1.0)]),
    use_partner_captions=False,  # the reward looks at (image, mask) only, so the partner's caption is not needed
    seed=0,
)
max_iters = 30
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=1e-5, by_epoch=False, begin=0, end=2),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=2, end=max_iters),  # noqa: F405
]

# prompts: ShapesWorld('train') scenes at the segmenter's resolution (held-out evaluation uses the 'val' stream)
shapes_region_dataset.update(num_samples=256, seed=1)
train_dataloader.update(batch_size=4, num_workers=0, persistent_workers=False,  # noqa: F405
                        dataset=shapes_region_dataset, collate_fn=region_collate_fn)

# one checkpoint at the end, a rollout table every 10 iterations
default_hooks.checkpoint.update(interval=max_iters)  # noqa: F405
default_hooks.rollout_logging.update(interval=10, max_prompts=2, max_rollouts=2)  # noqa: F405

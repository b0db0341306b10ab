"""prompt_rl: the GRPO caption->mask config trains with the learned GT-free reward (reward_net_dice)."""
from pathlib import Path

import torch

from engine_toy import run_config
from projects.llava_sam2.rl_train.prompt_rl.reward_net import RewardNet, RewardNetConfig, save_reward_net

CONFIG = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl/tiny_grpo_reward_net_cpu.py"


def test_reward_net_config_runs_the_caption_to_mask_loop_with_the_learned_reward(tmp_path):
    from projects.llava_sam2.rl_train.cli.setup_checkpoint import make_tiny_checkpoint  # a random tiny segmenter

    segmenter = make_tiny_checkpoint(tmp_path / "segmenter", seed=0)
    torch.manual_seed(0)
    save_reward_net(RewardNet(RewardNetConfig(side=64, width=8)), tmp_path / "reward_net")
    options = {"model.pretrained_path": str(segmenter), "train_cfg.max_iters": 2,
               "train_cfg.algorithm.rewards.caption_to_mask.0.checkpoint": str(tmp_path / "reward_net"),
               "shapes_region_dataset.image_size": 64, "train_dataloader.dataset.image_size": 64,
               "default_hooks.checkpoint.interval": 2, "optim_wrapper.optimizer.lr": 1e-3}
    runner, record = run_config(CONFIG, tmp_path / "work", **options)
    logged = record.outputs[1]
    assert "mask_to_caption/reward_mean" not in logged  # loop 1 is off
    assert logged["caption_to_mask/reward_net_dice/missing"] == 0 and logged["caption_to_mask/reward_std"] > 0
    grad_norms = runner.message_hub.get_scalar("train/grad_norm").data[0]
    assert min(grad_norms) > 0  # the mask policy's log-probs carry a real gradient
    algo = runner.train_loop.algorithm
    assert [loop.name for loop in algo.loops] == ["caption_to_mask"] and not algo.context.use_partner_captions
    assert [r.name for r in algo.loops[0].composer.rewards] == ["reward_net_dice"]
    assert algo.weights.num_updates == 2  # the EMA partner hook still runs

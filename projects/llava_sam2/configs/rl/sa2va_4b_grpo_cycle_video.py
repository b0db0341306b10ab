# Dual-loop GRPO (cycle RL) of Sa2VA-4B on VIDEO from unpaired clips (docs/data.md, "Video RL on your own clips"):
#   * loop 1 (masklet -> the policy's caption of its key frame -> the EMA partner's masklet for that caption, SAM2
#     memory propagation over the clip -> reward J&F) reads SA-V masklets without text;
#   * loop 2 (referring expression -> the policy's masklet from the first five frames -> its mask on the largest
#     frame -> the partner's caption there -> METEOR + judge) reads MeViS expressions, their masks dropped.
# The rest is the image config's (_base_/sa2va_grpo_cycle_dlc.py): LoRA r=128, EMA partner, KL to the start, the
# fused LM-head log-prob, ZeRO-2 launch:
#
#   DEEPSPEED=deepspeed_zero2 tools/dist_train.sh projects/llava_sam2/configs/rl/sa2va_4b_grpo_cycle_video.py 8
#
# Edit the data paths (and ./pretrained/Sa2VA-4B) to your copies; check them first with
#   sa2va-rl inspect projects/llava_sam2/configs/rl/sa2va_4b_grpo_cycle_video.py
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.video_mevis import mevis_video_dataset
    from ._base_.datasets.video_sav import sav_video_dataset
    from ._base_.sa2va_grpo_cycle_dlc import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.engine.builders import unpaired_region_dataset  # noqa: E402
from projects.llava_sam2.rl_train.rewards import VideoJFReward  # noqa: E402

model.update(pretrained_path="./pretrained/Sa2VA-4B")  # noqa: F405

# 16 frames a clip go to SAM2 (drawn at random per epoch, seeded); the language model sees the first 5 (upstream)
train_dataloader["dataset"] = dict(  # noqa: F405  a new dict: none of the image dataset's keys carry over
    type=unpaired_region_dataset,
    regions=dict(sav_video_dataset, num_frames=16, frame_sampling="random_or_contiguous", on_bad_sample="skip"),
    texts=dict(mevis_video_dataset, num_frames=16, frame_sampling="random_or_contiguous", on_bad_sample="skip"),
)
train_cfg.algorithm.config.update(video_mllm_frames=5)  # noqa: F405
train_cfg.algorithm.rewards.mask_to_caption = [dict(type=VideoJFReward, weight=1.0, measure="jf")]  # noqa: F405
# the rollout table's pictures are image-only; keep its text rows rarer
default_hooks.rollout_logging.update(interval=200)  # noqa: F405

# The VIDEO domain-adaptation demo's GRPO (`sa2va-rl demo --video`): the tiny Sa2VA trained on source shapes clips
# is adapted to target-domain clips (the same moving scenes and vocabulary with shifted pixels on every frame:
# data/shapes_video.py) from UNPAIRED target data only, read through the real-format loaders:
#   * loop 1 (masklet -> key-frame caption -> partner's masklet, rewarded by J&F) reads SA-V-layout masklets without
#     text (`regions`, SAVMaskletDataset);
#   * loop 2 (expression -> the policy's mask on its largest MLLM frame -> partner's caption) reads other clips'
#     MeViS-layout expressions, their masks dropped by the unpaired zip (`texts`, MeViSDataset).
# Everything else is grpo_shapes_cpu.py's (KL 0.5 to the starting model, EMA partner, `region` mask action, lr 5e-4),
# with smaller groups and shorter answers so that the whole demo runs in a few minutes on two cores. The image demo's
# dense loop-1 mask loss has no video form (grpo/cycle.py), so it is off here.
#
#   sa2va-rl train projects/llava_sam2/configs/rl/demo/grpo_shapes_video_cpu.py --work-dir work_dirs/demo_video/rl \
#       --cfg-options train_dataloader.dataset.regions.annotation_root=work_dirs/demo_video/data/rl_regions/sav_train \
#                     ...   (`sa2va-rl demo --video` passes every path)
from mmengine.config import read_base

with read_base():
    from .._base_.datasets.video_mevis import mevis_video_dataset
    from .._base_.datasets.video_sav import sav_video_dataset
    from .grpo_shapes_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.engine.builders import unpaired_region_dataset  # noqa: E402
from projects.llava_sam2.rl_train.rewards import VideoJFReward  # noqa: E402

# ---- data: two unpaired target sets (written by `sa2va-rl demo --video`, stage "data"), every frame of each clip --
train_dataloader["dataset"] = dict(  # noqa: F405  a new dict: none of the image dataset's keys carry over
    type=unpaired_region_dataset,
    regions=dict(sav_video_dataset, annotation_root="work_dirs/demo_video/data/rl_regions/sav_train",
                 frames_root="work_dirs/demo_video/data/rl_regions/JPEGImages_24fps", name="target_masklets",
                 num_frames=None),
    texts=dict(mevis_video_dataset, expression_file="work_dirs/demo_video/data/rl_texts/meta_expressions.json",
               mask_file="work_dirs/demo_video/data/rl_texts/mask_dict.json",
               image_root="work_dirs/demo_video/data/rl_texts/JPEGImages", name="target_texts", num_frames=None),
)
train_dataloader.update(batch_size=2)  # noqa: F405  B = 2 clips per loop and iteration

# ---- loop-1 reward: J&F between the gt masklet and the partner's masklet for the policy's key-frame caption -------
train_cfg.algorithm.rewards.mask_to_caption = [dict(type=VideoJFReward, weight=1.0, measure="jf")]  # noqa: F405

# ---- GRPO knobs: grpo_shapes_cpu.py's, with G = 4, short answers, the first 3 frames to the language model --------
train_cfg.algorithm.config.update(  # noqa: F405
    num_generations=4,
    max_completion_length=12,
    video_mllm_frames=3,
)
max_iters = 40
train_cfg.update(max_iters=max_iters)  # noqa: F405
param_scheduler = [
    dict(type=LinearLR, start_factor=0.1, by_epoch=False, begin=0, end=1),  # noqa: F405
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=False, begin=1, end=max_iters),  # noqa: F405
]
default_hooks.checkpoint.update(interval=max_iters, max_keep_ckpts=1)  # noqa: F405
default_hooks.rollout_logging.update(interval=1000)  # noqa: F405  no rollout tables (image panels only)

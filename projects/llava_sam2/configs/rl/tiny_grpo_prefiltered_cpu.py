# tiny_grpo_cycle_cpu.py on a COCO-style region dataset restricted to the prompts a `sa2va-rl prefilter` run kept
# (those whose GRPO group rewards vary; the others give zero advantages). The CI check of the pre-filter round trip:
#
#   sa2va-rl prefilter projects/llava_sam2/configs/rl/tiny_grpo_prefiltered_cpu.py --out work_dirs/tiny_prompts.json \
#       --cfg-options train_dataloader.dataset.dataset.ann_file=data/my_regions/annotations.json
#   sa2va-rl train projects/llava_sam2/configs/rl/tiny_grpo_prefiltered_cpu.py --work-dir work_dirs/tiny_prefiltered \
#       --cfg-options train_dataloader.dataset.dataset.ann_file=data/my_regions/annotations.json
#
# The pre-filter reads the dataset inside KeepIdsDataset (the whole data); training reads the kept part.
from mmengine.config import read_base

with read_base():
    from ._base_.datasets.coco_regions import coco_region_dataset
    from .tiny_grpo_cycle_cpu import *  # noqa: F401,F403

from projects.llava_sam2.rl_train.engine.prompt_filter import KeepIdsDataset  # noqa: E402

coco_region_dataset.update(image_root=None)  # None: the folder of ann_file
train_dataloader.dataset = dict(  # noqa: F405
    type=KeepIdsDataset, dataset=coco_region_dataset, keep_ids_file='work_dirs/tiny_prompts.json',
    loop=None)  # None: a prompt whose rewards vary in either loop

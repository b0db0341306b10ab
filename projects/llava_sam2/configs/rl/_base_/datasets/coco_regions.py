# COCO-style annotations.json as region samples (docs/data.md, "COCO-style").
# Set the two paths to your local copy; `file_name` in annotations.json is relative to image_root.
# Compose RL configs by the unique name (coco_region_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import CocoRegionDataset, region_collate

coco_region_dataset = dict(
    type=CocoRegionDataset,
    ann_file='data/my_regions/annotations.json',
    image_root='data/my_regions',           # None: the folder of ann_file
    name='coco',                            # sample ids: "<name>/<image id>#<ann id>"
    include_crowd=False,                    # iscrowd=1 regions are not one object
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent images: 'raise' | 'white' | 'black' | 'drop'
)
dataset = coco_region_dataset
region_collate_fn = dict(type=region_collate)

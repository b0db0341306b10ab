# Procedural shapes world (docs/data.md, "Shapes world"): seeded, no files needed.
# Compose RL configs by the unique name (shapes_region_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import ShapesWorld, region_collate

shapes_region_dataset = dict(
    type=ShapesWorld,
    split='train',                          # 'train' | 'val' | 'test': disjoint random streams
    num_samples=1000,
    seed=0,                                 # same (split, seed, index) -> byte-identical sample
    image_size=224,                         # tiny model input side
    min_objects=1,
    max_objects=4,
)
dataset = shapes_region_dataset
region_collate_fn = dict(type=region_collate)

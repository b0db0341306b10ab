# Procedural shapes video world (docs/data.md, "Shapes video world"): seeded moving shapes, exact masklets, no files.
# Compose RL configs by the unique name (shapes_video_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import ShapesVideoWorld, region_collate

shapes_video_dataset = dict(
    type=ShapesVideoWorld,
    split='train',                          # 'train' | 'val' | 'test': disjoint random streams
    num_samples=1000,
    seed=0,                                 # same (split, seed, index) -> byte-identical clip
    image_size=224,                         # tiny model input side
    num_frames=16,                          # frames per clip
    min_objects=1,
    max_objects=4,
    max_speed_per_frame=0.04,               # fastest object, as a fraction of the side per frame
    bounce=0.5,                             # probability an object reflects off the edges (else it may leave)
)
dataset = shapes_video_dataset
region_collate_fn = dict(type=region_collate)

# MeViS as video region samples (docs/data.md, "Video datasets"): meta_expressions.json + mask_dict.json (RLE per
# frame) + JPEGImages/<video>/<frame>.jpg. Set the three paths to your local copy (or to a folder written by
# ShapesVideoWorld.write_mevis, which returns them).
# Compose RL configs by the unique name (mevis_video_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import MeViSDataset, region_collate

mevis_video_dataset = dict(
    type=MeViSDataset,
    expression_file='data/video_datas/mevis/train/meta_expressions.json',
    mask_file='data/video_datas/mevis/train/mask_dict.json',
    image_root='data/video_datas/mevis/train/JPEGImages',
    name='mevis',                           # sample ids: "<name>/<video>#<anno ids joined by '+'>"
    num_frames=5,                           # frames per sample (None: every frame of the clip)
    frame_sampling='random',                # 'random' | 'random_or_contiguous' | 'uniform' (evaluation)
    seed=0,                                 # frame draws seeded by (seed, epoch, index)
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent frames: 'raise' | 'white' | 'black' | 'drop'
)
dataset = mevis_video_dataset
region_collate_fn = dict(type=region_collate)

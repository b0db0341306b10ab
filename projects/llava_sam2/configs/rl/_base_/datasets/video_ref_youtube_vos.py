# Ref-YouTube-VOS as video region samples (docs/data.md, "Video datasets"): meta_expressions.json, JPEG frames and
# object-id PNG masks (pixel value = object id). Set the paths to your local copy; meta_file is optional (categories,
# and expressions naming an unknown object caught while indexing).
# Compose RL configs by the unique name (ref_youtube_vos_video_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import RefYouTubeVOSDataset, region_collate

ref_youtube_vos_video_dataset = dict(
    type=RefYouTubeVOSDataset,
    expression_file='data/video_datas/rvos/meta_expressions/train/meta_expressions.json',
    image_root='data/video_datas/rvos/train/JPEGImages',
    mask_root='data/video_datas/rvos/train/Annotations',
    meta_file='data/video_datas/rvos/train/meta.json',   # None: no categories
    name='ref_youtube_vos',                 # sample ids: "<name>/<video>#<obj_id>"
    num_frames=5,                           # frames per sample (None: every frame of the clip)
    frame_sampling='random',                # 'random' | 'random_or_contiguous' | 'uniform' (evaluation)
    seed=0,                                 # frame draws seeded by (seed, epoch, index)
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent frames: 'raise' | 'white' | 'black' | 'drop'
)
dataset = ref_youtube_vos_video_dataset
region_collate_fn = dict(type=region_collate)

# ReVOS (reasoning video object segmentation) as video region samples (docs/data.md, "Video datasets"): MeViS's two
# files; the video ids are paths below the data root, which is the image root. Set the paths to your local copy.
# Compose RL configs by the unique name (revos_video_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import ReVOSDataset, region_collate

revos_video_dataset = dict(
    type=ReVOSDataset,
    expression_file='data/video_datas/revos/meta_expressions_train_.json',
    mask_file='data/video_datas/revos/mask_dict.json',
    image_root='data/video_datas/revos',    # the folder the video ids are relative to
    name='revos',                           # sample ids: "<name>/<video>#<anno ids joined by '+'>"
    num_frames=5,                           # frames per sample (None: every frame of the clip)
    frame_sampling='random',                # 'random' | 'random_or_contiguous' | 'uniform' (evaluation)
    seed=0,                                 # frame draws seeded by (seed, epoch, index)
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent frames: 'raise' | 'white' | 'black' | 'drop'
)
dataset = revos_video_dataset
region_collate_fn = dict(type=region_collate)

# SA-V masklets without text (loop 1's unpaired data; docs/data.md, "Video datasets"): <video_id>_manual.json files
# searched recursively under annotation_root; frames from the mp4 beside each JSON, or with frames_root from the
# extracted JPEGs <frames_root>/<video_id>/<video frame:05d>.jpg. Set the paths to your local copy (or to a folder
# written by ShapesVideoWorld.write_sav, which returns them).
# Compose RL configs by the unique name (sav_video_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import SAVMaskletDataset, region_collate

sav_video_dataset = dict(
    type=SAVMaskletDataset,
    annotation_root='data/video_datas/sav_train',
    frames_root='data/video_datas/sav_train/JPEGImages_24fps',  # None: decode the mp4 beside each JSON
    masklet_type='manual',                  # 'manual' | 'auto'
    name='sav',                             # sample ids: "<name>/<video_id>#<masklet_id>"
    num_frames=5,                           # annotated frames per sample (None: all of them)
    frame_sampling='random',                # 'random' | 'random_or_contiguous' | 'uniform' (evaluation)
    seed=0,                                 # frame draws seeded by (seed, epoch, index)
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent frames: 'raise' | 'white' | 'black' | 'drop'
)
dataset = sav_video_dataset
region_collate_fn = dict(type=region_collate)

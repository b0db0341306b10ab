# describe-anything (DLC) training data: <data_root>/<Subset>/annotations.json + images/*.tar
# (docs/data.md, "DLC"). The shards' pickles are unpickled: point data_root only at your own copy.
# Compose RL configs by the unique name (dlc_region_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import DLCRegionDataset, region_collate

dlc_region_dataset = dict(
    type=DLCRegionDataset,
    data_root='data/describe-anything-dataset',
    subsets=['COCOStuff', 'LVIS', 'PACO', 'Mapillary', 'OpenImages'],  # SAV (video) is not supported
    name='dlc',                             # sample ids: "<name>/<subset>/<key>#<ann_id>"
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent images: 'raise' | 'white' | 'black' | 'drop'
)
dataset = dlc_region_dataset
region_collate_fn = dict(type=region_collate)

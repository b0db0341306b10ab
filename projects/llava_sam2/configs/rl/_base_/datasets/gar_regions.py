# Grasp-Any-Region data: <data_root>/<Subset>/data-XXXXX-of-NNNNN.arrow from datasets.save_to_disk
# (docs/data.md, "GAR"). Relation rows (<PromptK> in the text) are left out and counted.
# Compose RL configs by the unique name (gar_region_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import GARRegionDataset, region_collate

gar_region_dataset = dict(
    type=GARRegionDataset,
    data_root='data/Grasp-Any-Region-Dataset',
    subsets=['Fine-Grained-Dataset*'],      # folder names or globs (HF copy: -Part1, -Part2, ...)
    name='gar',                             # sample ids: "<name>/<folder>/<shard>:<row>#<mask>"
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent images: 'raise' | 'white' | 'black' | 'drop'
)
dataset = gar_region_dataset
region_collate_fn = dict(type=region_collate)

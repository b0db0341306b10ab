# RefCOCO / RefCOCO+ / RefCOCOg: <data_root>/instances.json + refs(<split_by>).p, images in
# image_root (COCO train2014) (docs/data.md, "RefCOCO"). Upstream Sa2VA layout: data/ref_seg/<dataset>.
# Compose RL configs by the unique name (refcoco_region_dataset); `dataset` is the alias tools use.
from projects.llava_sam2.rl_train.data import RefCocoRegionDataset, region_collate

refcoco_region_dataset = dict(
    type=RefCocoRegionDataset,
    data_root='data/ref_seg/refcoco',
    image_root='data/glamm_data/images/coco2014/train2014',
    dataset='refcoco',                      # 'refcoco' | 'refcoco+' | 'refcocog'
    split='val',                            # unc: train/val/testA/testB; umd: train/val/test
    split_by=None,                          # None: unc for refcoco(+), umd for refcocog
    on_bad_sample='raise',                  # 'skip': drop bad samples, count them per problem
    alpha='raise',                          # transparent images: 'raise' | 'white' | 'black' | 'drop'
)
dataset = refcoco_region_dataset
region_collate_fn = dict(type=region_collate)

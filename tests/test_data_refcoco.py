"""RefCOCO-family refs + instances: split selection, exact masks, expressions."""
import numpy as np
import pytest

from data_fixtures import make_refcoco
from projects.llava_sam2.rl_train.data import BadSampleError, RefCocoRegionDataset


@pytest.fixture(scope="module")
def refcoco(tmp_path_factory):
    return make_refcoco(str(tmp_path_factory.mktemp("ref_seg")))


@pytest.mark.parametrize("dataset_name, split", [
    ("refcoco", "train"), ("refcoco", "val"), ("refcoco", "testA"), ("refcoco", "testB"),
    ("refcocog", "train"), ("refcocog", "val"), ("refcocog", "test")])
def test_split_selection_and_exact_samples(refcoco, dataset_name, split):
    root, image_root, expected = refcoco
    dataset = RefCocoRegionDataset(f"{root}/{dataset_name}", image_root, dataset=dataset_name, split=split)
    items = expected[(dataset_name, split)]
    assert len(dataset) == len(items)
    for index, item in enumerate(items):
        sample = dataset[index]
        assert sample.sample_id == item.sample_id and sample.source == dataset.name
        assert sample.image.mode == "RGB" and sample.image.size == item.size
        assert np.array_equal(sample.gt_mask, item.gt_mask), item.sample_id
        assert sample.captions == [] and sample.expressions == item.expressions
        assert sample.category == item.category


def test_unknown_split_lists_the_available_ones(refcoco):
    root, image_root, _ = refcoco
    with pytest.raises(ValueError, match=r"split='test' is not in .*refs\(unc\)\.p.*testA"):
        RefCocoRegionDataset(f"{root}/refcoco", image_root, split="test")


def test_wrong_split_by_and_dataset(refcoco):
    root, image_root, _ = refcoco
    with pytest.raises(ValueError, match=r"refs\(google\)\.p does not exist"):
        RefCocoRegionDataset(f"{root}/refcocog", image_root, dataset="refcocog", split_by="google")
    with pytest.raises(ValueError, match="dataset='refclef'"):
        RefCocoRegionDataset(f"{root}/refcoco", image_root, dataset="refclef")


def test_missing_image_names_the_ref(refcoco, tmp_path):
    root, _, expected = refcoco
    dataset = RefCocoRegionDataset(f"{root}/refcoco", str(tmp_path), split="val")
    with pytest.raises(BadSampleError) as info:
        dataset[0]
    assert info.value.problem == "missing_image"
    assert expected[("refcoco", "val")][0].sample_id in str(info.value)


def test_duplicate_ids_in_instances_are_bad_samples(refcoco, tmp_path):
    import json
    import pickle
    import shutil

    root, image_root, _ = refcoco
    folder = tmp_path / "refcoco"
    shutil.copytree(f"{root}/refcoco", folder)
    instances = json.loads((folder / "instances.json").read_text())
    instances["images"].append({"id": 9, "file_name": "other.jpg", "height": 30, "width": 40})  # image 9 twice
    instances["annotations"].append(dict(instances["annotations"][2], segmentation=[]))         # ann 503 twice
    (folder / "instances.json").write_text(json.dumps(instances))
    with pytest.raises(BadSampleError, match=r"image_id 9 appears 2 times in 'images'"):
        RefCocoRegionDataset(str(folder), image_root, split="val")  # val: refs 1 (ann 502, image 9), 2 (ann 503)
    skipping = RefCocoRegionDataset(str(folder), image_root, split="val", on_bad_sample="skip")
    assert len(skipping) == 0 and skipping.bad_sample_counts == {"duplicate_id": 2}
    refs = pickle.loads((folder / "refs(unc).p").read_bytes())
    assert {r["ann_id"] for r in refs if r["split"] == "val"} == {502, 503}

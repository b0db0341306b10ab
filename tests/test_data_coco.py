"""COCO-style annotations.json: exact masks and text back, and every bad-input case."""
import json

import numpy as np
import pytest

from data_fixtures import make_bad_coco, make_coco, replace_bytes, rgb_image
from projects.llava_sam2.rl_train.data import BadSampleError, CocoRegionDataset, SkippedSample
from projects.llava_sam2.rl_train.data.types import RegionSample


def assert_sample(sample, expected):
    assert isinstance(sample, RegionSample)
    assert sample.sample_id == expected.sample_id
    assert sample.image.mode == "RGB" and sample.image.size == expected.size
    assert sample.gt_mask.dtype == bool and sample.gt_mask.shape == expected.gt_mask.shape
    assert np.array_equal(sample.gt_mask, expected.gt_mask), expected.sample_id
    assert sample.captions == expected.captions and sample.expressions == expected.expressions
    assert sample.category == expected.category


def test_reads_polygons_rle_and_text_exactly(tmp_path):
    ann_file, expected = make_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file)
    non_crowd = expected[:-1]
    assert len(dataset) == len(non_crowd)
    for index, item in enumerate(non_crowd):
        assert_sample(dataset[index], item)
    # PNG images come back pixel-exact
    assert np.array_equal(np.asarray(dataset[0].image), np.asarray(rgb_image(1, 30, 40)))
    assert dataset.bad_sample_counts == {}


def test_include_crowd_and_custom_root(tmp_path):
    ann_file, expected = make_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file, image_root=str(tmp_path), include_crowd=True, name="mine")
    assert len(dataset) == len(expected)
    crowd = [dataset[i] for i in range(len(dataset)) if dataset[i].sample_id == "mine/3#31"]
    assert len(crowd) == 1 and np.array_equal(crowd[0].gt_mask, expected[-1].gt_mask)


def test_construction_reads_no_image(tmp_path):
    ann_file, _ = make_coco(str(tmp_path))
    for png in (tmp_path / "images").iterdir():
        png.unlink()
    dataset = CocoRegionDataset(ann_file)  # lazy: only the JSON is read here
    assert len(dataset) == 5
    with pytest.raises(BadSampleError, match="missing_image"):
        dataset[0]


def test_each_bad_case_raises_naming_file_sample_and_problem(tmp_path):
    ann_file, expected = make_bad_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file, name="bad")
    for index, item in enumerate(expected):
        if item.problem is None:
            assert dataset[index].sample_id == item.sample_id
            continue
        with pytest.raises(BadSampleError) as info:
            dataset[index]
        err = info.value
        assert (err.problem, err.sample_id) == (item.problem, item.sample_id)
        assert item.sample_id in str(err) and item.problem in str(err) and err.file in str(err)


def test_skip_mode_drops_and_counts(tmp_path):
    ann_file, expected = make_bad_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file, name="bad", on_bad_sample="skip")
    outputs = [dataset[i] for i in range(len(dataset))]
    kept = [o.sample_id for o in outputs if isinstance(o, RegionSample)]
    assert kept == [e.sample_id for e in expected if e.problem is None]
    assert all(isinstance(o, SkippedSample) for o in outputs if o.sample_id not in kept)
    problems = [e.problem for e in expected if e.problem]
    assert dataset.bad_sample_counts == {p: problems.count(p) for p in sorted(set(problems))}
    [dataset[i] for i in range(len(dataset))]  # a second epoch does not inflate unique counts
    assert dataset.bad_samples.total == len(problems)


def test_alpha_policy_reaches_the_loader(tmp_path):
    ann_file, expected = make_bad_coco(str(tmp_path))
    index = next(i for i, e in enumerate(expected) if e.problem == "image_mode")
    sample = CocoRegionDataset(ann_file, name="bad", alpha="white")[index]
    assert sample.image.mode == "RGB"


def test_index_time_problems(tmp_path):
    ann_file, _ = make_coco(str(tmp_path))
    data = json.loads(open(ann_file).read())
    data["annotations"].append({"id": 99, "image_id": 12345, "segmentation": []})
    data["annotations"].append({"id": 98, "image_id": 1, "segmentation": [], "caption": 5})
    bad_file = tmp_path / "broken.json"
    bad_file.write_text(json.dumps(data))
    with pytest.raises(BadSampleError, match="image_id 12345"):
        CocoRegionDataset(str(bad_file))
    skipping = CocoRegionDataset(str(bad_file), on_bad_sample="skip")
    assert len(skipping) == 5 and skipping.bad_sample_counts == {"bad_annotation": 2}


def test_unusable_files_and_knobs(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        CocoRegionDataset(str(tmp_path / "none.json"))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CocoRegionDataset(str(tmp_path / "x.json"))
    (tmp_path / "y.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="'annotations'"):
        CocoRegionDataset(str(tmp_path / "y.json"))
    ann_file, _ = make_coco(str(tmp_path))
    with pytest.raises(ValueError, match="on_bad_sample='ignore'"):
        CocoRegionDataset(ann_file, on_bad_sample="ignore")
    with pytest.raises(IndexError):
        CocoRegionDataset(ann_file)[5]


def test_non_utf8_annotation_file_names_file_and_offset(tmp_path):
    ann_file, _ = make_coco(str(tmp_path))
    replace_bytes(ann_file, b"two boxes", b"two b\xf6xes")  # latin-1 "ö"
    offset = open(ann_file, "rb").read().index(b"\xf6")
    with pytest.raises(ValueError, match=rf"annotations.json is not valid UTF-8: byte 0xf6 at offset {offset}") as info:
        CocoRegionDataset(ann_file)
    assert "re-save it as UTF-8" in str(info.value) and not isinstance(info.value, UnicodeDecodeError)


def _write(tmp_path, data):
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_duplicate_image_id_is_not_silently_overwritten(tmp_path):
    ann_file, _ = make_coco(str(tmp_path))
    data = json.loads(open(ann_file).read())
    # a second record for image 2 naming another picture: which one annotations 21/22 mean is unknown
    data["images"].append({"id": 2, "file_name": "images/003.png", "height": 32, "width": 32})
    dup = _write(tmp_path, data)
    with pytest.raises(BadSampleError, match=r"image_id 2 appears 2 times in 'images' \(file_name \['images/002.png', "
                                             r"'images/003.png'\]\)") as info:
        CocoRegionDataset(dup)
    assert info.value.problem == "duplicate_id" and info.value.sample_id == "coco/2#21" and info.value.file == dup
    skipping = CocoRegionDataset(dup, on_bad_sample="skip")
    assert [skipping[i].sample_id for i in range(len(skipping))] == ["coco/1#11", "coco/1#12", "coco/3#32"]
    assert skipping.bad_sample_counts == {"duplicate_id": 2}


def test_duplicate_annotation_ids_are_detected(tmp_path):
    ann_file, _ = make_coco(str(tmp_path))
    data = json.loads(open(ann_file).read())
    data["annotations"][3]["id"] = 12  # two annotations (image 1 and image 2) now share id 12
    dup = _write(tmp_path, data)
    with pytest.raises(BadSampleError, match=r"annotation id 12 \(entry 1 of 'annotations'\) is used by more than one"):
        CocoRegionDataset(dup)
    skipping = CocoRegionDataset(dup, on_bad_sample="skip")
    assert [skipping[i].sample_id for i in range(len(skipping))] == ["coco/1#11", "coco/2#21", "coco/3#32"]
    assert skipping.bad_sample_counts == {"duplicate_id": 2}

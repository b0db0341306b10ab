"""RLE decoding through pycocotools, with the checks pycocotools itself does not make."""
import numpy as np
import pytest

from data_fixtures import blob_mask, rect_mask, rect_polygons, rle, uncompressed_rle
from projects.llava_sam2.rl_train.data.bad_samples import BadSampleError
from projects.llava_sam2.rl_train.data.rle import decode_rle, decode_segmentation, encode_mask

WHERE = dict(file="ann.json", sample_id="set/7#3")


def worked_example():
    # docs/data.md "Masks (RLE)": 4x6 mask, rows 1-2, cols 2-4 on
    gt_mask = np.zeros((4, 6), dtype=bool)
    gt_mask[1:3, 2:5] = True
    return gt_mask


def test_worked_example_all_forms():
    gt_mask = worked_example()
    assert encode_mask(gt_mask) == {"size": [4, 6], "counts": "9220003"}
    assert uncompressed_rle(gt_mask)["counts"] == [9, 2, 2, 2, 2, 2, 5]
    for segm in ({"size": [4, 6], "counts": "9220003"}, {"size": [4, 6], "counts": b"9220003"},
                 {"size": [4, 6], "counts": [9, 2, 2, 2, 2, 2, 5]}):
        decoded = decode_segmentation(segm, 4, 6, **WHERE)
        assert decoded.dtype == bool and np.array_equal(decoded, gt_mask)


def test_random_masks_round_trip_exactly():
    for seed in range(5):
        gt_mask = blob_mask(seed, 17 + seed, 23)
        assert np.array_equal(decode_rle(rle(gt_mask), 17 + seed, 23, **WHERE), gt_mask)
        assert np.array_equal(decode_rle(uncompressed_rle(gt_mask), 17 + seed, 23, **WHERE), gt_mask)


def test_polygons_union_of_parts():
    boxes = [(1, 1, 4, 3), (5, 2, 8, 6)]
    decoded = decode_segmentation(rect_polygons(*boxes), 7, 9, **WHERE)
    assert np.array_equal(decoded, rect_mask(7, 9, *boxes))


@pytest.mark.parametrize("segm, problem", [
    ({"size": [4, 6], "counts": "9220"}, "corrupt_rle"),           # truncated string
    ({"size": [4, 6], "counts": "9"}, "corrupt_rle"),              # decodes to uninitialised memory
    ({"size": [4, 6], "counts": ""}, "corrupt_rle"),
    ({"size": [4, 6], "counts": "zz~~"}, "corrupt_rle"),           # not the 6-bit alphabet
    ({"size": [4, 6], "counts": "92200039"}, "corrupt_rle"),       # too many pixels
    ({"size": [4, 6], "counts": "9é"}, "corrupt_rle"),
    ({"size": [4, 6], "counts": [9, 2, 2]}, "corrupt_rle"),        # runs do not sum to H*W
    ({"size": [4, 6], "counts": [-1, 25]}, "corrupt_rle"),
    ({"size": [4, 6], "counts": 17}, "corrupt_rle"),
    ({"size": [4], "counts": "9220003"}, "corrupt_rle"),
    ({"counts": "9220003"}, "corrupt_rle"),
    ({"size": [6, 4], "counts": "9220003"}, "rle_size_mismatch"),  # [W, H] instead of [H, W]
    ({"size": [4, 7], "counts": "9220003"}, "rle_size_mismatch"),
    ([[1, 1, 3, 1]], "bad_annotation"),                            # polygon with 2 points
    ([[1, 1, 3, 1, 3]], "bad_annotation"),                         # odd coordinate count
    ("9220003", "corrupt_rle"),
])
def test_bad_segmentations_raise_with_file_sample_and_problem(segm, problem):
    with pytest.raises(BadSampleError) as info:
        decode_segmentation(segm, 4, 6, **WHERE)
    err = info.value
    assert err.problem == problem
    assert "ann.json" in str(err) and "set/7#3" in str(err) and problem in str(err)


def test_size_message_explains_height_width_order():
    with pytest.raises(BadSampleError, match=r"\[height, width\]"):
        decode_rle({"size": [6, 4], "counts": "9220003"}, 4, 6, **WHERE)


def test_encode_mask_is_json_ready_and_rejects_3d():
    encoded = encode_mask(blob_mask(3, 9, 11))
    assert isinstance(encoded["counts"], str) and encoded["size"] == [9, 11]
    with pytest.raises(ValueError, match=r"\[H, W\]"):
        encode_mask(np.zeros((2, 3, 4), bool))

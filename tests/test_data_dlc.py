"""describe-anything (DLC) shards: exact regions back, lazy index, missing/truncated members."""
import os
import pickle
import tarfile

import numpy as np
import pytest

from data_fixtures import DLC_KEYS, make_dlc, replace_bytes
from projects.llava_sam2.rl_train.data import BadSampleError, DLCRegionDataset, RegionSample
from projects.llava_sam2.rl_train.data.dlc import scan_tar
from projects.llava_sam2.rl_train.data.pickles import loads_data


def check(sample, item):
    assert isinstance(sample, RegionSample) and sample.sample_id == item.sample_id
    assert sample.image.mode == "RGB" and sample.image.size == item.size
    assert np.array_equal(sample.gt_mask, item.gt_mask), item.sample_id
    assert sample.captions == item.captions and sample.expressions == [] and sample.category == item.category
    assert sample.source == "dlc/COCOStuff"


def test_reads_every_region_exactly(tmp_path):
    expected = make_dlc(str(tmp_path))
    dataset = DLCRegionDataset(str(tmp_path), ["COCOStuff"])
    assert len(dataset) == len(expected) == 6  # 4 images, 2 + 1 + 2 + 1 regions
    for index, item in enumerate(expected):
        check(dataset[index], item)
    assert len(dataset.shards) == 2 and dataset.bad_sample_counts == {}


def test_index_uses_headers_only(tmp_path, monkeypatch):
    make_dlc(str(tmp_path))
    calls = []
    monkeypatch.setattr("projects.llava_sam2.rl_train.data.dlc.loads_data",
                        lambda payload: calls.append(1) or loads_data(payload))
    dataset = DLCRegionDataset(str(tmp_path), "COCOStuff")
    assert calls == [] and dataset._files._items == {}  # no pickle read, no handle kept open
    dataset[0]
    assert calls == [1]


def test_scan_tar_offsets_and_whole_shard(tmp_path):
    make_dlc(str(tmp_path))
    path = str(tmp_path / "COCOStuff" / "images" / "00000000.tar")
    members, problem = scan_tar(path)
    assert problem is None and set(members) == set(DLC_KEYS[:2])
    with tarfile.open(path) as archive, open(path, "rb") as raw:
        member = archive.getmember(f"{DLC_KEYS[0]}.pickle")
        raw.seek(members[DLC_KEYS[0]]["pickle"].offset)
        assert raw.read(member.size) == archive.extractfile(member).read()


def test_missing_member_raises_at_construction_or_is_counted(tmp_path):
    expected = make_dlc(str(tmp_path), missing_key=True)
    with pytest.raises(BadSampleError) as info:
        DLCRegionDataset(str(tmp_path), ["COCOStuff"])
    assert info.value.problem == "missing_member" and "000000999999" in str(info.value)
    assert "annotations.json" in str(info.value)
    dataset = DLCRegionDataset(str(tmp_path), ["COCOStuff"], on_bad_sample="skip")
    assert len(dataset) == len(expected) and dataset.bad_sample_counts == {"missing_member": 1}


def test_truncated_shard(tmp_path):
    expected = make_dlc(str(tmp_path), truncate=True)
    shard = str(tmp_path / "COCOStuff" / "images" / "00000001.tar")
    assert "needs bytes up to" in scan_tar(shard)[1]
    with pytest.raises(BadSampleError, match="truncated") as info:
        DLCRegionDataset(str(tmp_path), ["COCOStuff"])
    assert info.value.problem == "truncated_shard" and "00000001.tar" in str(info.value)
    dataset = DLCRegionDataset(str(tmp_path), ["COCOStuff"], on_bad_sample="skip")
    good = [e for e in expected if e.problem is None]
    assert [dataset[i].sample_id for i in range(len(dataset))] == [e.sample_id for e in good]
    assert dataset.bad_sample_counts == {"truncated_shard": len(expected) - len(good)}


def test_cut_between_members_is_detected(tmp_path):
    make_dlc(str(tmp_path))
    path = tmp_path / "COCOStuff" / "images" / "00000000.tar"
    members, _ = scan_tar(str(path))
    end_of_first = members[DLC_KEYS[0]]["pickle"]
    keep = end_of_first.offset + -(-end_of_first.size // 512) * 512  # a clean cut tarfile ignores
    path.write_bytes(path.read_bytes()[:keep])
    assert "end-of-archive" in scan_tar(str(path))[1]


def test_member_cut_after_indexing_is_a_bad_sample(tmp_path):
    expected = make_dlc(str(tmp_path))
    dataset = DLCRegionDataset(str(tmp_path), ["COCOStuff"], on_bad_sample="skip")
    path = tmp_path / "COCOStuff" / "images" / "00000001.tar"
    path.write_bytes(path.read_bytes()[:1000])
    last = dataset[len(dataset) - 1]
    assert last.problem == "truncated_shard" and last.sample_id == expected[-1].sample_id


def test_corrupt_rle_inside_the_pickle(tmp_path):
    expected = make_dlc(str(tmp_path), bad_rle=True)
    dataset = DLCRegionDataset(str(tmp_path), ["COCOStuff"])
    index = next(i for i, e in enumerate(expected) if e.problem == "corrupt_rle")
    with pytest.raises(BadSampleError) as info:
        dataset[index]
    assert info.value.problem == "corrupt_rle" and expected[index].sample_id in str(info.value)
    assert "00000000.tar" in str(info.value)


def test_pickles_with_code_are_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo never",))

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        loads_data(pickle.dumps([{"caption": Evil()}]))
    assert loads_data(pickle.dumps([{"ann_id": np.int64(3)}])) == [{"ann_id": 3}]


def test_layout_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        DLCRegionDataset(str(tmp_path), ["LVIS"])
    (tmp_path / "LVIS").mkdir()
    (tmp_path / "LVIS" / "annotations.json").write_text("{}")
    with pytest.raises(ValueError, match="no tar shards"):
        DLCRegionDataset(str(tmp_path), ["LVIS"])


def test_non_utf8_annotations_json_names_the_file(tmp_path):
    make_dlc(str(tmp_path))
    ann_path = str(tmp_path / "COCOStuff" / "annotations.json")
    caption = f"region 1 of image {DLC_KEYS[0]}".encode()
    replace_bytes(ann_path, caption, caption.replace(b"region", b"r\xe9gion"))  # latin-1 "é"
    with pytest.raises(ValueError, match=r"DLC COCOStuff annotation file .*annotations.json is not valid UTF-8: "
                                         r"byte 0xe9 at offset \d+ \(line 1\)"):
        DLCRegionDataset(str(tmp_path), ["COCOStuff"])

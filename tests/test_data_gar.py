"""Grasp-Any-Region Arrow shards: exact regions back, relation rows left out, bad conversations."""
import pickle

import numpy as np
import pyarrow as pa
import pytest

from data_fixtures import (
    blob_mask, make_gar, make_gar_json_conversations, replace_bytes, rgb_image, rle, truncate_file)
from projects.llava_sam2.rl_train.data import BadSampleError, GARRegionDataset, RegionSample
from projects.llava_sam2.rl_train.data.gar import parse_conversation, read_stream

SUBSETS = ["Fine-Grained-Dataset*", "Relation-Dataset"]


def check(sample, item):
    assert isinstance(sample, RegionSample) and sample.sample_id == item.sample_id
    assert sample.image.mode == "RGB" and sample.image.size == item.size
    assert np.array_equal(sample.gt_mask, item.gt_mask), item.sample_id
    assert sample.captions == item.captions and sample.category == item.category


@pytest.fixture(scope="module")
def gar_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("gar")
    return str(root), make_gar(str(root))


def test_reads_single_and_per_mask_rows_exactly(gar_root):
    root, expected = gar_root
    dataset = GARRegionDataset(root, SUBSETS)
    assert len(dataset) == len(expected) == 8
    for index, item in enumerate(expected):
        check(dataset[index], item)
    assert dataset[0].source == "gar/Fine-Grained-Dataset-Part1"
    assert dataset.excluded == {"relation_rows": 1, "rows_without_mask": 0}


def test_index_is_lazy_and_handles_are_per_process(gar_root):
    root, _ = gar_root
    dataset = GARRegionDataset(root, SUBSETS)
    assert dataset._tables._items == {}
    dataset[0]
    assert list(dataset._tables._items) == [dataset.shards[0]]
    assert pickle.loads(pickle.dumps(dataset))._tables._items == {}  # workers open their own maps


def test_bad_conversations_raise_or_skip(tmp_path):
    expected = make_gar(str(tmp_path), bad_conversation=True)
    dataset = GARRegionDataset(str(tmp_path), SUBSETS)
    bad = [i for i, e in enumerate(expected) if e.problem]
    assert len(bad) == 2
    for index in bad:
        with pytest.raises(BadSampleError) as info:
            dataset[index]
        assert info.value.problem == "bad_conversation"
        assert expected[index].sample_id in str(info.value) and ".arrow" in str(info.value)
    skipping = GARRegionDataset(str(tmp_path), SUBSETS, on_bad_sample="skip")
    kept = [s for s in (skipping[i] for i in range(len(skipping))) if isinstance(s, RegionSample)]
    assert len(kept) == len(expected) - 2 and skipping.bad_sample_counts == {"bad_conversation": 2}


def test_invalid_utf8_text_is_a_bad_sample_naming_file_row_and_column(tmp_path):
    expected = make_gar(str(tmp_path))
    shard = str(tmp_path / "Fine-Grained-Dataset-Part1" / "data-00000-of-00002.arrow")
    replace_bytes(shard, b"fine caption 1", b"fine capti\xff\xfe 1")  # Arrow does not validate UTF-8 on read
    replace_bytes(shard, b"cat2", b"c\xe9t2")
    dataset = GARRegionDataset(str(tmp_path), SUBSETS)
    for index, column in ((1, "conversations"), (2, "catagory")):
        with pytest.raises(BadSampleError, match=f"column '{column}' holds a string that is not valid UTF-8") as info:
            dataset[index]
        assert info.value.problem == "bad_text" and info.value.file == shard
        assert info.value.sample_id == expected[index].sample_id  # ".../data-00000-of-00002:<row>#0"
    skipping = GARRegionDataset(str(tmp_path), SUBSETS, on_bad_sample="skip")
    kept = [s for s in (skipping[i] for i in range(len(skipping))) if isinstance(s, RegionSample)]
    assert len(kept) == len(expected) - 2 and skipping.bad_sample_counts == {"bad_text": 2}


def test_json_string_conversations(tmp_path):
    expected = make_gar_json_conversations(str(tmp_path))
    dataset = GARRegionDataset(str(tmp_path), ["Json-Dataset"], on_bad_sample="skip")
    check(dataset[0], expected[0])
    skipped = dataset[1]
    assert skipped.problem == "bad_conversation" and "not JSON" in skipped.detail


def test_truncated_shard(tmp_path):
    expected = make_gar(str(tmp_path))
    shard = tmp_path / "Fine-Grained-Dataset-Part1" / "data-00001-of-00002.arrow"
    truncate_file(str(shard), shard.stat().st_size - 200)
    assert read_stream(str(shard))[1] is not None
    with pytest.raises(BadSampleError) as info:
        GARRegionDataset(str(tmp_path), SUBSETS)
    assert info.value.problem == "truncated_shard" and "data-00001-of-00002.arrow" in str(info.value)
    dataset = GARRegionDataset(str(tmp_path), SUBSETS, on_bad_sample="skip")
    assert dataset.bad_sample_counts == {"truncated_shard": 1}
    assert len(dataset) == len(expected) - 2  # both rows of the cut shard are in one record batch


def test_cut_at_batch_boundary_is_detected(tmp_path):
    make_gar(str(tmp_path))
    shard = tmp_path / "Relation-Dataset" / "data-00000-of-00001.arrow"
    truncate_file(str(shard), shard.stat().st_size - 8)  # drop only the end-of-stream marker
    table, problem = read_stream(str(shard))
    assert table.num_rows == 3 and problem == "no end-of-stream marker"


@pytest.mark.parametrize("raw, message", [
    ("{", "not JSON"), ([], "non-empty list"), ([{"from": "human", "value": "q"}], "no non-empty gpt"),
    ([{"from": "gpt", "value": 3}], "is not"), ([{"value": "x"}], "is not"),
])
def test_parse_conversation_rejects(raw, message):
    with pytest.raises(BadSampleError, match=message):
        parse_conversation(raw, file="s.arrow", sample_id="gar/x:0#0")


def test_parse_conversation_accepts_roles():
    turns = parse_conversation([{"from": "user", "value": "q"}, {"from": "assistant", "value": "a"}],
                               file="s.arrow", sample_id="gar/x:0#0")
    assert turns == [("human", "q"), ("gpt", "a")]


def write_stream(path, table):
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def test_image_paths_next_to_the_shard(tmp_path):
    folder = tmp_path / "Paths-Dataset"
    folder.mkdir()
    rgb_image(0, 12, 10).save(folder / "pic.png")
    gt_mask = blob_mask(1, 12, 10)
    conversation = [{"from": "human", "value": "<image>\nDescribe"}, {"from": "gpt", "value": "pic"}]
    write_stream(folder / "data-00000-of-00001.arrow", pa.table({
        "image": [{"bytes": None, "path": "pic.png"}, {"bytes": None, "path": "gone.png"}],
        "conversations": [conversation, conversation], "mask_rle": [rle(gt_mask), rle(gt_mask)]}))
    dataset = GARRegionDataset(str(tmp_path), ["Paths-Dataset"])
    assert np.array_equal(dataset[0].gt_mask, gt_mask) and dataset[0].category is None
    with pytest.raises(BadSampleError) as info:
        dataset[1]
    assert info.value.problem == "missing_image" and "gone.png" in str(info.value)


def test_missing_shards_and_columns(tmp_path):
    with pytest.raises(ValueError, match="no \\*.arrow shards"):
        GARRegionDataset(str(tmp_path), ["Seed-Dataset"])
    (tmp_path / "Seed-Dataset").mkdir()
    write_stream(tmp_path / "Seed-Dataset" / "data-00000-of-00001.arrow",
                 pa.table({"image": [{"bytes": b"", "path": None}], "conversations": ["[]"]}))
    with pytest.raises(ValueError, match="lacks columns \\['mask_rle'\\]"):
        GARRegionDataset(str(tmp_path), ["Seed-Dataset"])

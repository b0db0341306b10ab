"""Collate, DataLoader workers (own handles, skip counts across processes), MMEngine configs."""
import os
import pickle

import numpy as np
import pytest
from torch.utils.data import DataLoader

from data_fixtures import make_bad_coco, make_coco, make_dlc, make_gar, make_refcoco
from projects.llava_sam2.rl_train.data import (BadSampleLog, CocoRegionDataset, DLCRegionDataset,
                                               RegionBatch, RegionSample, SkippedSample, count_skipped,
                                               region_collate)

CONFIG_DIR = "projects/llava_sam2/configs/rl/_base_/datasets"


def test_collate_keeps_order_and_moves_skips_aside():
    good = [RegionSample(None, np.ones((1, 1), bool), ["c"], [], f"s/{i}#0", "s") for i in range(3)]
    skipped = SkippedSample("s/9#0", "f.json", "empty_mask", "no pixel")
    batch = region_collate([good[0], skipped, good[1], good[2]])
    assert isinstance(batch, list) and [s.sample_id for s in batch] == ["s/0#0", "s/1#0", "s/2#0"]
    assert batch.skipped == [skipped]
    again = pickle.loads(pickle.dumps(batch))  # what a worker sends to the main process
    assert isinstance(again, RegionBatch) and again.skipped == [skipped] and len(again) == 3
    with pytest.raises(TypeError, match="RegionSample"):
        region_collate([{"image": None}])


def test_workers_report_skips_to_the_main_process(tmp_path):
    ann_file, expected = make_bad_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file, name="bad", on_bad_sample="skip")
    loader = DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=region_collate)
    log = BadSampleLog()
    delivered = [s.sample_id for batch in count_skipped(loader, log, "bad") for s in batch]
    assert delivered == [e.sample_id for e in expected if e.problem is None]
    problems = [e.problem for e in expected if e.problem]
    assert log.counts == {p: problems.count(p) for p in sorted(set(problems))}
    assert dataset.bad_sample_counts == {}  # the main-process copy loaded nothing itself
    assert "bad: 9 bad sample(s) skipped" in log.report("bad") and "missing.png" in log.report("bad")


def test_workers_open_their_own_tar_handles(tmp_path):
    expected = make_dlc(str(tmp_path))
    dataset = DLCRegionDataset(str(tmp_path), ["COCOStuff"])
    dataset[0]  # the parent opens a handle before forking
    parent_handle = dataset._files.get(dataset.shards[0])
    offset = parent_handle.tell()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=region_collate)
    samples = [s for batch in loader for s in batch]
    assert [s.sample_id for s in samples] == [e.sample_id for e in expected]
    assert all(np.array_equal(s.gt_mask, e.gt_mask) for s, e in zip(samples, expected))
    # a forked handle shares its offset with the parent: unchanged means workers used their own
    assert not parent_handle.closed and parent_handle.tell() == offset
    assert pickle.loads(pickle.dumps(dataset))._files._items == {}


def build(config_name: str, **overrides):
    from mmengine.config import Config
    from xtuner.registry import BUILDER

    cfg = Config.fromfile(os.path.join(CONFIG_DIR, config_name))
    for key, value in overrides.items():
        cfg.dataset[key] = value
    return cfg, BUILDER.build(cfg.dataset)


def test_mmengine_configs_build_on_fixtures(tmp_path):
    ann_file, coco_expected = make_coco(str(tmp_path / "coco"))
    dlc_expected = make_dlc(str(tmp_path / "dlc"))
    gar_expected = make_gar(str(tmp_path / "gar"))
    ref_root, image_root, ref_expected = make_refcoco(str(tmp_path / "ref"))
    cases = [
        ("coco_regions.py", dict(ann_file=ann_file, image_root=str(tmp_path / "coco")), coco_expected[0]),
        ("dlc_regions.py", dict(data_root=str(tmp_path / "dlc"), subsets=["COCOStuff"]), dlc_expected[0]),
        ("gar_regions.py", dict(data_root=str(tmp_path / "gar")), gar_expected[0]),
        ("refcoco_regions.py", dict(data_root=f"{ref_root}/refcoco", image_root=image_root),
         ref_expected[("refcoco", "val")][0]),
    ]
    for config_name, overrides, first in cases:
        cfg, dataset = build(config_name, **overrides)
        assert dataset.on_bad_sample == "raise"
        assert dataset[0].sample_id == first.sample_id and np.array_equal(dataset[0].gt_mask, first.gt_mask)
        assert cfg.region_collate_fn["type"] is region_collate
    cfg, shapes = build("shapes_regions.py", num_samples=2)
    assert len(shapes) == 2 and shapes[1].image.size == (224, 224)


def test_skip_warnings_are_capped_and_the_epoch_report_is_logged(caplog):
    log = BadSampleLog()
    with caplog.at_level("WARNING", logger="projects.llava_sam2.rl_train.data.bad_samples"):
        for i in range(8):
            log.add(SkippedSample(f"s/{i}#0", "f.json", "empty_mask", "no pixel"), warn=True)
        log.add(SkippedSample("s/0#0", "f.json", "empty_mask", "no pixel"), warn=True)  # seen before
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 5 and "further empty_mask samples are only counted" in warned[-1]
    assert log.counts == {"empty_mask": 8}
    caplog.clear()
    batches = [RegionBatch([], [SkippedSample("s/9#0", "g.json", "corrupt_rle", "cut")])]
    with caplog.at_level("WARNING", logger="projects.llava_sam2.rl_train.data.bad_samples"):
        assert len(list(count_skipped(batches, log, "demo"))) == 1
    assert caplog.records[-1].getMessage().startswith("demo: 9 bad sample(s) skipped")

"""Video loaders (Ref-YouTube-VOS, MeViS, ReVOS, SA-V): exact masklets and frames back, seeded frame sampling, and
every bad-input rule with the fault injected into a real-format fixture."""
import json
import os
import pickle

import numpy as np
import PIL.Image
import pytest

from data_fixtures import rgb_image, rle, truncate_file
from projects.llava_sam2.rl_train.data import (BadSampleError, MeViSDataset, RefYouTubeVOSDataset, ReVOSDataset,
                                               SAVMaskletDataset, SkippedSample, VideoRegionSample, region_collate)
from projects.llava_sam2.rl_train.data.video import sample_frame_indices
from video_fixtures import make_mevis, make_ref_youtube_vos, make_revos, make_sav, save_id_png


def assert_clip(sample, expected, indices=None):
    """``sample`` equals ``expected`` on the frames ``indices`` (default: all)."""
    indices = list(range(len(expected.frame_names))) if indices is None else indices
    assert isinstance(sample, VideoRegionSample) and sample.sample_id == expected.sample_id
    assert sample.frame_names == [expected.frame_names[i] for i in indices]
    assert sample.gt_masks.dtype == bool and np.array_equal(sample.gt_masks, expected.gt_masks[indices])
    assert sample.expressions == expected.expressions and sample.captions == []
    assert sample.category == expected.category
    assert all(f.mode == "RGB" and f.size == expected.size for f in sample.frames)
    if expected.frame_files is not None:  # JPEG frames: exactly PIL's decode of the file
        for frame, i in zip(sample.frames, indices):
            assert np.array_equal(np.asarray(frame), np.asarray(PIL.Image.open(expected.frame_files[i]).convert("RGB")))


def ytvos(paths, **kw):
    return RefYouTubeVOSDataset(paths["expression_file"], paths["image_root"], paths["mask_root"],
                                paths.get("meta_file"), **kw)


def mevis(paths, cls=MeViSDataset, **kw):
    return cls(paths["expression_file"], paths["mask_file"], paths["image_root"], **kw)


# --------------------------------------------------------------------------- reading each format
def test_ref_youtube_vos_reads_object_id_pngs_exactly(tmp_path):
    paths, expected = make_ref_youtube_vos(str(tmp_path))
    dataset = ytvos(paths, num_frames=None)
    assert [dataset.sample_id(i) for i in range(len(dataset))] == [e.sample_id for e in expected]
    for index, item in enumerate(expected):
        assert_clip(dataset[index], item)
    # object 2 is absent on frames 2-3, and object 2 paints over object 1 where they overlap
    assert not dataset[1].gt_masks[2:4].any() and dataset[1].gt_masks[0].any()
    without_meta = ytvos(dict(paths, meta_file=None), num_frames=None)
    assert without_meta[0].category is None and np.array_equal(without_meta[0].gt_masks, expected[0].gt_masks)


def test_mevis_unions_anno_ids_and_reads_null_frames(tmp_path):
    paths, expected = make_mevis(str(tmp_path))
    dataset = mevis(paths, num_frames=None)
    assert len(dataset) == len(expected) == 3
    for index, item in enumerate(expected):
        assert_clip(dataset[index], item)
    single, union = dataset[0].gt_masks, dataset[1].gt_masks  # [10] and [10, 11]
    assert (union >= single).all() and union.sum() > single.sum()
    assert dataset.bad_sample_counts == {}
    # a frame entry may also be a list of RLEs (parts of one object): their union
    halves = [expected[2].gt_masks[0].copy(), expected[2].gt_masks[0].copy()]
    middle = int(np.flatnonzero(halves[0].any(0)).mean()) + 1  # a column that cuts the box in two
    halves[0][:, :middle], halves[1][:, middle:] = False, False
    assert halves[0].any() and halves[1].any()
    _edit_json(paths["mask_file"], lambda d: d["12"].__setitem__(0, [rle(halves[0]), rle(halves[1])]))
    assert_clip(mevis(paths, num_frames=None)[2], expected[2])


def test_revos_video_ids_are_paths_below_the_data_root(tmp_path):
    paths, expected = make_revos(str(tmp_path))
    dataset = mevis(paths, ReVOSDataset, num_frames=None)
    assert dataset.name == "revos" and paths["image_root"] == str(tmp_path)
    for index, item in enumerate(expected):
        assert_clip(dataset[index], item)
        assert dataset[index].source == "revos"


def test_sav_masklets_from_mp4_and_from_extracted_jpeg_frames(tmp_path):
    paths, expected, written = make_sav(str(tmp_path))
    from_jpeg = SAVMaskletDataset(paths["annotation_root"], paths["frames_root"], num_frames=None)
    from_mp4 = SAVMaskletDataset(paths["annotation_root"], num_frames=None)
    assert len(from_jpeg) == len(from_mp4) == len(expected) == 4
    for index, item in enumerate(expected):
        assert_clip(from_jpeg[index], item)
        sample = from_mp4[index]
        assert_clip(sample, dict_replace(item, frame_files=None))
        assert sample.captions == [] and sample.expressions == []  # unpaired: masks without text
        # annotated frame k is video frame 4k: of all written frames, the decoded one is closest to frame 4k
        video = written[item.sample_id.split("/")[1].split("#")[0]]
        for k, frame in enumerate(sample.frames):
            errors = [np.abs(np.asarray(frame, int) - v.astype(int)).mean() for v in video]
            assert int(np.argmin(errors)) == 4 * k and errors[4 * k] < 5


def dict_replace(item, **fields):
    from dataclasses import replace
    return replace(item, **fields)


# --------------------------------------------------------------------------- frame sampling
def test_frame_sampling_is_seeded_per_sample_and_epoch(tmp_path):
    paths, expected = make_ref_youtube_vos(str(tmp_path))
    first, second = ytvos(paths, num_frames=3, seed=7), ytvos(paths, num_frames=3, seed=7)
    draws = []
    for index, item in enumerate(expected):
        sample = first[index]
        indices = [item.frame_names.index(n) for n in sample.frame_names]
        assert indices == sorted(indices) and len(indices) == 3
        assert_clip(sample, item, indices)  # masks and frames belong to the drawn frames
        assert second[index].frame_names == sample.frame_names  # another instance (another worker) draws the same
        draws.append(sample.frame_names)
    # the 8-frame clip draws 3 distinct frames; epochs and seeds change the draw, the same epoch repeats it
    assert len(set(draws[0])) == 3
    epochs = set()
    for epoch in range(6):
        first.set_epoch(epoch)
        epochs.add(tuple(first[0].frame_names))
    assert len(epochs) > 1
    first.set_epoch(0)
    assert first[0].frame_names == draws[0]
    assert {tuple(ytvos(paths, num_frames=3, seed=s)[0].frame_names) for s in range(6)} != {tuple(draws[0])}


def test_sample_frame_indices_policies():
    rng = np.random.default_rng(0)
    for _ in range(200):  # enough frames: distinct, sorted
        idx = sample_frame_indices(10, 5, "random", rng)
        assert idx == sorted(idx) and len(set(idx)) == 5 and all(0 <= i < 10 for i in idx)
    # fewer than num_frames + 2 frames: drawn with replacement (frames repeat), as in the training recipe
    short = [sample_frame_indices(6, 5, "random", rng) for _ in range(200)]
    assert all(len(i) == 5 and i == sorted(i) and max(i) < 6 for i in short)
    assert any(len(set(i)) < 5 for i in short)
    # random_or_contiguous: about half contiguous runs (a random draw is one only 6 times in 252), starting
    # anywhere but at the last possible start 10 - 5 (which only a random draw reaches, once in 252)
    mixed = [sample_frame_indices(10, 5, "random_or_contiguous", rng) for _ in range(400)]
    runs = [i for i in mixed if i == list(range(i[0], i[0] + 5))]
    assert 120 < len(runs) < 280 and {i[0] for i in runs} >= set(range(5))
    assert sum(i[0] == 5 for i in runs) <= 3
    assert sample_frame_indices(9, 3, "uniform", rng) == [0, 4, 8]
    assert sample_frame_indices(4, None, "random", rng) == [0, 1, 2, 3]
    for bad in (dict(num_frames=0), dict(num_frames=2.5), dict(frame_sampling="every_other")):
        with pytest.raises(ValueError, match="num_frames|frame_sampling"):
            RefYouTubeVOSDataset("unused.json", ".", ".", **bad)


def test_video_samples_go_through_region_collate(tmp_path):
    paths, expected = make_mevis(str(tmp_path))
    dataset = mevis(paths, num_frames=2)
    skipped = SkippedSample("mevis/x#1", "f", "empty_mask", "d")
    batch = region_collate([dataset[0], skipped, dataset[2]])
    assert [s.sample_id for s in batch] == [expected[0].sample_id, expected[2].sample_id]
    assert batch.skipped == [skipped]
    copy = pickle.loads(pickle.dumps(dataset))  # what a spawned DataLoader worker gets: the same draws
    assert copy[2].frame_names == dataset[2].frame_names and np.array_equal(copy[2].gt_masks, dataset[2].gt_masks)


# --------------------------------------------------------------------------- bad input
def _edit_json(path, edit):
    data = json.loads(open(path).read())
    edit(data)
    with open(path, "w") as handle:
        json.dump(data, handle)


def _replace_frame(path, size):
    rgb_image(99, size[1], size[0]).save(path, "JPEG")


YT = "ref_youtube_vos/a1"
YT_FAULTS = {  # fault -> (inject(paths), problem, sample id, the file the message names, found while indexing)
    "missing frame": (lambda p: os.remove(f"{p['image_root']}/a1/00010.jpg"), "missing_frame", f"{YT}#1",
                      "image_root/a1/00010.jpg", False),
    "missing mask": (lambda p: os.remove(f"{p['mask_root']}/a1/00010.png"), "missing_mask", f"{YT}#1",
                     "mask_root/a1/00010.png", False),
    "mask of the wrong size": (lambda p: save_id_png(f"{p['mask_root']}/a1/00010.png", np.ones((24, 31))),
                               "rle_size_mismatch", f"{YT}#1", "mask_root/a1/00010.png", False),
    "corrupt frame bytes": (lambda p: truncate_file(f"{p['image_root']}/a1/00015.jpg", 200), "bad_image", f"{YT}#1",
                            "image_root/a1/00015.jpg", False),
    "frame of another size": (lambda p: _replace_frame(f"{p['image_root']}/a1/00020.jpg", (30, 24)),
                              "frame_size_mismatch", f"{YT}#1", "image_root/a1/00020.jpg", False),
    "unknown object": (lambda p: _edit_json(p["expression_file"], lambda d: d["videos"]["a1"]["expressions"].update(
        {"3": {"exp": "a ghost", "obj_id": "7"}})), "unknown_object", f"{YT}#exp3", "expression_file", True),
    "empty masklet": (lambda p: (_edit_json(p["meta_file"], lambda d: d["videos"]["a1"]["objects"].update(
        {"3": {"category": "ghost", "frames": []}})), _edit_json(p["expression_file"], lambda d: d["videos"]["a1"][
            "expressions"].update({"3": {"exp": "a ghost", "obj_id": "3"}}))), "empty_mask", f"{YT}#3",
        "expression_file", False),
}

MV = "mevis/v001"


def _corrupt_counts(d):
    d["10"][1]["counts"] = d["10"][1]["counts"][:-4]


MV_FAULTS = {
    "RLE that does not decode": (lambda p: _edit_json(p["mask_file"], _corrupt_counts), "corrupt_rle", f"{MV}#10",
                                 "mask_file", False),
    "RLE of the wrong size": (lambda p: _edit_json(p["mask_file"], lambda d: d["12"].__setitem__(
        0, rle(np.ones((23, 26), bool)))), "rle_size_mismatch", "mevis/v002#12", "mask_file", False),
    "unknown anno id": (lambda p: _edit_json(p["expression_file"], lambda d: d["videos"]["v002"]["expressions"][
        "0"].__setitem__("anno_id", [99])), "unknown_object", "mevis/v002#exp0", "expression_file", True),
    "all-null masklet": (lambda p: _edit_json(p["mask_file"], lambda d: d.__setitem__("12", [None] * 4)),
                         "empty_mask", "mevis/v002#exp0", "expression_file", True),
    "mask list of the wrong length": (lambda p: _edit_json(p["mask_file"], lambda d: d["12"].pop()),
                                      "bad_annotation", "mevis/v002#exp0", "expression_file", True),
    "missing frame": (lambda p: os.remove(f"{p['image_root']}/v002/00003.jpg"), "missing_frame", "mevis/v002#12",
                      "image_root/v002/00003.jpg", False),
}

SV = "sav/sav_000001"
SAV_JSON = "annotation_root/sav_000/sav_000001_manual.json"
SAV_MP4 = "annotation_root/sav_000/sav_000001.mp4"


def _zero_masklet(d):
    for frame in d["masklet"]:
        frame[2] = rle(np.zeros((32, 48), bool))


def _garbage(path):
    with open(path, "wb") as handle:
        handle.write(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())


SAV_FAULTS = {
    "empty masklet": (lambda p: _edit_json(p[SAV_JSON], _zero_masklet), "empty_mask", f"{SV}#2", SAV_JSON, False),
    "RLE that does not decode": (lambda p: _edit_json(p[SAV_JSON], lambda d: d["masklet"][2][0].__setitem__(
        "counts", "zz!!")), "corrupt_rle", f"{SV}#0", SAV_JSON, False),
    "missing video": (lambda p: os.remove(p[SAV_MP4]), "missing_frame", f"{SV}#0", SAV_MP4, False),
    "corrupt video bytes": (lambda p: _garbage(p[SAV_MP4]), "bad_image", f"{SV}#0", SAV_MP4, False),
    "video cut short": (lambda p: truncate_file(p[SAV_MP4], os.path.getsize(p[SAV_MP4]) // 2), "bad_image",
                        f"{SV}#0", SAV_MP4, False),  # the mp4 index (moov) is lost with the tail
    "annotations longer than the video": (lambda p: _edit_json(p[SAV_JSON], lambda d: d["masklet"].append(
        d["masklet"][-1])), "missing_frame", f"{SV}#0", SAV_MP4, False),
    "objects missing on a frame": (lambda p: _edit_json(p[SAV_JSON], lambda d: d["masklet"][1].pop()),
                                   "bad_annotation", SV, SAV_JSON, True),
}


def _build(kind, root):
    if kind == "ytvos":
        paths, _ = make_ref_youtube_vos(root)
        return paths, lambda **kw: ytvos(paths, num_frames=None, **kw)
    if kind == "mevis":
        paths, _ = make_mevis(root)
        return paths, lambda **kw: mevis(paths, num_frames=None, **kw)
    paths, _, _ = make_sav(root, jpeg_frames=False)
    paths[SAV_JSON] = os.path.join(paths["annotation_root"], "sav_000", "sav_000001_manual.json")
    paths[SAV_MP4] = os.path.join(paths["annotation_root"], "sav_000", "sav_000001.mp4")
    return paths, lambda **kw: SAVMaskletDataset(paths["annotation_root"], num_frames=None, **kw)


CASES = [("ytvos", k, v) for k, v in YT_FAULTS.items()] + [("mevis", k, v) for k, v in MV_FAULTS.items()] + \
        [("sav", k, v) for k, v in SAV_FAULTS.items()]


@pytest.mark.parametrize("kind, fault, case", CASES, ids=[f"{k}: {f}" for k, f, _ in CASES])
def test_each_bad_input_is_a_named_error_or_a_counted_skip(tmp_path, kind, fault, case):
    inject, problem, sample_id, file_key, at_index = case
    paths, build = _build(kind, str(tmp_path))
    clean = build()
    inject(paths)
    key, _, rest = file_key.partition("/")
    file = os.path.join(paths[key], rest) if rest else paths[key]

    def check(err):
        assert (err.problem, err.sample_id, err.file) == (problem, sample_id, file)
        message = str(err)
        assert message.startswith(f"{file}: sample {sample_id}: {problem}: ") and "Fix: " in message

    if at_index:
        with pytest.raises(BadSampleError) as info:
            build()
        check(info.value)
        skipping = build(on_bad_sample="skip")
        assert skipping.bad_sample_counts == {problem: 1}
        assert len(skipping) < len(clean) or kind == "ytvos"  # ytvos: the bad expression was an extra one
        assert sample_id not in [skipping.sample_id(i) for i in range(len(skipping))]
        return
    raising = build()
    index = [raising.sample_id(i) for i in range(len(raising))].index(sample_id)
    with pytest.raises(BadSampleError) as info:
        raising[index]
    check(info.value)
    skipping = build(on_bad_sample="skip")
    outputs = [skipping[i] for i in range(len(skipping))] * 2  # a second epoch does not count twice
    outputs += [skipping[i] for i in range(len(skipping))]
    bad = {o.sample_id for o in outputs if isinstance(o, SkippedSample)}
    assert sample_id in bad and skipping.bad_sample_counts == {problem: len(bad)}
    assert all(isinstance(o, VideoRegionSample) for o in outputs if o.sample_id not in bad)


def test_skip_counts_several_faults_at_once_and_keeps_the_good_clips(tmp_path):
    paths, expected = make_ref_youtube_vos(str(tmp_path))
    YT_FAULTS["empty masklet"][0](paths)  # expression 3 names object 3, which has no pixel
    _edit_json(paths["expression_file"], lambda d: d["videos"]["a1"]["expressions"].update(
        {"4": {"exp": "a ghost", "obj_id": "9"}}))  # not an object of a1 in meta.json
    truncate_file(os.path.join(paths["image_root"], "b2", "00005.jpg"), 300)
    dataset = ytvos(paths, num_frames=None, on_bad_sample="skip")
    batch = region_collate([dataset[i] for i in range(len(dataset))])
    assert [s.sample_id for s in batch] == [f"{YT}#1", f"{YT}#2"]
    assert sorted(s.sample_id for s in batch.skipped) == [f"{YT}#3", "ref_youtube_vos/b2#1"]
    assert dataset.bad_sample_counts == {"bad_image": 1, "empty_mask": 1, "unknown_object": 1}
    assert_clip(batch[0], expected[0])
    assert_clip(batch[1], expected[1])


def test_unreadable_files_are_errors_in_both_modes(tmp_path):
    paths, _ = make_mevis(str(tmp_path))
    for mode in ("raise", "skip"):
        with pytest.raises(ValueError, match="does not exist"):
            mevis(dict(paths, mask_file=str(tmp_path / "none.json")), on_bad_sample=mode)
    (tmp_path / "bad.json").write_text(json.dumps({"clips": {}}))
    with pytest.raises(ValueError, match="'videos'"):
        mevis(dict(paths, expression_file=str(tmp_path / "bad.json")))
    with pytest.raises(ValueError, match="no \\*_manual.json"):
        SAVMaskletDataset(str(tmp_path))

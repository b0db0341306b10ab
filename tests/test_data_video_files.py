"""ShapesVideoWorld written in the real video layouts (MeViS, Ref-YouTube-VOS, SA-V) reads back through our loaders,
and the model's input check judges every video dataset on its key frame through one shared function."""
import json
import os

import numpy as np
import PIL.Image
import pytest

from projects.llava_sam2.rl_train.data import (BadSampleError, MeViSDataset, RefYouTubeVOSDataset, ReVOSDataset,
                                               SAVMaskletDataset, ShapesVideoWorld, SkippedSample, key_frame)
from projects.llava_sam2.rl_train.data.rle import encode_mask
from projects.llava_sam2.rl_train.model.text.input_check import InputCheck
from video_fixtures import make_mevis, make_ref_youtube_vos, make_revos, make_sav

SIDE, FRAMES = 48, 6
# JPEG at quality 95 without chroma subsampling loses part of the world's per-pixel noise (high-frequency content is
# what JPEG quantises): measured over 8 clips x 6 frames at 48 and 64 px, the mean absolute error is 3.15-3.21 grey
# levels (single pixels up to 23) and the PSNR at least 35.8 dB. The bounds leave a margin over that. Frames of the
# same clip differ from each other by less than the JPEG error (a still background), so the order is checked apart:
# each read frame is nearest (mean absolute error) to its own source frame, by a measured gap of at least 1.2 levels.
JPEG_MEAN_ABS_ERROR = 4.0
JPEG_PSNR_DB = 34.0


def world(num_samples=3, **kw):
    return ShapesVideoWorld("train", num_samples, seed=3, image_size=SIDE, num_frames=FRAMES, **kw)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def assert_same_clip(loaded, original, frame_files, frame_names):
    """Masklet and expressions equal, frames equal to the decoded JPEG file and within JPEG error of the clip."""
    assert loaded.sample_id == original.sample_id and loaded.frame_names == frame_names
    assert loaded.gt_masks.dtype == bool and np.array_equal(loaded.gt_masks, original.gt_masks)
    sources = [np.asarray(f).astype(int) for f in original.frames]
    for t, (frame, path) in enumerate(zip(loaded.frames, frame_files)):
        pixels = np.asarray(frame)
        assert np.array_equal(pixels, np.asarray(PIL.Image.open(path).convert("RGB")))  # the loader adds no change
        errors = [np.abs(pixels - source).mean() for source in sources]
        assert errors[t] <= JPEG_MEAN_ABS_ERROR and psnr(pixels, sources[t]) >= JPEG_PSNR_DB
        assert int(np.argmin(errors)) == t  # the right frame in the right place


def test_write_mevis_reads_back_through_the_mevis_loader(tmp_path):
    shapes = world(start=5)  # ids come from the split's stream: start + index
    paths = shapes.write_mevis(str(tmp_path))
    loaded = MeViSDataset(**paths, name=shapes.name, num_frames=None)
    assert len(loaded) == len(shapes) and loaded.bad_sample_counts == {}
    for index in range(len(shapes)):
        original, sample = shapes[index], loaded[index]
        video = str(5 + index)
        files = [os.path.join(paths["image_root"], video, f"{n}.jpg") for n in original.frame_names]
        assert_same_clip(sample, original, files, original.frame_names)
        assert sample.expressions == original.expressions and sample.captions == []  # MeViS has no caption field
    # a frame where the object is out of view is null, as MeViS stores an absent object
    with open(paths["mask_file"]) as handle:
        masks = json.load(handle)
    for anno_id, per_frame in masks.items():
        assert [rle is None for rle in per_frame] == [not m.any() for m in shapes[int(anno_id) - 5].gt_masks]
    # ReVOS reads the same two files (its image root is the folder the video ids are relative to)
    revos = ReVOSDataset(**paths, name=shapes.name, num_frames=None)
    assert np.array_equal(revos[1].gt_masks, shapes[1].gt_masks)


def test_write_mevis_all_objects_annotates_every_object_of_a_clip(tmp_path):
    shapes = world(num_samples=4, min_objects=2, max_objects=3)
    paths = shapes.write_mevis(str(tmp_path), all_objects=True)
    loaded = MeViSDataset(**paths, name=shapes.name, num_frames=None)
    expected = []
    for index in range(len(shapes)):
        clip, _ = shapes.clip(index, render=False)
        order = [clip.target] + [k for k in range(len(clip.objects)) if k != clip.target]
        expected += [(f"{shapes.name}/{index}#{4 * index + k}", clip.visible[k]) for k in order]
    assert [loaded.sample_id(i) for i in range(len(loaded))] == [sample_id for sample_id, _ in expected]
    for i, (_, masks) in enumerate(expected):
        assert np.array_equal(loaded[i].gt_masks, masks)
    assert loaded[0].expressions == shapes[0].expressions  # the target comes first, with its own expressions


def test_write_ref_youtube_vos_reads_back_through_its_loader(tmp_path):
    shapes = world(min_objects=2)
    paths = shapes.write_ref_youtube_vos(str(tmp_path))
    loaded = RefYouTubeVOSDataset(**paths, name=shapes.name, num_frames=None)
    assert len(loaded) == len(shapes) and loaded.bad_sample_counts == {}
    for index in range(len(shapes)):
        clip, _ = shapes.clip(index, render=False)
        original, sample = shapes[index], loaded[index]
        # the loader names an object by its PNG id (1 + paint-order index), not by the world's sample index
        original.sample_id = f"{shapes.name}/{index}#{clip.target + 1}"
        files = [os.path.join(paths["image_root"], str(index), f"{n}.jpg") for n in original.frame_names]
        assert_same_clip(sample, original, files, original.frame_names)
        assert sample.expressions == original.expressions and sample.category == original.category
        with PIL.Image.open(os.path.join(paths["mask_root"], str(index), "00000.png")) as png:
            assert png.mode == "P"  # an object-id map, as YouTube-VOS stores it
    every = shapes.write_ref_youtube_vos(str(tmp_path / "all"), all_objects=True)
    objects = RefYouTubeVOSDataset(**every, num_frames=None)
    clip, _ = shapes.clip(0, render=False)
    order = [clip.target] + [k for k in range(len(clip.objects)) if k != clip.target]
    assert [objects.sample_id(i) for i in range(len(clip.objects))] == [f"ref_youtube_vos/0#{k + 1}" for k in order]
    for i in range(len(clip.objects)):  # every object's masklet from the shared id map
        assert np.array_equal(objects[i].gt_masks, clip.visible[int(objects.sample_id(i).split("#")[1]) - 1])


def test_write_sav_reads_back_as_masklets_without_text(tmp_path):
    shapes = world()
    paths = shapes.write_sav(str(tmp_path))
    loaded = SAVMaskletDataset(paths["annotation_root"], paths["frames_root"], name=shapes.name, num_frames=None)
    assert len(loaded) == len(shapes)
    names = [f"{4 * t:05d}" for t in range(FRAMES)]  # clip frame t is SA-V video frame 4 t
    for index in range(len(shapes)):
        original, sample = shapes[index], loaded[index]
        files = [os.path.join(paths["frames_root"], str(index), f"{n}.jpg") for n in names]
        assert_same_clip(sample, original, files, names)
        assert sample.captions == [] and sample.expressions == []  # unpaired: masks without text
    with_all = shapes.write_sav(str(tmp_path / "all"), all_objects=True)
    every = SAVMaskletDataset(with_all["annotation_root"], with_all["frames_root"], num_frames=None)
    assert len(every) == sum(len(shapes.clip(i, render=False)[0].objects) for i in range(len(shapes)))


# --------------------------------------------------------------------------- the model's input check on video
class Recorder:
    """An input check that records what it is shown and reports ``problem``."""

    def __init__(self, problem=None):
        self.seen, self.answer = [], problem

    def problem(self, image, gt_mask):
        self.seen.append((np.asarray(image).copy(), np.asarray(gt_mask).copy()))
        return self.answer


def build_loader(kind, root):
    if kind == "ref_youtube_vos":
        paths, _ = make_ref_youtube_vos(root)
        return RefYouTubeVOSDataset(**paths, num_frames=3, seed=1)
    if kind in ("mevis", "revos"):
        paths, _ = (make_mevis if kind == "mevis" else make_revos)(root)
        return (MeViSDataset if kind == "mevis" else ReVOSDataset)(**paths, num_frames=3, seed=1)
    if kind == "sav":
        paths, _, _ = make_sav(root)
        return SAVMaskletDataset(paths["annotation_root"], paths["frames_root"], num_frames=3, seed=1)
    return world()


@pytest.mark.parametrize("kind", ["ref_youtube_vos", "mevis", "revos", "sav", "shapes_video"])
def test_every_video_dataset_shows_the_input_check_its_key_frame(tmp_path, kind):
    dataset = build_loader(kind, str(tmp_path))
    plain = dataset[0]
    key = key_frame(plain.gt_masks)
    recorder = Recorder()
    dataset.set_input_check(recorder)
    assert np.array_equal(dataset[0].gt_masks, plain.gt_masks)
    (image, gt_mask), = recorder.seen  # one call per sample, on the key frame of the drawn frames
    assert np.array_equal(image, np.asarray(plain.frames[key])) and np.array_equal(gt_mask, plain.gt_masks[key])
    dataset.set_input_check(Recorder(("region_off_grid", "no grid point")))
    with pytest.raises(BadSampleError, match=rf"region_off_grid: on key frame {key} \('{plain.frame_names[key]}'\)"):
        dataset[0]


def off_grid_masklet_mevis(root, masks):
    """The MeViS fixture with video v002's masklet (anno id 12, 4 frames of 22 x 26) replaced by ``masks``."""
    paths, _ = make_mevis(root)
    with open(paths["mask_file"]) as handle:
        mask_dict = json.load(handle)
    mask_dict["12"] = [encode_mask(m) if m.any() else None for m in masks]
    with open(paths["mask_file"], "w") as handle:
        json.dump(mask_dict, handle)
    return paths


def test_a_key_frame_region_below_one_region_cell_is_a_bad_sample(tmp_path):
    """Fault injected: a masklet whose key-frame region hits none of the 16 x 16 region-grid sample points (pixel
    rows floor(r * 22 / 16), columns floor(c * 26 / 16): rows 3 and 7 and column 2 are off the grid)."""
    masks = np.zeros((4, 22, 26), dtype=bool)
    masks[1, 3, 2] = True                   # one pixel
    masks[3, 3, 2] = masks[3, 7, 2] = True  # the key frame: two pixels, still between grid points
    check = InputCheck(region_grid_size=16, empty_region="raise")
    assert check.problem(PIL.Image.new("RGB", (26, 22)), masks[3])[0] == "region_off_grid"
    paths = off_grid_masklet_mevis(str(tmp_path / "raise"), masks)
    strict = MeViSDataset(**paths, num_frames=None)
    assert strict.sample_id(2) == "mevis/v002#12"
    strict[2]  # no input check set: the masklet loads
    strict.set_input_check(check)
    with pytest.raises(BadSampleError, match=r"region_off_grid: on key frame 3 \('00003'\)") as err:
        strict[2]
    assert err.value.sample_id == "mevis/v002#12" and err.value.file == paths["mask_file"]
    skipping = MeViSDataset(**paths, num_frames=None, on_bad_sample="skip")
    skipping.set_input_check(check)
    assert isinstance(skipping[2], SkippedSample) and skipping.bad_sample_counts == {"region_off_grid": 1}
    assert skipping[0].sample_id == "mevis/v001#10"  # the other clips still load
    # other policies keep a region off the grid (the processor dilates or keeps it)
    lenient = MeViSDataset(**paths, num_frames=None)
    lenient.set_input_check(InputCheck(region_grid_size=16, empty_region="dilate_to_one_cell"))
    assert np.array_equal(lenient[2].gt_masks, masks)


def test_only_the_key_frame_is_judged(tmp_path):
    """A frame other than the key frame may hold a region below one cell (an object entering the view): loop 1 never
    shows that frame as a region, so the sample stays."""
    masks = np.zeros((4, 22, 26), dtype=bool)
    masks[0, 3, 2] = True           # entering: one pixel between grid points
    masks[2, 4:14, 6:20] = True     # the key frame: a box over many grid points
    paths = off_grid_masklet_mevis(str(tmp_path), masks)
    dataset = MeViSDataset(**paths, num_frames=None)
    dataset.set_input_check(InputCheck(region_grid_size=16, empty_region="raise"))
    assert np.array_equal(dataset[2].gt_masks, masks)

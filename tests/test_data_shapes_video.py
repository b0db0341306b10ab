"""Shapes video world: determinism, disjoint splits, exact masklets, occlusion, enter/leave, key frame, texts that
pick out the target over the whole clip."""
import hashlib

import numpy as np
import pytest

from projects.llava_sam2.rl_train.data import ShapesVideoWorld, ShapesWorld, key_frame
from projects.llava_sam2.rl_train.data.shapes import BACKGROUND_RANGE, OBJECT_NOISE
from projects.llava_sam2.rl_train.data.shapes_scene import (MIN_VISIBLE, VOCABULARY, canonical_caption, cell_of,
                                                            parse_phrase, shape_mask)

SIDE, FRAMES = 64, 12


@pytest.fixture(scope="module")
def world():
    return ShapesVideoWorld("train", 60, seed=0, image_size=SIDE, num_frames=FRAMES)


@pytest.fixture(scope="module")
def clips(world):
    return [world.clip(i) for i in range(len(world))]


def full_masks(clip) -> np.ndarray:
    """Each object rasterised alone at its centre in every frame, bool ``[n, T, H, W]``."""
    n, frames = clip.centres.shape[:2]
    return np.stack([[shape_mask(clip.object_at(i, t), SIDE) for t in range(frames)] for i in range(n)])


def digest(frames: np.ndarray, masks: np.ndarray) -> str:
    return hashlib.sha256(frames.tobytes() + masks.tobytes()).hexdigest()


def test_same_seed_gives_byte_identical_clips():
    first, again = (ShapesVideoWorld("train", 4, seed=7, image_size=SIDE, num_frames=6) for _ in range(2))
    for i in (3, 0, 2):  # random access, any order
        a, b = first[i], again[i]
        assert [f.tobytes() for f in a.frames] == [f.tobytes() for f in b.frames]
        assert a.gt_masks.tobytes() == b.gt_masks.tobytes()
        assert (a.captions, a.expressions, a.sample_id, a.frame_names, a.category) == \
               (b.captions, b.expressions, b.sample_id, b.frame_names, b.category)
    other_seed = ShapesVideoWorld("train", 4, seed=8, image_size=SIDE, num_frames=6)
    assert all(first[i].frames[0].tobytes() != other_seed[i].frames[0].tobytes() for i in range(4))
    clip, _ = first.clip(1, render=False)  # the clip is drawn before its pixels
    assert np.array_equal(clip.visible, first.clip(1)[0].visible)


def test_splits_are_disjoint_streams_and_not_the_image_worlds(clips):
    train = {digest(frames, clip.visible) for clip, frames in clips[:30]}
    for split in ("val", "test"):
        other = ShapesVideoWorld(split, 30, seed=0, image_size=SIDE, num_frames=FRAMES)
        assert not train & {digest(frames, clip.visible) for clip, frames in (other.clip(i) for i in range(30))}
    # a later start continues the same stream
    later, later_frames = ShapesVideoWorld("train", 1, seed=0, image_size=SIDE, num_frames=FRAMES, start=5).clip(0)
    assert digest(later_frames, later.visible) == digest(clips[5][1], clips[5][0].visible)
    # the video streams are not the image world's: the same (split, seed, index) draws other objects
    images = ShapesWorld("train", 30, seed=0, image_size=SIDE)

    def objects(scene):
        return sorted((obj.shape, obj.colour, obj.size) for obj in scene.objects)

    assert sum(objects(images.scene(i, render=False)[0]) == objects(clips[i][0]) for i in range(30)) < 5


def test_masks_are_exactly_the_visible_painted_pixels(world, clips):
    low, high = BACKGROUND_RANGE
    for index, (clip, frames) in enumerate(clips[:30]):
        sample = world[index]
        assert np.array_equal(sample.gt_masks, clip.visible[clip.target])
        assert np.array_equal(np.stack([np.asarray(f) for f in sample.frames]), frames)
        for i, obj in enumerate(clip.objects):
            in_colour = (np.abs(frames.astype(int) - np.array(obj.fill)) <= OBJECT_NOISE).all(-1)   # [T, H, W]
            others = clip.visible[np.arange(len(clip.objects)) != i].any(0)                         # [T, H, W]
            assert np.array_equal(in_colour & ~others, clip.visible[i]), (index, i)  # no stray or missing pixel
        background = ~clip.visible.any(0)                                                            # [T, H, W]
        assert frames[background].min() >= low and frames[background].max() <= high


def test_occlusion_shrinks_a_covered_mask_by_exactly_the_overlap(clips):
    """Each object rendered alone gives its full shape; its mask is that shape less the objects painted after it."""
    overlaps = 0
    for clip, frames in clips:
        full = full_masks(clip)                                                                      # [n, T, H, W]
        for i in range(len(clip.objects)):
            in_front = full[i + 1:].any(0)                                                           # [T, H, W]
            overlap = (full[i] & in_front).sum(axis=(1, 2))                                          # [T]
            assert np.array_equal(full[i].sum(axis=(1, 2)) - clip.visible[i].sum(axis=(1, 2)), overlap)
            assert np.array_equal(clip.visible[i], full[i] & ~in_front)
            overlaps += int((overlap > 0).sum())
            for j in range(i + 1, len(clip.objects)):  # where j covers i, the pixels carry j's colour or a nearer one
                covered = full[i] & full[j] & ~full[j + 1:].any(0)
                assert (np.abs(frames[covered].astype(int) - clip.objects[j].fill) <= OBJECT_NOISE).all()
    assert overlaps > 20  # the fixture exercises occlusion


def test_every_object_is_recognisable_at_its_key_frame():
    """As visible as in an image (MIN_VISIBLE of its whole shape, drawn at its anchor frame) where it is largest."""
    crowded = ShapesVideoWorld("val", 80, seed=5, image_size=SIDE, num_frames=FRAMES, min_objects=4)
    for index in range(len(crowded)):
        clip, _ = crowded.clip(index, render=False)
        for obj, masks, key in zip(clip.objects, clip.visible, clip.key_frames):
            assert masks[key].sum() >= MIN_VISIBLE * shape_mask(obj, SIDE).sum(), index


def test_objects_move_enter_and_leave():
    """Straight movers leave and enter (all-False masks while out of view); bouncers stay wholly in view."""
    straight = ShapesVideoWorld("val", 40, seed=3, image_size=SIDE, num_frames=FRAMES, max_speed_per_frame=0.08,
                                bounce=0.0)
    entering = leaving = 0
    for index in range(len(straight)):
        clip, _ = straight.clip(index, render=False)
        full = full_masks(clip)
        steps = np.diff(clip.centres, axis=1)                                                        # [n, T-1, 2]
        assert np.allclose(steps, steps[:, :1]) and (np.linalg.norm(steps[:, 0], axis=-1) > 0).all()
        out_of_view = ~full.any(axis=(2, 3))                                                         # [n, T]
        assert not (clip.visible.any(axis=(2, 3)) & out_of_view).any()
        entering += int((out_of_view[:, 0] & ~out_of_view[:, -1]).sum())
        leaving += int((~out_of_view[:, 0] & out_of_view[:, -1]).sum())
    assert entering > 0 and leaving > 0
    bouncing = ShapesVideoWorld("val", 20, seed=3, image_size=SIDE, num_frames=FRAMES, max_speed_per_frame=0.08,
                                bounce=1.0)
    for index in range(len(bouncing)):
        clip, _ = bouncing.clip(index, render=False)
        radius = np.array([obj.radius for obj in clip.objects])[:, None, None]                      # [n, 1, 1]
        assert ((clip.centres >= radius + 2 - 1e-9) & (clip.centres <= SIDE - radius - 2 + 1e-9)).all()


def test_key_frame_is_the_largest_mask_and_the_caption_is_true_there(world, clips):
    masks = np.zeros((5, 4, 4), dtype=bool)
    for t, area in enumerate((0, 3, 5, 5, 1)):
        masks[t].flat[:area] = True
    assert key_frame(masks) == 2  # the earliest of the tied largest frames
    with pytest.raises(ValueError, match="empty in every frame"):
        key_frame(np.zeros((3, 4, 4), dtype=bool))
    with pytest.raises(ValueError, match=r"\[T, H, W\]"):
        key_frame(masks[0])
    for index, (clip, _) in enumerate(clips):
        sample = world[index]
        key = key_frame(sample.gt_masks)
        assert key == clip.key_frames[clip.target]
        whole = shape_mask(clip.objects[clip.target], SIDE).sum()  # at its anchor frame, wholly inside
        assert sample.gt_masks[key].sum() >= MIN_VISIBLE * whole
        assert parse_phrase(sample.captions[0])["cell"] == cell_of(sample.gt_masks[key])


def test_texts_pick_out_the_target_in_every_frame(world, clips):
    """No other object fits a caption or expression of the target in any frame where it is seen."""
    for index, (clip, _) in enumerate(clips):
        sample = world[index]
        assert len(sample.expressions) >= 3 and len(set(sample.expressions)) == len(sample.expressions)
        captions = [canonical_caption(a) for a in clip.attrs]
        assert sample.captions == [captions[clip.target]] and len(set(captions)) == len(captions)
        for text in sample.captions + sample.expressions:
            stated = parse_phrase(text)
            for j, obj in enumerate(clip.objects):
                seen = [cell_of(frame) for frame in clip.visible[j] if frame.any()]
                fits = [all({"size": obj.size, "colour": obj.colour, "shape": obj.shape, "cell": cell}[k] == v
                            for k, v in stated.items()) for cell in seen]
                assert any(fits) == (j == clip.target), (index, text, j)
        words = {w for text in sample.captions + sample.expressions for w in text.split()}
        assert words <= set(VOCABULARY)
    assert {len(clip.objects) for clip, _ in clips} == {1, 2, 3, 4}


def test_target_domain_keeps_clips_and_texts():
    source = ShapesVideoWorld("test", 3, seed=1, image_size=SIDE, num_frames=6)
    target = ShapesVideoWorld("test", 3, seed=1, image_size=SIDE, num_frames=6, domain="target")
    for i in range(3):
        a, b = source[i], target[i]
        assert np.array_equal(a.gt_masks, b.gt_masks) and (a.captions, a.expressions) == (b.captions, b.expressions)
        assert all(x.tobytes() != y.tobytes() for x, y in zip(a.frames, b.frames))
        # one shift per clip (still camera): away from the moving objects, consecutive frames keep their pixels
        frames = np.stack([np.asarray(frame) for frame in b.frames])                                 # [T, H, W, 3]
        assert (frames[1:] == frames[:-1]).all(-1).mean() > 0.5
    assert target.name == "shapes_video_target_test"


@pytest.mark.parametrize("kwargs, message", [
    (dict(split="dev"), "split='dev'"), (dict(image_size=16), "image_size=16"), (dict(num_frames=0), "num_frames=0"),
    (dict(max_objects=5), "max_objects"), (dict(num_samples=-1), "num_samples=-1"),
    (dict(max_speed_per_frame=-0.1), "max_speed_per_frame=-0.1"), (dict(bounce=1.5), "bounce=1.5"),
    (dict(domain="night"), "domain='night'")])
def test_knobs_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShapesVideoWorld(**kwargs)


def test_video_strip_shows_the_key_frame(tmp_path, world):
    import PIL.Image

    from projects.llava_sam2.rl_train.evaluation.plots import GT_COLOUR, PRED_COLOUR, plot_video_strip, strip_frames

    sample = world[0]
    key = key_frame(sample.gt_masks)
    shown = strip_frames(sample.gt_masks, FRAMES, 4)
    assert len(shown) == 4 and key in shown and shown == sorted(shown)
    assert strip_frames(None, 3, 8) == [0, 1, 2]

    def colours(path):
        pixels = np.asarray(PIL.Image.open(path).convert("RGB")).reshape(-1, 3)
        return [bool((pixels == colour).all(-1).any()) for colour in (GT_COLOUR, PRED_COLOUR)]

    both = plot_video_strip(sample, str(tmp_path / "both.png"), pred_masks=sample.gt_masks, max_frames=4)
    truth = plot_video_strip(sample, str(tmp_path / "truth.png"), max_frames=4)
    assert colours(both) == [True, True] and colours(truth) == [True, False]
    assert PIL.Image.open(both).size[1] > PIL.Image.open(truth).size[1]  # the prediction row


def test_the_model_input_check_sees_the_key_frame():
    """Loop 1 gives the model the key frame as an image region, so that frame is what the input check judges."""
    from projects.llava_sam2.rl_train.data import BadSampleError

    class Recorder:
        def __init__(self, problem):
            self.seen, self.problem_to_report = [], problem

        def problem(self, image, gt_mask):
            self.seen.append((image.tobytes(), gt_mask.copy()))
            return self.problem_to_report

    world = ShapesVideoWorld("test", 2, seed=4, image_size=SIDE, num_frames=FRAMES)
    plain = world[1]
    key = key_frame(plain.gt_masks)
    world.set_input_check(Recorder(None))
    world[1]
    (image, gt_mask), = world.input_check.seen
    assert image == plain.frames[key].tobytes() and np.array_equal(gt_mask, plain.gt_masks[key])
    world.set_input_check(Recorder(("region_off_grid", "no grid point in the region")))
    with pytest.raises(BadSampleError, match=rf"region_off_grid.*key frame {key}|key frame {key}.*region_off_grid"):
        world[1]

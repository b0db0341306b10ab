"""Shapes world: determinism, exact masks, disambiguating captions, COCO export round trip."""
import itertools

import numpy as np
import pytest

from projects.llava_sam2.rl_train.data import CocoRegionDataset, ShapesWorld
from projects.llava_sam2.rl_train.data.shapes import BACKGROUND_RANGE, OBJECT_NOISE
from projects.llava_sam2.rl_train.data.shapes_scene import (VOCABULARY, canonical_caption, parse_phrase,
                                                            shape_mask)


@pytest.fixture(scope="module")
def scenes():
    world = ShapesWorld("train", 120, seed=0)
    return world, [world.scene(i) for i in range(len(world))]


@pytest.fixture(scope="module")
def samples(scenes):
    world, _ = scenes
    return [world[i] for i in range(len(world))]


def test_same_seed_gives_byte_identical_samples():
    first, again = ShapesWorld("train", 4, seed=7), ShapesWorld("train", 4, seed=7)
    for i in (3, 0, 2):  # random access, any order
        a, b = first[i], again[i]
        assert a.image.tobytes() == b.image.tobytes() and a.gt_mask.tobytes() == b.gt_mask.tobytes()
        assert (a.captions, a.expressions, a.sample_id) == (b.captions, b.expressions, b.sample_id)
    other_seed, other_split = ShapesWorld("train", 4, seed=8), ShapesWorld("val", 4, seed=7)
    assert all(first[i].image.tobytes() != other_seed[i].image.tobytes() for i in range(4))
    assert all(first[i].image.tobytes() != other_split[i].image.tobytes() for i in range(4))


def test_masks_are_exactly_the_visible_painted_pixels(scenes, samples):
    _, rendered = scenes
    for index, (scene, pixels) in enumerate(rendered[:40]):
        t = scene.target
        assert np.array_equal(samples[index].gt_mask, scene.visible[t])
        assert np.array_equal(np.asarray(samples[index].image), pixels)
        in_colour = (np.abs(pixels.astype(int) - np.array(scene.objects[t].fill)) <= OBJECT_NOISE).all(-1)
        others = scene.visible[np.arange(len(scene.objects)) != t].any(0)
        assert np.array_equal(in_colour & ~others, scene.visible[t]), index  # no stray or missing pixel
        background = ~scene.visible.any(0)
        low, high = BACKGROUND_RANGE
        assert pixels[background].min() >= low and pixels[background].max() <= high


def test_masks_sit_where_the_geometry_says(scenes):
    _, rendered = scenes
    for scene, _ in rendered[:40]:
        for obj in scene.objects:
            if obj.shape in ("circle", "square", "cross"):  # centrally symmetric shapes
                ys, xs = np.nonzero(shape_mask(obj, scene.visible.shape[1]))
                assert abs(xs.mean() - obj.centre[0]) < 1.0 and abs(ys.mean() - obj.centre[1]) < 1.0


def test_captions_are_unique_and_expressions_pick_the_target(scenes, samples):
    _, rendered = scenes
    for index, (scene, _) in enumerate(rendered):
        captions = [canonical_caption(a) for a in scene.attrs]
        assert len(set(captions)) == len(captions)
        for i, caption in enumerate(captions):
            assert parse_phrase(caption) == scene.attrs[i] and scene.referents(parse_phrase(caption)) == [i]
        sample = samples[index]
        assert sample.captions == [captions[scene.target]]
        assert len(sample.expressions) >= 3 and len(set(sample.expressions)) == len(sample.expressions)
        for expression in sample.expressions:
            assert scene.referents(parse_phrase(expression)) == [scene.target], expression


def test_distractors_share_colour_or_shape(scenes):
    _, rendered = scenes
    multi = [scene for scene, _ in rendered if len(scene.objects) > 1]
    assert multi
    for scene in multi:
        target = scene.attrs[scene.target]
        assert any((a["colour"] == target["colour"]) != (a["shape"] == target["shape"])
                   for i, a in enumerate(scene.attrs) if i != scene.target)


def test_scene_variety_and_occlusion(scenes):
    _, rendered = scenes
    counts = {len(scene.objects) for scene, _ in rendered}
    assert counts == {1, 2, 3, 4}
    side = rendered[0][0].visible.shape[1]
    occluded = sum(int((shape_mask(o, side) & ~v).any()) for scene, _ in rendered
                   for o, v in zip(scene.objects, scene.visible))
    assert occluded > 0
    assert all(np.std(pixels[~scene.visible.any(0)]) > 5 for scene, pixels in rendered[:20])  # textured


def test_same_caption_different_masks(scenes):
    """The caption alone does not give the mask: equal captions occur with different masks."""
    _, rendered = scenes
    by_caption = {}
    for index, (scene, _) in enumerate(rendered):
        by_caption.setdefault(canonical_caption(scene.attrs[scene.target]), []).append(index)
    pairs = [p for group in by_caption.values() for p in itertools.combinations(group, 2)]
    assert len(pairs) >= 3
    for a, b in pairs:
        (scene_a, _), (scene_b, _) = rendered[a], rendered[b]
        mask_a, mask_b = scene_a.visible[scene_a.target], scene_b.visible[scene_b.target]
        assert (mask_a & mask_b).sum() / (mask_a | mask_b).sum() < 0.95


def test_vocabulary_is_small_and_closed(samples):
    assert len(VOCABULARY) <= 60
    words = {w for sample in samples for text in sample.captions + sample.expressions for w in text.split()}
    assert words <= set(VOCABULARY)


def test_write_coco_round_trips_through_the_coco_loader(tmp_path):
    world = ShapesWorld("val", 6, seed=1, image_size=96)
    ann_file = world.write_coco(str(tmp_path))
    loaded = CocoRegionDataset(ann_file, name=world.name)
    assert len(loaded) == len(world)
    for i in range(len(world)):
        a, b = world[i], loaded[i]
        assert a.image.size == (96, 96) and a.image.tobytes() == b.image.tobytes()
        assert np.array_equal(a.gt_mask, b.gt_mask)
        assert (a.captions, a.expressions, a.sample_id, a.source, a.category) == \
               (b.captions, b.expressions, b.sample_id, b.source, b.category)


@pytest.mark.parametrize("kwargs, message", [
    (dict(split="dev"), "split='dev'"), (dict(image_size=16), "image_size=16"),
    (dict(max_objects=5), "max_objects"), (dict(num_samples=-1), "num_samples=-1")])
def test_knobs_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShapesWorld(**kwargs)


def test_write_coco_all_objects_annotates_every_object_of_each_scene(tmp_path):
    world = ShapesWorld("train", 8, seed=2, image_size=96)
    loaded = CocoRegionDataset(world.write_coco(str(tmp_path), all_objects=True), name=world.name)
    per_image = {}
    for i in range(len(loaded)):
        sample = loaded[i]
        per_image.setdefault(sample.sample_id.split("#")[0], []).append(sample)
    assert len(per_image) == len(world)
    for index in range(len(world)):
        scene, _ = world.scene(index)
        samples = per_image[f"{world.name}/{index}"]
        assert len(samples) == len(scene.objects)
        target = world[index]  # the first annotation of an image is the scene's target, as without all_objects
        assert np.array_equal(samples[0].gt_mask, target.gt_mask) and samples[0].captions == target.captions
        masks = np.stack([s.gt_mask for s in samples])
        assert masks.sum(0).max() == 1, "objects' visible masks overlap"
        assert len({s.captions[0] for s in samples}) == len(samples), "captions must tell the objects apart"

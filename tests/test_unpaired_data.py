"""Unpaired target-domain data: the shapes world's target domain keeps scenes and texts and shifts only
pixels; the COCO writer/loader carry region-only and text-only annotations; CycleGRPO gives each loop only the
samples that carry what it needs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_tiny import build_tiny, make_algo, one_thread, run_rollout, step_loss
from projects.llava_sam2.rl_train.data.coco import CocoRegionDataset
from projects.llava_sam2.rl_train.data.collate import region_collate
from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.data.shapes_scene import COLOURS
from projects.llava_sam2.rl_train.data.unpaired import UnpairedRegionDataset

_one_thread = pytest.fixture(autouse=True)(one_thread)


def test_target_domain_keeps_scenes_and_texts_and_shifts_pixels():
    source = ShapesWorld("val", 6, seed=3, image_size=64)
    target = ShapesWorld("val", 6, seed=3, image_size=64, domain="target")
    for i in range(6):
        a, b = source[i], target[i]
        assert np.array_equal(a.gt_mask, b.gt_mask) and a.captions == b.captions and a.expressions == b.expressions
        pixels_a, pixels_b = np.asarray(a.image, dtype=float), np.asarray(b.image, dtype=float)
        assert np.abs(pixels_a - pixels_b).mean() > 5  # the pixels move
        # no hue shift: the object's mean colour is still nearest to the colour its caption names
        scene, _ = target.scene(i)
        colour = scene.attrs[scene.target]["colour"]
        mean = pixels_b[b.gt_mask].mean(axis=0)
        nearest = min(COLOURS, key=lambda name: np.abs(np.asarray(COLOURS[name]) - mean).sum())
        assert nearest == colour
    again = ShapesWorld("val", 6, seed=3, image_size=64, domain="target")
    assert np.array_equal(np.asarray(again[2].image), np.asarray(target[2].image))  # seeded
    assert target.name != source.name


def test_source_pixels_are_unchanged_by_the_domain_option():
    # digest of ShapesWorld('val', 2, 0, image_size=64) pixels before the domain option existed
    world = ShapesWorld("val", 2, seed=0, image_size=64)
    digest = sum(int(np.asarray(world[i].image, dtype=np.int64).sum()) * (i + 1) for i in range(2))
    assert digest == 4050598  # recorded with the code before this change


def test_start_gives_disjoint_sets_of_one_split():
    first = ShapesWorld("train", 3, seed=0, image_size=64)
    rest = ShapesWorld("train", 3, seed=0, image_size=64, start=3)
    whole = ShapesWorld("train", 6, seed=0, image_size=64)
    assert np.array_equal(np.asarray(rest[0].image), np.asarray(whole[3].image))
    assert not np.array_equal(np.asarray(rest[0].image), np.asarray(first[0].image))


def test_unpaired_coco_files_load_as_region_only_and_text_only_samples(tmp_path):
    regions = ShapesWorld("train", 3, seed=0, image_size=64, domain="target")
    texts = ShapesWorld("train", 2, seed=0, image_size=64, domain="target", start=3)
    region_set = CocoRegionDataset(regions.write_coco(str(tmp_path / "regions"), keep="regions"), name="r")
    text_set = CocoRegionDataset(texts.write_coco(str(tmp_path / "texts"), keep="texts"), name="t")
    sample = region_set[0]
    assert sample.captions == [] and sample.expressions == [] and sample.category is None
    assert np.array_equal(sample.gt_mask, regions[0].gt_mask)
    sample = text_set[1]
    assert sample.gt_mask is None and sample.captions == texts[1].captions and sample.expressions
    batch = region_collate([UnpairedRegionDataset(region_set, text_set)[i] for i in range(3)])
    assert [s.gt_mask is None for s in batch] == [False, True] * 3
    assert [s.sample_id for s in batch[1::2]] == ["t/3#3", "t/4#4", "t/3#3"]  # texts cycle


def test_each_loop_gets_only_the_samples_it_can_use():
    model, processor = build_tiny()
    seen = {}

    def recorder(name):
        class Record:
            weight = 1.0

            def __call__(self, inputs):
                seen[name] = inputs
                return [0.1 * (k % 3) for k in range(len(inputs.sample_ids))]
        Record.name = name
        return Record()

    regions = [ShapesWorld("train", 2, seed=0, image_size=64, domain="target")[i] for i in range(2)]
    texts = [ShapesWorld("train", 1, seed=0, image_size=64, domain="target", start=2)[0]]
    regions = [type(s)(s.image, s.gt_mask, [], [], s.sample_id, s.source) for s in regions]
    texts = [type(s)(s.image, None, s.captions, s.expressions, s.sample_id + "t", s.source) for s in texts]
    algo, _ = make_algo(model, processor, {"mask_to_caption": [recorder("loop1")],
                                           "caption_to_mask": [recorder("loop2")]}, minibatch_size=4)
    batch = [regions[0], texts[0], regions[1]]
    step = run_rollout(algo, batch)
    features, rollouts = step.features, step.rollouts
    G = 4
    assert seen["loop1"].sample_ids == [s.sample_id for s in regions for _ in range(G)]
    assert seen["loop1"].gt_captions == [[]] * (2 * G)  # no caption reaches loop 1's reward
    assert seen["loop2"].sample_ids == [texts[0].sample_id] * G
    assert [tuple(r.rewards.shape) for r in rollouts] == [(2, G), (1, G)]
    parts = [[p.loop.name for p in mb.parts] for mb in algo.minibatches(step)]
    assert parts == [["mask_to_caption", "caption_to_mask"], ["mask_to_caption"]]  # 2 chunks vs 1
    out = step_loss(algo, model, step)
    assert torch.isfinite(out["loss"])
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_rollout_logging_shows_each_loop_its_own_samples():
    from projects.llava_sam2.rl_train.engine.hooks.rollout_logging import loop_samples

    world = ShapesWorld("train", 3, seed=0, image_size=64)
    region = [type(s)(s.image, s.gt_mask, [], [], s.sample_id, s.source) for s in (world[0], world[1])]
    text = type(world[2])(world[2].image, None, world[2].captions, [], world[2].sample_id, world[2].source)
    batch = [region[0], text, region[1]]
    paired = [world[0], world[1]]

    def ids(samples):
        return [id(s) for s in samples]
    assert ids(loop_samples(batch, "mask_to_caption")) == ids(region)  # prompt b of loop 1 is the b-th region sample
    assert ids(loop_samples(batch, "caption_to_mask")) == ids([text])
    assert ids(loop_samples(paired, "caption_to_mask")) == ids(paired)  # paired data: every sample, both loops

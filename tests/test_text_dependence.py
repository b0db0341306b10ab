"""evaluation/text_dependence.py: own vs other-text IoU and identical pairs, on constructed segmenters."""
import numpy as np
import pytest

from projects.llava_sam2.rl_train.evaluation.text_dependence import (
    held_out_scenes, measure, model_segmenter, score_scene, summarize)


def _masks():
    a = np.zeros((4, 4), dtype=bool)
    a[:2, :2] = True  # 4 px
    b = np.zeros((4, 4), dtype=bool)
    b[2:, :] = True  # 8 px, disjoint from a
    return a, b


def test_score_scene_worked_example():
    a, b = _masks()
    # text 0 -> a (own IoU 1), text 1 -> a as well (own IoU 0 for b): own = 0.5
    # other: for object 0 the mask of text 1 (a) -> IoU 1; for object 1 the mask of text 0 (a) -> 0: other = 0.5
    s = score_scene([a, a], [a, b])
    assert (s.own, s.other, s.identical_pairs, s.pairs, s.objects) == (0.5, 0.5, 1, 1, 2)
    s = score_scene([a, None], [a, b])  # no [SEG]: empty mask, IoU 0 with b, not identical to a
    assert (s.own, s.other, s.identical_pairs) == (0.5, 0.0, 0)
    with pytest.raises(ValueError, match=">= 2 objects"):
        score_scene([a], [a])


@pytest.fixture(scope="module")
def scenes():
    return held_out_scenes(12, seed=0)


def test_held_out_scenes_are_multi_object_val_scenes(scenes):
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

    assert len(scenes) == 12 and all(len(s.texts) == len(s.gt_masks) >= 2 for s in scenes)
    scene, pixels = ShapesWorld("val", 1000, 0).scene(scenes[0].index)  # the demo's held-out stream
    assert np.array_equal(np.asarray(scenes[0].image), pixels)
    with pytest.raises(ValueError, match="text_source"):
        held_out_scenes(2, text_source="title")


def test_text_blind_segmenter_has_no_gap_and_only_identical_pairs(scenes):
    by_image = {id(s.image): s for s in scenes}

    def blind(images, texts):  # the union of all objects, whatever the text
        return [[np.logical_or.reduce(by_image[id(im)].gt_masks)] * len(row) for im, row in zip(images, texts)]

    result = measure(blind, scenes, batch_size=5, n_resamples=200)
    assert result.gap.value == pytest.approx(0.0, abs=1e-12)
    assert result.identical_share.value == pytest.approx(1.0)
    assert result.own_iou.value > 0.2 and not result.meets_targets
    assert result.num_scenes == 12 and result.num_pairs == sum(len(s.texts) * (len(s.texts) - 1) // 2 for s in scenes)


def test_oracle_segmenter_shows_the_full_gap(scenes):
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
    from projects.llava_sam2.rl_train.data.shapes_scene import parse_phrase

    world = ShapesWorld("val", 1000, 0)
    by_image = {id(s.image): world.scene(s.index)[0] for s in scenes}

    def oracle(images, texts):  # parse the text with the grammar and return the named object's GT
        out = []
        for im, row in zip(images, texts):
            scene = by_image[id(im)]
            out.append([scene.visible[scene.referents(parse_phrase(t))[0]] for t in row])
        return out

    result = measure(oracle, scenes, batch_size=5, n_resamples=200)
    assert result.own_iou.value == 1.0 and result.other_iou.value == 0.0
    assert result.gap.value == 1.0 and result.identical_share.value == 0.0 and result.meets_targets
    assert result.to_dict()["meets_targets"] is True and "gap 1.000" in result.format()


def test_summarize_gives_cis_over_scenes():
    from projects.llava_sam2.rl_train.evaluation.text_dependence import SceneScore

    scores = [SceneScore(0.8, 0.1, 0, 1, 2), SceneScore(0.6, 0.3, 1, 3, 3), SceneScore(0.7, 0.2, 0, 1, 2)]
    result = summarize(scores, n_resamples=200)
    assert result.gap.value == pytest.approx(0.5) and result.gap.low <= 0.5 <= result.gap.high
    assert result.identical_share.value == pytest.approx(1 / 5)  # 1 identical of 5 pairs
    assert result.num_objects == 7 and result.num_pairs == 5
    with pytest.raises(ValueError, match="no held-out scene"):
        summarize([])


def test_compare_pairs_scenes_and_rejects_different_ones():
    from projects.llava_sam2.rl_train.evaluation.text_dependence import SceneScore, compare

    base = summarize([SceneScore(0.8, 0.1, 0, 1, 2), SceneScore(0.6, 0.3, 1, 3, 3), SceneScore(0.7, 0.2, 0, 1, 2)],
                     n_resamples=200, indices=[3, 5, 9]).to_dict()
    # B: own +0.1 on every scene, other unchanged, the identical pair of scene 5 gone
    rl = summarize([SceneScore(0.9, 0.1, 0, 1, 2), SceneScore(0.7, 0.3, 0, 3, 3), SceneScore(0.8, 0.2, 0, 1, 2)],
                   n_resamples=200, indices=[3, 5, 9]).to_dict()
    assert [row["index"] for row in rl["scenes"]] == [3, 5, 9]
    change = compare(base, rl, n_resamples=200)
    # every scene's gap rose by exactly 0.1, so the paired CI collapses onto it; identical pairs 1/5 -> 0/5
    assert change.gap.value == pytest.approx(0.1) and change.gap.low == pytest.approx(0.1)
    assert change.own_iou.value == pytest.approx(0.1) and change.other_iou.value == pytest.approx(0.0)
    assert change.identical_share.value == pytest.approx(-0.2) and change.num_scenes == 3
    shifted = {**rl, "scenes": [{**row, "index": row["index"] + 1} for row in rl["scenes"]]}
    with pytest.raises(ValueError, match="different scenes"):
        compare(base, shifted)
    with pytest.raises(ValueError, match="per-scene"):
        compare({k: v for k, v in base.items() if k != "scenes"}, rl)


def test_model_segmenter_runs_the_res_path_on_a_tiny_model(scenes):
    import torch

    from projects.llava_sam2.rl_train.model.network.presets import build_preset
    from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
    from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    torch.manual_seed(0)
    model = Sa2VAModel(build_preset("tiny", vocab_size=len(tok))).eval()
    model.bind_tokenizer(tok)
    processor = Sa2VAProcessor.from_config(tok, model.config)
    segment = model_segmenter(model, processor, max_new_tokens=3)
    masks = segment([s.image for s in scenes[:2]], [s.texts for s in scenes[:2]])
    assert [len(m) for m in masks] == [len(s.texts) for s in scenes[:2]]
    assert all(m is None or (m.dtype == bool and m.shape == (224, 224)) for row in masks for m in row)

"""prompt_rl: candidate prompts, the teacher-forced segmentation pass and the quality-dataset builder / cache."""
import json

import numpy as np
import pytest
import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.prompt_rl.prompts import (
    DEFAULT_PROMPT_SPECS, PromptSpec, candidate_expressions, check_prompt_specs, default_prompt_specs,
    parse_prompt_specs)
from projects.llava_sam2.rl_train.prompt_rl.quality_data import (
    build_quality_data, load_quality_data, save_quality_data, split_by_image)
from projects.llava_sam2.rl_train.rewards.mask_metrics import mask_metrics


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # tiny model: a second thread only contends with other processes


# ---------------------------------------------------------------------------------------------- prompts

def test_default_list_has_k_11_distinct_specs_starting_with_the_res_eval_prompt():
    specs = default_prompt_specs()
    assert len(specs) == 11 and len(set(specs)) == 11
    assert specs[0] == PromptSpec(0, 0) and specs[0].question is None  # the RES eval prompt, first expression
    assert specs[3].template_text() == "Can you segment the {} in this image?"


@pytest.mark.parametrize("k", [0, 1])
def test_prompt_lists_of_size_0_or_1_are_errors(k):
    with pytest.raises(ValueError, match="K >= 2"):
        default_prompt_specs(k)
    with pytest.raises(ValueError, match="K >= 2"):
        check_prompt_specs(DEFAULT_PROMPT_SPECS[:k])
    with pytest.raises(ValueError, match="K >= 2"):
        parse_prompt_specs(",".join(f"{s.template}:{s.slot}" for s in DEFAULT_PROMPT_SPECS[:k]))


def test_bad_specs_are_errors():
    with pytest.raises(ValueError, match="duplicate"):
        check_prompt_specs([PromptSpec(0, 0), PromptSpec(0, 0)])
    with pytest.raises(ValueError, match="template"):
        PromptSpec(17, 0)
    with pytest.raises(ValueError, match="template:slot"):
        parse_prompt_specs("0:0,x:1")
    with pytest.raises(ValueError, match="expected 2..24"):
        default_prompt_specs(25)
    assert parse_prompt_specs("0:0, 9:2") == (PromptSpec(0, 0), PromptSpec(9, 2))


def test_expression_slots_clip_to_the_last_paraphrase_and_normalise():
    specs = [PromptSpec(0, 0), PromptSpec(1, 1), PromptSpec(2, 5)]
    assert candidate_expressions(["The Red <b>Circle.", "a blue square"], specs, "s#0") == [
        "the red bcircle", "a blue square", "a blue square"]
    with pytest.raises(ValueError, match="no referring expression"):
        candidate_expressions([" . "], specs, "s#0")


# ------------------------------------------------------------------------------------ model + builder

@pytest.fixture(scope="module")
def tiny():
    from projects.llava_sam2.rl_train.model.network.presets import build_preset
    from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
    from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    torch.manual_seed(0)
    model = Sa2VAModel(build_preset("tiny", vocab_size=len(tok))).eval()
    model.bind_tokenizer(tok)
    return model, Sa2VAProcessor.from_config(tok, model.config)


@pytest.fixture(scope="module")
def built(tiny):
    model, proc = tiny
    world = ShapesWorld("val", 4, seed=0, image_size=64)
    specs = default_prompt_specs(3)
    return build_quality_data(model, proc, world, specs, heldout_fraction=0.5, seed=0, image_side=16), world


def test_segment_rows_masks_follow_the_released_chain(tiny):
    from projects.llava_sam2.rl_train.model.network.grounding import upsample_logits
    from projects.llava_sam2.rl_train.prompt_rl.segment import SegmentRows, segment_rows

    model, proc = tiny
    world = ShapesWorld("val", 2, seed=0, image_size=64)
    rows = SegmentRows([0, 1, 1], ["the circle", "the square", "the red star"], [None, None, DEFAULT_PROMPT_SPECS[3].question])
    out = segment_rows(model, proc, [world[0].image, world[1].image], rows, chunk_size=2)
    assert out.low_res_logits.shape == (3, 64, 64) and out.pred_iou.shape == (3,)
    assert out.image_features.shape == (2, model.config.llm_hidden_size)
    released = model.logits_to_masks(out.low_res_logits, [(64, 64)] * 3)
    for ours, theirs in zip(out.pred_masks, released):
        np.testing.assert_array_equal(ours, theirs.numpy())
    np.testing.assert_array_equal(upsample_logits(out.low_res_logits[:1], (64, 64), 256)[0].numpy() > 0,
                                  out.pred_masks[0])
    assert not torch.allclose(out.low_res_logits[1], out.low_res_logits[2])  # the prompt changes the mask
    with pytest.raises(ValueError, match="out of range"):
        segment_rows(model, proc, [world[0].image], SegmentRows([1], ["x"], [None]))
    with pytest.raises(ValueError, match="one of each per row"):
        SegmentRows([0, 0], ["x"], [None, None])


def test_builder_records_every_pair_with_true_metrics(built):
    data, world = built
    I, K = 4, 3
    assert data.logits.shape == (I, K, 64, 64) and data.logits.dtype == np.float16
    assert data.images.shape == (I, 16, 16, 3) and data.images.dtype == np.uint8
    assert data.pred_iou.shape == (I, K) and data.image_features.shape[0] == I
    assert data.meta["prompt_labels"] == ["t0/e0", "t0/e1", "t0/e2"]
    assert data.meta["degenerate"]["pairs"] == I * K
    assert data.meta["prompt_texts"][0][0] == "<image>\n Please segment {} in this image.".format(
        world[0].expressions[0].lower().rstrip("."))
    from pycocotools import mask as mask_utils

    for i in range(I):
        gt = data.gt_mask(i)
        np.testing.assert_array_equal(gt, world[i].gt_mask)
        for k in range(K):
            rle = data.meta["pred_rles"][i][k]
            pred = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)
            m = mask_metrics(pred, gt)
            for name in ("dice", "iou", "precision", "recall"):
                assert getattr(data, name)[i, k] == pytest.approx(float(m[name][0]))
            assert data.pred_area[i, k] == pytest.approx(pred.mean())


def test_split_is_by_image_and_seeded():
    ids = ["d/1#1", "d/1#2", "d/2#3", "d/3#4", "d/4#5"]
    held = split_by_image(ids, 0.5, seed=0)
    assert held[0] == held[1]  # two regions of image 1 stay together
    assert held.tolist() == split_by_image(ids, 0.5, seed=0).tolist()
    assert 0 < held.sum() < len(ids)
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_by_image(ids, 1.0, seed=0)
    with pytest.raises(ValueError, match="need >= 2"):
        split_by_image(["d/1#1", "d/1#2"], 0.5, seed=0)


def test_cache_round_trip_and_bad_caches(built, tmp_path):
    data, _ = built
    save_quality_data(data, tmp_path / "ok")
    loaded = load_quality_data(tmp_path / "ok")
    for key, value in data.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[key], value)
    assert loaded.meta["sample_ids"] == data.meta["sample_ids"]
    assert len(loaded.split_indices("train")) + len(loaded.split_indices("heldout")) == 4

    with pytest.raises(ValueError, match="missing quality.npz"):
        load_quality_data(tmp_path / "nothing")
    arrays = dict(data.arrays)
    del arrays["pred_iou"]  # a cache without the IoU-head outputs
    (tmp_path / "missing").mkdir()
    np.savez(tmp_path / "missing" / "quality.npz", **arrays)
    (tmp_path / "missing" / "meta.json").write_text(json.dumps(data.meta))
    with pytest.raises(ValueError, match=r"missing model outputs \['pred_iou'\]"):
        load_quality_data(tmp_path / "missing")
    arrays = dict(data.arrays, logits=data.logits.copy())
    arrays["logits"][0, 0, 0, 0] = np.nan
    (tmp_path / "nan").mkdir()
    np.savez(tmp_path / "nan" / "quality.npz", **arrays)
    (tmp_path / "nan" / "meta.json").write_text(json.dumps(data.meta))
    with pytest.raises(ValueError, match="'logits' holds NaN"):
        load_quality_data(tmp_path / "nan")
    arrays = {k: (v[:, :1] if v.ndim > 1 and v.shape[1] == 3 and k != "images" else v) for k, v in data.arrays.items()}
    (tmp_path / "k1").mkdir()
    np.savez(tmp_path / "k1" / "quality.npz", **arrays)
    (tmp_path / "k1" / "meta.json").write_text(json.dumps(data.meta))
    with pytest.raises(ValueError, match="K >= 2"):
        load_quality_data(tmp_path / "k1")


def test_builder_rejects_too_few_prompts_or_samples(tiny):
    model, proc = tiny
    world = ShapesWorld("val", 2, seed=0, image_size=64)
    with pytest.raises(ValueError, match="K >= 2"):
        build_quality_data(model, proc, world, default_prompt_specs(2)[:1])
    with pytest.raises(ValueError, match="need >= 2 images"):
        build_quality_data(model, proc, ShapesWorld("val", 1, seed=0, image_size=64), default_prompt_specs(2))


def test_quality_model_and_postprocess_run_on_a_built_cache(built):
    from projects.llava_sam2.rl_train.prompt_rl.postprocess import tune_postprocess
    from projects.llava_sam2.rl_train.prompt_rl.quality_model import fit_quality_models
    from projects.llava_sam2.rl_train.prompt_rl.reward_net import RewardNetConfig

    data, _ = built
    net, scores, results = fit_quality_models(data, RewardNetConfig(side=16, width=8), epochs=2, n_resamples=20)
    assert set(scores) == {"reward_net", "iou_head", "stability"}
    assert all(s.shape == data.dice.shape for s in scores.values())
    assert results["images"] == {"fit": 1, "val": 1, "heldout": 2}
    assert results["selected_scorer"] in scores and set(results["heldout"]["iou_head"]) == {
        "pearson", "spearman", "mae", "auroc"}
    train, held = data.split_indices("train"), data.split_indices("heldout")
    out = tune_postprocess(data, np.zeros(len(train), int), np.zeros(len(held), int), n_resamples=20)
    untouched = out["heldout"]["untouched"]["value"]
    assert untouched == pytest.approx(data.dice[held, 0].mean(), abs=0.02)  # float16 logits vs the cached masks
    assert out["train_dice"]["tuned"] >= out["train_dice"]["untouched"]

"""The step's host preprocessing made where the batch is built (data/prepared.py, PreprocessingCollate): the step's
features are the same bit for bit, the collate works in DataLoader workers, errors still name the sample."""
from __future__ import annotations

import argparse
import dataclasses
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from grpo_tiny import build_tiny, one_thread, shapes_batch
from projects.llava_sam2.rl_train.benchmarks import loader as loader_bench
from projects.llava_sam2.rl_train.benchmarks.rl_step import step_batch
from projects.llava_sam2.rl_train.data.collate import PreprocessingCollate, RegionBatch, region_collate
from projects.llava_sam2.rl_train.engine.iteration_loop import give_step_preprocessing
from projects.llava_sam2.rl_train.grpo.features import encode_step
from projects.llava_sam2.rl_train.model.pipeline.shared import host_to_device
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor

_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tiny():
    model, processor = build_tiny()
    return model.eval(), processor


def mixed_batch():
    """Three shapes samples, a second region of the first image (the same PIL object) and a text-only sample."""
    batch = shapes_batch(3)
    second_region = dataclasses.replace(batch[0], sample_id=batch[0].sample_id + "#b",
                                        gt_mask=np.roll(np.asarray(batch[0].gt_mask), 3, axis=1))
    text_only = dataclasses.replace(batch[2], sample_id=batch[2].sample_id + "#text", gt_mask=None)
    return batch + [second_region, text_only]


def assert_same_features(a, b):
    assert a.image_sizes == b.image_sizes and a.tile_start == b.tile_start
    assert torch.equal(a.image_index, b.image_index)
    assert torch.equal(a.vit_tokens, b.vit_tokens)
    assert torch.equal(a.grounding.image_embed, b.grounding.image_embed)
    assert all(torch.equal(x, y) for x, y in zip(a.grounding.high_res_feats, b.grounding.high_res_feats, strict=True))
    assert [m is None for m in a.gt_masks] == [m is None for m in b.gt_masks]
    assert all(torch.equal(x, y) for x, y in zip(a.gt_masks, b.gt_masks) if x is not None)
    assert torch.equal(a.region_cells, b.region_cells)


def test_features_from_prepared_batch_equal_raw_features_without_preprocessing_in_the_step(tiny, monkeypatch):
    model, processor = tiny
    samples = mixed_batch()
    raw = encode_step(model, processor, samples, use_region_cells=True, use_prompt_texts=True)
    batch = PreprocessingCollate(processor)(samples)
    assert batch.prepared.samples[0].image_inputs is batch.prepared.samples[3].image_inputs  # one per PIL image
    assert batch.prepared.samples[4].gt_mask is None and batch.prepared.samples[4].region_cells is None

    def not_in_the_step(*args, **kwargs):
        raise AssertionError("the step preprocessed an image the collate had prepared")

    monkeypatch.setattr(processor, "preprocess_image", not_in_the_step)
    monkeypatch.setattr(processor, "region_cells", not_in_the_step)
    assert_same_features(encode_step(model, processor, batch, use_region_cells=True, use_prompt_texts=True), raw)


def test_collate_prepares_in_dataloader_workers(tiny):
    _, processor = tiny
    samples = mixed_batch()
    loader = DataLoader(samples, batch_size=3, num_workers=2, collate_fn=PreprocessingCollate(processor))
    batches = list(loader)
    assert [len(b) for b in batches] == [3, 2] and all(isinstance(b, RegionBatch) for b in batches)
    prepared = [p for b in batches for p in b.prepared.samples]
    assert all(p is not None for p in prepared)
    for sample, made in zip(samples, prepared):  # made in a worker, equal to the processor's output here
        here = processor.preprocess_image(sample.image, where=sample.sample_id)
        assert torch.equal(made.image_inputs.pixel_values, here.pixel_values)
        assert torch.equal(made.image_inputs.g_pixel_values, here.g_pixel_values)
        if sample.gt_mask is not None:
            assert torch.equal(made.region_cells, processor.region_cells(sample.gt_mask, size=here.size))


@pytest.mark.parametrize("fault, message", [
    ("grey_image", "image mode 'L' is not 'RGB'"),
    ("mask_size", "gt_mask has shape"),
])
def test_a_bad_sample_still_fails_in_the_step_naming_it(tiny, fault, message):
    model, processor = tiny
    samples = shapes_batch(2)
    bad = samples[1]
    if fault == "grey_image":
        bad = dataclasses.replace(bad, image=bad.image.convert("L"))
    else:
        bad = dataclasses.replace(bad, gt_mask=np.asarray(bad.gt_mask)[:-1])
    batch = PreprocessingCollate(processor)([samples[0], bad])
    assert batch.prepared.samples[0] is not None and batch.prepared.samples[1] is None
    with pytest.raises(ValueError, match=message) as raised:
        encode_step(model, processor, batch, use_region_cells=True, use_prompt_texts=True)
    assert bad.sample_id in str(raised.value)


def test_step_refuses_inputs_prepared_by_another_processor(tiny):
    model, processor = tiny
    other = Sa2VAProcessor.from_config(processor.tokenizer, model.config, empty_region="keep")
    batch = PreprocessingCollate(other)(shapes_batch(2))
    with pytest.raises(ValueError, match="PreprocessingCollate"):
        encode_step(model, processor, batch, use_region_cells=True, use_prompt_texts=True)


def test_step_refuses_inputs_of_a_batch_changed_after_the_collate(tiny):
    model, processor = tiny
    samples = shapes_batch(3)
    batch = PreprocessingCollate(processor)(samples[:2])
    batch[1] = samples[2]  # same length, another sample
    with pytest.raises(ValueError, match="changed after the collate"):
        encode_step(model, processor, batch, use_region_cells=True, use_prompt_texts=True)


def test_a_region_collate_loader_gets_the_models_processor(tiny):
    _, processor = tiny
    model = SimpleNamespace(processor=processor)
    mmengine_built = DataLoader(shapes_batch(2), batch_size=2, collate_fn=partial(region_collate))
    assert give_step_preprocessing(mmengine_built, model)
    assert next(iter(mmengine_built)).prepared.settings == processor.preprocessing_settings
    other_collate = DataLoader(shapes_batch(2), batch_size=2, collate_fn=list)
    assert not give_step_preprocessing(other_collate, model) and other_collate.collate_fn is list
    plain = DataLoader(shapes_batch(2), batch_size=2, collate_fn=region_collate)
    assert not give_step_preprocessing(plain, SimpleNamespace()) and plain.collate_fn is region_collate


def test_benches_build_their_batches_through_the_collate(tiny, tmp_path, capsys):
    _, processor = tiny
    args = argparse.Namespace(video=False, batch=2, preprocess_in="loader")
    assert step_batch(args, 64, 64, processor).prepared is not None
    assert not hasattr(step_batch(argparse.Namespace(**{**vars(args), "preprocess_in": "step"}), 64, 64, processor),
                       "prepared")
    assert loader_bench.main(["--num-samples", "4", "--image-size", "64", "--workers", "0", "--repeats", "1",
                              "--preprocess", "tiny", "--out-dir", str(tmp_path)]) == 0
    assert "collate: PreprocessingCollate, tiny" in capsys.readouterr().out


def test_host_to_device_joins_like_cat_and_stack():
    tiles = [torch.randn(2, 3, 4, 4), torch.randn(1, 3, 4, 4)]
    assert torch.equal(host_to_device(tiles, "cpu"), torch.cat(tiles))
    sam_inputs = [torch.randn(3, 8, 8), torch.randn(3, 8, 8)]
    assert torch.equal(host_to_device(sam_inputs, "cpu", stack=True), torch.stack(sam_inputs))

"""Samples the model cannot take are bad samples at load time (issue #29 items 3 and 10b).

A region that hits no region-grid point under ``empty_region='raise'``, a 1x1 image and a caption with a lone
surrogate load as images and masks, but used to fail later: inside a training step (``region_cells``,
``check_rgb_image``) or in the tokenizer. Now ``on_bad_sample='raise'`` names the file and the sample, and
``'skip'`` drops and counts them, in the dataset and in a real tiny GRPO run.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from data_fixtures import make_model_input_coco
from engine_toy import run_config
from grpo_tiny import one_thread

from projects.llava_sam2.rl_train.cli.inspect_dataset import main as inspect_main
from projects.llava_sam2.rl_train.data import BadSampleError, CocoRegionDataset, SkippedSample
from projects.llava_sam2.rl_train.data.types import RegionSample
from projects.llava_sam2.rl_train.model.text.input_check import InputCheck
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.tiling import check_rgb_image
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

_one_thread = pytest.fixture(autouse=True)(one_thread)
CONFIGS = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl"


def test_raise_names_file_sample_and_problem(tmp_path):
    ann_file, expected = make_model_input_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file)
    dataset.set_input_check(InputCheck(16, "raise"))
    for index, item in enumerate(expected):
        if item.problem is None:
            assert dataset[index].sample_id == item.sample_id
            continue
        with pytest.raises(BadSampleError) as info:
            dataset[index]
        assert (info.value.problem, info.value.sample_id, info.value.file) == (item.problem, item.sample_id, ann_file)
        assert item.sample_id in str(info.value) and ann_file in str(info.value)


def test_skip_counts_every_problem_once(tmp_path):
    ann_file, expected = make_model_input_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file, on_bad_sample="skip")
    dataset.set_input_check(InputCheck(16, "raise"))
    loaded = [dataset[i] for i in range(len(dataset))]
    assert [s.sample_id for s in loaded if isinstance(s, RegionSample)] == ["coco/1#10"]
    assert all(isinstance(s, SkippedSample) for s in loaded[1:])
    assert dataset.bad_sample_counts == {"bad_text": 1, "image_too_small": 1, "region_off_grid": 1}


def test_the_check_follows_the_empty_region_policy_and_the_text_check_needs_no_model(tmp_path):
    ann_file, _ = make_model_input_coco(str(tmp_path))
    dataset = CocoRegionDataset(ann_file, on_bad_sample="skip")  # no input check: only data problems
    assert isinstance(dataset[1], RegionSample) and isinstance(dataset[2], RegionSample)
    assert isinstance(dataset[3], SkippedSample) and dataset[3].problem == "bad_text"
    dataset.set_input_check(InputCheck(16, "dilate_to_one_cell"))  # the processor gives the speck one cell
    assert isinstance(dataset[1], RegionSample)
    assert isinstance(dataset[2], SkippedSample) and dataset[2].problem == "image_too_small"


def test_the_check_agrees_with_the_processor(tmp_path):
    """The load-time check flags exactly what ``region_cells`` / ``check_rgb_image`` would raise on mid-step."""
    ann_file, expected = make_model_input_coco(str(tmp_path))
    processor = Sa2VAProcessor(load_tiny_tokenizer(), template="qwen_chat", empty_region="raise")
    assert processor.input_check == InputCheck(16, "raise")
    dataset = CocoRegionDataset(ann_file)  # samples as loaded, unchecked
    for index, item in enumerate(expected[:3]):
        sample = dataset[index]
        flagged = processor.input_check.problem(sample.image, sample.gt_mask)
        assert (flagged[0] if flagged else None) == item.problem
        if item.problem == "region_off_grid":
            with pytest.raises(ValueError, match="hits none"):
                processor.region_cells(sample.gt_mask, size=sample.gt_mask.shape)
        elif item.problem == "image_too_small":
            with pytest.raises(ValueError, match="below the minimum"):
                check_rgb_image(sample.image)
        else:
            processor.region_cells(sample.gt_mask, size=sample.gt_mask.shape)
            check_rgb_image(sample.image)


def test_grpo_run_skips_and_counts_them_instead_of_failing_mid_step(tmp_path):
    """The tiny GRPO config with ``empty_region='raise'`` on the fixture: the train loop gives the dataset the model
    processor's check, so the run trains and counts three skipped samples (it raised in ``region_cells`` before)."""
    ann_file, _ = make_model_input_coco(str(tmp_path / "data"))
    shutil.copytree(CONFIGS, tmp_path / "rl")  # the tiny config, with the COCO fixture as its dataset
    config = tmp_path / "rl" / "tiny_grpo_cycle_cpu.py"
    with open(config, "a") as handle:
        handle.write("from projects.llava_sam2.rl_train.data import CocoRegionDataset\n"
                     f"train_dataloader['dataset'] = dict(type=CocoRegionDataset, ann_file={ann_file!r}, "
                     "on_bad_sample='skip')\n")
    options = {"train_cfg.max_iters": 1, "train_dataloader.batch_size": 4,
               "train_dataloader.sampler.shuffle": False, "model.processor_cfg.empty_region": "raise",
               "default_hooks.checkpoint.interval": 10, "default_hooks.rollout_logging.interval": 10,
               "train_cfg.algorithm.rewards": dict(mask_to_caption=[dict(type="iou")],
                                                   caption_to_mask=[dict(type="iou")])}
    runner, record = run_config(config, tmp_path, **options)
    assert sorted(record.outputs) == [1]
    assert runner.message_hub.get_scalar("train/data/skipped_samples").current() == 3


def test_inspect_reports_them_and_draws_the_good_ones(tmp_path, capsys):
    ann_file, _ = make_model_input_coco(str(tmp_path))
    config = tmp_path / "regions.py"
    config.write_text(f"from projects.llava_sam2.rl_train.data import CocoRegionDataset\n"
                      f"dataset = dict(type=CocoRegionDataset, ann_file={ann_file!r}, on_bad_sample='raise')\n")
    out = tmp_path / "grid.png"
    assert inspect_main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 bad sample(s) skipped" in printed
    for problem in ("region_off_grid: 1", "image_too_small: 1", "bad_text: 1"):
        assert problem in printed
    assert "16x16 region grid (no model config found" in printed  # says which check it applied
    assert out.is_file()


@pytest.mark.parametrize("field", ["captions", "expressions"])
def test_every_loader_rejects_a_lone_surrogate_through_finish_sample(field):
    """finish_sample is the last step of the COCO, RefCOCO, DLC and GAR loaders: its text check covers all of them."""
    import numpy as np
    import PIL.Image

    from projects.llava_sam2.rl_train.data.base import finish_sample

    texts = {"captions": ["fine"], "expressions": ["also fine"], field: ["ok", "a grey \udcff box"]}
    with pytest.raises(BadSampleError, match="bad_text") as info:
        finish_sample(PIL.Image.new("RGB", (4, 4)), np.ones((4, 4), bool), sample_id="s/1#1", source="s",
                      file="shard.tar", **texts)
    assert info.value.file == "shard.tar" and "position 7" in str(info.value)


@pytest.mark.parametrize("config, key", [("tiny_grpo_cycle_cpu.py", "train_dataloader.dataset"),
                                         ("tiny_sft_cpu.py", "train_dataloader.dataset.region_dataset")])
def test_inspect_finds_a_training_configs_dataset_and_says_which(config, key, tmp_path, capsys):
    """`sa2va-rl inspect CONFIG` on a training config needed --key before; it now picks the dataset and the model's
    check (the tiny preset's 8x8 grid, the config's empty_region) and names both."""
    assert inspect_main([str(CONFIGS / config), "--out", str(tmp_path / "grid.png"), "--num", "2", "--check", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"dataset: {key} of {CONFIGS / config}" in printed
    assert "8x8 region grid (the config's model), empty_region='dilate_to_one_cell'" in printed
    assert "2 scanned, 2 good" in printed


def test_the_check_comes_from_the_model_config_when_the_model_is_not_built_yet():
    """FlexibleRunner (DeepSpeed) builds the train loop, and so the dataloader, before the model: the check is then read
    from the model config, with the same result as the built processor's."""
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
    from projects.llava_sam2.rl_train.engine.iteration_loop import give_input_check

    world = ShapesWorld("train", num_samples=1, seed=0, image_size=64)
    give_input_check(world, dict(type="Sa2VATrainModel", preset="tiny", processor_cfg=dict(empty_region="raise")))
    processor = Sa2VAProcessor(load_tiny_tokenizer(), template="qwen_chat", image_size=224, empty_region="raise")
    assert world.input_check == processor.input_check == InputCheck(8, "raise")
    give_input_check(world, dict(type="Sa2VATrainModel", upstream_sft=dict()))  # nothing readable: left as it was
    assert world.input_check == InputCheck(8, "raise")


def test_the_shapes_world_applies_the_check_too():
    from projects.llava_sam2.rl_train.data.shapes import ShapesWorld

    world = ShapesWorld("train", num_samples=1, seed=0, image_size=64)
    world.set_input_check(InputCheck(region_grid_size=64, empty_region="raise"))  # every pixel a grid point: passes
    assert isinstance(world[0], RegionSample)
    world.set_input_check(InputCheck(region_grid_size=1, empty_region="raise"))  # one point, (0, 0): the background
    with pytest.raises(BadSampleError, match="region_off_grid"):
        world[0]

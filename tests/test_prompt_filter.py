"""engine/prompt_filter.py + `sa2va-rl prefilter` (cli/prefilter.py) on the tiny model and the tiny COCO fixture: the
file is written with the prompts whose group rewards vary, a config that reads it trains on exactly those prompts,
and a bad file is refused with a named error."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from mmengine.config import Config

from data_fixtures import make_coco
from engine_toy import run_config
from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.cli.prefilter import prefilter_config
from projects.llava_sam2.rl_train.data import CocoRegionDataset
from projects.llava_sam2.rl_train.engine.prompt_filter import (
    FORMAT, KeepIdsDataset, PromptFileError, group_stats, read_keep_ids)
from projects.llava_sam2.rl_train.rewards import REWARDS, register_reward

_one_thread = pytest.fixture(autouse=True)(one_thread)

CONFIG = Path(__file__).resolve().parents[1] / "projects/llava_sam2/configs/rl/tiny_grpo_prefiltered_cpu.py"
FLAT_IDS = {"coco/1#11", "coco/2#21"}  # the reward below is constant on these prompts
SEEN: list[str] = []  # sample ids the reward was asked about (what the run rolled out)


@register_reward("test_flat_on_some_prompts") if "test_flat_on_some_prompts" not in REWARDS else (lambda cls: cls)
class FlatOnSomePromptsReward:
    """Loop-1 test reward: 0.5 on the FLAT_IDS prompts, else a hash of the sampled caption (random captions of a
    group differ, so those groups vary)."""

    name, weight = "flat_on_some", 1.0

    def __call__(self, inputs):
        SEEN.extend(inputs.sample_ids)
        return [0.5 if sid in FLAT_IDS else (sum(map(ord, c)) % 97) / 97
                for sid, c in zip(inputs.sample_ids, inputs.pred_captions)]


OPTIONS = {"train_cfg.algorithm.rewards": dict(mask_to_caption=[dict(type="test_flat_on_some_prompts")]),
           "train_cfg.algorithm.config.caption_to_mask_weight": 0.0,
           "train_cfg.algorithm.config.num_generations": 4}


def test_group_stats_use_the_scored_rewards():
    stats = group_stats([0.2, float("nan"), 0.4, 0.6])
    assert stats["rewards"] == [0.2, None, 0.4, 0.6] and stats["mean"] == pytest.approx(0.4)
    assert stats["std"] == pytest.approx(math.sqrt(0.08 / 3))
    assert group_stats([0.3, 0.3, 0.3])["std"] == 0.0 and group_stats([0.3, float("nan")])["std"] == 0.0


def test_prefilter_writes_the_varying_prompts_and_a_config_trains_on_exactly_those(tmp_path):
    ann_file, _ = make_coco(str(tmp_path / "coco"))
    all_ids = [CocoRegionDataset(ann_file).sample_id(i) for i in range(len(CocoRegionDataset(ann_file)))]
    out = tmp_path / "prompts.json"
    cfg = Config.fromfile(str(CONFIG))
    cfg.merge_from_dict({**OPTIONS, "train_dataloader.dataset.dataset.ann_file": ann_file})
    content = prefilter_config(cfg, str(out), threshold=1e-6, device="cpu", progress=False)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(content)) and written["format"] == FORMAT
    assert written["num_prompts"] == len(all_ids) == 5 and written["loops"] == ["mask_to_caption"]
    assert set(written["keep_ids"]) == set(all_ids) - FLAT_IDS  # every other group varies
    assert written["keep_ids_per_loop"] == {"mask_to_caption": written["keep_ids"]}
    for sid in FLAT_IDS:
        stats = written["prompts"][sid]["mask_to_caption"]
        assert stats["std"] == 0 and stats["rewards"] == [0.5] * 4

    SEEN.clear()
    kept = written["keep_ids"]
    runner, _ = run_config(CONFIG, tmp_path / "run", **OPTIONS, **{
        "train_dataloader.dataset.dataset.ann_file": ann_file, "train_dataloader.dataset.keep_ids_file": str(out),
        "train_dataloader.sampler.shuffle": False, "train_cfg.max_iters": math.ceil(len(kept) / 2),
        "default_hooks.checkpoint.interval": 100})
    dataset = runner.train_dataloader.dataset
    assert isinstance(dataset, KeepIdsDataset) and len(dataset) == len(kept)
    assert dataset.summary.startswith(f"KeepIdsDataset: kept {len(kept)} of 5 prompts (2 left out")
    assert set(SEEN) == set(kept)  # one epoch over the kept prompts, none of the others


def test_a_bad_prompt_file_is_refused_with_a_named_error(tmp_path):
    ann_file, _ = make_coco(str(tmp_path / "coco"))
    dataset = CocoRegionDataset(ann_file)
    with pytest.raises(PromptFileError, match="does not exist; write it with `sa2va-rl prefilter"):
        KeepIdsDataset(dataset, tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(PromptFileError, match="broken.json' is not JSON"):
        KeepIdsDataset(dataset, broken)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"keep_ids": ["coco/1#11"]}))  # no format tag: not a prefilter file
    with pytest.raises(PromptFileError, match="is not a prefilter file"):
        KeepIdsDataset(dataset, other)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"format": FORMAT, "keep_ids": ["coco/1#11", "dlc/9#9"],
                                   "keep_ids_per_loop": {"mask_to_caption": []}}))
    with pytest.raises(PromptFileError, match=r"keeps 1 ids the dataset does not hold \(e.g. \['dlc/9#9'\]\)"):
        KeepIdsDataset(dataset, foreign)
    with pytest.raises(PromptFileError, match="keeps no prompt"):
        KeepIdsDataset(dataset, foreign, loop="mask_to_caption")
    with pytest.raises(PromptFileError, match="has no loop 'caption_to_mask'"):
        read_keep_ids(foreign, loop="caption_to_mask")
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"format": FORMAT, "keep_ids": ["coco/2#22", "coco/1#11"]}))
    kept = KeepIdsDataset(dict(type=CocoRegionDataset, ann_file=ann_file), good)  # a config dict is built
    assert [kept[i].sample_id for i in range(len(kept))] == ["coco/1#11", "coco/2#22"]  # the dataset's order

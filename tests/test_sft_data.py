"""RegionSFTDataset: caption and segment SFT items from RegionSamples, seeded, collatable."""
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from projects.llava_sam2.rl_train.data.types import RegionSample
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.sft.sft_data import DEFAULT_CAPTION_QUESTIONS, RegionSFTDataset
from projects.llava_sam2.rl_train.model.text.constants import IGNORE_INDEX, IMG_CONTEXT_TOKEN
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.prompts import ANSWER_LIST
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer


def _sample(index, *, captions=("a small <red> square.",), expressions=("The Red Square.",),
            box=(5, 20, 10, 30)):
    image = Image.new("RGB", (40, 30), (255, 255, 255))
    r0, r1, c0, c1 = box
    image.paste((255, 0, 0), (c0, r0, c1, r1))
    gt_mask = np.zeros((30, 40), bool)
    gt_mask[r0:r1, c0:c1] = True
    return RegionSample(image=image, gt_mask=gt_mask, captions=list(captions), expressions=list(expressions),
                        sample_id=f"shapes/{index}#0", source="shapes")


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def proc(tok):
    return Sa2VAProcessor.from_config(tok, build_preset("tiny"))


def _supervised_text(tok, item):
    ids = [i for i, l in zip(item["input_ids"], item["labels"]) if l != IGNORE_INDEX]
    return tok.decode(ids)


def test_caption_item(proc, tok):
    dataset = RegionSFTDataset([_sample(0)], proc, tasks=("caption",), seed=0)
    item = dataset[0]
    assert item["task"] == "caption" and item["sample_id"] == "shapes/0#0"
    assert _supervised_text(tok, item) == "a small red square.<|im_end|>"  # '<', '>' stripped
    # rows 5..19, cols 10..29 of 30x40 -> 4x4 = 16 cells (hand count in test_processor)
    assert item["prompt_masks"].shape == (1, 8, 8) and int(item["prompt_masks"].sum()) == 16
    assert item["vp_overall_mask"].tolist() == [True]
    assert item["pixel_values"].shape == (1, 3, 224, 224)
    assert "g_pixel_values" not in item and "masks" not in item
    ctx = tok.convert_tokens_to_ids(IMG_CONTEXT_TOKEN)
    assert item["input_ids"].count(ctx) == 64 + 16
    prompt = tok.decode([i for i, l in zip(item["input_ids"], item["labels"]) if l == IGNORE_INDEX])
    assert "There are 1 part regions in the picture: region1<vp>" in prompt
    assert any(q.replace("<image>", "") in prompt for q in DEFAULT_CAPTION_QUESTIONS)


def test_segment_item(proc, tok):
    dataset = RegionSFTDataset([_sample(0)], proc, tasks=("segment",), seed=0)
    item = dataset[0]
    answer = _supervised_text(tok, item)
    assert answer.endswith("<|im_end|>") and answer[: -len("<|im_end|>")] in ANSWER_LIST
    assert "[SEG]" in answer
    prompt = tok.decode([i for i, l in zip(item["input_ids"], item["labels"]) if l == IGNORE_INDEX])
    assert "the red square" in prompt and "The Red Square." not in prompt  # normalised expression
    assert item["masks"].shape == (1, 30, 40) and item["masks"].dtype == torch.uint8
    assert int(item["masks"].sum()) == 15 * 20
    assert item["g_pixel_values"].shape == (3, 256, 256)
    assert "prompt_masks" not in item and "vp_overall_mask" not in item


def test_layout_length_and_seeding(proc):
    samples = [_sample(i) for i in range(4)]
    dataset = RegionSFTDataset(samples, proc, seed=0)
    first = [dataset[i] for i in range(8)]
    assert len(dataset) == 8 and [item["task"] for item in first[:4]] == ["caption", "segment"] * 2
    again = RegionSFTDataset(samples, proc, seed=0)
    other = RegionSFTDataset(samples, proc, seed=1)
    assert all(first[i]["input_ids"] == again[i]["input_ids"] for i in range(8))
    # 31 caption questions x 16 seg questions x 5 answers: seed 1 differs somewhere in 8 items
    assert any(first[i]["input_ids"] != other[i]["input_ids"] for i in range(8))
    with pytest.raises(IndexError):
        dataset[8]


def test_items_feed_sft_collate(proc):
    dataset = RegionSFTDataset([_sample(0), _sample(1)], proc, seed=0)
    batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=proc.sft_collate)))
    data = batch["data"]
    assert data["input_ids"].shape[0] == 4 and data["pixel_values"].shape == (4, 1, 3, 224, 224)
    assert data["frames_per_batch"] == [1, 1] and len(data["g_pixel_values"]) == 2
    assert len(data["masks"]) == 2 and len(data["prompt_masks"]) == 2
    assert data["vp_overall_mask"].tolist() == [True, False, True, False]


def test_missing_text_and_bad_tasks(tok, proc):
    no_captions = RegionSFTDataset([_sample(3, captions=())], proc, tasks=("caption",))
    with pytest.raises(ValueError, match=r"'shapes/3#0'.*no captions"):
        no_captions[0]
    no_text = RegionSFTDataset([_sample(4, captions=(), expressions=())], proc, tasks=("segment",))
    with pytest.raises(ValueError, match=r"'shapes/4#0'.*no text"):
        no_text[0]
    captions_only = RegionSFTDataset([_sample(5, expressions=())], proc, tasks=("segment",))
    item = captions_only[0]  # falls through to captions (segment_text_sources order), cleaned
    prompt = tok.decode([i for i, l in zip(item["input_ids"], item["labels"]) if l == IGNORE_INDEX])
    assert "a small red square" in prompt and "<red>" not in prompt
    with pytest.raises(ValueError, match="tasks="):
        RegionSFTDataset([], proc, tasks=("vqa",))


def test_empty_region_rule_names_the_sample(tok, proc):
    # a 1x1 box at (3, 3) of 30x40: sample rows floor(3.75 r) = 0, 3, ...; cols 5c = 0, 5, ... ->
    # row 3 is sampled but col 3 is not -> 0 cells.
    tiny_box = _sample(9, box=(3, 4, 3, 4))
    with pytest.raises(ValueError, match=r"'shapes/9#0'.*0 region tokens"):
        RegionSFTDataset([tiny_box], proc, tasks=("caption",))[0]
    dilate = Sa2VAProcessor.from_config(tok, build_preset("tiny"), empty_region="dilate_to_one_cell")
    item = RegionSFTDataset([tiny_box], dilate, tasks=("caption",))[0]
    assert int(item["prompt_masks"].sum()) == 1
    assert item["input_ids"].count(tok.convert_tokens_to_ids(IMG_CONTEXT_TOKEN)) == 64 + 1

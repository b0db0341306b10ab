"""Sa2VAProcessor: region cells (nearest point sampling), prompts, left padding, collate layout."""
import types

import numpy as np
import pytest
import torch
from PIL import Image

from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.text.constants import IMG_CONTEXT_TOKEN
from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
from projects.llava_sam2.rl_train.model.text.prompts import (
    ANSWER_LIST,
    DETAILED_QUESTIONS,
    SEG_QUESTIONS,
    detailed_question,
    region_string,
)
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

CTX = IMG_CONTEXT_TOKEN


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def proc(tok):
    # tiny preset: 224 px tiles, patch 14, ratio 0.5 -> g = 8, 64 tokens per tile, one tile
    return Sa2VAProcessor.from_config(tok, build_preset("tiny"))


def test_from_config_reads_every_knob(tok, proc):
    assert (proc.region_grid_size, proc.tokens_per_tile, proc.sam_image_size) == (8, 64, 256)
    assert proc.tiling.max_num == 1 and proc.template_name == "qwen_chat"
    real = Sa2VAProcessor.from_config(tok, build_preset("1b"))
    assert (real.region_grid_size, real.tokens_per_tile, real.sam_image_size) == (16, 256, 1024)
    assert (real.tiling.image_size, real.tiling.min_num, real.tiling.max_num) == (448, 1, 12)
    cfg = types.SimpleNamespace(template="phi3-chat", force_image_size=None, downsample_ratio=0.5,
                                min_dynamic_patch=1, max_dynamic_patch=6, use_thumbnail=False,
                                vision_config=types.SimpleNamespace(patch_size=14, image_size=448))
    other = Sa2VAProcessor.from_config(tok, cfg, tile_budget="config")  # '-' -> '_', image size from vision_config
    assert other.template_name == "phi3_chat" and other.tiling.image_size == 448
    assert other.sam_image_size == 1024 and other.tiling.use_thumbnail is False and other.tiling.max_num == 6


def test_tile_budget_follows_upstream_inference(tok):
    # A 448 px checkpoint whose config.json says max_dynamic_patch=6 (Sa2VAConfig's default) and no thumbnail:
    # upstream's predict_forward still tiles with 1..12 tiles + thumbnail. 640x480: r = 4/3 -> grid (4, 3)
    # (exact ratio within 12 tiles) -> 12 tiles + thumbnail = 13. With max 6 the closest grid is (3, 2):
    # |4/3 - 3/2| = 0.167 < |4/3 - 1| = 0.333 -> 6 tiles + thumbnail = 7 (this repo's old default).
    cfg = build_preset("1b")
    cfg.max_dynamic_patch, cfg.use_thumbnail = 6, False
    image = Image.new("RGB", (640, 480), (10, 20, 30))
    assert Sa2VAProcessor.from_config(tok, cfg).preprocess_image(image).n_tiles == 13  # the default
    for budget in ("auto", "upstream"):
        proc = Sa2VAProcessor.from_config(tok, cfg, tile_budget=budget)
        assert (proc.tiling.min_num, proc.tiling.max_num, proc.tiling.use_thumbnail) == (1, 12, True)
        assert proc.preprocess_image(image).n_tiles == 13
        assert proc.segment_text(13, "the cat").count(CTX) == 13 * 256
    assert Sa2VAProcessor.from_config(tok, cfg, tile_budget="config").preprocess_image(image).n_tiles == 6  # no thumb
    explicit = Sa2VAProcessor.from_config(tok, cfg, max_dynamic_patch=6)  # an explicit override wins
    assert explicit.preprocess_image(image).n_tiles == 7 and explicit.tiling.use_thumbnail is True
    tiny = Sa2VAProcessor.from_config(tok, build_preset("tiny"))  # 224 px tiles: not upstream's geometry
    assert tiny.tiling.max_num == 1
    assert Sa2VAProcessor.from_config(tok, build_preset("tiny"), tile_budget="upstream").tiling.max_num == 12
    with pytest.raises(ValueError, match="tile_budget='max'"):
        Sa2VAProcessor.from_config(tok, cfg, tile_budget="max")


def test_bad_construction(tok):
    with pytest.raises(ValueError, match="not in xtuner PROMPT_TEMPLATE"):
        Sa2VAProcessor(tok, template="nope")
    with pytest.raises(ValueError, match="whole number"):
        Sa2VAProcessor(tok, template="qwen_chat", image_size=448, patch_size=14, downsample_ratio=0.3)
    with pytest.raises(ValueError, match="empty_region"):
        Sa2VAProcessor(tok, template="qwen_chat", empty_region="ignore")


def test_preprocess_image(proc):
    inputs = proc.preprocess_image(Image.new("RGB", (40, 30), (255, 0, 0)))
    assert inputs.pixel_values.shape == (1, 3, 224, 224) and inputs.n_tiles == 1
    assert inputs.g_pixel_values.shape == (3, 256, 256) and inputs.size == (30, 40)
    assert float(inputs.g_pixel_values.max()) == 255.0
    with pytest.raises(ValueError, match="mode 'RGBA'"):
        proc.preprocess_image(Image.new("RGBA", (40, 30)))


# ----------------------------------------------------------------------------- region cells
def _mask(h, w, *pixels):
    mask = np.zeros((h, w), dtype=bool)
    for r, c in pixels:
        mask[r, c] = True
    return mask


def test_single_pixel_hits_one_sample_point(proc):
    # 16x16 -> g = 8: cell (r, c) samples pixel (2r, 2c). Pixel (2, 4) is the sample of cell (1, 2).
    cells = proc.region_cells(_mask(16, 16, (2, 4)))
    assert cells.dtype == torch.bool and cells.shape == (8, 8)
    assert cells.nonzero().tolist() == [[1, 2]]


def test_thin_masks(proc):
    row4 = np.zeros((16, 16), bool)
    row4[4, :] = True  # row 4 = 2*2 is sampled -> the whole cell row 2: 8 cells
    cells = proc.region_cells(row4)
    assert int(cells.sum()) == 8 and cells[2].all()
    row3 = np.zeros((16, 16), bool)
    row3[3, :] = True  # odd row is never sampled -> 0 cells
    with pytest.raises(ValueError, match="0 region tokens"):
        proc.region_cells(row3, sample_id="shapes/7#1")
    assert int(proc.region_cells(row3, empty_region="keep").sum()) == 0


def test_non_integer_scale(proc):
    # 20x20, g = 8: sampled rows/cols floor(k * 2.5) = 0, 2, 5, 7, 10, 12, 15, 17.
    # Rows 5..10 contain sample rows 5, 7, 10 (cell rows 2, 3, 4); all columns -> 3 * 8 = 24 cells.
    mask = np.zeros((20, 20), bool)
    mask[5:11, :] = True
    cells = proc.region_cells(mask)
    assert int(cells.sum()) == 24 and cells[2:5].all()
    # 30x40 rectangle rows 5..19, cols 10..29: sample rows floor(3.75 r) = 0,3,7,11,15,18,22,26 ->
    # 7, 11, 15, 18 (r = 2..5); sample cols 5c -> 10, 15, 20, 25 (c = 2..5): 4 x 4 = 16 cells.
    rect = np.zeros((30, 40), bool)
    rect[5:20, 10:30] = True
    cells = proc.region_cells(rect, size=(30, 40))
    assert int(cells.sum()) == 16 and cells[2:6, 2:6].all()


@pytest.mark.parametrize("h, w", [(37, 53), (9, 100), (8, 8), (5, 3)])
def test_cells_equal_the_point_sampling_formula(proc, h, w):
    rng = np.random.default_rng(h * 1000 + w)
    mask = rng.random((h, w)) < 0.4
    g = proc.region_grid_size
    rows = np.floor(np.arange(g) * h / g).astype(int)
    cols = np.floor(np.arange(g) * w / g).astype(int)
    expected = mask[np.ix_(rows, cols)]  # cell (r, c) <- pixel (floor(r*H/g), floor(c*W/g))
    assert np.array_equal(proc.region_cells(mask, empty_region="keep").numpy(), expected)


def test_dilate_to_one_cell_picks_the_pooled_bin(proc):
    # pixel (3, 5) of 16x16 is not a sample point; its 2x2 pooling bin is cell (1, 2).
    cells = proc.region_cells(_mask(16, 16, (3, 5)), empty_region="dilate_to_one_cell")
    assert cells.nonzero().tolist() == [[1, 2]]


def test_mask_validation(proc):
    with pytest.raises(ValueError, match="no foreground"):
        proc.region_cells(np.zeros((16, 16), bool), empty_region="dilate_to_one_cell")
    with pytest.raises(ValueError, match="0/1"):
        proc.region_cells(np.full((16, 16), 0.5))
    with pytest.raises(ValueError, match="2-D"):
        proc.region_cells(np.ones((2, 16, 16), bool))
    with pytest.raises(ValueError, match=r"!= image size"):
        proc.region_cells(np.ones((16, 16), bool), size=(16, 17))
    with pytest.raises(TypeError, match="list"):
        proc.region_cells([[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="'s1'"):
        proc.region_cells(_mask(16, 16, (3, 5)), sample_id="s1")


# --------------------------------------------------------------------------------- prompts
def test_region_string_exact():
    assert region_string([1, 0]) == (
        f"There are 2 part regions in the picture: region1<vp>{CTX}</vp>, region2<vp></vp>.\n")
    assert region_string([2]) == f"There are 1 part regions in the picture: region1<vp>{CTX * 2}</vp>.\n"


def test_caption_prompt_eval_form_exact(proc, tok):
    cells = proc.region_cells(_mask(16, 16, (0, 0), (2, 4), (14, 14)))  # 3 sample points
    prompt = proc.caption_prompt(1, cells)
    expected = (
        "<|im_start|>user\n<img>" + CTX * 64 + "</img>\n"
        "There are 1 part regions in the picture: region1<vp>" + CTX * 3 + "</vp>.\n"
        "\nPlease give me a short description of the region in the picture marked by region1."
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt == expected
    ids = tok.encode(prompt, add_special_tokens=False)
    ctx_id, vp, vp_end = tok.convert_tokens_to_ids([CTX, "<vp>", "</vp>"])
    assert ids.count(ctx_id) == 64 + 3
    assert ids[ids.index(vp) + 1:ids.index(vp_end)] == [ctx_id] * 3


def test_caption_prompt_training_form_and_multi_region(proc):
    question = detailed_question(DETAILED_QUESTIONS[20])
    assert question == "Please describe the region region1 in the image in detail."
    cells = torch.zeros(2, 8, 8, dtype=torch.bool)
    cells[0, 0, 0] = True  # region1: 1 cell
    cells[1, 1, :2] = True  # region2: 2 cells
    text = proc.caption_text(1, cells, question)
    assert text == ("<img>" + CTX * 64 + "</img>\nThere are 2 part regions in the picture: region1<vp>"
                    + CTX + "</vp>, region2<vp>" + CTX * 2 + "</vp>.\n" + question)


def test_empty_region_in_prompt_follows_the_policy(tok, proc):
    empty = torch.zeros(8, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="region1 has 0 cells"):
        proc.caption_prompt(1, empty)
    keep = Sa2VAProcessor.from_config(tok, build_preset("tiny"), empty_region="keep")
    assert "region1<vp></vp>.\n" in keep.caption_prompt(1, empty)


def test_segment_prompts_exact(proc):
    assert proc.segment_prompt(1, "the red square") == (
        "<|im_start|>user\n<img>" + CTX * 64 + "</img>\n Please segment the red square in this image."
        "<|im_end|>\n<|im_start|>assistant\n")  # RES eval: note the space after '\n'
    assert proc.segment_text(1, "red square", SEG_QUESTIONS[0]) == (
        "<img>" + CTX * 64 + "</img>\nCan you segment the red square in this image?")
    with pytest.raises(ValueError, match="non-empty"):
        proc.segment_prompt(1, "  ")


def test_prompt_string_tables():
    assert len(SEG_QUESTIONS) == 16 and len(set(SEG_QUESTIONS)) == 16
    assert all("{class_name}" in q for q in SEG_QUESTIONS)
    assert [q.rstrip("?.") for q in SEG_QUESTIONS[:4]] == [q for q in SEG_QUESTIONS[4:8]]
    assert ANSWER_LIST == ("It is [SEG].", "Sure, [SEG].", "Sure, it is [SEG].",
                           "Sure, the segmentation result is [SEG].", "[SEG].")
    assert len(DETAILED_QUESTIONS) == 30 and all("<region>" in q for q in DETAILED_QUESTIONS)


def test_phi3_template_wraps_with_its_tags(tok):
    phi3 = Sa2VAProcessor(tok, template="phi3_chat", image_size=224, max_dynamic_patch=1)
    prompt = phi3.segment_prompt(1, "x")
    assert prompt.startswith("<|user|>\n<img>") and prompt.endswith("<|end|>\n<|assistant|>\n")


def test_expand_image_requires_one_placeholder(proc):
    with pytest.raises(ValueError, match="exactly once"):
        proc.expand_image("no image here", 1)
    with pytest.raises(ValueError, match=r"\[8, 8\]"):
        proc.caption_text(1, torch.zeros(16, 16, dtype=torch.bool))


# --------------------------------------------------------------------------- left padding
def test_tokenize_prompts_left_pads(proc, tok):
    long_prompt = proc.segment_prompt(1, "the big blue circle on the left")
    short_prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    input_ids, attention_mask = proc.tokenize_prompts([short_prompt, long_prompt])
    long_ids = tok.encode(long_prompt)
    short_ids = tok.encode(short_prompt)
    n_pad = len(long_ids) - len(short_ids)
    assert input_ids.shape == attention_mask.shape == (2, len(long_ids))
    assert input_ids.dtype == torch.long and attention_mask.dtype == torch.bool
    assert input_ids[1].tolist() == long_ids and attention_mask[1].all()
    assert input_ids[0, :n_pad].tolist() == [tok.pad_token_id] * n_pad
    assert input_ids[0, n_pad:].tolist() == short_ids
    assert attention_mask[0].tolist() == [False] * n_pad + [True] * len(short_ids)
    assert attention_mask[:, -1].all()  # every row ends with a real token
    with pytest.raises(ValueError, match="non-empty list"):
        proc.tokenize_prompts([])


# --------------------------------------------------------------------------------- collate
def _item(length, n_tiles, *, seg=False, region=False):
    item = {"input_ids": list(range(1, length + 1)), "labels": [-100] * (length - 1) + [7],
            "pixel_values": torch.ones(n_tiles, 3, 4, 4), "sample_id": f"s{length}"}
    if seg:
        item["g_pixel_values"] = torch.zeros(3, 8, 8)
        item["masks"] = np.ones((1, 5, 6), np.uint8)
    if region:
        item["prompt_masks"] = torch.ones(1, 2, 2, dtype=torch.bool)
        item["vp_overall_mask"] = torch.tensor([False] * (n_tiles - 1) + [True])
    return item


def test_sft_collate_layout(proc):
    batch = proc.sft_collate([_item(3, 2, region=True), _item(5, 2, seg=True)])
    assert batch["data_samples"] is None
    data = batch["data"]
    assert data["input_ids"].tolist() == [[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]  # right pad with 0
    assert data["labels"].tolist() == [[-100, -100, 7, -100, -100], [-100] * 4 + [7]]
    assert data["attention_mask"].tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert data["position_ids"].tolist() == [[0, 1, 2, 3, 4]] * 2
    assert data["pixel_values"].shape == (2, 2, 3, 4, 4)  # same tile count -> stacked 5-D
    assert data["frames_per_batch"] == [1]  # only the segmentation item has a SAM2 frame
    assert len(data["g_pixel_values"]) == 1 and data["g_pixel_values"][0].shape == (3, 8, 8)
    assert len(data["masks"]) == 1 and data["masks"][0].dtype == torch.uint8
    assert data["vp_overall_mask"].tolist() == [False, True, False, False]  # seg item: all False
    assert len(data["prompt_masks"]) == 1 and data["prompt_masks"][0].dtype == torch.bool
    assert "sample_id" not in data


def test_sft_collate_ragged_tiles_and_no_regions(proc):
    data = proc.sft_collate([_item(2, 1), _item(2, 3)])["data"]
    assert isinstance(data["pixel_values"], list) and [p.shape[0] for p in data["pixel_values"]] == [1, 3]
    assert "vp_overall_mask" not in data and "prompt_masks" not in data and "masks" not in data
    with pytest.raises(ValueError, match="empty batch"):
        proc.sft_collate([])
    bad = _item(3, 1)
    bad["labels"] = bad["labels"][:-1]
    with pytest.raises(ValueError, match="'s3'"):
        proc.sft_collate([bad])

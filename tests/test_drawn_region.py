"""The drawn region input (model/text/drawn_region.py, model/pipeline/drawn_regions.py) on the tiny InternVL model:
describe_masks, the held-out evaluation and the tiny pretraining's caption rows."""
import numpy as np
import pytest
import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.demo import pretrain_tiny as tool
from projects.llava_sam2.rl_train.demo.pretrain_data import StageBatches
from projects.llava_sam2.rl_train.demo.pretrain_stages import JointWeights, joint_step
from projects.llava_sam2.rl_train.evaluation.tasks import EvalConfig, evaluate
from projects.llava_sam2.rl_train.model.pipeline import drawn_regions
from projects.llava_sam2.rl_train.model.pipeline.shared import describe_masks, encode_images
from projects.llava_sam2.rl_train.model.text.constants import IMG_CONTEXT_TOKEN
from projects.llava_sam2.rl_train.model.text.drawn_region import RegionOutline
from grpo_tiny import one_thread

SMALL = dict(seed=0, steps=2, scenes_per_batch=2, image_sizes=(96,))


_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tiny():
    model, _, processor = tool.build_tiny(0, "cpu")  # the shapes world's processor: white outlines
    model.eval()
    return model, processor


@pytest.fixture(scope="module")
def scene():
    scene, pixels = ShapesWorld("val", 1, 0, image_size=96).scene(0)
    from PIL import Image

    return scene, Image.fromarray(pixels)


def test_outline_paints_only_the_region_edge_in_its_colour(scene):
    scene, image = scene
    region = scene.visible[0]
    outline = RegionOutline("white", 0.01)
    drawn = np.asarray(outline.draw(image, region))
    changed = (drawn != np.asarray(image)).any(-1)  # [H, W]
    edge = outline.outline_pixels(region, region.shape)
    assert edge.any() and (edge & ~region).sum() == 0 and (region & ~edge).any()  # on the region, interior kept
    assert not (changed & ~edge).any() and (drawn[edge] == 255).all()
    width = outline.width(*region.shape)
    assert width == 2  # max(2 px, 1 % of 96 px)
    outside = np.pad(~region, width, constant_values=True)
    for y, x in zip(*np.nonzero(region & ~edge)):  # an unpainted region pixel lies more than the width from outside
        assert not outside[y:y + 2 * width + 1, x:x + 2 * width + 1].any()
    with pytest.raises(ValueError, match="colour"):
        RegionOutline("teal")


def test_internvl_describes_a_drawn_region_as_an_extra_image_without_region_tokens(tiny, scene, monkeypatch):
    model, processor = tiny
    scene, image = scene
    region = scene.visible[0]
    encoded_calls, rows_seen = [], []
    encode_vision, greedy = model.encode_vision, drawn_regions.greedy_answers

    def recording_encode_vision(pixel_values):
        encoded_calls.append(pixel_values.clone())
        return encode_vision(pixel_values)

    def recording_greedy(model_, processor_, encoded, rows, **kwargs):
        rows_seen.append((encoded, list(rows)))
        return greedy(model_, processor_, encoded, rows, **kwargs)

    monkeypatch.setattr(model, "encode_vision", recording_encode_vision)
    monkeypatch.setattr(drawn_regions, "greedy_answers", recording_greedy)
    encoded = encode_images(model, processor, [image], ["s0"])
    described = describe_masks(model, processor, encoded, [region, None], [0, 0], ["s0", "s1"], max_new_tokens=4,
                               empty_region=None, region_input="drawn")
    assert described[1] is None and described[0].is_drawn and described[0].region_tokens == 0
    expected = processor.preprocess_image(processor.region_outline.draw(image, region))
    assert len(encoded_calls) == 2 and torch.equal(encoded_calls[1], expected.pixel_values)  # the drawn copy
    extended, rows = rows_seen[0]
    assert len(rows) == 1 and rows[0].image == 1 and rows[0].region_cells is None and extended.num_images == 2
    assert rows[0].text == processor.region_outline.caption_prompt(processor, expected.n_tiles)
    assert "outlined in white" in rows[0].text and "region1" not in rows[0].text and "<vp>" not in rows[0].text
    assert rows[0].text.count(IMG_CONTEXT_TOKEN) == processor.image_token_count(expected.n_tiles)
    # the caller's own projection of the originals is extended with the drawn copy's: the same answer
    with_embeds = describe_masks(model, processor, encoded, [region], [0], ["s0"], max_new_tokens=4,
                                 empty_region=None, region_input="drawn",
                                 tile_embeds=model.project_vision(encoded.vit_tokens).detach())
    assert with_embeds[0].answer.text == described[0].answer.text
    native = describe_masks(model, processor, encoded, [region], [0], ["s0"], max_new_tokens=4, empty_region=None)
    assert not native[0].is_drawn and native[0].region_tokens > 0  # the InternVL default stays the region tokens
    with pytest.raises(ValueError, match="region_input"):
        describe_masks(model, processor, encoded, [region], [0], ["s0"], max_new_tokens=4, empty_region=None,
                       region_input="tokens")


def test_evaluation_takes_the_region_input(tiny):
    model, processor = tiny
    world = ShapesWorld("val", 2, 0, image_size=64)
    result = evaluate(model, processor, world, ("cycle_iou",),
                      EvalConfig(batch_size=2, max_new_tokens=4, n_resamples=10, show_progress=False,
                                 region_input="drawn"))["cycle_iou"]
    assert [r.region_tokens for r in result.records] == [0, 0]
    with pytest.raises(ValueError, match="region_input"):
        EvalConfig(region_input="tokens")
    from projects.llava_sam2.rl_train.evaluation.video_cycle_tasks import evaluate_video

    with pytest.raises(ValueError, match="region_input='drawn' is an image-task option"):  # not silently ignored
        evaluate_video(model, processor, [], config=EvalConfig(region_input="drawn"))


def test_pretrain_drawn_caption_rows_show_the_drawn_copy_and_keep_the_native_stream(tiny):
    model, processor = tiny
    native, drawn = (StageBatches("joint", processor, **SMALL, region_input=r)[1] for r in ("native", "drawn"))
    seg = ~native.is_caption
    assert torch.equal(native.is_caption, drawn.is_caption) and torch.equal(native.masks, drawn.masks)
    assert torch.equal(native.row_image[seg], drawn.row_image[seg])  # the same segmentation rows, same scenes
    for r in torch.nonzero(seg).flatten().tolist():
        n_ids = native.text["input_ids"][r][native.text["attention_mask"][r].bool()]
        d_ids = drawn.text["input_ids"][r][drawn.text["attention_mask"][r].bool()]
        assert torch.equal(n_ids, d_ids)
    assert native.region_rows.equal(native.is_caption) and not drawn.region_rows.any()
    assert len(drawn.prompt_masks) == 0 and len(native.prompt_masks) == int(native.is_caption.sum())
    scenes = native.pixel_values.shape[0]
    captions = torch.nonzero(drawn.is_caption).flatten().tolist()
    assert drawn.pixel_values.shape[0] == scenes + len(captions)
    source = StageBatches("joint", processor, **SMALL).source
    first = 10**9 + 1 * SMALL["scenes_per_batch"] * 4  # batch 1's first scene (pretrain_data.STAGE_BASES)
    tokenizer = processor.tokenizer
    for j, r in enumerate(captions):
        scene_row = native.row_image[r].item()  # the scene the native row captions
        assert drawn.row_image[r].item() == scenes + j
        scene, _, image = source.get_with_image(first + scene_row)
        copies = [processor.preprocess_image(processor.region_outline.draw(image, v)).pixel_values
                  for v in scene.visible]
        assert any(torch.equal(drawn.pixel_values[scenes + j], c) for c in copies)
        text = tokenizer.decode(drawn.text["input_ids"][r])
        assert "outlined in white" in text and "region1" not in text
    data = drawn.sft_data("cpu")
    assert not data["vp_overall_mask"].any() and data["prompt_masks"] == []
    losses = joint_step(model, None, drawn, JointWeights(num_points=64), 0.0, None)
    assert torch.isfinite(losses["loss"]) and losses["llm_loss"] > 0
    with pytest.raises(ValueError, match="region_input"):
        tool.PretrainSettings(out="x", region_input="tokens")


def test_the_outline_dilation_equals_the_square_max_pool_at_the_border_too():
    """``dilate`` (shifted ORs) gives what a (2w+1)² max-pool with -inf padding gives, on random masks that touch
    the image border, for several widths (the drawn pixels do not depend on which of the two computes them)."""
    import torch.nn.functional as F

    from projects.llava_sam2.rl_train.model.text.drawn_region import dilate

    generator = torch.Generator().manual_seed(0)
    for w in (1, 2, 5):
        mask = torch.rand(37, 53, generator=generator) > 0.97
        mask[0, 0] = mask[-1, 20] = True  # on the border
        pooled = F.max_pool2d(mask.float()[None, None], 2 * w + 1, stride=1, padding=w)[0, 0] > 0
        assert torch.equal(dilate(mask, w), pooled)
        assert not torch.equal(dilate(mask, w), dilate(mask, w + 1))

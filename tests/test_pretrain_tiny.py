"""demo/pretrain_tiny.py and its stages: settings, batches, a few steps of every stage, the saved checkpoint."""
import json

import numpy as np
import pytest
import torch

from projects.llava_sam2.rl_train.cli.settings import field_docs
from projects.llava_sam2.rl_train.demo import pretrain_tiny as tool
from projects.llava_sam2.rl_train.demo.pretrain_data import StageBatches, attribute_ids
from projects.llava_sam2.rl_train.demo.pretrain_stages import (AttributePrompt, JointWeights, joint_step, lm_step,
                                                               run_stage, sam_step, trainable_encoders)
from grpo_tiny import one_thread

SMALL = dict(seed=0, steps=2, scenes_per_batch=2, image_sizes=(96,))


_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, processor = tool.build_tiny(0, "cpu")
    return model, tokenizer, processor


def test_settings_are_validated_with_the_knob_named():
    with pytest.raises(ValueError, match="--out"):
        tool.PretrainSettings()
    with pytest.raises(ValueError, match="teacher_weight > 0 needs"):
        tool.PretrainSettings(out="x", sam_steps=0)
    with pytest.raises(ValueError, match="eval_tasks"):
        tool.PretrainSettings(out="x", eval_tasks=("segment",))
    with pytest.raises(ValueError, match="at least one stage"):
        tool.PretrainSettings(out="x", sam_steps=0, joint_steps=0, teacher_weight=0)
    with pytest.raises(ValueError, match="attribute_share"):
        tool.PretrainSettings(out="x", attribute_share=1.5)
    assert tool.main(["--out", "x", "--joint-lr", "0"]) == 2


def test_help_shows_every_setting_with_its_doc():
    text = " ".join(tool.build_parser().format_help().split())
    docs = field_docs(tool.PretrainSettings)
    for f in tool.dataclasses.fields(tool.PretrainSettings):
        assert "--" + f.name.replace("_", "-") in text, f.name
        assert docs[f.name][:30] in text, f.name
    args = tool.build_parser().parse_args(["--out", "x", "--image-sizes", "96", "160", "--no-group-by-scene"])
    settings = tool.settings_from_args(tool.PretrainSettings, args)
    assert settings.image_sizes == (96, 160) and settings.eval_tasks == ("res", "caption")
    assert not settings.group_by_scene and settings.sam_steps == 1500


def test_attribute_ids_follow_the_grammar():
    # colour red = 0, shape circle = 0, size big = 1, cell unstated = 9
    assert attribute_ids("the big red circle") == [0, 0, 1, 9]
    assert attribute_ids("a small blue star in the top left") == [2, 3, 0, 0]


def test_joint_batches_group_a_scene_and_are_deterministic(tiny):
    _, _, processor = tiny
    batches = StageBatches("joint", processor, **SMALL)
    a, b = batches[1], batches[1]
    assert torch.equal(a.text["input_ids"], b.text["input_ids"]) and torch.equal(a.pixel_values, b.pixel_values)
    seg_images = a.row_image[~a.is_caption].tolist()
    assert len(a.masks) == len(seg_images) == a.seg_attributes.shape[0] and a.is_caption.sum() == 2
    for image in set(seg_images):  # every object of the scene, each its own mask and text
        rows = [r for r, i in enumerate(a.row_image.tolist()) if i == image and not a.is_caption[r]]
        masks = [a.masks[seg_images.index(image) + j] for j in range(len(rows))]
        assert len({m.numpy().tobytes() for m in masks}) == len(rows)
    data = a.sft_data("cpu")
    assert data["pixel_values"].shape[0] == data["input_ids"].shape[0] == len(a.row_image)
    assert len(data["g_pixel_values"]) == len(data["masks"]) == len(seg_images)
    assert int(data["vp_overall_mask"].sum()) == len(data["prompt_masks"]) == 2
    ungrouped = StageBatches("joint", processor, **{**SMALL, "group_by_scene": False})[1]
    assert len(set(ungrouped.row_image[~ungrouped.is_caption].tolist())) == len(ungrouped.masks) == 5


def _learns(step_fn, batch, params, steps=4, lr=3e-3):
    log = run_stage("t", [batch] * steps, step_fn, params, steps=steps, lr=lr, warmup=1, time_budget_s=0,
                    log_every=1)
    losses = [row["loss"] for row in log.rows]
    assert log.steps_done == steps and losses[-1] < losses[0], losses
    return log


def test_sam_stage_learns_a_repeated_batch(tiny):
    model, _, processor = tiny
    batch = StageBatches("sam", processor, **SMALL, attribute_share=0.5)[0]
    assert batch.is_attribute.any() and (~batch.is_attribute).any()
    prompt = AttributePrompt(model.config.sam_hidden_dim)
    sam = model.grounding_encoder.sam2_model
    params = [*sam.image_encoder.parameters(), *sam.sam_mask_decoder.parameters(), *prompt.parameters()]
    before = sam.image_encoder.trunk.patch_embed.proj.weight.detach().clone()
    with trainable_encoders(model):
        _learns(lambda b, _: sam_step(model, prompt, b), batch, params)
    assert not torch.equal(before, sam.image_encoder.trunk.patch_embed.proj.weight)  # the encoder trained


def test_lm_stage_learns_a_repeated_batch(tiny):
    model, _, processor = tiny
    batch = StageBatches("lm", processor, **SMALL, text_rows=4)[0]
    _learns(lambda b, _: lm_step(model, b), batch, list(model.language_model.parameters()))


def test_joint_stage_learns_a_repeated_batch_and_the_teacher_reaches_the_llm(tiny):
    model, _, processor = tiny
    batch = StageBatches("joint", processor, **SMALL)[0]
    prompt = AttributePrompt(model.config.sam_hidden_dim).requires_grad_(False)
    weights = JointWeights(num_points=64, teacher=1.0)
    with trainable_encoders(model):
        log = _learns(lambda b, _: joint_step(model, prompt, b, weights, 1.0, None), batch, list(model.parameters()))
        assert log.rows[-1]["loss_teacher"] < log.rows[0]["loss_teacher"]
        model.zero_grad(set_to_none=True)
        joint_step(model, prompt, batch, JointWeights(num_points=64, teacher=1.0, mask=0.0, iou=0.0), 1.0,
                   None)["loss_teacher"].backward()
        layer = model.language_model.model.layers[0].self_attn.q_proj.weight
        assert layer.grad is not None and layer.grad.abs().sum() > 0
        decoder = model.grounding_encoder.sam2_model.sam_mask_decoder
        assert all(p.grad is None for p in decoder.parameters())  # the teacher trains the prompt, not the decoder
        model.zero_grad(set_to_none=True)


def test_trainable_encoders_is_scoped_to_the_block(tiny):
    model, _, processor = tiny
    pixels = torch.zeros(1, 3, 224, 224)
    with trainable_encoders(model):
        assert model.encode_vision(pixels).requires_grad
    assert not model.encode_vision(pixels).requires_grad and "encode_vision" not in vars(model)


def test_time_budget_stops_a_stage_early():
    param = torch.nn.Parameter(torch.ones(2))
    log = run_stage("t", [None] * 5, lambda b, s: {"loss": (param ** 2).sum()}, [param], steps=5, lr=0.1, warmup=1,
                    time_budget_s=1e-9, log_every=100)
    assert log.stopped_early and log.steps_done == 1 and log.rows[-1]["step"] == 1


def test_pretrain_writes_a_checkpoint_that_loads(tmp_path):
    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import load_pretrained

    out = tmp_path / "ckpt"
    argv = ["--out", str(out), "--sam-steps", "2", "--lm-steps", "1", "--joint-steps", "2", "--scenes-per-batch", "1",
            "--image-sizes", "96", "--warmup-steps", "1", "--eval-scenes", "0", "--log-every", "1"]
    assert tool.main(argv) == 0
    log = json.loads((out / "pretrain_log.json").read_text())
    assert [s["steps_done"] for s in log["stages"]] == [2, 1, 2, 0] and log["command"].endswith(" ".join(argv))
    import hashlib
    assert log["sha256"]["model.safetensors"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    loaded = load_pretrained(out)
    fresh, tokenizer, _ = tool.build_tiny(0, "cpu")
    loaded.bind_tokenizer(tokenizer)
    changed = [n for n, p in loaded.state_dict().items() if not torch.equal(p, fresh.state_dict()[n])]
    assert any(n.startswith("language_model.") for n in changed) and any("sam_mask_decoder" in n for n in changed)
    assert any(n.startswith("vision_model.") for n in changed)
    assert np.isfinite([p.abs().sum().item() for p in loaded.parameters()]).all()


def test_committed_checkpoint_matches_its_build_record_and_reads_its_text():
    import hashlib
    import re
    from pathlib import Path

    from projects.llava_sam2.rl_train.evaluation.loading import load_system
    from projects.llava_sam2.rl_train.evaluation.text_dependence import text_dependence

    path = Path(tool.__file__).resolve().parents[1] / "assets" / "tiny_shapes_pretrained"
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest in re.findall(r"[0-9a-f]{64}", (path / "BUILD.md").read_text())
    assert json.loads((path / "pretrain_log.json").read_text())["sha256"]["model.safetensors"] == digest
    model, processor, _ = load_system(checkpoint=str(path))
    result = text_dependence(model, processor, num_scenes=12, image_size=128, max_new_tokens=16, n_resamples=100)
    # 200 scenes (BUILD.md): gap 0.173, 12.9 % identical pairs; a text-blind model has gap 0 and ~100 % identical
    assert result.gap.value > 0.05 and result.identical_share.value < 0.5, result.format()

"""The video stage of the tiny pretraining recipe (demo/pretrain_*.py), clip-batched SAM2 propagation, and the held-out
video RES measure (evaluation/video_tasks.py), on the tiny preset at tiny sizes."""
import json
import math

import numpy as np
import pytest
import torch

from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld
from projects.llava_sam2.rl_train.demo import pretrain_tiny as tool
from projects.llava_sam2.rl_train.demo.pretrain_data import JointBatch, StageBatches, VideoBatch, is_image_step
from projects.llava_sam2.rl_train.demo.pretrain_stages import JointWeights, run_stage, trainable_encoders, video_step
from projects.llava_sam2.rl_train.evaluation.video_tasks import VideoRecord, evaluate_video_res, summarize_video
from projects.llava_sam2.rl_train.model.decoding.text_decoding import eval_mode
from projects.llava_sam2.rl_train.model.pipeline.video import encode_video
from grpo_tiny import one_thread

CLIPS = dict(seed=0, steps=3, scenes_per_batch=1, image_sizes=(96,), clips_per_batch=2, video_frames=5,
             video_image_size=64, mllm_frames=2)
MEMORY_MODULES = ("memory_attention", "memory_encoder", "obj_ptr_proj", "maskmem_tpos_enc")


_one_thread = pytest.fixture(autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tiny():
    model, _, processor = tool.build_tiny(0, "cpu")
    return model, processor


def _memory_params(model) -> dict[str, torch.Tensor]:
    sam = model.grounding_encoder.sam2_model
    return {name: p for name, p in sam.named_parameters() if name.split(".")[0] in MEMORY_MODULES}


def test_video_batches_hold_a_row_per_object_with_its_masklet_and_are_deterministic(tiny):
    _, processor = tiny
    batches = StageBatches("video", processor, **CLIPS)
    batch = batches[0]
    assert isinstance(batch, VideoBatch) and batch.pixel_values.shape[:2] == (2, 2)
    assert batch.g_pixel_values.shape[:2] == (2, 5) and batch.g_pixel_values.dtype == torch.uint8
    objects = [len(batches.clips.clip(c, render=False)[0].objects) for c in range(2)]
    assert batch.row_clip.tolist() == [c for c, k in enumerate(objects) for _ in range(k)]
    assert batch.masklets.shape[:2] == (sum(objects), 5) and batch.masklets.amax(dim=(1, 2, 3)).min() == 1
    ids = batch.text["input_ids"]
    seg_id = processor.tokenizer.convert_tokens_to_ids("[SEG]")
    assert ((ids == seg_id).sum(1) == 1).all()  # one [SEG] per row, its masklet the target
    context = processor.tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    assert ((ids == context).sum(1) == processor.image_token_count(1) * 2).all()  # one tile per MLLM frame
    again = StageBatches("video", processor, **CLIPS)[0]
    assert torch.equal(again.masklets, batch.masklets) and torch.equal(again.text["input_ids"], ids)
    mixed = StageBatches("video", processor, **{**CLIPS, "image_share": 0.5})
    kinds = [type(mixed[t]) for t in range(3)]
    assert kinds == [VideoBatch if not is_image_step(t, 0.5) else JointBatch for t in range(3)]
    assert JointBatch in kinds and VideoBatch in kinds


def test_batched_propagation_equals_one_clip_at_a_time(tiny):
    model, processor = tiny
    world = ShapesVideoWorld("val", 2, 0, image_size=64, num_frames=4)
    videos = [encode_video(model, processor, world[i].frames, mllm_frames=2) for i in range(2)]
    grounding = [v.encoded.grounding for v in videos]
    stacked = type(grounding[0])(**{k: (torch.cat([getattr(g, k) for g in grounding])
                                        if k != "high_res_feats" and k != "backbone_pos" else getattr(grounding[0], k))
                                    for k in ("image_embed", "high_res_feats", "backbone_embed", "backbone_pos")})
    stacked.high_res_feats = [torch.cat([g.high_res_feats[i] for g in grounding]) for i in range(2)]
    prompts = torch.randn(3, model.config.sam_hidden_dim, generator=torch.Generator().manual_seed(0))
    clip_index = torch.tensor([1, 0, 1])
    with eval_mode(model), torch.no_grad():
        together = model.propagate_masklets(prompts, stacked, 2, clip_index=clip_index, num_clips=2)  # [3, 4, h, w]
        alone = [model.propagate_masklets(prompts[i:i + 1], grounding[int(c)], 2) for i, c in enumerate(clip_index)]
    assert together.shape[:2] == (3, 4)
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="num_clips=3"):
        model.propagate_masklets(prompts, stacked, 2, clip_index=clip_index, num_clips=3)


def test_video_stage_trains_the_memory_modules_through_propagated_frames(tiny):
    model, processor = tiny
    batches = StageBatches("video", processor, **CLIPS)
    weights = JointWeights(num_points=64)
    memory = _memory_params(model)
    assert {name.split(".")[0] for name in memory} == set(MEMORY_MODULES)
    before = {name: p.detach().clone() for name, p in memory.items()}
    fast = StageBatches("video", processor, **{**CLIPS, "video_frames": 3, "mllm_frames": 1})  # 2 propagated frames
    model.train()
    with trainable_encoders(model):
        log = run_stage("video", [fast[0], fast[1]], lambda b, _: video_step(model, b, weights, None),
                        list(model.parameters()), steps=2, lr=1e-3, warmup=1, time_budget_s=0, log_every=1)
    model.eval()
    assert log.steps_done == 2 and all(math.isfinite(r[k]) for r in log.rows for k in ("loss", "llm_loss", "loss_dice"))
    for name, p in memory.items():  # the last step's gradients are left in place
        if name.startswith(MEMORY_MODULES[:3]):  # every weight of these modules is read by the memory path
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for module in MEMORY_MODULES:
        params = [(n, p) for n, p in memory.items() if n.split(".")[0] == module]
        assert sum(p.grad.abs().sum() for _, p in params if p.grad is not None) > 0, module
        assert any(not torch.equal(before[n], p) for n, p in params), module
    model.zero_grad(set_to_none=True)


def test_held_out_video_measure_splits_memory_free_and_propagated_frames(tiny):
    model, processor = tiny
    world = ShapesVideoWorld("val", 3, 0, image_size=64, num_frames=4)
    result = evaluate_video_res(model, processor, world, mllm_frames=2, max_new_tokens=8, n_resamples=50)
    assert len(result.records) == 3 and all(len(r.j) == len(r.f) == 4 for r in result.records)
    for name in ("j_and_f", "j_and_f_memory_free", "j_and_f_propagated", "j", "f", "no_seg_rate"):
        estimate = result.metrics[name]
        assert estimate.n == 3 and 0 <= estimate.low <= estimate.value <= estimate.high <= 1, name
    # the split: frames < n are memory-free, frames >= n propagated; J&F = (mean J + mean F) / 2 per group
    record = VideoRecord("x", "t", "a", True, 2, [1.0, 0.5, 0.0, 0.25], [1.0, 1.0, 0.5, 0.0])
    assert record.j_and_f("memory_free") == pytest.approx(0.875)
    assert record.j_and_f("propagated") == pytest.approx(0.1875)
    assert record.j_and_f("all") == pytest.approx((0.4375 + 0.625) / 2)
    only_prompted = VideoRecord("y", "t", "a", False, 2, [1.0, 1.0], [1.0, 1.0])
    metrics = summarize_video([record, only_prompted], n_resamples=50)
    assert metrics["j_and_f_propagated"].n == 1 and metrics["no_seg_rate"].value == 0.5


def test_pretrain_runs_the_video_stage_and_logs_the_held_out_video_measure(tmp_path, capsys):
    out = tmp_path / "video"
    argv = ["--out", str(out), "--sam-steps", "0", "--joint-steps", "0", "--teacher-weight", "0", "--video-steps", "3",
            "--clips-per-batch", "1", "--video-frames", "6", "--video-image-size", "48", "--image-share", "0.5",
            "--scenes-per-batch", "1", "--image-sizes", "64", "--warmup-steps", "1", "--num-points", "32",
            "--eval-scenes", "0", "--video-eval-clips", "1", "--log-every", "1"]
    assert tool.main(argv) == 0
    log = json.loads((out / "pretrain_log.json").read_text())
    video = log["stages"][-1]
    assert video["name"] == "video" and video["steps_done"] == 3
    assert all("iou_tracked" in row for row in video["rows"][:2])  # batches 0 and 1: clips
    assert "loss_dice" in video["rows"][2] and "iou_tracked" not in video["rows"][2]  # batch 2: an image batch
    held = log["held_out"]["video_res"]
    assert held["clips"] == 1 and {"j_and_f", "j_and_f_memory_free", "j_and_f_propagated"} <= set(held)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["held_out_video_res"] == held

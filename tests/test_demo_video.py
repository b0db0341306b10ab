"""The video demo's pieces (demo/video.py, `sa2va-rl demo --video`): its data stage writes the unpaired RL clips and the
held-out clips in the real layouts and they read back through the real loaders; the unpaired zip takes video samples;
the video cycle evaluation tasks (evaluation/video_cycle_tasks.py) equal a hand composition of the pipeline functions
and carry bootstrap CIs; the held-out table's paired difference and the multi-seed table come from the records. The
whole pipeline at tiny sizes is tests/test_demo_video_pipeline.py (`make demo`)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_tiny import one_thread
from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld
from projects.llava_sam2.rl_train.data.types import VideoRegionSample
from projects.llava_sam2.rl_train.data.unpaired import UnpairedRegionDataset
from projects.llava_sam2.rl_train.data.video_formats.mevis import MeViSDataset
from projects.llava_sam2.rl_train.data.video_formats.sav import SAVMaskletDataset
from projects.llava_sam2.rl_train.demo.pipeline import CONFIG_DIR, DemoSettings, rl_options, stage_data

_one_thread = pytest.fixture(autouse=True)(one_thread)
TINY = dict(video=True, train_samples=4, val_samples=3, num_frames=4, video_mllm_frames=2, eval_split="val",
            image_size=64)


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    settings = DemoSettings(tmp_path_factory.mktemp("video_demo"), **TINY)
    return settings, stage_data(settings)


def test_video_settings_pick_the_video_config_and_sizes_and_reject_what_video_cannot_do(tmp_path):
    s = DemoSettings(tmp_path, video=True)
    assert s.rl_config == str(CONFIG_DIR / "grpo_shapes_video_cpu.py")
    assert (s.train_samples, s.val_samples, s.image_size, s.num_frames) == (80, 48, 128, 6)
    image = DemoSettings(tmp_path)  # the image demo's defaults are unchanged
    assert (image.train_samples, image.val_samples, image.image_size) == (2000, 200, 128)
    assert image.rl_config.endswith("grpo_shapes_unpaired_cpu.py")
    assert image.start_checkpoint.endswith("assets/tiny_shapes_pretrained")
    for bad, word in ((dict(rl_data="paired"), "unpaired"), (dict(sft_iters=5), "sft_iters"),
                      (dict(video_mllm_frames=9), "video_mllm_frames")):
        with pytest.raises(ValueError, match=word):
            DemoSettings(tmp_path, video=True, **bad)


def test_data_stage_writes_sav_masklets_mevis_texts_and_held_out_clips_that_the_loaders_read(demo_data):
    s, outputs = demo_data
    assert outputs["clips"] == {"rl_regions": 2, "rl_texts": 2, "eval": 3}
    world = ShapesVideoWorld("train", 4, 0, image_size=64, num_frames=4, domain="target")
    regions = SAVMaskletDataset(**outputs["files"]["rl_regions"], num_frames=None)
    texts = MeViSDataset(**outputs["files"]["rl_texts"], num_frames=None)
    for k in range(2):  # the two disjoint halves of the training clips, masklets exact through RLE
        assert np.array_equal(regions[k].gt_masks, world[k].gt_masks)
        assert regions[k].captions == regions[k].expressions == []
        assert np.array_equal(texts[k].gt_masks, world[2 + k].gt_masks)
        assert texts[k].expressions == world[2 + k].expressions
        assert len(texts[k].frames) == 4
    held_out = MeViSDataset(**outputs["files"]["eval"], num_frames=None)
    expected = ShapesVideoWorld("val", 3, 0, image_size=64, num_frames=4, domain="target")
    assert [x.expressions for x in held_out] == [expected[i].expressions for i in range(3)]
    # the target domain's pixels (JPEG round trip within a few levels), not the source's
    frame, target = np.asarray(held_out[0].frames[1], float), np.asarray(expected[0].frames[1], float)
    source = np.asarray(ShapesVideoWorld("val", 1, 0, image_size=64, num_frames=4)[0].frames[1], float)
    assert np.abs(frame - target).mean() < 6 < np.abs(frame - source).mean()  # measured: 3.2 and 18.8


def test_rl_options_point_the_video_config_at_the_demo_files(demo_data):
    """The GRPO config with the demo's --cfg-options builds the unpaired zip of the written files: items are
    (masklet without text, clip with text and no masklet)."""
    import argparse

    from mmengine.config import Config, DictAction
    from mmengine.registry import DATASETS

    from projects.llava_sam2.rl_train.engine.registry import build_component

    s, _ = demo_data
    cfg = Config.fromfile(s.rl_config)
    parser = argparse.ArgumentParser()
    parser.add_argument("--cfg-options", nargs="+", action=DictAction)  # as `sa2va-rl train` reads them
    options = [o for o in rl_options(s) if o.startswith("train_")]
    cfg.merge_from_dict(parser.parse_args(["--cfg-options", *options]).cfg_options)
    assert cfg.train_cfg.algorithm.config.video_mllm_frames == s.video_mllm_frames == 2
    dataset = build_component(DATASETS, cfg.train_dataloader.dataset)
    region, text = dataset[0]
    assert isinstance(region, VideoRegionSample) and isinstance(text, VideoRegionSample)
    assert region.gt_masks is not None and region.expressions == region.captions == []
    assert text.gt_masks is None and text.expressions


def test_unpaired_zip_of_clips_drops_texts_from_masklets_and_masklets_from_texts():
    world = ShapesVideoWorld("val", 4, seed=2, image_size=64, num_frames=3)
    zipped = UnpairedRegionDataset(torch.utils.data.Subset(world, [0, 1]), torch.utils.data.Subset(world, [2, 3]))
    region, text = zipped[1]
    assert isinstance(region, VideoRegionSample) and isinstance(text, VideoRegionSample)
    assert np.array_equal(region.gt_masks, world[1].gt_masks) and region.captions == region.expressions == []
    assert region.category is None and region.frame_names == world[1].frame_names
    assert text.gt_masks is None and text.expressions == world[3].expressions and text.captions == world[3].captions
    no_masklet = UnpairedRegionDataset([text], [text])
    with pytest.raises(ValueError, match="region set has no mask"):
        no_masklet[0]


@pytest.fixture(scope="module")
def asset_model():
    from projects.llava_sam2.rl_train.demo.pipeline import PRETRAINED
    from projects.llava_sam2.rl_train.evaluation.loading import load_system

    torch.set_num_threads(1)
    model, processor, _ = load_system(checkpoint=str(PRETRAINED), device="cpu",
                                      processor_overrides={"empty_region": "dilate_to_one_cell"})
    return model, processor


def _hand_cycles(model, processor, clips, max_new_tokens, mllm_frames):
    """The two video cycles composed from the pipeline functions directly (the order the task module doc gives)."""
    from projects.llava_sam2.rl_train.data.video import key_frame
    from projects.llava_sam2.rl_train.evaluation.captions import get_cleaner, meteor_per_caption
    from projects.llava_sam2.rl_train.model.pipeline.shared import describe_masks
    from projects.llava_sam2.rl_train.model.pipeline.video import (
        encode_clips, largest_mask_frames, segment_texts_in_clips)
    from projects.llava_sam2.rl_train.rewards.video_metrics import j_and_f

    gts = [np.asarray(c.gt_masks, bool) for c in clips]
    keys = [key_frame(g) for g in gts]
    ids = [c.sample_id for c in clips]
    encoded = encode_clips(model, processor, [c.frames for c in clips], ids, list(enumerate(keys)),
                           mllm_frames=mllm_frames)
    rows = range(len(clips))
    captions = describe_masks(model, processor, encoded.stills, [g[k] for g, k in zip(gts, keys)], rows, ids,
                              max_new_tokens=max_new_tokens, empty_region="dilate_to_one_cell")
    _, masklets = segment_texts_in_clips(model, processor, encoded, [d.answer.plain for d in captions], rows,
                                         max_new_tokens=max_new_tokens)
    loop1 = [(d.answer.plain, j_and_f(g, np.zeros_like(g) if m is None else m.numpy()))
             for d, g, m in zip(captions, gts, masklets)]
    answers, masklets = segment_texts_in_clips(model, processor, encoded, [c.expressions[0] for c in clips], rows,
                                               max_new_tokens=max_new_tokens)
    prompts = torch.stack([a.seg_prompts[0] for a in answers])  # the asset answers every expression with [SEG]
    frames = largest_mask_frames(model, encoded, list(rows), prompts)
    described = describe_masks(model, processor, encoded.frame_images(list(rows), frames),
                               [m[k] for m, k in zip(masklets, frames)], rows, ids, max_new_tokens=max_new_tokens,
                               empty_region="dilate_to_one_cell")
    clean = get_cleaner("sa2va")
    loop2 = [(clean(d.answer.text), meteor_per_caption(clean(d.answer.text), c.expressions, c.sample_id),
              j_and_f(g, m.numpy()), k) for d, c, g, m, k in zip(described, clips, gts, masklets, frames)]
    return loop1, loop2


def test_video_cycle_tasks_through_the_cli_equal_the_hand_composition_and_carry_cis(demo_data, asset_model, tmp_path):
    from projects.llava_sam2.rl_train.cli.evaluate import main as evaluate_main
    from projects.llava_sam2.rl_train.demo.pipeline import PRETRAINED
    from projects.llava_sam2.rl_train.demo.video import video_eval_arguments
    from projects.llava_sam2.rl_train.evaluation.results import build_dataset, load_run

    s, _ = demo_data
    out = tmp_path / "eval"
    arguments = [a if a != "16" else "3" for a in video_eval_arguments(s)]  # one batch of the 3 clips
    assert evaluate_main(["--checkpoint", str(PRETRAINED), *arguments, "--out", str(out), "--no-progress",
                          "--n-resamples", "200", "--device", "cpu"]) == 0
    run = load_run(str(out))
    clips = [c for c in build_dataset(run.meta["dataset"])]
    assert len(clips) == 3 and len(clips[0].frames) == 4  # every frame of every held-out clip
    model, processor = asset_model
    loop1, loop2 = _hand_cycles(model, processor, clips, s.eval_max_new_tokens, s.video_mllm_frames)
    for record, (caption, jf) in zip(run.records("video_cycle_jf"), loop1):
        assert record.caption == caption and record.score == pytest.approx(jf, abs=1e-12)
        assert record.j_and_f == pytest.approx(jf, abs=1e-12) and len(record.masklet) == 4
    for record, (caption, meteor, jf, frame) in zip(run.records("video_cycle_caption"), loop2):
        assert (record.caption, record.key_frame) == (caption, frame)
        assert record.score == pytest.approx(meteor, abs=1e-12) and record.j_and_f == pytest.approx(jf, abs=1e-12)
    assert len({r.score for r in run.records("video_cycle_jf")}) > 1  # not one constant value
    # video_res: A's masklet for the first expression, the chain loop 2's masklet comes from, scored per frame group
    for record, (_, _, jf, _) in zip(run.records("video_res"), loop2):
        assert record.score == pytest.approx(jf, abs=1e-12) and record.mllm_frames == 2
        n = record.mllm_frames
        assert record.frames_j_and_f("propagated") == pytest.approx(
            (np.mean(record.frame_j[n:]) + np.mean(record.frame_f[n:])) / 2)
    for task, metric in (("video_res", "j_and_f"), ("video_res", "j_and_f_propagated"), ("video_cycle_jf", "cycle_JF"), ("video_cycle_caption", "cycle_METEOR_nltk"),
                         ("video_cycle_caption", "masklet_JF")):
        estimate = run.results[task].metrics[metric]
        assert estimate.n == 3 and estimate.n_resamples == 200
        assert math.isfinite(estimate.low) and estimate.low <= estimate.value <= estimate.high


def test_video_res_agrees_with_the_pretraining_stages_measure(demo_data, asset_model):
    """evaluation/video_tasks.py's evaluate_video_res (one clip at a time) and the batched video_res task score the
    same masklets."""
    from projects.llava_sam2.rl_train.evaluation.tasks import EvalConfig
    from projects.llava_sam2.rl_train.evaluation.video_cycle_tasks import evaluate_video
    from projects.llava_sam2.rl_train.evaluation.video_tasks import evaluate_video_res

    s, outputs = demo_data
    clips = list(MeViSDataset(**outputs["files"]["eval"], num_frames=None))
    model, processor = asset_model
    theirs = evaluate_video_res(model, processor, clips, mllm_frames=2, max_new_tokens=24, n_resamples=50)
    ours = evaluate_video(model, processor, clips, ("video_res",), EvalConfig(
        batch_size=3, max_new_tokens=24, video_mllm_frames=2, n_resamples=50, show_progress=False))["video_res"]
    for a, b in zip(theirs.records, ours.records):
        assert a.sample_id == b.sample_id and a.text == b.text_in
        assert np.allclose(a.j, b.frame_j) and np.allclose(a.f, b.frame_f)
    for name in ("j_and_f", "j_and_f_memory_free", "j_and_f_propagated"):
        assert ours.metrics[name].value == pytest.approx(theirs.metrics[name].value)


def _fake_run(path, system, scores):
    """An evaluation run on disk with ``video_cycle_jf`` records of the given J&F scores (J = F = score)."""
    from projects.llava_sam2.rl_train.evaluation.metrics import summarize
    from projects.llava_sam2.rl_train.evaluation.records import EvalRecord, MaskStats
    from projects.llava_sam2.rl_train.evaluation.results import save_run
    from projects.llava_sam2.rl_train.evaluation.tasks import TaskResult

    records = [EvalRecord("video_cycle_jf", f"clip#{i}", v, caption="a red circle", frame_j=[v, v], frame_f=[v, v],
                          mask=MaskStats(True, 1, 1, 2, 1, 2)) for i, v in enumerate(scores)]
    save_run(str(path), {"video_cycle_jf": TaskResult("video_cycle_jf", records,
                                                      summarize("video_cycle_jf", records, n_resamples=200))},
             {"system": system})


def test_held_out_rows_give_the_paired_difference_of_the_records(tmp_path):
    from projects.llava_sam2.rl_train.demo.video import held_out_rows

    base, rl = [0.2, 0.4, 0.5, 0.1], [0.3, 0.4, 0.7, 0.1]
    _fake_run(tmp_path / "base", "base", base)
    _fake_run(tmp_path / "rl", "rl", rl)
    rows = held_out_rows(tmp_path / "base", tmp_path / "rl", n_resamples=200)
    assert [r["metric"] for r in rows] == ["cycle_JF", "cycle_J", "cycle_F"]  # the tasks the runs have
    jf = rows[0]
    assert jf["diff"].value == pytest.approx(np.mean(np.subtract(rl, base)))  # (0.1 + 0 + 0.2 + 0) / 4 = 0.075
    assert jf["base"].value == pytest.approx(0.3) and jf["rl"].value == pytest.approx(0.375)
    assert jf["diff"].low <= 0.075 <= jf["diff"].high


def test_seed_table_lists_every_seed_and_the_mean(tmp_path):
    from projects.llava_sam2.rl_train.demo.video import seed_table

    for seed, gain in ((0, 0.1), (1, 0.3)):
        _fake_run(tmp_path / f"seed{seed}/eval/base", "base", [0.2, 0.4, 0.5])
        _fake_run(tmp_path / f"seed{seed}/eval/rl", "rl", [0.2 + gain, 0.4 + gain, 0.5 + gain])
    table = seed_table({seed: tmp_path / f"seed{seed}" for seed in (0, 1)}, n_resamples=200)
    lines = table.splitlines()
    assert any(line.startswith("| 0 |") and "+0.100" in line for line in lines)
    assert any(line.startswith("| 1 |") and "+0.300" in line for line in lines)
    assert any(line.startswith("| mean ± std |") and "+0.200 ± 0.141" in line for line in lines)


def test_image_demo_fingerprints_do_not_see_the_video_settings(tmp_path):
    """Image runs recorded before the video mode existed stay finished: the video fields change video fingerprints
    only."""
    paths = dict(start_checkpoint="S", listener_checkpoint="L", sft_config="C", rl_config="R")
    image = DemoSettings(tmp_path, **paths)
    # recorded with the code before the video mode
    assert [image.fingerprint(stage) for stage in ("data", "rl", "eval_rl", "report")] == [
        "d6223ddc3978", "82c5480cd370", "5d448fabe8ba", "3efdbe0953b4"]
    assert DemoSettings(tmp_path, num_frames=9, video_mllm_frames=4, **paths).fingerprint("report") == "3efdbe0953b4"
    video = DemoSettings(tmp_path, video=True)
    assert DemoSettings(tmp_path, video=True, num_frames=8).fingerprint("data") != video.fingerprint("data")
    assert DemoSettings(tmp_path, video=True, video_mllm_frames=2).fingerprint("rl") != video.fingerprint("rl")


def test_evaluate_refuses_video_tasks_on_image_data_and_image_tasks_on_clips_before_loading_a_model(tmp_path):
    from projects.llava_sam2.rl_train.cli.evaluate import main as evaluate_main

    missing = str(tmp_path / "no_checkpoint")  # never read: the check comes first
    with pytest.raises(SystemExit, match="video tasks do not run on --dataset shapes"):
        evaluate_main(["--checkpoint", missing, "--tasks", "video_res", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match="image tasks do not run on --dataset mevis"):
        evaluate_main(["--checkpoint", missing, "--dataset", "mevis", "--expression-file", "e", "--mask-file", "m",
                       "--image-root", "i", "--tasks", "res", "--out", str(tmp_path / "b")])


def test_demo_controls_video_writes_the_seed_report_and_refuses_controls(tmp_path, capsys):
    from projects.llava_sam2.rl_train.demo.controls import main as controls_main

    for seed in (3, 4):
        _fake_run(tmp_path / f"seed{seed}/eval/base", "base", [0.2, 0.4, 0.5])
        _fake_run(tmp_path / f"seed{seed}/eval/rl", "rl", [0.3, 0.4, 0.6])
    assert controls_main(["--video", "--work-dir", str(tmp_path), "--seeds", "3", "4", "--report-only"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| 3 | +0.067" in report and "| 4 | +0.067" in report and "| mean ± std | +0.067 ± 0.000" in report
    with pytest.raises(SystemExit):
        controls_main(["--video", "--work-dir", str(tmp_path), "--seeds", "3", "--controls", "sft_more"])
    assert "the video demo has no controls" in capsys.readouterr().err

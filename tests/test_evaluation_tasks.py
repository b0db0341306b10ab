"""evaluation/tasks.py, loading.py and cli/evaluate.py on the tiny random Sa2VA and shapes samples (the greedy
answers they run, model/pipeline/shared.py, are tested in test_model_pipeline.py)."""
import json
import os

import numpy as np
import pytest
import torch

from projects.llava_sam2.rl_train.data.shapes import ShapesWorld
from projects.llava_sam2.rl_train.evaluation import captions, tasks
from projects.llava_sam2.rl_train.evaluation.tasks import EvalConfig, answer_mask, evaluate
from projects.llava_sam2.rl_train.model.pipeline import shared as pipeline
from projects.llava_sam2.rl_train.model.pipeline.shared import Answer

CONFIG = dict(batch_size=3, max_new_tokens=4, n_resamples=100, show_progress=False)


def _tiny(seed=0):
    from projects.llava_sam2.rl_train.model.network.presets import build_preset
    from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel
    from projects.llava_sam2.rl_train.model.text.processor import Sa2VAProcessor
    from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    torch.manual_seed(seed)
    model = Sa2VAModel(build_preset("tiny", vocab_size=len(tok))).eval()
    model.bind_tokenizer(tok)
    return model, Sa2VAProcessor.from_config(tok, model.config, empty_region="dilate_to_one_cell")


@pytest.fixture(scope="module")
def tiny():
    return _tiny(0)


@pytest.fixture(scope="module")
def world():
    return ShapesWorld("val", 5, seed=1, image_size=64)


def test_answer_mask_is_the_union_of_the_kept_seg_masks():
    """multi_seg picks which [SEG] masks an answer keeps ('first' -> the first, 'union' -> all); the answer's mask is
    their union, None without one."""
    a, b = torch.zeros(4, 5, dtype=torch.bool), torch.zeros(4, 5, dtype=torch.bool)
    a[0, :2], b[3, 1:] = True, True
    assert np.array_equal(answer_mask(Answer("t", "t", 3, False, 2, [a, b])), (a | b).numpy())
    assert np.array_equal(answer_mask(Answer("t", "t", 3, False, 2, [a])), a.numpy())
    assert answer_mask(Answer("t", "t", 3, False, 0, [])) is None
    assert tasks.MULTI_SEG_RULES == {"first": "first", "union": "all"}


def _fake_answers(samples, seen):
    """greedy_answers stand-in (the pipeline's partner tasks call it): region prompts get 'a small red circle'; RES
    prompts of even samples get the GT mask, odd samples answer without [SEG]."""
    def fake(model, processor, features, rows, *, max_new_tokens, seg_masks=None, **kwargs):
        out = []
        for row in rows:
            seen.append((id(model), row.image, row.region_cells is not None, row.text[-60:]))
            if row.region_cells is not None:
                out.append(Answer("a small red circle<|im_end|>", "a small red circle", 5, False, 0))
            elif row.image % 2 == 0:
                gt_mask = torch.from_numpy(samples[row.image].gt_mask.copy())
                out.append(Answer("It is [SEG].<|im_end|>", "It is .", 5, False, 1, [gt_mask] if seg_masks else []))
            else:
                out.append(Answer("no idea<|im_end|>", "no idea", 3, False, 0))
        return out
    return fake


def test_evaluate_task_logic_with_scripted_answers(tiny, world, monkeypatch):
    model, proc = tiny
    samples = [world[i] for i in range(4)]
    seen = []
    monkeypatch.setattr(pipeline, "greedy_answers", _fake_answers(samples, seen))
    monkeypatch.setattr(captions, "meteor_nltk", lambda pred, refs: float(pred.split()[-1] in refs[0].split()))
    encoded = []
    real_encode = tasks.encode_images
    monkeypatch.setattr(tasks, "encode_images", lambda m, p, images, names: encoded.append((id(m), len(images)))
                        or real_encode(m, p, images, names))
    results = evaluate(model, proc, samples, config=EvalConfig(**{**CONFIG, "batch_size": 4}))
    assert encoded == [(id(model), 4)]  # one encoder pass for all four tasks
    res = results["res"]
    assert [r.score for r in res.records] == [1.0, 0.0, 1.0, 0.0]
    gt_area = [int(s.gt_mask.sum()) for s in samples]
    assert res.metrics["cIoU"].value == pytest.approx((gt_area[0] + gt_area[2]) / sum(gt_area))
    assert res.metrics["no_seg_rate"].value == 0.5 and res.records[0].mask.rle is not None
    assert res.records[0].text_in == samples[0].expressions[0]
    cap = results["caption"]
    assert {r.caption for r in cap.records} == {"a small red circle"}  # Sa2VA cleaning drops <|im_end|>
    assert all(r.region_tokens >= 1 and r.references == s.captions for r, s in zip(cap.records, samples))
    # loop 1: B segments A's plain caption; odd samples give no mask
    b_texts = [text for _, _, is_region, text in seen if not is_region and "red circle" in text]
    assert len(b_texts) == 4 and results["cycle_iou"].metrics["cycle_IoU"].value == 0.5
    # loop 2: B describes only the masks A produced (even samples); the others get an empty caption
    cyc = results["cycle_caption"].records
    assert [r.caption for r in cyc] == ["a small red circle", "", "a small red circle", ""]
    assert [r.answer_b is None for r in cyc] == [False, True, False, True]
    assert results["cycle_caption"].metrics["empty_caption_rate"].value == 0.5
    assert cyc[1].score == 0.0 and cyc[0].text_in == samples[0].captions[0]


def test_partner_model_and_meteor15_plumbing(tiny, world, monkeypatch):
    model, proc = tiny
    partner, _ = _tiny(1)
    samples = [world[i] for i in range(2)]
    seen = []
    monkeypatch.setattr(pipeline, "greedy_answers", _fake_answers(samples, seen))
    monkeypatch.setattr(captions, "meteor_nltk", lambda pred, refs: 0.5)
    monkeypatch.setattr(tasks, "meteor15_scores", lambda caps, refs: (0.25, [0.2] * len(caps)))
    results = evaluate(model, proc, samples, ("cycle_iou", "caption"), EvalConfig(**{**CONFIG, "use_meteor15": True}),
                       model_b=partner)
    stages = {(m, is_region) for m, _, is_region, _ in seen}
    assert stages == {(id(model), True), (id(partner), False)}  # A captions, B segments
    assert results["caption"].meteor15_corpus == 0.25 and results["caption"].metrics["METEOR15_mean"].value == 0.2
    assert "METEOR15_mean" not in results["cycle_iou"].metrics
    with pytest.raises(ValueError, match="tasks=\\['nope'\\]"):
        evaluate(model, proc, samples, ("nope",))
    with pytest.raises(ValueError, match="EvalConfig.multi_seg='all'"):
        EvalConfig(multi_seg="all")


@pytest.mark.skipif(not os.environ.get("NLTK_DATA"), reason="NLTK_DATA unset: run through `make test` (WordNet)")
def test_evaluate_end_to_end_on_shapes(tiny, world):
    """The real chain on 5 samples in batches of 3 (a partial last batch): records in order, metrics consistent."""
    model, proc = tiny
    results = evaluate(model, proc, world, config=EvalConfig(**CONFIG))
    for task, result in results.items():
        assert [r.sample_id for r in result.records] == [world[i].sample_id for i in range(5)], task
        assert all(0.0 <= r.score <= 1.0 and r.num_tokens <= 8 for r in result.records)
        json.loads(result.records[0].to_json())
    res = results["res"].records
    total = sum(r.mask.intersection for r in res) / (sum(r.mask.union for r in res) + 1e-10)
    assert results["res"].metrics["cIoU"].value == pytest.approx(total)
    assert all(r.mask.gt_area == int(world[i].gt_mask.sum()) for i, r in enumerate(res))
    assert all(r.answer_a and r.caption is not None for r in results["caption"].records)


def test_load_weights_layouts_and_errors(tiny, tmp_path):
    from safetensors.torch import save_file

    from projects.llava_sam2.rl_train.evaluation.loading import load_weights
    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import checkpoint_state_dict

    source, _ = tiny
    target, _ = _tiny(1)
    save_file({k: v.contiguous() for k, v in checkpoint_state_dict(source).items()}, str(tmp_path / "full.safetensors"))
    assert load_weights(target, str(tmp_path / "full.safetensors")) == len(source.state_dict())
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name
    partial, _ = _tiny(2)
    torch.save({"state_dict": {"sa2va.mlp1.1.weight": source.mlp1[1].weight.detach().clone()}}, tmp_path / "p.pth")
    assert load_weights(partial, str(tmp_path / "p.pth")) == 1
    assert torch.equal(partial.mlp1[1].weight, source.mlp1[1].weight)
    assert not torch.equal(partial.mlp1[3].weight, source.mlp1[3].weight)
    torch.save({"language_model.base_model.model.x.lora_A.weight": torch.zeros(1)}, tmp_path / "lora.pt")
    with pytest.raises(ValueError, match="LoRA tensors"):
        load_weights(partial, str(tmp_path / "lora.pt"))
    torch.save({"nope.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="match neither the checkpoint nor the module layout"):
        load_weights(partial, str(tmp_path / "bad.pt"))


def test_evaluate_tool_writes_a_loadable_run(tmp_path, capsys):
    import projects.llava_sam2.rl_train.cli.evaluate as evaluate_tool

    from projects.llava_sam2.rl_train.evaluation.results import load_run

    out = tmp_path / "run"
    evaluate_tool.main(["--preset", "tiny", "--num-samples", "2", "--image-size", "64", "--tasks", "res",
                        "--max-new-tokens", "3", "--n-resamples", "50", "--out", str(out), "--no-progress",
                        "--device", "cpu"])
    assert "res (n=2): cIoU" in capsys.readouterr().out
    run = load_run(str(out))
    assert run.meta["system"] == "run" and run.meta["dataset"]["kind"] == "shapes"
    assert run.meta["model"]["source"] == "preset tiny (init seed 0)"
    assert [r.sample_id for r in run.records("res")] == ["shapes_val/0#0", "shapes_val/1#1"]

"""From an upstream XTuner SFT run to RL and back (issue #16), on a tiny upstream-style run built by
``model.checkpoints.tiny_upstream_run`` (peft names, a real DeepSpeed ZeRO-2 directory written by DeepSpeed, 2 ranks).

1. load: ``.pth`` and DeepSpeed dir, LoRA kept or merged, vocabulary resized, errors that name keys;
2. convert: ``to-hf`` equals upstream's rename rule applied to the emulated upstream model; ``to-xtuner`` back;
3. config reuse: the SFT config (upstream schema) read without importing upstream classes; the RL config built on it;
5. end to end: load -> RL 2 steps -> export both ways -> load back, outputs equal.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from engine_toy import run_config
from projects.llava_sam2.rl_train.cli import convert
from projects.llava_sam2.rl_train.engine.checkpointing import unwrap_model
from projects.llava_sam2.rl_train.engine.upstream_sft import load_sft_config
from projects.llava_sam2.rl_train.model.checkpoints.deepspeed_zero import read_zero_checkpoint
from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import load_pretrained
from projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run import (BASE_DIR, SAM2_PT, SFT_DS_DIR, SFT_PTH,
                                                                   make_tiny_sft_run)
from projects.llava_sam2.rl_train.model.checkpoints.upstream_base import read_xtuner_checkpoint
from projects.llava_sam2.rl_train.model.checkpoints.xtuner_checkpoint import load_upstream_sft
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel

REPO = Path(__file__).resolve().parents[1]
SFT_CONFIG = REPO / "projects/llava_sam2/configs/rl/upstream_sft/sa2va_tiny_sft.py"
RL_CONFIG = REPO / "projects/llava_sam2/configs/rl/tiny_grpo_from_upstream_sft_cpu.py"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
# IoU for both loops keeps the RL steps fast and offline (no judge, no METEOR)
FAST_REWARDS = {"train_cfg.algorithm.rewards": dict(mask_to_caption=[dict(type="iou")],
                                                    caption_to_mask=[dict(type="iou")])}


@pytest.fixture(scope="module")
def torch_extensions(tmp_path_factory):
    """Where a JIT-built torch extension of the fixture's writer would land (TORCH_EXTENSIONS_DIR)."""
    return tmp_path_factory.mktemp("torch_extensions")


@pytest.fixture(scope="module")
def run(tmp_path_factory, torch_extensions):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(torch_extensions))
        return make_tiny_sft_run(tmp_path_factory.mktemp("sa2va_checkout"), seed=0, deepspeed=HAS_DEEPSPEED,
                                 world_size=2)


@pytest.fixture()
def source(run, monkeypatch):
    """The SFT config's model description, paths resolved from the checkout root (as upstream's ./pretrained)."""
    monkeypatch.chdir(run.root)
    src, _ = load_sft_config(SFT_CONFIG)
    return replace(src, pretrained_pth=SFT_PTH)


@torch.no_grad()
def outputs(model: Sa2VAModel) -> list[torch.Tensor]:
    """LLM logits, [SEG]-prompted SAM2 mask logits and projected ViT tokens on fixed random inputs."""
    generator = torch.Generator().manual_seed(1)
    was_training = model.training
    model.eval()
    ids = torch.randint(0, 1000, (1, 12), generator=generator)
    out = model.language_model(input_ids=ids, output_hidden_states=True)
    prompt = model.seg_hidden_to_prompt(out.hidden_states[-1][0, -3:])
    features = model.encode_grounding(torch.rand(1, 3, 256, 256, generator=generator) * 255)
    masks = model.decode_masks(prompt, features, torch.zeros(3, dtype=torch.long)).low_res_logits
    vit = model.project_vision(model.encode_vision(torch.randn(1, 3, 224, 224, generator=generator)))
    model.train(was_training)
    return [out.logits, masks, vit]


def assert_outputs_close(a: Sa2VAModel, b: Sa2VAModel, atol: float = 0.0) -> None:
    for name, x, y in zip(("logits", "mask logits", "vision tokens"), outputs(a), outputs(b)):
        assert torch.allclose(x, y, atol=atol, rtol=0), f"{name} differ by {(x - y).abs().max():.3g}"


# ---------------------------------------------------------------------------------------------- 1. load
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="writing the DeepSpeed fixture needs deepspeed")
def test_deepspeed_dir_reads_as_deepspeed_and_xtuner_read_it(run):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from xtuner.model.utils import guess_load_checkpoint

    directory = run.path(SFT_DS_DIR)
    ours = read_zero_checkpoint(directory)
    theirs = get_fp32_state_dict_from_zero_checkpoint(str(directory.parent), directory.name)
    assert ours.keys() == theirs.keys() == guess_load_checkpoint(str(directory)).keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    trained = read_xtuner_checkpoint(run.path(SFT_PTH))  # the .pth holds upstream's trained subset
    assert set(trained) < set(ours)
    assert all(torch.equal(trained[k], ours[k]) for k in trained)


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="writing the DeepSpeed fixture needs deepspeed")
def test_deepspeed_writer_compiles_no_op(run, torch_extensions):
    """The ZeRO-2 writer starts its CPU process group without DeepSpeed's shared-memory all-reduce op, whose first
    JIT build (ninja, C++) made this fixture the slowest of CI (37 s idle, 130-220 s beside the other test worker)."""
    built = sorted(str(p.relative_to(torch_extensions)) for p in torch_extensions.rglob("*") if p.is_dir())
    assert not built, f"the DeepSpeed fixture writer JIT-built torch extensions: {built}"


@pytest.mark.parametrize("checkpoint", ["pth", "deepspeed"])
@pytest.mark.parametrize("lora_mode", ["keep", "merge"])
def test_load_reproduces_the_sft_model(run, source, checkpoint, lora_mode):
    if checkpoint == "deepspeed":
        if not HAS_DEEPSPEED:
            pytest.skip("writing the DeepSpeed fixture needs deepspeed")
        source = replace(source, pretrained_pth=SFT_DS_DIR, sam2_checkpoint=None)  # the dir holds every tensor
    model, tokenizer, report = load_upstream_sft(source, lora_mode=lora_mode)
    assert report.vocab == (len(run.tokenizer) - 5, len(run.tokenizer))  # the 5 Sa2VA tokens were added
    assert tokenizer.get_vocab() == run.tokenizer.get_vocab()
    assert report.lora_layers == 14 and report.lora_mode == lora_mode
    assert isinstance(model.language_model, PeftModel) == (lora_mode == "keep")
    if checkpoint == "pth":
        assert set(report.counts) == {"checkpoint", "sam2", "base"}
    assert_outputs_close(model, run.model, atol=0.0 if lora_mode == "keep" else 2e-6)


def test_unmapped_and_mismatched_keys_are_named(run, source, tmp_path):
    state = read_xtuner_checkpoint(run.path(SFT_PTH))
    state["text_exist_fcs.0.weight"] = torch.zeros(2, 2)
    state["mllm.model.vision_model.base_model.model.encoder.layers.0.attn.qkv.lora_A.default.weight"] = torch.zeros(1)
    torch.save({"state_dict": state}, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match=r"2 keys do not map(.|\n)*text_exist_fcs\.0\.weight(.|\n)*vision_model"):
        load_upstream_sft(replace(source, pretrained_pth=str(tmp_path / "bad.pth")))
    with pytest.raises(ValueError, match=r"shape mismatch(.|\n)*embed_tokens(.|\n)*special_tokens"):
        load_upstream_sft(replace(source, special_tokens=source.special_tokens + ("<extra>",)))
    with pytest.raises(ValueError, match="LoRA rank"):
        load_upstream_sft(replace(source, lora=replace(source.lora, r=4)))
    with pytest.raises(FileNotFoundError, match="sam2"):
        load_upstream_sft(replace(source, sam2_checkpoint="pretrained/missing_sam2.pt"))
    with pytest.raises(ValueError, match="text_hidden_fcs comes only from the SFT checkpoint"):
        load_upstream_sft(replace(source, pretrained_pth=None))


# ---------------------------------------------------------------------------------------------- 2. convert
def test_to_hf_writes_what_upstream_convert_to_hf_writes(run, source, tmp_path):
    remote = run.root / "projects/llava_sam2/hf/models"  # a checkout's remote code, copied like upstream does
    remote.mkdir(parents=True, exist_ok=True)
    (remote / "modeling_sa2va_chat.py").write_text("# upstream remote code\n")
    out = tmp_path / "hf"
    assert convert.main(["to-hf", str(SFT_CONFIG), SFT_PTH, "--save-path", str(out)]) == 0
    # upstream: merge LoRA, take the whole state dict, rename 'mllm.model.' -> '' and '.gamma' -> '.g_weight'
    merged_llm = copy.deepcopy(run.model.language_model).merge_and_unload()
    expected = {}
    for prefix, module in (("mllm.model.vision_model.", run.model.vision_model),
                           ("mllm.model.language_model.", merged_llm), ("mllm.model.mlp1.", run.model.mlp1),
                           ("grounding_encoder.sam2_model.", run.model.grounding_encoder.sam2_model),
                           ("text_hidden_fcs.", run.model.text_hidden_fcs)):
        for key, value in module.state_dict().items():
            expected[(prefix + key).replace("mllm.model.", "").replace(".gamma", ".g_weight")] = value
    written = load_file(out / "model.safetensors")
    assert written.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.allclose(written[key], value, atol=2e-6, rtol=0), key
    config = json.loads((out / "config.json").read_text())
    base = json.loads((run.root / BASE_DIR / "config.json").read_text())
    assert config["template"] == "qwen_chat" and config["llm_config"]["vocab_size"] == len(run.tokenizer)
    assert config["model_type"] == "sa2va_chat" and config["architectures"] == ["Sa2VAChatModel"]
    assert config["auto_map"]["AutoModel"] == "modeling_sa2va_chat.Sa2VAChatModel"
    assert config["vision_config"] == base["vision_config"] and config["system_message"] is None
    assert {k: v for k, v in config["llm_config"].items() if k != "vocab_size"} == \
        {k: v for k, v in base["llm_config"].items() if k != "vocab_size"}
    assert (out / "modeling_sa2va_chat.py").is_file()
    hf = load_pretrained(out)
    assert_outputs_close(hf, run.model, atol=2e-6)


# ---------------------------------------------------------------------------------------------- 3. config reuse
def test_sft_config_is_read_without_upstream_classes(run, source):
    assert "projects.llava_sam2.models" not in sys.modules  # the lazy type=... objects were never built
    assert (source.base_path, source.template, source.sam2_checkpoint) == (
        "./pretrained/InternVL2_5-tiny", "qwen_chat", SAM2_PT)
    assert (source.lora.r, source.lora.lora_alpha, source.lora.lora_dropout, source.lora.target_modules) == \
        (8, 16.0, 0.05, None)
    assert source.special_tokens == ("[SEG]", "<p>", "</p>", "<vp>", "</vp>")
    _, flags = load_sft_config(SFT_CONFIG)
    assert flags.train_mask_decoder and flags.has_llm_lora
    with pytest.raises(ValueError, match="vision encoder was trained"):
        load_sft_config(SFT_CONFIG, {"model.mllm.freeze_visual_encoder": False})
    with pytest.raises(ValueError, match="full LLM fine-tuning"):
        load_sft_config(SFT_CONFIG, {"model.mllm.llm_lora": None, "model.mllm.freeze_llm": False})
    _, frozen = load_sft_config(SFT_CONFIG, {"model.frozen_sam2_decoder": True})
    assert not frozen.train_mask_decoder


# ---------------------------------------------------------------------------------------------- 5. end to end
@pytest.mark.parametrize("lora_mode", ["keep", "merge"])
def test_rl_from_upstream_sft_then_export_both_ways(run, source, lora_mode, tmp_path):
    """load -> 2 GRPO steps -> HF export and XTuner .pth -> load back: same outputs as the RL model."""
    options = {**FAST_REWARDS, "model.upstream_sft.lora_mode": lora_mode}
    runner, record = run_config(RL_CONFIG, tmp_path / "rl", **options)
    trained = unwrap_model(runner.model)
    assert trained.is_lora_from_sft == (lora_mode == "keep")
    assert len(record.outputs) == 2 and all(torch.isfinite(torch.tensor(o["loss"])) for o in record.outputs.values())
    names = runner.train_loop.algorithm.weights.reference_names
    assert any("lora_" in n for n in names) == (lora_mode == "keep")  # SFT adapter: reference = its snapshot
    if lora_mode == "keep":  # RL moved the SFT adapter
        sft = run.model.language_model.state_dict()
        moved = [n for n, p in trained.sa2va.language_model.named_parameters() if "lora_B" in n
                 and not torch.equal(p.detach(), sft[n])]
        assert moved, "no LoRA tensor changed in 2 RL steps"
    rl = trained.sa2va
    trained.export_pretrained(tmp_path / "hf")
    assert_outputs_close(load_pretrained(tmp_path / "hf"), rl, atol=2e-6)
    pth = tmp_path / "xtuner" / "iter_2.pth"
    args = ["to-xtuner", "--config", str(RL_CONFIG), "--checkpoint", str(tmp_path / "rl" / "iter_2.pth"),
            "--save-path", str(pth), "--cfg-options", f"model.upstream_sft.lora_mode={lora_mode}"]
    assert convert.main(args) == 0
    state = read_xtuner_checkpoint(pth)
    if lora_mode == "keep":  # compact: the key set of an XTuner SFT .pth
        assert state.keys() == read_xtuner_checkpoint(run.path(SFT_PTH)).keys()
    else:
        assert any(k.endswith("q_proj.base_layer.weight") for k in state) and not any("lora_" in k for k in state)
    back, _, _ = load_upstream_sft(replace(source, pretrained_pth=str(pth)), lora_mode=lora_mode)
    assert_outputs_close(back, rl, atol=0.0 if lora_mode == "keep" else 2e-6)

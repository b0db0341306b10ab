"""Upstream codebase-v2 SFT runs of the Qwen-VL family (``arch_type='qwen'``, ``Qwen2_5_VL`` / ``Qwen3VL`` mllm) as
RL's start, on a tiny Qwen3-VL-shaped run (tests/qwen_sft_fixtures.py: upstream's peft wrap of the whole Qwen-VL
model, its ``.pth`` from xtuner's own filter, a real DeepSpeed ZeRO-2 directory):

1. the key layout pinned from upstream's own wrapper classes (tests/data/upstream_v2_sft_keys.json ``qwen_vl``,
   research/upstream_v2_qwen_keys.py) maps onto our names;
2. load: ``.pth`` and DeepSpeed dir, LoRA kept or merged, to the SFT model's tensors and logits;
3. errors naming file and key; a config that mixes the families;
4. the v2 Qwen-VL SFT config mapped to RL's model (trainable set, LoRA, template); one loop-2 GRPO step of the tiny
   RL config built on it.

Needs transformers >= 4.57 (Qwen3-VL)."""
from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", minversion="4.57")

from peft import PeftModel  # noqa: E402

from projects.llava_sam2.rl_train.engine.upstream_sft import load_sft_config  # noqa: E402
from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import checkpoint_state_dict  # noqa: E402
from projects.llava_sam2.rl_train.model.checkpoints.qwen_vl_sft import (load_upstream_qwen_sft,  # noqa: E402
                                                                        parse_qwen_upstream_state)
from projects.llava_sam2.rl_train.model.checkpoints.upstream_base import read_xtuner_checkpoint  # noqa: E402
from projects.llava_sam2.rl_train.model.network.qwen_vl import Sa2VAQwenModel  # noqa: E402
from qwen_sft_fixtures import (QWEN_SAM2_PT, QWEN_SFT_DS_DIR, QWEN_SFT_PTH,  # noqa: E402
                               make_tiny_qwen_sft_run)

REPO = Path(__file__).resolve().parents[1]
SFT_CONFIG = REPO / "projects/llava_sam2/configs/rl/upstream_sft/sa2va_qwen3vl_tiny_sft.py"
RL_CONFIG = REPO / "projects/llava_sam2/configs/rl/tiny_grpo_from_upstream_v2_qwen_sft_cpu.py"
PINNED = json.loads((REPO / "tests/data/upstream_v2_sft_keys.json").read_text())["qwen_vl"]
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
MLLM = "mllm.model.base_model.model."


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path_factory.mktemp("torch_extensions")))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return make_tiny_qwen_sft_run(tmp_path_factory.mktemp("sa2va_v2_qwen_checkout"), deepspeed=HAS_DEEPSPEED)
        finally:
            torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def expected(run):
    """The emulated SFT model in HF names as upstream's converter gets them: peft merge_and_unload of the whole
    Qwen-VL model (keeping the modules_to_save copies), then the module names."""
    reference = copy.deepcopy(run.model)
    reference.model = reference.model.merge_and_unload()
    return checkpoint_state_dict(reference)


@pytest.fixture()
def source(run, monkeypatch):
    monkeypatch.chdir(run.root)
    src, _ = load_sft_config(SFT_CONFIG)
    return replace(src, pretrained_pth=QWEN_SFT_PTH)


@torch.no_grad()
def logits(model: Sa2VAQwenModel, seed: int = 1) -> torch.Tensor:
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(seed))
    was_training = model.training
    out = model.eval().llm_forward(ids, torch.ones_like(ids)).logits
    model.train(was_training)
    return out


# ---------------------------------------------------------------------------------------------- 1. key layout
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_pinned_qwen_layout_maps_to_the_names_upstreams_converter_gives(family):
    """Every pinned upstream key (upstream's wrapper, its LoRA preparation and state_dict filter) lands where
    upstream's merge + rename puts it; the frozen original copies of the modules_to_save are dropped."""
    pth, ds_only = PINNED[family]["pth"], PINNED[family]["deepspeed_only"]
    parsed = parse_qwen_upstream_state({k: torch.zeros(1) for k in {**pth, **ds_only}}, "pinned")
    assert parsed.saved_modules == {"model.language_model.embed_tokens", "lm_head"} and parsed.is_llm_wrapped
    for key, hf in {**pth, **ds_only}.items():
        if hf is None:
            assert ".original_module." in key
        elif ".lora_" in key:
            layer = hf.removesuffix(".weight")
            assert layer in (parsed.lora_A if ".lora_A." in key else parsed.lora_B), key
        else:
            assert hf in parsed.weights, key
    assert parsed.dropped_base_copies == 2
    assert set(parsed.weights) == {hf for k, hf in {**pth, **ds_only}.items() if hf is not None and ".lora_" not in k}
    assert PINNED["lora"]["modules_to_save"] == ["lm_head", "embed_tokens"] and PINNED["lora"]["target_modules"] is None


def test_tiny_run_writes_upstreams_pth_key_set(run):
    """The fixture's .pth holds, for the tensors pinned (text layer 0, non-layer tensors, text_hidden_fcs), exactly
    the keys of upstream's Qwen3-VL .pth; nothing of the vision tower."""
    written = set(read_xtuner_checkpoint(run.path(QWEN_SFT_PTH)))
    pinned = set(PINNED["qwen3_vl"]["pth"])
    assert pinned <= written
    same_kind = {k for k in written if k.startswith((MLLM, "text_hidden_fcs.")) and ".layers.1." not in k}
    assert same_kind == {k for k in pinned if not k.startswith("grounding_encoder.")}
    assert not any(".visual." in k for k in written)


# ---------------------------------------------------------------------------------------------- 2. load
@pytest.mark.parametrize("checkpoint", ["pth", "deepspeed"])
@pytest.mark.parametrize("lora_mode", ["keep", "merge"])
def test_qwen_checkpoint_loads_to_the_sft_models_tensors(run, source, expected, checkpoint, lora_mode):
    if checkpoint == "deepspeed":
        if not HAS_DEEPSPEED:
            pytest.skip("writing the DeepSpeed fixture needs deepspeed")
        source = replace(source, pretrained_pth=QWEN_SFT_DS_DIR, sam2_checkpoint=None)  # the dir holds SAM2 too
    model, tokenizer, report = load_upstream_qwen_sft(source, lora_mode=lora_mode)
    assert isinstance(model, Sa2VAQwenModel) and report.lora_layers == 14 and report.lora_mode == lora_mode
    assert report.vocab == (len(run.tokenizer) - 5, len(run.tokenizer))  # Sa2VA's 5 tokens grow the vocabulary
    assert isinstance(model.model, PeftModel) == (lora_mode == "keep")
    assert tokenizer.get_vocab() == run.tokenizer.get_vocab()
    loaded = checkpoint_state_dict(model)
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():  # merged LoRA layers may differ by fp32 rounding of W + s·BA only
        assert torch.allclose(loaded[key], value, atol=2e-6, rtol=0), key
    hf = run.model.model.base_model.model
    for name, ours in (("model.language_model.embed_tokens", "model.model.language_model.embed_tokens.weight"),
                       ("lm_head", "model.lm_head.weight")):  # the trained modules_to_save copy, not the original
        trained = hf.get_submodule(name).modules_to_save["default"].weight
        assert torch.equal(loaded[ours], trained)
        assert not torch.equal(trained, hf.get_submodule(name).original_module.weight)
    # the reference runs eager attention, the loaded model sdpa
    assert torch.allclose(logits(model), logits(run.model), atol=2e-5, rtol=0)


def test_a_qwen2_5_vl_run_and_its_start_weights_load(tmp_path, monkeypatch):
    """Qwen2.5-VL (``Qwen2_5_VL`` mllm): the .pth loads to the SFT model's tensors; the config's own
    ``model.pretrained_pth`` (the start weights, upstream's names without peft's prefix, loaded before the LoRA wrap)
    fills what the SFT .pth lacks, its adapter tensors ignored as upstream ignores them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = make_tiny_qwen_sft_run(tmp_path, family="qwen2_5_vl")
    finally:
        torch.set_num_threads(threads)
    monkeypatch.chdir(tmp_path)
    reference = copy.deepcopy(run.model)
    reference.model = reference.model.merge_and_unload()
    expected = checkpoint_state_dict(reference)
    src, _ = load_sft_config(SFT_CONFIG, {"model.mllm.type": "Qwen2_5_VL"})
    model, _, report = load_upstream_qwen_sft(replace(src, pretrained_pth=QWEN_SFT_PTH), lora_mode="keep")
    assert model.config.family == "qwen2_5_vl" and report.lora_layers == 14
    loaded = checkpoint_state_dict(model)
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], v) for k, v in expected.items())
    norm = "model.model.language_model.norm.weight"  # not in the SFT .pth: from the start weights when given
    start = {"mllm.model." + norm[len("model."):]: expected[norm] + 1.0,
             "mllm.model.model.language_model.layers.0.mlp.up_proj.lora_A.default.weight": torch.ones(8, 64)}
    torch.save(start, tmp_path / "Sa2VA-Qwen-tiny.pth")
    src, _ = load_sft_config(SFT_CONFIG, {"model.pretrained_pth": str(tmp_path / "Sa2VA-Qwen-tiny.pth")})
    model, _, report = load_upstream_qwen_sft(replace(src, pretrained_pth=QWEN_SFT_PTH), lora_mode="keep")
    assert report.ignored_init_adapter == 1 and report.counts["init"] == 1
    assert torch.equal(checkpoint_state_dict(model)[norm], expected[norm] + 1.0)


# ---------------------------------------------------------------------------------------------- 3. errors
def test_mismatched_checkpoints_name_file_and_key(run, source, tmp_path):
    state = read_xtuner_checkpoint(run.path(QWEN_SFT_PTH))
    internvl = dict(state, **{"mllm.model.mlp1.0.weight": torch.zeros(2)})  # an InternVL-family tensor
    torch.save({"state_dict": internvl}, tmp_path / "internvl.pth")
    with pytest.raises(ValueError, match=r"internvl\.pth: 1 keys do not map onto Sa2VA-Qwen(.|\n)*"
                                         r"mllm\.model\.mlp1\.0\.weight(.|\n)*InternVL-family"):
        load_upstream_qwen_sft(replace(source, pretrained_pth=str(tmp_path / "internvl.pth")))
    vision_lora = dict(state, **{f"{MLLM}model.visual.blocks.0.attn.qkv.lora_A.default.weight": torch.zeros(8, 32)})
    torch.save({"state_dict": vision_lora}, tmp_path / "vision_lora.pth")
    with pytest.raises(ValueError, match=r"vision_lora\.pth: 1 keys(.|\n)*visual\.blocks\.0\.attn\.qkv\.lora_A"):
        load_upstream_qwen_sft(replace(source, pretrained_pth=str(tmp_path / "vision_lora.pth")))
    head = f"{MLLM}lm_head.modules_to_save.default.weight"
    wide = dict(state, **{head: torch.zeros(state[head].shape[0] + 3, state[head].shape[1])})
    torch.save({"state_dict": wide}, tmp_path / "wide.pth")
    with pytest.raises(ValueError, match=r"wide\.pth: tensors that do not fit(.|\n)*model\.lm_head\.weight"):
        load_upstream_qwen_sft(replace(source, pretrained_pth=str(tmp_path / "wide.pth")))
    with pytest.raises(ValueError, match=r"LoRA rank\(s\) \[8\] in the checkpoint, but llm_lora r=4"):
        load_upstream_qwen_sft(replace(source, lora=replace(source.lora, r=4)))


def test_a_config_that_mixes_the_families_is_refused(run, source):
    with pytest.raises(ValueError, match=r"arch_type='qwen' but model.mllm type 'InternVLMLLM'"):
        load_sft_config(SFT_CONFIG, {"model.mllm.type": "InternVLMLLM"})
    with pytest.raises(ValueError, match=r"arch_type='intern_vl' but model.mllm type 'Qwen3VL'"):
        load_sft_config(SFT_CONFIG, {"model.arch_type": "intern_vl"})
    with pytest.raises(ValueError, match=r"arch_type='llava'"):
        load_sft_config(SFT_CONFIG, {"model.arch_type": "llava"})
    with pytest.raises(ValueError, match=r"vision encoder was trained"):
        load_sft_config(SFT_CONFIG, {"model.mllm.freeze_visual_encoder": False})
    from projects.llava_sam2.rl_train.cli import convert

    with pytest.raises(ValueError, match=r"convert to-hf: the SFT run is of the qwen_vl family"):
        convert.main(["to-hf", str(SFT_CONFIG), QWEN_SFT_PTH, "--save-path", str(run.root / "hf")])


# ---------------------------------------------------------------------------------------------- 4. config, RL
def test_qwen_config_maps_to_rls_model(run, source):
    assert (source.family, source.codebase, source.template) == ("qwen_vl", "v2", "qwen_chat")
    assert source.base_path == "./pretrained/Qwen3-VL-tiny" and source.sam2_checkpoint == QWEN_SAM2_PT
    assert (source.lora.r, source.lora.lora_alpha, source.lora.lora_dropout, source.lora.target_modules,
            source.lora.modules_to_save) == (8, 16.0, 0.05, None, ("lm_head", "embed_tokens"))
    assert source.special_tokens == ("[SEG]", "<p>", "</p>", "<vp>", "</vp>") and source.init_checkpoint is None
    _, flags = load_sft_config(SFT_CONFIG)
    assert flags.train_mask_decoder and flags.has_llm_lora and flags.sft_trained_embeddings


def test_one_dual_loop_grpo_step_of_the_rl_config_on_the_qwen_sft_run(run, source, tmp_path):
    """The RL config built on the v2 Qwen-VL SFT config: the SFT adapter continued (RL's trainable set: LoRA,
    text_hidden_fcs, mask decoder; not the vision tower or embeddings), one step of both loops (loop 1 on the drawn
    region) that moves the adapter."""
    from mmengine.model import is_model_wrapper

    from engine_toy import run_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner, record = run_config(RL_CONFIG, tmp_path / "rl", **{"train_cfg.max_iters": 1, "param_scheduler": []})
    finally:
        torch.set_num_threads(threads)
    trained = runner.model.module if is_model_wrapper(runner.model) else runner.model
    assert isinstance(trained.sa2va, Sa2VAQwenModel) and trained.is_lora_from_sft
    assert trained.processor.template_name == "qwen_chat"
    names = {n for n, p in trained.sa2va.named_parameters() if p.requires_grad}
    kinds = {"lora" if "lora_" in n else "mask_decoder" if ".sam_mask_decoder." in n else n.split(".")[0]
             for n in names}
    assert kinds == {"lora", "mask_decoder", "text_hidden_fcs"}
    out = record.outputs[1]
    assert torch.isfinite(torch.tensor(out["loss"])) and out["caption_to_mask/reward_std"] > 0
    assert "mask_to_caption/reward_mean" in out  # loop 1 ran on this family too
    sft = run.model.model.state_dict()
    moved = [n for n, p in trained.sa2va.model.named_parameters() if "lora_B" in n
             and not torch.equal(p.detach(), sft[n])]
    assert moved, "no LoRA tensor changed in one RL step"

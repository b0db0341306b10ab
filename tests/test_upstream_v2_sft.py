"""Upstream codebase-v2 SFT runs (``projects/sa2va``: ``Sa2VAModel`` + ``InternVLMLLM``) as RL's start, on a tiny
v2-style run from ``model.checkpoints.tiny_upstream_run`` (``codebase='v2'``: peft LoRA with v2's
``modules_to_save=["embed_tokens", "lm_head"]``, a real DeepSpeed ZeRO-2 directory written by DeepSpeed).

1. the key layout pinned from upstream's own modules (tests/data/upstream_v2_sft_keys.json, written by
   research/upstream_v2_keys.py);
2. load: ``.pth`` and DeepSpeed dir, LoRA kept or merged, to the SFT model's tensors; a v1 run still loads;
3. errors that name the file and the key; the SFT start weights (v2's ``model.pretrained_pth``) as a layer;
4. the v2 SFT config read without upstream classes, mapped onto RL's model built from the RL config (its GRPO loop
   is the v1 path's, run end to end in test_upstream_sft.py).
"""
from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from projects.llava_sam2.rl_train.engine.upstream_sft import load_sft_config
from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import checkpoint_state_dict
from projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run import (SFT_PTH, V2_SAM2_PT, V2_SFT_DS_DIR,
                                                                              V2_SFT_PTH, make_tiny_sft_run)
from projects.llava_sam2.rl_train.model.checkpoints.upstream_base import read_xtuner_checkpoint
from projects.llava_sam2.rl_train.model.checkpoints.xtuner_checkpoint import load_upstream_sft
from projects.llava_sam2.rl_train.model.checkpoints.xtuner_keys import parse_upstream_state, upstream_key

REPO = Path(__file__).resolve().parents[1]
V2_SFT_CONFIG = REPO / "projects/llava_sam2/configs/rl/upstream_sft/sa2va_in30_tiny_sft.py"
V1_SFT_CONFIG = REPO / "projects/llava_sam2/configs/rl/upstream_sft/sa2va_tiny_sft.py"
RL_CONFIG = REPO / "projects/llava_sam2/configs/rl/tiny_grpo_from_upstream_v2_sft_cpu.py"
PINNED = json.loads((REPO / "tests/data/upstream_v2_sft_keys.json").read_text())
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
LLM = "mllm.model.language_model.base_model.model."


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path_factory.mktemp("torch_extensions")))
        # one rank: the merge of several ranks' partitions is test_upstream_sft.py's (the layout does not differ)
        return make_tiny_sft_run(tmp_path_factory.mktemp("sa2va_v2_checkout"), seed=0, deepspeed=HAS_DEEPSPEED,
                                 world_size=1, codebase="v2")


@pytest.fixture(scope="module")
def expected(run):
    return reference_hf_state(run.model)


@pytest.fixture()
def source(run, monkeypatch):
    """The v2 SFT config's model description, paths resolved from the checkout root (upstream's ./pretrained)."""
    monkeypatch.chdir(run.root)
    src, _ = load_sft_config(V2_SFT_CONFIG)
    return replace(src, pretrained_pth=V2_SFT_PTH)


def reference_hf_state(model) -> dict[str, torch.Tensor]:
    """The emulated SFT model in HF names the way upstream's converter gets them: peft merge_and_unload (which keeps
    the modules_to_save copies), then the module names."""
    reference = copy.deepcopy(model)
    reference.language_model = reference.language_model.merge_and_unload()
    return checkpoint_state_dict(reference)


@torch.no_grad()
def logits(model, seed: int = 1) -> torch.Tensor:
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(seed))
    was_training = model.training
    out = model.eval().language_model(input_ids=ids).logits
    model.train(was_training)
    return out


# ---------------------------------------------------------------------------------------------- 1. key layout
def test_pinned_v2_layout_maps_to_the_names_upstreams_converter_gives():
    """Every pinned upstream key (derived from upstream's modules, xtuner's state_dict filter and peft) lands where
    upstream's merge + rename puts it; the frozen original copies are dropped."""
    pth, ds_only = PINNED["pth"], PINNED["deepspeed_only"]
    parsed = parse_upstream_state({k: torch.zeros(1) for k in {**pth, **ds_only}}, "pinned")
    assert parsed.layout == "v2" and parsed.saved_modules == {"model.embed_tokens", "lm_head"}
    for key, hf in {**pth, **ds_only}.items():
        if hf is None:
            assert ".original_module." in key
        elif ".lora_" in key:
            layer = hf.removeprefix("language_model.").removesuffix(".weight")
            assert layer in (parsed.lora_A if ".lora_A." in key else parsed.lora_B), key
        else:
            assert hf in parsed.weights, key
    assert parsed.dropped_base_copies == sum(v is None for v in ds_only.values()) == 2
    non_lora = {hf for k, hf in {**pth, **ds_only}.items() if hf is not None and ".lora_" not in k}
    assert set(parsed.weights) == non_lora


def test_tiny_v2_run_writes_upstreams_key_set(run):
    """The fixture's .pth holds, for the kinds of tensors pinned, exactly upstream's v2 .pth keys."""
    written = set(read_xtuner_checkpoint(run.path(V2_SFT_PTH)))
    pinned = set(PINNED["pth"])
    assert pinned <= written
    same_kind = {k for k in written if k.startswith((LLM, "mllm.model.mlp1.", "text_hidden_fcs."))
                 and ".layers.1." not in k}
    assert same_kind == {k for k in pinned if not k.startswith("grounding_encoder.")}


# ---------------------------------------------------------------------------------------------- 2. load
@pytest.mark.parametrize("checkpoint", ["pth", "deepspeed"])
@pytest.mark.parametrize("lora_mode", ["keep", "merge"])
def test_v2_checkpoint_loads_to_the_sft_models_tensors(run, source, expected, checkpoint, lora_mode):
    if checkpoint == "deepspeed":
        if not HAS_DEEPSPEED:
            pytest.skip("writing the DeepSpeed fixture needs deepspeed")
        source = replace(source, pretrained_pth=V2_SFT_DS_DIR, sam2_checkpoint=None)
    model, tokenizer, report = load_upstream_sft(source, lora_mode=lora_mode)
    assert report.layout == "v2" and report.lora_layers == 14 and report.lora_mode == lora_mode
    assert isinstance(model.language_model, PeftModel) == (lora_mode == "keep")
    assert tokenizer.get_vocab() == run.tokenizer.get_vocab()
    loaded = checkpoint_state_dict(model)
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():  # merged LoRA layers differ by fp32 rounding of W + s·BA only
        assert torch.allclose(loaded[key], value, atol=2e-6, rtol=0), key
    lm = run.model.language_model.base_model.model
    for name in ("model.embed_tokens", "lm_head"):  # the trained modules_to_save copy, not the frozen original
        trained = lm.get_submodule(name).modules_to_save["default"].weight
        assert torch.equal(loaded[f"language_model.{name}.weight"], trained)
        assert not torch.equal(trained, lm.get_submodule(name).original_module.weight)
    assert torch.allclose(logits(model), logits(run.model), atol=0.0 if lora_mode == "keep" else 2e-6, rtol=0)


def test_v1_checkpoint_still_loads_and_says_its_layout(tmp_path, monkeypatch):
    v1 = make_tiny_sft_run(tmp_path, seed=1)
    monkeypatch.chdir(tmp_path)
    src, _ = load_sft_config(V1_SFT_CONFIG)
    model, _, report = load_upstream_sft(replace(src, pretrained_pth=SFT_PTH), lora_mode="keep")
    assert report.layout == "v1" and src.codebase == "v1" and src.sam2_checkpoint == "pretrained/sam2_tiny.pt"
    assert torch.equal(logits(model), logits(v1.model))


def test_to_hf_of_a_v2_run_copies_v2s_remote_code(run, source, expected, tmp_path):
    """``convert to-hf`` with a v2 SFT config: the merged tensors (modules_to_save copies) and, as v2's
    tools/convert_to_hf.py does, the remote code of projects/sa2va/hf/models."""
    from safetensors.torch import load_file

    from projects.llava_sam2.rl_train.cli import convert

    remote = run.root / "projects/sa2va/hf/models"
    remote.mkdir(parents=True, exist_ok=True)
    (remote / "modeling_sa2va_chat.py").write_text("# upstream v2 remote code\n")
    out = tmp_path / "hf"
    assert convert.main(["to-hf", str(V2_SFT_CONFIG), V2_SFT_PTH, "--save-path", str(out), "--dtype", "float32"]) == 0
    written = load_file(out / "model.safetensors")
    assert written.keys() == expected.keys()
    assert all(torch.allclose(written[k], v, atol=2e-6, rtol=0) for k, v in expected.items())
    assert json.loads((out / "config.json").read_text())["template"] == "qwen_chat"
    assert (out / "modeling_sa2va_chat.py").read_text() == "# upstream v2 remote code\n"


# ---------------------------------------------------------------------------------------------- 3. errors, init
def test_checkpoints_of_neither_layout_name_file_and_key(run, source, tmp_path):
    state = read_xtuner_checkpoint(run.path(V2_SFT_PTH))
    foreign = dict(state, **{"text_exist_fcs.0.weight": torch.zeros(2)})
    torch.save({"state_dict": foreign}, tmp_path / "foreign.pth")
    with pytest.raises(ValueError, match=r"foreign\.pth: 1 keys do not map onto Sa2VA: they match neither the "
                                         r"codebase v1 nor the v2 layout"
                                         r"(.|\n)*text_exist_fcs\.0\.weight"):
        load_upstream_sft(replace(source, pretrained_pth=str(tmp_path / "foreign.pth")))
    head = f"{LLM}lm_head.modules_to_save.default.weight"
    mixed = dict(state, **{f"{LLM}lm_head.weight": state[head]})  # v1's plain head beside v2's copy
    torch.save({"state_dict": mixed}, tmp_path / "mixed.pth")
    with pytest.raises(ValueError, match=r"mixed\.pth: tensors given twice(.|\n)*mixes the two layouts") as error:
        load_upstream_sft(replace(source, pretrained_pth=str(tmp_path / "mixed.pth")))
    assert f"{LLM}lm_head.weight" in str(error.value) and head in str(error.value)
    orphan = {k: v for k, v in state.items() if k != head}
    orphan[f"{LLM}lm_head.original_module.weight"] = state[head]  # a frozen copy without its trained one
    torch.save({"state_dict": orphan}, tmp_path / "orphan.pth")
    with pytest.raises(ValueError, match=r"orphan\.pth: 1 keys do not map(.|\n)*lm_head\.original_module"):
        load_upstream_sft(replace(source, pretrained_pth=str(tmp_path / "orphan.pth")))
    (tmp_path / "corrupt.pth").write_bytes(b"\x80\x02not a checkpoint")
    with pytest.raises(ValueError, match=r"corrupt\.pth: cannot read this checkpoint"):
        load_upstream_sft(replace(source, pretrained_pth=str(tmp_path / "corrupt.pth")))


def test_v2_start_weights_sit_between_the_sft_result_and_the_base(run, source, expected, tmp_path):
    """v2's sa2va_finetune.py starts the SFT from a released model (``model.pretrained_pth``, the bare dict
    tools/convert_to_pth.py writes, LLM unwrapped); upstream loads it before the LoRA wrap, so its adapter tensors
    never reach the run. RL gets: SFT result > start weights > SAM2 / base."""
    torch.manual_seed(5)
    start = {upstream_key(k, is_llm_wrapped=False): v + 0.01 * torch.randn_like(v)
             for k, v in expected.items()}
    start[f"{LLM}model.layers.0.mlp.up_proj.lora_A.default.weight"] = torch.ones(8, 128)  # ignored, as upstream
    torch.save(start, tmp_path / "Sa2VA-tiny.pth")
    src, _ = load_sft_config(V2_SFT_CONFIG, {"model.pretrained_pth": str(tmp_path / "Sa2VA-tiny.pth")})
    assert src.init_checkpoint == str(tmp_path / "Sa2VA-tiny.pth") and src.pretrained_pth is None
    model, _, report = load_upstream_sft(replace(src, pretrained_pth=V2_SFT_PTH), lora_mode="keep")
    assert report.ignored_init_adapter == 1 and "sam2" not in report.counts and "base" not in report.counts
    loaded, sft = checkpoint_state_dict(model), read_xtuner_checkpoint(run.path(V2_SFT_PTH))
    norm = "mllm.model.language_model.model.norm.weight"  # not in the SFT .pth: from the start weights
    assert torch.equal(loaded["language_model.model.norm.weight"], start[norm])
    assert torch.equal(loaded["mlp1.1.weight"], sft["mllm.model.mlp1.1.weight"])  # the SFT result wins
    up = "language_model.model.layers.0.mlp.up_proj.weight"  # start weight + the SFT's LoRA on top
    lora_a, lora_b = (sft[f"{LLM}model.layers.0.mlp.up_proj.lora_{ab}.default.weight"] for ab in "AB")
    merged = start[upstream_key(up, is_llm_wrapped=False)] + src.lora.scaling * lora_b @ lora_a
    assert torch.allclose(loaded[up], merged, atol=2e-6, rtol=0)


# ---------------------------------------------------------------------------------------------- 4. config, RL
def test_v2_config_maps_to_rls_model(run, source):
    assert (source.codebase, source.template, source.base_path) == ("v2", "qwen_chat", "./pretrained/InternVL3-tiny")
    assert source.sam2_checkpoint == V2_SAM2_PT  # v2 reads SAM2 from pretrained/sam2/
    assert (source.lora.r, source.lora.lora_alpha, source.lora.lora_dropout, source.lora.modules_to_save) == \
        (8, 16.0, 0.05, ("embed_tokens", "lm_head"))
    assert source.special_tokens == ("[SEG]", "<p>", "</p>", "<vp>", "</vp>") and source.init_checkpoint is None
    _, flags = load_sft_config(V2_SFT_CONFIG)
    assert flags.train_mask_decoder and flags.has_llm_lora and flags.sft_trained_embeddings
    with pytest.raises(ValueError, match="codebase v2.*llm_lora is None"):
        load_sft_config(V2_SFT_CONFIG, {"model.mllm.llm_lora": None})
    with pytest.raises(ValueError, match="codebase v2.*mllm.special_tokens"):
        load_sft_config(V2_SFT_CONFIG, {"model.mllm.special_tokens": ["[SEG]"]})
    with pytest.raises(ValueError, match="modules_to_save.*unknown \\['norm'\\]"):
        load_sft_config(V2_SFT_CONFIG, {"model.mllm.llm_lora.modules_to_save": ["embed_tokens", "norm"]})
    with pytest.raises(ValueError, match="model type 'MyModel' is neither"):
        load_sft_config(V2_SFT_CONFIG, {"model.type": "MyModel"})
    _, frozen = load_sft_config(V2_SFT_CONFIG, {"model.frozen_sam2_decoder": True})
    assert not frozen.train_mask_decoder


def test_rl_model_from_the_v2_sft_run(run, source):
    """The RL config built on the v2 SFT config: the SFT adapter continued, RL's trainable set."""
    from mmengine.config import Config
    from mmengine.registry import MODELS

    model = MODELS.build(Config.fromfile(str(RL_CONFIG)).model)
    assert model.is_lora_from_sft and model.processor.template_name == "qwen_chat"
    assert model.processor.tokenizer.get_vocab() == run.tokenizer.get_vocab()
    names = {n for n, p in model.sa2va.named_parameters() if p.requires_grad}
    kinds = {"lora" if "lora_" in n else "mask_decoder" if ".sam_mask_decoder." in n else n.split(".")[0]
             for n in names}
    assert kinds == {"lora", "mlp1", "mask_decoder", "text_hidden_fcs"}  # embeddings: RL's train_embeddings=False
    sft = run.model.language_model.base_model.model.state_dict()
    body = model.sa2va.language_model.base_model.model
    lora = {n: p for n, p in body.named_parameters() if "lora_" in n}
    assert len(lora) == 28 and all(torch.equal(p.detach(), sft[n]) for n, p in lora.items())

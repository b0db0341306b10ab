"""A tiny upstream codebase-v2 SFT run of the Qwen-VL family (tests only), laid out under ``root`` as an upstream
checkout holds it after training ``upstream_sft/sa2va_qwen3vl_tiny_sft.py``:

    pretrained/Qwen3-VL-tiny/        base Qwen-VL dir: config.json (transformers' Qwen-VL config, plus our
                                     ``grounding_config`` sizing the tiny SAM2), model.safetensors in transformers'
                                     names, the tiny tokenizer *without* Sa2VA's tokens (loading grows the vocabulary)
    pretrained/sam2/sam2_tiny.pt     {'model': SAM2Base state}, sam2 names
    work_dirs/sa2va_qwen3vl_tiny_sft/iter_2.pth
                                     {'state_dict': ...}: upstream's Sa2VAModel.state_dict of the run
    work_dirs/sa2va_qwen3vl_tiny_sft/iter_2_zero2.pth/
                                     (``deepspeed=True``) the whole module tree saved by DeepSpeed ZeRO-2 itself

The "SFT" is emulated as upstream's Qwen-VL wrapper prepares it: the whole transformers Qwen-VL model is resized to
the grown vocabulary and wrapped by ``peft.get_peft_model`` with targets ``'language_model.' + name`` of every
``nn.Linear`` of its text decoder and ``modules_to_save=['lm_head', 'embed_tokens']``; the trained tensors get seeded
noise. The ``.pth`` keys come from xtuner's own ``get_peft_model_state_dict`` (the filter upstream's wrapper calls)
plus the mask decoder and ``text_hidden_fcs`` (what upstream's ``Sa2VAModel.state_dict`` adds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from projects.llava_sam2.rl_train.model.checkpoints.tiny_upstream_run import _write_base_tokenizer
from projects.llava_sam2.rl_train.model.network.qwen_vl import Sa2VAQwenConfig, Sa2VAQwenModel
from projects.llava_sam2.rl_train.model.text.constants import SA2VA_SPECIAL_TOKENS
from qwen_vl_fixtures import QWEN_VISION_TOKENS, WEIGHT_NOISE, tiny_qwen_config

QWEN_BASE_DIR = "pretrained/Qwen3-VL-tiny"
QWEN_SAM2_PT = "pretrained/sam2/sam2_tiny.pt"
QWEN_SFT_PTH = "work_dirs/sa2va_qwen3vl_tiny_sft/iter_2.pth"
QWEN_SFT_DS_DIR = "work_dirs/sa2va_qwen3vl_tiny_sft/iter_2_zero2.pth"
QWEN_SFT_LORA = dict(r=8, lora_alpha=16, lora_dropout=0.05)  # the tiny SFT config's llm_lora
QWEN_MODULES_TO_SAVE = ["lm_head", "embed_tokens"]


@dataclass
class TinyQwenSFTRun:
    root: Path
    model: Sa2VAQwenModel  # the emulated SFT result, ``model`` peft-wrapped as upstream's; the reference
    tree: nn.Module  # upstream's module tree (mllm.model, grounding_encoder.sam2_model, text_hidden_fcs)
    tokenizer: object  # base tokenizer + Sa2VA tokens, ids as the run's

    def path(self, relative: str) -> Path:
        return self.root / relative


def write_base_tokenizer(out: Path):
    """The tiny tokenizer minus Sa2VA's tokens, plus Qwen-VL's vision markers: what a Qwen-VL directory ships."""
    from transformers import AutoTokenizer

    _write_base_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    tokenizer.add_tokens(list(QWEN_VISION_TOKENS), special_tokens=True)
    tokenizer.save_pretrained(str(out))
    return AutoTokenizer.from_pretrained(str(out), local_files_only=True)


def base_config(family: str, tokenizer) -> Sa2VAQwenConfig:
    """The tiny replica's config with the base tokenizer's vocabulary and vision-token ids."""
    data = tiny_qwen_config(family).to_dict()
    data["text_config"]["vocab_size"] = len(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_VISION_TOKENS}
    data.update(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    return Sa2VAQwenConfig(data)


def build_qwen_sft_tree(root: Path, family: str = "qwen3_vl", seed: int = 0):
    """(tree, Sa2VAQwenModel sharing its modules, base HF state, SAM2 state, tokenizer with Sa2VA's tokens)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(root / QWEN_BASE_DIR), local_files_only=True)
    config = base_config(family, tokenizer)
    torch.manual_seed(seed)
    model = Sa2VAQwenModel(config, attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.add_(torch.randn(param.shape, generator=generator) * WEIGHT_NOISE)
    base = {k: v.clone() for k, v in model.model.state_dict().items()}  # transformers' names
    sam2 = {k: v.clone() for k, v in model.grounding_encoder.sam2_model.state_dict().items()}
    hf = model.model
    tokenizer.add_tokens(list(SA2VA_SPECIAL_TOKENS), special_tokens=True)  # upstream's add_special_tokens
    hf.resize_token_embeddings(len(tokenizer))
    model.config.data["text_config"]["vocab_size"] = len(tokenizer)
    targets = ["language_model." + name for name, m in hf.language_model.named_modules() if isinstance(m, nn.Linear)]
    lora = LoraConfig(**QWEN_SFT_LORA, bias="none", task_type="CAUSAL_LM", target_modules=targets,
                      modules_to_save=list(QWEN_MODULES_TO_SAVE))
    model.model = get_peft_model(hf, lora)
    tree = nn.Module()
    tree.mllm = nn.Module()
    tree.mllm.model = model.model
    tree.grounding_encoder = nn.Module()
    tree.grounding_encoder.sam2_model = model.grounding_encoder.sam2_model
    tree.text_hidden_fcs = model.text_hidden_fcs
    tree.requires_grad_(False)
    for name, param in tree.named_parameters():  # upstream's trainable set
        param.requires_grad_("lora_" in name or ".modules_to_save." in name or ".sam_mask_decoder." in name
                             or name.startswith("text_hidden_fcs."))
    with torch.no_grad():
        for name, param in tree.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * (0.05 if "lora_B" in name else 0.01))
    return tree, model, base, sam2, tokenizer


def upstream_pth_state(tree: nn.Module) -> dict[str, torch.Tensor]:
    """What upstream's Sa2VAModel.state_dict writes: the mllm through xtuner's peft filter (the Qwen-VL wrapper's
    state_dict), the SAM2 mask decoder, text_hidden_fcs."""
    from xtuner.model.utils import get_peft_model_state_dict

    mllm = get_peft_model_state_dict(tree.mllm.model, state_dict=tree.mllm.state_dict(prefix="mllm."))
    sam = {k: v for k, v in tree.state_dict().items() if k.startswith("grounding_encoder.sam2_model.sam_mask_decoder")}
    fcs = tree.text_hidden_fcs.state_dict(prefix="text_hidden_fcs.")
    return {k: v.detach().clone() for k, v in {**mllm, **sam, **fcs}.items()}


def make_tiny_qwen_sft_run(root: str | os.PathLike, family: str = "qwen3_vl", seed: int = 0,
                           deepspeed: bool = False) -> TinyQwenSFTRun:
    root = Path(root)
    base_tokenizer = write_base_tokenizer(root / QWEN_BASE_DIR)
    tree, model, base, sam2, tokenizer = build_qwen_sft_tree(root, family, seed)
    hf_config = base_config(family, base_tokenizer).to_dict()
    for key in ("template", "auto_map", "architectures", "model_type"):  # a Qwen-VL dir, not a Sa2VA one
        hf_config.pop(key, None)
    hf_config.update(architectures=["Qwen3VLForConditionalGeneration" if family == "qwen3_vl"
                                    else "Qwen2_5_VLForConditionalGeneration"], model_type=family)
    (root / QWEN_BASE_DIR / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in base.items()}, str(root / QWEN_BASE_DIR / "model.safetensors"),
              metadata={"format": "pt"})
    (root / QWEN_SAM2_PT).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": sam2}, root / QWEN_SAM2_PT)
    (root / QWEN_SFT_PTH).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": upstream_pth_state(tree), "meta": {"seed": seed}}, root / QWEN_SFT_PTH)
    if deepspeed:
        here = Path(__file__).resolve().parent
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(here.parent), str(here),
                                                            os.environ.get("PYTHONPATH")])))
        result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--root", str(root), "--family", family,
                                 "--seed", str(seed)], env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"DeepSpeed checkpoint writer failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    model.bind_tokenizer(tokenizer)
    return TinyQwenSFTRun(root=root, model=model, tree=tree, tokenizer=tokenizer)


def _deepspeed_worker(rank: int, root: str, family: str, seed: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import deepspeed

    from projects.llava_sam2.rl_train.model.checkpoints.deepspeed_zero import without_shm_comm_op

    tree, *_ = build_qwen_sft_tree(Path(root), family, seed)
    with without_shm_comm_op():
        deepspeed.init_distributed(dist_backend="gloo")
    optimizer = torch.optim.AdamW([p for p in tree.parameters() if p.requires_grad], lr=1e-4)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}
    engine, *_ = deepspeed.initialize(model=tree, optimizer=optimizer, config=config)
    directory = Path(root) / QWEN_SFT_DS_DIR
    engine.save_checkpoint(str(directory.parent), tag=directory.name, save_latest=False)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description="write the DeepSpeed ZeRO-2 directory of the tiny Qwen-VL SFT run")
    parser.add_argument("--root", required=True)
    parser.add_argument("--family", default="qwen3_vl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    mp.start_processes(_deepspeed_worker, args=(args.root, args.family, args.seed, 29500 + os.getpid() % 1000),
                       nprocs=1, join=True, start_method="fork")

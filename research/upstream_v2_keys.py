"""Derivation (docs/upstream.md, "Codebase v2 SFT runs"): the tensor names a codebase-v2 Sa2VA SFT run saves, and the
HF name each one becomes, written to ``tests/data/upstream_v2_sft_keys.json`` for ``tests/test_upstream_v2_sft.py``.

The module tree is assembled from upstream's own pieces, nothing named by hand:

* ``mllm.model.{vision_model, language_model, mlp1}``, ``grounding_encoder.sam2_model``, ``text_hidden_fcs``: the
  modules of upstream's v2 HF ``Sa2VAChatModel`` (``projects/sa2va/hf/models``, built as research.upstream_v2_parity
  builds it, on the tiny InternVL3 replica), placed where v2's training ``Sa2VAModel`` keeps them (its ``mllm`` is an
  ``InternVLMLLM``, whose ``.model`` is the InternVL chat model; its ``grounding_encoder`` a ``SAM2TrainRunner``);
* the LLM wrapped as v2's LoRA preparation does it: peft's ``prepare_model_for_kbit_training``, then xtuner's
  ``find_all_linear_names`` for the targets and peft's ``get_peft_model`` with the ``LoraConfig`` values of
  ``sa2va_in30_2b.py`` (r 128, alpha 256, dropout 0.05, ``modules_to_save=["embed_tokens", "lm_head"]``);
* the ``.pth`` key set: xtuner's own ``InternVL_V1_5.state_dict`` (the method v2's ``InternVLMLLM.state_dict``
  defers to) run on that tree with v2's flags (LoRA on, visual-encoder LoRA off, frozen ViT), plus the SAM2 mask
  decoder and ``text_hidden_fcs``, the two other parts v2's ``Sa2VAModel.state_dict`` adds;
* HF names: a copy of the tree is merged as v2's ``_merge_lora`` does (peft ``merge_and_unload`` on the LLM) and
  renamed by ``tools/convert_to_hf.py``'s rule (drop ``mllm.model.``, ``gamma`` -> ``g_weight``); each training
  tensor is paired with the HF tensor that shares its storage after the merge (the LoRA A / B tensors with the
  weight they merge into).

SAM2 tensors are named as in training (``gamma``, by the reverse rule of ``tools/convert_to_pth.py``). A
representative subset is kept (LLM layer 0, ViT layer 0, a few mask-decoder tensors). Upstream's code is never part
of this repository; pass a checkout of bytedance/Sa2VA (codebase v2):

    python -m research.upstream_v2_keys /tmp/Sa2VA --out tests/data/upstream_v2_sft_keys.json [--commit 9832e1a]
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from research.upstream_v2_parity import REPO, load_upstream

V2_LORA = dict(r=128, lora_alpha=256, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
               modules_to_save=["embed_tokens", "lm_head"])  # sa2va_in30_2b.py's llm_lora
_SAM_KEPT = ("sam_mask_decoder.iou_token.", "sam_mask_decoder.transformer.layers.0.self_attn.q_proj.",
             "memory_encoder.fuser.layers.0.gamma", "obj_ptr_proj.layers.0.weight")


def representative(key: str) -> bool:
    """LLM: layer 0 and the non-layer tensors; ViT: embeddings and layer 0's attention; mlp1, text_hidden_fcs: all;
    SAM2: a few mask-decoder tensors and one of each rename / prefix case."""
    if key.startswith("mllm.model.language_model."):
        return not re.search(r"layers\.[1-9]", key)
    if key.startswith("mllm.model.vision_model."):
        return ".embeddings." in key or ".encoder.layers.0.attn." in key
    if key.startswith("grounding_encoder."):
        return any(part in key for part in _SAM_KEPT)
    return key.startswith(("mllm.model.mlp1.", "text_hidden_fcs."))


def build_v2_tree(upstream_model: nn.Module) -> nn.Module:
    """The v2 training module tree around upstream's HF modules, LLM wrapped as v2's LoRA preparation does."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from xtuner.model.utils import find_all_linear_names

    tree = nn.Module()
    tree.mllm = nn.Module()
    tree.mllm.model = nn.Module()
    tree.mllm.model.vision_model = upstream_model.vision_model
    lm = prepare_model_for_kbit_training(upstream_model.language_model, True)
    config = LoraConfig(**V2_LORA, target_modules=find_all_linear_names(lm))
    tree.mllm.model.language_model = get_peft_model(lm, config)
    tree.mllm.model.mlp1 = upstream_model.mlp1
    tree.grounding_encoder = nn.Module()
    tree.grounding_encoder.sam2_model = upstream_model.grounding_encoder.sam2_model
    tree.text_hidden_fcs = upstream_model.text_hidden_fcs
    return tree


def pth_keys(tree: nn.Module) -> list[str]:
    """The key set of a v2 ``iter_*.pth``: xtuner's InternVL_V1_5.state_dict for ``mllm`` + v2's two other parts."""
    from xtuner.model.internvl import InternVL_V1_5

    shell = InternVL_V1_5.__new__(InternVL_V1_5)  # the real method on v2's flags, without loading a model
    nn.Module.__init__(shell)
    shell.model = tree.mllm.model
    shell.use_llm_lora, shell.use_visual_encoder_lora = True, False
    shell.freeze_llm, shell.freeze_visual_encoder = True, True
    mllm = list(shell.state_dict(prefix="mllm."))
    sam = [k for k in tree.state_dict() if k.startswith("grounding_encoder.sam2_model.sam_mask_decoder")]
    return mllm + sam + [k for k in tree.state_dict() if k.startswith("text_hidden_fcs.")]


def training_name(hf_sam_key: str) -> str:
    return hf_sam_key.replace(".g_weight", ".gamma")


def hf_names(tree: nn.Module) -> dict[str, str | None]:
    """{training key: HF key after the merge and rename}, paired by storage; None: no HF tensor (a dropped copy)."""
    merged = copy.deepcopy(tree)
    before = {k: t for k, t in merged.state_dict(keep_vars=True).items()}
    wrapped_layers = {name: module for name, module in merged.mllm.model.language_model.named_modules()
                      if hasattr(module, "base_layer")}
    lora_target = {}  # lora tensor key -> the base weight it merges into
    for name, module in wrapped_layers.items():
        base = f"mllm.model.language_model.{name}.base_layer.weight"
        for key in before:
            if key.startswith(f"mllm.model.language_model.{name}.lora_"):
                lora_target[key] = base
    merged.mllm.model.language_model = merged.mllm.model.language_model.merge_and_unload()
    after = {}
    for key, tensor in merged.state_dict(keep_vars=True).items():
        hf = key.replace("mllm.model.", "").replace(".gamma", ".g_weight")
        after[tensor.data_ptr(), tuple(tensor.shape)] = hf
    out = {}
    for key, tensor in before.items():
        probe = before[lora_target[key]] if key in lora_target else tensor
        out[training_name(key)] = after.get((probe.data_ptr(), tuple(probe.shape)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("upstream", type=Path, help="a checkout of bytedance/Sa2VA (codebase v2)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--commit", default=None, help="the checkout's commit, if it is not a git work tree")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from internvl3_fixtures import tiny_internvl3_model

    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import save_pretrained

    ours = tiny_internvl3_model()
    upstream = load_upstream(args.upstream, ours.config.grounding)
    with tempfile.TemporaryDirectory() as staging:
        save_pretrained(ours, Path(staging))
        theirs = upstream.Sa2VAChatModel(upstream.Sa2VAChatConfig.from_pretrained(staging), use_flash_attn=False)
    tree = build_v2_tree(theirs.float())
    names = hf_names(tree)
    pth = pth_keys(tree)
    everything = list(tree.state_dict())  # what a DeepSpeed directory holds (the whole module tree)
    commit = args.commit or subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    data = {
        "derivation": "research/upstream_v2_keys.py (module docstring); upstream bytedance/Sa2VA @ " + commit,
        "lora": dict(V2_LORA),
        "pth": {training_name(k): names[training_name(k)] for k in pth if representative(k)},
        "deepspeed_only": {training_name(k): names[training_name(k)] for k in everything
                           if k not in set(pth) and representative(training_name(k))},
    }
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(data['pth'])} .pth keys, {len(data['deepspeed_only'])} DeepSpeed-only keys")


if __name__ == "__main__":
    main()

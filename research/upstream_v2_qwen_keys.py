"""Derivation (docs/upstream.md, "Codebase v2 SFT runs"): the tensor names a codebase-v2 SFT run of the Qwen-VL
family saves, and the HF name each one becomes, added to ``tests/data/upstream_v2_sft_keys.json`` under ``qwen_vl``
for ``tests/test_upstream_v2_qwen_sft.py``.

Upstream's own code does every step that names a tensor; this script only places modules and calls it:

* the mllm: upstream's ``Qwen2_5_VL`` / ``Qwen3VL`` wrapper classes (``projects/sa2va/models/mllm/qwenvl.py``,
  ``qwen3vl.py``, imported from the checkout as files), whose ``.model`` is set to the transformers Qwen-VL model of the
  tiny replica (tests/qwen_vl_fixtures.py; the wrapper's own ``__init__`` would download the released weights);
* the LoRA wrap: the wrapper's own ``_prepare_llm_for_lora`` with the ``llm_lora`` values of
  ``sa2va_qwenvl3/sa2va_qwen3_4b.py`` (r 128, alpha 256, dropout 0.05, ``modules_to_save=['lm_head',
  'embed_tokens']``, ``target_modules=None``, so the wrapper picks every Linear under ``language_model``);
* the ``.pth`` key set: the wrapper's own ``state_dict`` (xtuner's ``get_peft_model_state_dict``) under the prefix
  ``mllm.``, plus the SAM2 mask decoder and ``text_hidden_fcs``, the parts ``Sa2VAModel.state_dict`` adds;
* HF names: a copy merged as ``Sa2VAModel._merge_lora`` does for a ``PeftModelForCausalLM`` mllm (peft
  ``merge_and_unload`` of the whole Qwen-VL model) and renamed by ``tools/convert_to_hf.py``'s Qwen rule (drop
  ``mllm.``, ``.gamma`` -> ``.g_weight``); each training tensor is paired with the HF tensor that shares its storage
  after the merge (LoRA A / B with the weight they merge into).

A representative subset is kept (text layer 0 and the non-layer tensors, vision patch embedding, block 0's attention
and the merger, a few mask-decoder tensors). Upstream's code is never part of this repository; pass a checkout of
bytedance/Sa2VA (codebase v2):

    python -m research.upstream_v2_qwen_keys /tmp/Sa2VA --json tests/data/upstream_v2_sft_keys.json [--commit 9832e1a]
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from research.upstream_v2_keys import training_name

REPO = Path(__file__).resolve().parents[1]
V2_QWEN_LORA = dict(r=128, lora_alpha=256, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                    modules_to_save=["lm_head", "embed_tokens"], target_modules=None)  # sa2va_qwen3_4b.py's llm_lora
# our family name -> (upstream mllm file, class)
WRAPPERS = {"qwen2_5_vl": ("qwenvl.py", "Qwen2_5_VL"), "qwen3_vl": ("qwen3vl.py", "Qwen3VL")}
_SAM_KEPT = ("sam_mask_decoder.iou_token.", "sam_mask_decoder.transformer.layers.0.self_attn.q_proj.",
             "memory_encoder.fuser.layers.0.gamma", "obj_ptr_proj.layers.0.weight")


def representative(key: str) -> bool:
    if ".language_model." in key:
        return not re.search(r"layers\.[1-9]", key)
    if ".visual." in key:
        return ".patch_embed." in key or ".blocks.0.attn." in key or ".merger." in key
    if key.startswith("grounding_encoder."):
        return any(part in key for part in _SAM_KEPT)
    return key.startswith("text_hidden_fcs.") or key.endswith("lm_head.modules_to_save.default.weight") \
        or ".lm_head." in key


def upstream_wrapper(checkout: Path, family: str) -> type:
    """The upstream mllm class, loaded from its file (its package __init__ pulls in the datasets and third_parts)."""
    file, name = WRAPPERS[family]
    path = checkout / "projects/sa2va/models/mllm" / file
    spec = importlib.util.spec_from_file_location(f"upstream_{family}_mllm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def build_tree(checkout: Path, family: str) -> nn.Module:
    from mmengine.model import BaseModel
    from peft import LoraConfig
    from qwen_vl_fixtures import tiny_qwen_model

    ours = tiny_qwen_model(family)
    wrapper_cls = upstream_wrapper(checkout, family)
    mllm = wrapper_cls.__new__(wrapper_cls)  # the real methods, without the download in __init__
    BaseModel.__init__(mllm)
    mllm.model = ours.model
    mllm.freeze_llm = mllm.freeze_visual_encoder = True
    mllm.model.language_model.requires_grad_(False)
    mllm.model.visual.requires_grad_(False)
    mllm._prepare_llm_for_lora(LoraConfig(**V2_QWEN_LORA))
    tree = nn.Module()
    tree.mllm = mllm
    tree.grounding_encoder = nn.Module()
    tree.grounding_encoder.sam2_model = ours.grounding_encoder.sam2_model
    tree.text_hidden_fcs = ours.text_hidden_fcs
    return tree


def pth_keys(tree: nn.Module) -> list[str]:
    mllm = list(tree.mllm.state_dict(prefix="mllm."))
    sam = [k for k in tree.state_dict() if k.startswith("grounding_encoder.sam2_model.sam_mask_decoder")]
    return mllm + sam + [k for k in tree.state_dict() if k.startswith("text_hidden_fcs.")]


def hf_names(tree: nn.Module) -> dict[str, str | None]:
    """{training key: HF key after upstream's merge and rename}, paired by storage; None: a dropped copy."""
    merged = copy.deepcopy(tree)
    before = dict(nn.Module.state_dict(merged, keep_vars=True))
    lora_target = {}
    for key in before:
        match = re.match(r"^(.+)\.lora_[AB]\.default\.weight$", key)
        if match:
            lora_target[key] = match[1] + ".base_layer.weight"
    plain = nn.Module()  # the names of the merged tree (the wrapper's filtered state_dict does not apply any more)
    plain.model = merged.mllm.model.merge_and_unload()
    merged.mllm = plain
    after = {}
    for key, tensor in nn.Module.state_dict(merged, keep_vars=True).items():
        after[tensor.data_ptr(), tuple(tensor.shape)] = key.replace("mllm.", "").replace(".gamma", ".g_weight")
    out = {}
    for key, tensor in before.items():
        probe = before[lora_target[key]] if key in lora_target else tensor
        out[training_name(key)] = after.get((probe.data_ptr(), tuple(probe.shape)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("upstream", type=Path, help="a checkout of bytedance/Sa2VA (codebase v2)")
    parser.add_argument("--json", type=Path, required=True, help="the keys JSON to add the qwen_vl entry to")
    parser.add_argument("--commit", default=None, help="the checkout's commit, if it is not a git work tree")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    commit = args.commit or subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    entry = {"derivation": "research/upstream_v2_qwen_keys.py (module docstring); upstream bytedance/Sa2VA @ "
                           + commit, "lora": {k: v for k, v in V2_QWEN_LORA.items()}}
    for family in WRAPPERS:
        torch.manual_seed(0)
        tree = build_tree(args.upstream, family)
        names = hf_names(tree)
        pth = pth_keys(tree)
        everything = list(nn.Module.state_dict(tree))  # a DeepSpeed directory: the whole module tree
        entry[family] = {
            "pth": {training_name(k): names[training_name(k)] for k in pth if representative(k)},
            "deepspeed_only": {training_name(k): names[training_name(k)] for k in everything
                               if k not in set(pth) and representative(training_name(k))},
        }
    data = json.loads(args.json.read_text())
    data["qwen_vl"] = entry
    args.json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote qwen_vl into {args.json}: " + ", ".join(
        f"{f} {len(entry[f]['pth'])} .pth / {len(entry[f]['deepspeed_only'])} DeepSpeed-only keys" for f in WRAPPERS))


if __name__ == "__main__":
    main()

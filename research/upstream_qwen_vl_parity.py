"""Measurement (docs/upstream.md, "The Qwen-VL family"): upstream's codebase-v2 HF code for its Qwen-VL family
(``Sa2VAChatModelQwen`` over Qwen2.5-VL and Qwen3-VL) against ours on the tiny replicas of tests/qwen_vl_fixtures.py,
both directions, and the test data it pins.

Direction A: our save_pretrained -> upstream's Sa2VAChatConfigQwen.from_pretrained + Sa2VAChatModelQwen + strict load
-> its forward. Direction B: upstream's save_pretrained -> our load_pretrained -> our forward. Prints
max |ours - upstream| per family and writes ``qwen_vl_upstream_reference_<family>.safetensors`` and
``qwen_vl_upstream_saved_<family>.json`` into ``--out`` (copied to tests/data/ by hand).

Upstream's code is never part of this repository: pass a checkout of bytedance/Sa2VA (codebase v2 with "qwen3vl
support"), e.g. fetched to /tmp; its ``projects/sa2va/hf/models_qwen2_5_vl`` and ``models_qwen3vl`` are copied into
temporary packages and left as they are. Needs transformers >= 4.57 (Qwen3-VL).

    python -m research.upstream_qwen_vl_parity /tmp/Sa2VA --out /tmp/qwen_parity   # from the repository root
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from research.upstream_v2_parity import _size_sam2, max_abs_diff

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_DIRS = {"qwen2_5_vl": "models_qwen2_5_vl", "qwen3_vl": "models_qwen3vl"}


def load_upstream(checkout: Path, family: str, grounding: dict) -> types.SimpleNamespace:
    """Upstream's HF classes of one Qwen-VL family, importable and runnable on a CPU, SAM2 sized as ``grounding``."""
    staging = Path(tempfile.mkdtemp(prefix="sa2va_qwen_hf_"))
    package = f"sa2va_hf_{family}"
    shutil.copytree(checkout / "projects/sa2va/hf" / UPSTREAM_DIRS[family], staging / package)
    (staging / package / "__init__.py").touch()
    sys.path.insert(0, str(staging))
    # The modeling module imports qwen_vl_utils (not installed here) for predict_forward's image loading only; the
    # teacher-forced run below never calls it.
    if "qwen_vl_utils" not in sys.modules:
        stand_in = types.ModuleType("qwen_vl_utils")

        def process_vision_info(*args, **kwargs):
            raise RuntimeError("stand-in: predict_forward's image loading is not part of this measurement")

        stand_in.process_vision_info = process_vision_info
        sys.modules["qwen_vl_utils"] = stand_in
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # upstream's SAM2 predictor moves state to CUDA

    sam2 = __import__(f"{package}.sam2", fromlist=["SAM2"])
    config_module = __import__(f"{package}.configuration_sa2va_chat", fromlist=["Sa2VAChatConfigQwen"])
    modeling = __import__(f"{package}.modeling_sa2va_qwen", fromlist=["Sa2VAChatModelQwen"])
    _size_sam2(sam2, grounding)
    return types.SimpleNamespace(Config=config_module.Sa2VAChatConfigQwen, Model=modeling.Sa2VAChatModelQwen)


@torch.no_grad()
def upstream_outputs(model, tokenizer, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What upstream's predict_forward computes, teacher-forced: its Qwen-VL model's forward on the processor's
    tensors, the last hidden state at the [SEG] input position through text_hidden_fcs, and its SAM2 video
    predictor's mask for that prompt."""
    ids = inputs["input_ids"]
    out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                      image_grid_thw=inputs["image_grid_thw"], output_hidden_states=True, return_dict=True)
    rows = (ids[0] == tokenizer.convert_tokens_to_ids("[SEG]")).nonzero()[:, 0]
    prompt = model.text_hidden_fcs(out.hidden_states[-1][0, rows])
    images = torch.stack([model.grounding_encoder.preprocess_image(p.clone(), dtype=torch.float32)
                          for p in inputs["g_pixel_values"]])
    state = model.grounding_encoder.get_sam2_embeddings(images)
    state["device"] = state["storage_device"] = torch.device("cpu")
    masks = model.grounding_encoder.language_embd_inference(state, [prompt])  # [frames, objects, S_sam, S_sam]
    return {"logits": out.logits[0], "seg_prompt": prompt, "mask_logits": masks[:, 0]}


def measure(checkout: Path, family: str, out: Path) -> dict[str, dict[str, float]]:
    from qwen_vl_fixtures import our_outputs, pinned_outputs, reference_inputs, tiny_qwen_model, tiny_qwen_tokenizer

    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import load_pretrained, save_pretrained

    tokenizer = tiny_qwen_tokenizer()
    ours = tiny_qwen_model(family)
    upstream = load_upstream(checkout, family, ours.config.grounding)
    inputs = reference_inputs(tokenizer, ours.config)
    mine = our_outputs(ours, tokenizer, inputs)

    save_pretrained(ours, out / f"ours_saved_{family}")  # direction A
    config = upstream.Config.from_pretrained(str(out / f"ours_saved_{family}"))
    config._attn_implementation = "eager"  # as the replica: same kernels
    for sub in (config.text_config, config.vision_config):
        sub._attn_implementation = "eager"
    theirs = upstream.Model(config)
    print(family, "upstream strict load:",
          theirs.load_state_dict(load_file(str(out / f"ours_saved_{family}/model.safetensors")), strict=True))
    theirs = theirs.float().eval()
    reference = upstream_outputs(theirs, tokenizer, inputs)
    diff_a = max_abs_diff(mine, reference)

    theirs.save_pretrained(str(out / f"upstream_saved_{family}"), safe_serialization=True)  # direction B
    back = load_pretrained(out / f"upstream_saved_{family}", attn_implementation="eager")
    diff_b = max_abs_diff(our_outputs(back, tokenizer, inputs), reference)
    print(family, "max |ours - upstream|, our save -> upstream:", diff_a)
    print(family, "max |ours - upstream|, upstream save -> ours:", diff_b)

    with safe_open(str(out / f"upstream_saved_{family}/model.safetensors"), framework="pt") as handle:
        layout = {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "upstream": f"bytedance/Sa2VA codebase v2, projects/sa2va/hf/{UPSTREAM_DIRS[family]}",
            "max_abs_diff_our_save": json.dumps(diff_a), "max_abs_diff_upstream_save": json.dumps(diff_b)}
    save_file(pinned_outputs(reference, tokenizer, inputs),
              str(out / f"qwen_vl_upstream_reference_{family}.safetensors"), metadata=meta)
    saved_config = json.loads((out / f"upstream_saved_{family}/config.json").read_text())
    (out / f"qwen_vl_upstream_saved_{family}.json").write_text(
        json.dumps({"config": saved_config, "layout": layout}, indent=1, sort_keys=True))
    return {"our_save": diff_a, "upstream_save": diff_b}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("upstream", type=Path, help="a checkout of bytedance/Sa2VA holding projects/sa2va/hf")
    parser.add_argument("--out", type=Path, required=True, help="folder for the saved checkpoints and the test data")
    parser.add_argument("--family", choices=sorted(UPSTREAM_DIRS), action="append",
                        help="one family (repeatable; default both)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))  # the replicas
    args.out.mkdir(parents=True, exist_ok=True)
    for family in args.family or sorted(UPSTREAM_DIRS):
        measure(args.upstream, family, args.out)


if __name__ == "__main__":
    main()

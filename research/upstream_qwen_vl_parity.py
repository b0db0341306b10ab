"""Measurement (docs/upstream.md, "The Qwen-VL family"): upstream's codebase-v2 HF code for its Qwen-VL family
(``Sa2VAChatModelQwen`` over Qwen2.5-VL and Qwen3-VL) against ours on the tiny replicas of tests/qwen_vl_fixtures.py,
both directions, and the test data it pins.

Direction A: our save_pretrained -> upstream's Sa2VAChatConfigQwen.from_pretrained + Sa2VAChatModelQwen + strict load
-> its forward. Direction B: upstream's save_pretrained -> our load_pretrained -> our forward. Prints
max |ours - upstream| per family and writes ``qwen_vl_upstream_reference_<family>.safetensors`` and
``qwen_vl_upstream_saved_<family>.json`` into ``--out`` (copied to tests/data/ by hand).

Third, ``predict``: upstream's own ``predict_forward`` (its chat template call, ``qwen_vl_utils.process_vision_info``,
the transformers processor with its pixel budget, ``generate`` with every hidden state, the [SEG] state through SAM2,
the mask at image size) against our ``predict`` on a replica whose head answers ``[SEG]<|im_end|>``
(``seg_then_stop_model``); writes ``qwen_vl_upstream_predict_<family>.safetensors`` (the answer and the mask).
``--qwen-vl-utils`` points at an unpacked qwen-vl-utils (``pip download qwen-vl-utils --no-deps``, unzip), which
upstream's predict path imports; without it the third part is skipped.

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


def measure_predict(checkout: Path, family: str, out: Path) -> dict:
    """Upstream's predict_forward against our predict on the [SEG]-then-stop replica (module doc, third part)."""
    import functools

    import numpy as np
    from qwen_vl_fixtures import (PREDICT_TEXT, predict_image, seg_then_stop_model, tiny_qwen_hf_processor,
                                  tiny_qwen_tokenizer)

    from projects.llava_sam2.rl_train.model.checkpoints.hf_checkpoint import save_pretrained
    from projects.llava_sam2.rl_train.model.pipeline.inference import predict
    from projects.llava_sam2.rl_train.model.text.qwen_processor import Sa2VAQwenProcessor

    tokenizer = tiny_qwen_tokenizer()
    ours = seg_then_stop_model(family, tokenizer)
    hf_processor = tiny_qwen_hf_processor(family, tokenizer)
    upstream = load_upstream(checkout, family, ours.config.grounding)
    save_pretrained(ours, out / f"predict_saved_{family}")
    config = upstream.Config.from_pretrained(str(out / f"predict_saved_{family}"))
    for sub in (config, config.text_config, config.vision_config):
        sub._attn_implementation = "eager"
    theirs = upstream.Model(config)
    theirs.load_state_dict(load_file(str(out / f"predict_saved_{family}/model.safetensors")), strict=True)
    theirs = theirs.float().eval()
    # predict_forward casts the SAM2 input to bf16 (an attribute and a default argument): fp32 here, like the weights
    theirs.torch_dtype = torch.float32
    # its SAM2 input resize is built for 1024 px in the constructor: the replica's SAM2 size instead
    theirs.extra_image_processor = type(theirs.extra_image_processor)(target_length=ours.config.sam_image_size)
    encoder = theirs.grounding_encoder
    encoder.preprocess_image = functools.partial(type(encoder).preprocess_image, encoder, dtype=torch.float32)

    def cpu_state(images):  # its SAM2 state names CUDA as the device; this run is on the CPU
        state = type(encoder).get_sam2_embeddings(encoder, images)
        state["device"] = state["storage_device"] = torch.device("cpu")
        return state

    encoder.get_sam2_embeddings = cpu_state
    with torch.no_grad():
        reference = theirs.predict_forward(image=predict_image(), text=PREDICT_TEXT, processor=hf_processor)
    processor = Sa2VAQwenProcessor.from_config(tokenizer, ours.config, image_processor=hf_processor.image_processor)
    mine = predict(ours, processor, predict_image(), PREDICT_TEXT)
    masks_up = np.stack([m[0] for m in reference["prediction_masks"]])  # [n_seg, H, W] (one frame each)
    masks_ours = np.stack(mine["prediction_masks"])
    result = {"prediction_upstream": reference["prediction"], "prediction_ours": mine["prediction"],
              "mask_pixels_upstream": int(masks_up.sum()), "mask_pixels_differing": int((masks_up != masks_ours).sum())}
    print(family, "predict:", result)
    save_file({"masks": torch.from_numpy(masks_up.astype(np.uint8))},
              str(out / f"qwen_vl_upstream_predict_{family}.safetensors"),
              metadata={"prediction": reference["prediction"], "transformers": transformers.__version__,
                        "upstream": f"bytedance/Sa2VA codebase v2, {UPSTREAM_DIRS[family]} predict_forward"})
    return result


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
    parser.add_argument("--qwen-vl-utils", type=Path, help="folder holding an unpacked qwen_vl_utils package")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))  # the replicas
    if args.qwen_vl_utils:
        sys.path.insert(0, str(args.qwen_vl_utils))
        import qwen_vl_utils  # noqa: F401  (the real one, before load_upstream's stand-in)
    args.out.mkdir(parents=True, exist_ok=True)
    for family in args.family or sorted(UPSTREAM_DIRS):
        measure(args.upstream, family, args.out)
        if args.qwen_vl_utils:
            measure_predict(args.upstream, family, args.out)


if __name__ == "__main__":
    main()

"""Reference outputs of upstream Sa2VA's own video inference on the tiny replica (tests/data/video_parity_tiny.npz).

Upstream's HF ``predict_forward(video=...)`` (magic-research/Sa2VA, ``projects/llava_sam2/hf/models``) is run on the
weights of ``tests/video_parity_model.memory_stressed_model`` (``assets/tiny_shapes_pretrained`` with its SAM2 memory
path made to matter), written with our ``save_pretrained`` (HF layout), for one seeded ShapesVideoWorld clip;
``tests/test_video_inference.py::test_masklet_logits_equal_upstream_predict_forward`` compares ours with it.
Upstream's code is copied to a temporary folder and patched there, never into this repository:

* sizes: its SAM2 builder hard-codes Hiera-L (1024 px) and its generation setup 448 px tiles; they become the tiny
  preset's (Hiera 16-d, 256 px, 224 px tiles);
* CPU: ``.cuda()`` is an identity and the video state lives on the CPU;
* ``timm`` (not installed) gives only ``DropPath``, an identity at inference;
* dtype (``--variant fp32``, what the test pins): upstream rounds the SAM2 normalisation constants and the stored
  memory features to bf16 whatever the model dtype (no-ops under its own bf16 inference); the fp32 variant drops
  both roundings, the ``exact`` variant keeps them (it differs from ours by up to ~0.25 in logit, see
  docs/architecture.md "Video inference").

Usage (upstream checked out at UPSTREAM)::

    python -m research.video_parity_upstream --upstream UPSTREAM/projects/llava_sam2/hf/models \
        --out tests/data/video_parity_tiny.npz [--variant fp32|exact]
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
NUM_FRAMES, FRAME_SIZE, MAX_NEW_TOKENS = 12, 64, 12

TINY_SAM2 = [("embed_dim = 144", "embed_dim = 16"), ("num_heads = 2\n", "num_heads = 1\n"),
             ("stages = [2, 6, 36, 4]", "stages = [1, 2, 2, 1]"),
             ("global_att_blocks = [23, 33, 43]", "global_att_blocks = [4]"),
             ("window_pos_embed_bkg_spatial_size = [7, 7]", "window_pos_embed_bkg_spatial_size = [4, 4]"),
             ("window_spec = [8, 4, 16, 8]", "window_spec = [8, 4, 8, 8]"),
             ("backbone_channel_list = [1152, 576, 288, 144]", "backbone_channel_list = [128, 64, 32, 16]"),
             ("[32, 32]", "[16, 16]"), ("= 256", "= 32"), ("= 64", "= 16"),
             ("dim_feedforward = 2048", "dim_feedforward = 64"), ("num_layers = 4", "num_layers = 1"),
             ("ret = MaskDownSampler(\n", "ret = MaskDownSampler(embed_dim=32,\n"),
             ("ret = MemoryEncoder(\n", "ret = MemoryEncoder(in_dim=32,\n")]


def _replace(text: str, pairs, where: str) -> str:
    for old, new in pairs:
        if old not in text:
            raise SystemExit(f"{where}: {old!r} not found; upstream changed, update the patch")
        text = text.replace(old, new)
    return text


def patched_copy(upstream: Path, root: Path, variant: str) -> str:
    """Copy upstream's HF model folder to ``root/<package>`` and size it to the tiny preset (module doc)."""
    package = f"sa2va_upstream_{variant}"
    shutil.copytree(upstream, root / package)
    (root / package / "__init__.py").touch()
    path = root / package / "sam2.py"
    text = path.read_text()
    start, end = text.index("    def build_image_encoder(self):"), text.index("    def inject_language_embd(")
    text = text[:start] + _replace(text[start:end], TINY_SAM2, "sam2.py builders") + text[end:]
    text = _replace(text, [("image_size = 1024,", "image_size = 256,"),
                           ('torch.device("cuda")', 'torch.device("cpu")')], "sam2.py")
    if variant == "fp32":
        text = _replace(text, [("maskmem_features = maskmem_features.to(torch.bfloat16)", "pass"),
                               ("dtype=torch.bfloat16) -> torch.Tensor:", "dtype=torch.float32) -> torch.Tensor:")],
                        "sam2.py (bf16 roundings)")
    path.write_text(text)
    path = root / package / "modeling_intern_vit.py"
    path.write_text(_replace(path.read_text(), [("from timm.models.layers import DropPath",
                                                 "from torch.nn import Identity as DropPath")], path.name))
    path = root / package / "modeling_sa2va_chat.py"
    path.write_text(_replace(path.read_text(), [("self.image_size = 448", "self.image_size = 224"),
                                                ("DirectResize(target_length=1024, )",
                                                 "DirectResize(target_length=256, )")], path.name))
    return package


def clip() -> tuple[np.ndarray, str]:
    """The first NUM_FRAMES frames of ShapesVideoWorld('val', seed 0) clip 0 and a RES question about its object."""
    from projects.llava_sam2.rl_train.data.shapes_video import ShapesVideoWorld

    sample = ShapesVideoWorld("val", num_samples=4, seed=0, image_size=FRAME_SIZE).load(0)
    frames = np.stack([np.asarray(frame) for frame in sample.frames[:NUM_FRAMES]])  # [T, H, W, 3] uint8
    return frames, f"<image>\n Please segment {sample.expressions[0]} in this image."


def run_upstream(package: str, weights: Path, frames: np.ndarray, text: str) -> dict[str, np.ndarray]:
    """Upstream ``predict_forward(video=...)`` in fp32 on CPU; records the prompt ids and each [SEG]'s masklet
    logits at SAM2's low resolution (read from the video predictor's state after propagation)."""
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # upstream calls .cuda() unconditionally
    chat = importlib.import_module(f"{package}.modeling_sa2va_chat")
    config = importlib.import_module(f"{package}.configuration_sa2va_chat").Sa2VAChatConfig(
        **json.loads((weights / "config.json").read_text()))
    model = chat.Sa2VAChatModel(config, use_flash_attn=False)
    missing, unexpected = model.load_state_dict(load_file(weights / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise SystemExit(f"upstream model does not take the asset's keys: missing {missing}, unexpected {unexpected}")
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(weights)
    model.preparing_for_generation(tokenizer, max_new_tokens=MAX_NEW_TOKENS, torch_dtype=torch.float32)
    seen: dict[str, list] = {"low_res": []}
    inference = model.grounding_encoder.language_embd_inference

    def recording_inference(state, language_embd):
        out = inference(state, language_embd)
        bank = state["output_dict"]
        seen["low_res"].append(torch.stack([
            (bank["cond_frame_outputs"].get(t) or bank["non_cond_frame_outputs"][t])["pred_masks"][0, 0].float()
            for t in range(state["num_frames"])]).numpy())  # [T, h, w]
        return out

    generate = model.generate

    def recording_generate(**kwargs):
        seen["input_ids"] = kwargs["input_ids"][0].numpy()
        return generate(**kwargs)

    model.grounding_encoder.language_embd_inference = recording_inference
    model.generate = recording_generate
    with torch.no_grad():
        result = model.predict_forward(video=[Image.fromarray(f) for f in frames], text=text, tokenizer=tokenizer)
    return {"prediction": np.array(result["prediction"]), "input_ids": seen["input_ids"],
            "low_res_logits": np.stack(seen["low_res"]).astype(np.float32),  # [M, T, h, w]
            "masks": np.stack(result["prediction_masks"]).astype(bool)}  # [M, T, H, W]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="upstream projects/llava_sam2/hf/models")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", choices=("fp32", "exact"), default="fp32")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from video_parity_model import asset_sha256, memory_stressed_model

    from projects.llava_sam2.rl_train.model import save_pretrained

    frames, text = clip()
    with tempfile.TemporaryDirectory() as root:
        model, tokenizer = memory_stressed_model()
        weights = Path(root) / "weights"
        save_pretrained(model, weights)
        tokenizer.save_pretrained(weights)
        package = patched_copy(args.upstream, Path(root), args.variant)
        sys.path.insert(0, root)
        reference = run_upstream(package, weights, frames, text)
    np.savez_compressed(args.out, frames=frames, text=np.array(text), variant=np.array(args.variant),
                        asset_sha256=np.array(asset_sha256()), **reference)
    print(f"{args.out}: {reference['prediction']!r}, masklets {reference['low_res_logits'].shape}")


if __name__ == "__main__":
    main()

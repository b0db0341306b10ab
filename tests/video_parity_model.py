"""The model of the video parity reference (tests/test_video_inference.py, research/video_parity_upstream.py).

``assets/tiny_shapes_pretrained`` reads its text and answers "Sure, [SEG].", but its SAM2 memory path was never
trained: its object pointers move a masklet by ~1e-5 (by ~0.3 after the edits) and every object score is positive,
so a parity check on it could not see a wrong pointer or a wrong "object absent" branch. ``memory_stressed_model`` makes both matter, by
fixed edits of three SAM2 tensors: the pointer projection's output ×200, a seeded ``no_obj_ptr`` of scale 50, and the
object-score bias lowered by 0.06 so that the conditioning frames' objects read as absent and later frames' as
present on the parity clip.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

ASSET = Path(__file__).parents[1] / "projects/llava_sam2/rl_train/assets/tiny_shapes_pretrained"


def asset_sha256() -> str:
    """Hash of the asset's weights (the reference is valid for these weights only)."""
    return hashlib.sha256((ASSET / "model.safetensors").read_bytes()).hexdigest()


def memory_stressed_model():
    """``(model in eval mode with a bound tokenizer, tokenizer)``: the asset with the edits of the module doc."""
    from transformers import AutoTokenizer

    from projects.llava_sam2.rl_train.model import load_pretrained

    model, tokenizer = load_pretrained(str(ASSET)), AutoTokenizer.from_pretrained(str(ASSET))
    model.bind_tokenizer(tokenizer)
    model.eval()
    sam = model.grounding_encoder.sam2_model
    with torch.no_grad():
        projection = sam.obj_ptr_proj.layers[-1]
        projection.weight.mul_(200.0)
        projection.bias.mul_(200.0)
        sam.no_obj_ptr.copy_(50.0 * torch.randn(sam.no_obj_ptr.shape, generator=torch.Generator().manual_seed(0)))
        sam.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.sub_(0.06)
    return model, tokenizer

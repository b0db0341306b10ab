"""Tiny Sa2VA-Qwen replicas (Qwen2.5-VL and Qwen3-VL text + vision towers, tiny SAM2): the config.json shape of
upstream's codebase-v2 converter for its Qwen-VL family, deterministic weights, one fixed input, our outputs on it.

tests/test_qwen_vl.py uses it, and so does research/upstream_qwen_vl_parity.py, the run of upstream's own HF code
(``Sa2VAChatModelQwen``) that wrote tests/data/qwen_vl_upstream_*.{safetensors,json} (docs/upstream.md): both sides
see the same weights and the same input.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.network.presets import _TINY_GROUNDING
from projects.llava_sam2.rl_train.model.network.qwen_vl import (QWEN_IMAGE_TOKEN, QWEN_VL_ARCHITECTURES,
                                                                QWEN_VL_AUTO_MAP, Sa2VAQwenConfig, Sa2VAQwenModel)
from projects.llava_sam2.rl_train.model.text.tokenizer import load_tiny_tokenizer

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
# Qwen-VL's vision markers, added to the tiny tokenizer after Sa2VA's tokens (ids differ from the released ones)
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", QWEN_IMAGE_TOKEN, "<|video_pad|>")
GRID_THW = (1, 4, 6)  # one image of 4 x 6 patches: 2 x 3 = 6 LLM tokens after the 2 x 2 merge (non-square on purpose)
MASK_PIN_STRIDE = 4
WEIGHT_NOISE = 0.02
SEG_PROMPT = "Please segment the red circle in this image."


def tiny_qwen_tokenizer():
    tokenizer = load_tiny_tokenizer()
    tokenizer.add_tokens(list(QWEN_VISION_TOKENS), special_tokens=True)
    return tokenizer


def _text(family: str, tokenizer) -> dict:
    """The released text configs name <|im_end|> as EOS (what generate stops at) and <|endoftext|> as BOS."""
    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
            "vocab_size": len(tokenizer), "tie_word_embeddings": False,
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>")}
    if family == "qwen2_5_vl":
        return {**text, "model_type": "qwen2_5_vl_text", "rope_theta": 1000000.0,
                "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]}}
    return {**text, "model_type": "qwen3_vl_text", "head_dim": 16, "rope_theta": 5000000.0, "attention_bias": False,
            "rope_scaling": {"rope_type": "default", "mrope_interleaved": True, "mrope_section": [2, 3, 3]}}


def _vision(family: str) -> dict:
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64}
    if family == "qwen2_5_vl":  # block 0 windowed (a 2 x 2 merged-token window), block 1 full
        return {**vision, "model_type": "qwen2_5_vl", "hidden_act": "silu", "patch_size": 14, "window_size": 56,
                "fullatt_block_indexes": [1], "tokens_per_second": 2}
    return {**vision, "model_type": "qwen3_vl", "hidden_act": "gelu_pytorch_tanh", "patch_size": 16,
            "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}


def tiny_qwen_config(family: str) -> Sa2VAQwenConfig:
    tokenizer = tiny_qwen_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_VISION_TOKENS}
    data = {"text_config": _text(family, tokenizer), "vision_config": _vision(family),
            "image_token_id": ids[QWEN_IMAGE_TOKEN], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
            "tie_word_embeddings": False, "template": "qwen_chat", "architectures": list(QWEN_VL_ARCHITECTURES),
            "auto_map": dict(QWEN_VL_AUTO_MAP), "torch_dtype": "float32",
            "grounding_config": copy.deepcopy(_TINY_GROUNDING)}
    return Sa2VAQwenConfig(data)


def tiny_qwen_model(family: str, seed: int = 0) -> Sa2VAQwenModel:
    """fp32 replica: torch's initialisation under ``seed``, then N(0, WEIGHT_NOISE²) on every parameter in name
    order."""
    torch.manual_seed(seed)
    model = Sa2VAQwenModel(tiny_qwen_config(family), attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.add_(torch.randn(param.shape, generator=generator) * WEIGHT_NOISE)
    return model.eval()


def reference_inputs(tokenizer, config: Sa2VAQwenConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """One image's patches and grid, its SAM2 image, and a teacher-forced qwen_chat exchange with one ``[SEG]``."""
    generator = torch.Generator().manual_seed(seed)
    vision = config.data["vision_config"]
    t, h, w = GRID_THW
    patch_width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    n_tokens = t * h * w // vision["spatial_merge_size"] ** 2
    S_sam = config.sam_image_size
    text = (f"<|im_start|>user\n<|vision_start|>{QWEN_IMAGE_TOKEN * n_tokens}<|vision_end|>{SEG_PROMPT}<|im_end|>\n"
            "<|im_start|>assistant\nSure, [SEG].<|im_end|>")
    return {
        "pixel_values": torch.randn(t * h * w, patch_width, generator=generator),  # [P, C·t·p²]
        "image_grid_thw": torch.tensor([GRID_THW]),  # [1, 3]
        "g_pixel_values": torch.rand(1, 3, S_sam, S_sam, generator=generator) * 255,  # [B, 3, S_sam, S_sam]
        "input_ids": torch.tensor([tokenizer.encode(text, add_special_tokens=False)]),  # [1, L]
    }


@torch.no_grad()
def our_outputs(model: Sa2VAQwenModel, tokenizer, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """logits [L, V], the [SEG] prompt [1, C_sam], the chosen mask's logits at the SAM2 input size [1, S, S]."""
    model.bind_tokenizer(tokenizer)
    ids = inputs["input_ids"]
    out = model.llm_forward(ids, torch.ones_like(ids), inputs["pixel_values"], inputs["image_grid_thw"])
    seg_rows = (ids[0] == model.seg_token_id).nonzero()[:, 0]
    prompt = model.seg_hidden_to_prompt(out.hidden_states[-1][0, seg_rows])  # [1, C_sam]
    features = model.encode_grounding(inputs["g_pixel_values"])
    decoded = model.decode_masks(prompt, features, torch.zeros(len(prompt), dtype=torch.long))
    S_sam = model.config.sam_image_size
    mask_logits = F.interpolate(decoded.best_logits[:, None], size=(S_sam, S_sam), mode="bilinear",
                                align_corners=False)[:, 0]
    return {"logits": out.logits[0], "seg_prompt": prompt, "mask_logits": mask_logits}


def pinned_outputs(outputs: dict[str, torch.Tensor], tokenizer, inputs: dict[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """What is kept as test data: logits from ``<|vision_end|>`` on [L', V] (every later position attends to all image
    tokens), the [SEG] prompt, and the mask logits on a stride-4 grid."""
    end = (inputs["input_ids"][0] == tokenizer.convert_tokens_to_ids("<|vision_end|>")).nonzero()[0, 0]
    return {"logits": outputs["logits"][end:].contiguous(), "seg_prompt": outputs["seg_prompt"],
            "mask_logits": outputs["mask_logits"][:, ::MASK_PIN_STRIDE, ::MASK_PIN_STRIDE].contiguous()}


def seg_writing_head(model: Sa2VAQwenModel, tokenizer, first_hidden: torch.Tensor) -> None:
    """Make the replica's greedy answers start with ``[SEG]``: the head scores only ``[SEG]`` (+v) and ``<|im_end|>``
    (-v), v = the final state of the first answer step, so step one writes ``[SEG]`` and every later step writes
    ``[SEG]`` or stops."""
    with torch.no_grad():
        head = model.model.lm_head.weight
        head.zero_()
        head[model.seg_token_id] = first_hidden
        head[tokenizer.convert_tokens_to_ids("<|im_end|>")] = -first_hidden


# A Qwen-style chat template for the tiny tokenizer (the released processors carry their own): an image content item
# becomes the one-pad image block the Qwen processors expand, string content is kept as it is.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PREDICT_TEXT = "<image>Please segment the circle."
PREDICT_IMAGE_SIZE = (70, 100)  # H, W


def predict_image():
    from PIL import Image
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 256, (*PREDICT_IMAGE_SIZE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def tiny_qwen_hf_processor(family: str, tokenizer):
    """The transformers processor of the family over the tiny tokenizer (what upstream's predict_forward is given)."""
    import transformers

    vision = _vision(family)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    image_processor = transformers.Qwen2VLImageProcessor(patch_size=vision["patch_size"], merge_size=2,
                                                         temporal_patch_size=2)
    if family == "qwen2_5_vl":
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        return transformers.Qwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                                video_processor=Qwen2VLVideoProcessor(),
                                                chat_template=TINY_CHAT_TEMPLATE)
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return transformers.Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                         video_processor=Qwen3VLVideoProcessor(patch_size=16),
                                         chat_template=TINY_CHAT_TEMPLATE)


def seg_then_stop_model(family: str, tokenizer) -> Sa2VAQwenModel:
    """The replica with a head that answers ``PREDICT_TEXT`` about ``predict_image()`` with ``[SEG]<|im_end|>``: the
    head's ``[SEG]`` and ``<|im_end|>`` rows (u, v) solve u·h0 = 1, v·h0 = 0, u·h1 = 0, v·h1 = 1 for the final
    states h0 (first answer step) and h1 (after ``[SEG]`` is fed back), every other row 0: greedy decoding writes
    ``[SEG]``, then stops, whatever the rest of the weights say."""
    from projects.llava_sam2.rl_train.model.text.qwen_processor import Sa2VAQwenProcessor

    model = tiny_qwen_model(family)
    model.bind_tokenizer(tokenizer)
    image_processor = tiny_qwen_hf_processor(family, tokenizer).image_processor
    processor = Sa2VAQwenProcessor.from_config(tokenizer, model.config, image_processor=image_processor)
    inputs = processor.preprocess_image(predict_image())
    prompt = processor.template_user_turn(processor.expand_image(PREDICT_TEXT, inputs.n_tiles))
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=True) + [model.seg_token_id]])
    with torch.no_grad():
        hidden = model.llm_forward(ids, torch.ones_like(ids), inputs.pixel_values,
                                   inputs.image_grid_thw[None]).hidden_states[-1][0, -2:]  # [2, D]: h0, h1
        rows = torch.linalg.pinv(hidden.double()).T.float()  # [2, D]: rows[i]·h_j = δ_ij
        head = model.model.lm_head.weight
        head.zero_()
        head[model.seg_token_id] = rows[0]
        head[tokenizer.convert_tokens_to_ids("<|im_end|>")] = rows[1]
    return model

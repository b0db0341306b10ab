"""A tiny Sa2VA-InternVL3 replica: tiny sizes in the config.json shape of upstream's codebase-v2 export for the
InternVL3 family (docs/sa2va_internals.md §9), deterministic weights, one fixed input, and our model's outputs on it.

tests/test_internvl3.py uses it, and so does research/upstream_v2_parity.py, the run of upstream's own HF code that
wrote tests/data/internvl3_upstream_*.{safetensors,json} (docs/upstream.md, "Parity with upstream's HF code"): both
sides see the same weights and the same input, so the pinned outputs compare like for like.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from projects.llava_sam2.rl_train.model.network.configuration import Sa2VAConfig
from projects.llava_sam2.rl_train.model.network.presets import build_preset
from projects.llava_sam2.rl_train.model.network.sa2va import Sa2VAModel

# Keys the InternVL3 base config carries into a Sa2VA-InternVL3 config.json beside the ones we interpret.
INTERNVL3_TOP_LEVEL_EXTRAS = {"image_fold": None, "system_message": None, "use_backbone_lora": 0, "use_llm_lora": 0,
                              "pad2square": False, "output_attentions": False, "transformers_version": "4.48.0"}
INTERNVL3_LLM_EXTRAS = {
    "_name_or_path": "./pretrained/Qwen2.5-1.5B-Instruct", "attention_dropout": 0.0, "initializer_range": 0.02,
    "max_window_layers": 70, "moe_config": None, "sliding_window": None, "use_bfloat16": True, "use_cache": False,
    "rope_scaling": {"factor": 2.0, "rope_type": "dynamic", "type": "dynamic"},
}
INTERNVL3_VISION_EXTRAS = {
    "_name_or_path": "OpenGVLab/InternViT-300M-448px-V2_5", "attention_dropout": 0.0, "dropout": 0.0,
    "drop_path_rate": 0.1, "initializer_range": 1e-10, "use_flash_attn": False, "use_moe": False, "num_experts": 8,
    "auto_map": {"AutoConfig": "configuration_intern_vit.InternVisionConfig",
                 "AutoModel": "modeling_intern_vit.InternVisionModel"},
}
# A Qwen3 LLM in that config.json (upstream's v2 InternVL-family code builds Qwen3ForCausalLM): the fields a Qwen3
# config.json carries beside the tiny_qwen3 preset's, without RoPE scaling
QWEN3_LLM_EXTRAS = {
    "_name_or_path": "./pretrained/Qwen3", "attention_dropout": 0.0, "initializer_range": 0.02,
    "max_window_layers": 28, "sliding_window": None, "use_cache": False, "rope_scaling": None,
}
# qwen3_tied: with tied input embeddings and LM head, as the small Qwen3 checkpoints (0.6B to 4B) have them
LLM_PRESETS = {"qwen2": ("tiny", INTERNVL3_LLM_EXTRAS), "qwen3": ("tiny_qwen3", QWEN3_LLM_EXTRAS),
               "qwen3_tied": ("tiny_qwen3", {**QWEN3_LLM_EXTRAS, "tie_word_embeddings": True})}
MASK_PIN_STRIDE = 4  # the pinned mask logits keep every 4th row and column of the S_sam x S_sam map
WEIGHT_NOISE = 0.02  # added to every initialised parameter, so no bias is zero and no norm weight exactly 1
SEG_PROMPT = "Please segment the red circle in this image."


def tiny_internvl3_config(llm: str = "qwen2") -> Sa2VAConfig:
    """The replica's config; ``llm``: a key of ``LLM_PRESETS`` (``qwen2``: Qwen2.5, as released)."""
    preset, llm_extras = LLM_PRESETS[llm]
    data = build_preset(preset).to_dict()
    data.update(copy.deepcopy(INTERNVL3_TOP_LEVEL_EXTRAS))
    data["template"] = "qwen_chat"
    data["llm_config"].update(copy.deepcopy(llm_extras))
    data["vision_config"].update(copy.deepcopy(INTERNVL3_VISION_EXTRAS))
    return Sa2VAConfig.from_dict(data)


def tiny_internvl3_model(seed: int = 0, llm: str = "qwen2") -> Sa2VAModel:
    """fp32 replica: torch's initialisation under ``seed``, then N(0, WEIGHT_NOISE²) added to every parameter in
    name order from its own generator; with tied embeddings the LM head is then a copy of the input embeddings."""
    torch.manual_seed(seed)
    model = Sa2VAModel(tiny_internvl3_config(llm), attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.add_(torch.randn(param.shape, generator=generator) * WEIGHT_NOISE)
    if model.config.llm_config.get("tie_word_embeddings"):
        with torch.no_grad():
            model.language_model.lm_head.weight.copy_(model.language_model.get_input_embeddings().weight)
    return model.eval()


def reference_inputs(tokenizer, config: Sa2VAConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """One tile, its SAM2 image, and a teacher-forced qwen_chat exchange whose answer holds one ``[SEG]``."""
    generator = torch.Generator().manual_seed(seed)
    S, S_sam = config.image_size, config.sam_image_size
    image_block = "<img>" + "<IMG_CONTEXT>" * config.num_image_token + "</img>"
    text = (f"<|im_start|>user\n{image_block}\n{SEG_PROMPT}<|im_end|>\n"
            "<|im_start|>assistant\nSure, [SEG].<|im_end|>")
    return {
        "pixel_values": torch.randn(1, 3, S, S, generator=generator),  # one normalised tile [n, 3, S, S]
        "g_pixel_values": torch.rand(1, 3, S_sam, S_sam, generator=generator) * 255,  # [B, 3, S_sam, S_sam]
        "input_ids": torch.tensor([tokenizer.encode(text, add_special_tokens=False)]),  # [1, L]
    }


@torch.no_grad()
def our_outputs(model: Sa2VAModel, tokenizer, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """logits [L, V], the [SEG] prompt [1, C_sam] and the chosen mask's logits at the SAM2 input size [1, S, S]
    (the resolution upstream's video predictor returns before resizing to the image)."""
    model.bind_tokenizer(tokenizer)
    ids = inputs["input_ids"]
    tiles = model.project_vision(model.encode_vision(inputs["pixel_values"]))  # [1, t, D]
    embeds = model.embed_inputs(ids, [model.build_image_embeds(tiles)])  # [1, L, D]
    out = model.language_model(inputs_embeds=embeds, output_hidden_states=True)
    seg_rows = (ids[0] == model.seg_token_id).nonzero()[:, 0]  # positions whose input is [SEG]
    prompt = model.seg_hidden_to_prompt(out.hidden_states[-1][0, seg_rows])  # [1, C_sam]
    features = model.encode_grounding(inputs["g_pixel_values"])
    decoded = model.decode_masks(prompt, features, torch.zeros(len(prompt), dtype=torch.long))
    S_sam = model.config.sam_image_size
    mask_logits = F.interpolate(decoded.best_logits[:, None], size=(S_sam, S_sam), mode="bilinear",
                                align_corners=False)[:, 0]  # [1, S_sam, S_sam]
    return {"logits": out.logits[0], "seg_prompt": prompt, "mask_logits": mask_logits}


def pinned_outputs(outputs: dict[str, torch.Tensor], tokenizer, inputs: dict[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """The part of ``our_outputs`` kept as test data: logits from ``</img>`` on (every later position attends to all
    image tokens, so the image path and the LLM both show there) [L', V], the [SEG] prompt, and the mask logits on a
    stride-4 grid [1, S_sam/4, S_sam/4]."""
    img_end = (inputs["input_ids"][0] == tokenizer.convert_tokens_to_ids("</img>")).nonzero()[0, 0]
    return {"logits": outputs["logits"][img_end:].contiguous(), "seg_prompt": outputs["seg_prompt"],
            "mask_logits": outputs["mask_logits"][:, ::MASK_PIN_STRIDE, ::MASK_PIN_STRIDE].contiguous()}

"""The grounding half every Sa2VA family shares: ``[SEG]`` state → ``text_hidden_fcs`` → SAM2 prompt → masks.

Both families (InternVL: ``sa2va.Sa2VAModel``; Qwen-VL: ``qwen_vl.Sa2VAQwenModel``) hold the same two modules under
the same checkpoint names, ``text_hidden_fcs`` and ``grounding_encoder.sam2_model``, and use them identically; only
how the LLM sees the image differs. The mixin needs ``self.text_hidden_fcs``, ``self.grounding_encoder`` and
``self.config.sam_image_size``.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .grounding import GroundingFeatures, MaskDecoderOutput, logits_to_masks


def build_text_hidden_fcs(llm_hidden: int, sam_hidden: int) -> nn.Sequential:
    """Linear(D→D) → ReLU → Linear(D→C_sam) → Dropout(0); keys ``text_hidden_fcs.{0,2}``."""
    return nn.Sequential(nn.Linear(llm_hidden, llm_hidden), nn.ReLU(inplace=True), nn.Linear(llm_hidden, sam_hidden),
                         nn.Dropout(0.0))


class SegGroundingMixin:
    """``[SEG]`` hidden states to SAM2 masks (image and video)."""

    def seg_hidden_to_prompt(self, seg_hidden: torch.Tensor) -> torch.Tensor:
        """text_hidden_fcs: [SEG] final-norm hidden [M, D] → SAM2 prompt [M, C_sam]."""
        return self.text_hidden_fcs(seg_hidden.to(self.text_hidden_fcs[0].weight.dtype))

    def encode_grounding(self, g_pixel_values: torch.Tensor, keep_memory_inputs: bool = False) -> GroundingFeatures:
        """g_pixel_values [B, 3, S_sam, S_sam] (0..255) → frozen SAM2 features (no grad); ``keep_memory_inputs``
        for frames that ``propagate_masklets`` will track."""
        return self.grounding_encoder.encode(g_pixel_values, keep_memory_inputs)

    def propagate_masklets(self, prompt: torch.Tensor, features: GroundingFeatures, num_cond_frames: int,
                           clip_index: torch.Tensor | None = None, num_clips: int = 1) -> torch.Tensor:
        """prompt [M, C_sam] over the T frames of ``features`` → masklet logits [M, T, h, w] (SAM2 memory
        propagation; frames before ``num_cond_frames`` get the prompt). ``features`` may stack ``num_clips``
        clips clip-major, ``clip_index`` [M] naming each prompt's clip (``GroundingEncoder.propagate``)."""
        return self.grounding_encoder.propagate(prompt, features, num_cond_frames, clip_index, num_clips)

    def decode_masks(self, prompt: torch.Tensor, features: GroundingFeatures, image_index: torch.Tensor
                     ) -> MaskDecoderOutput:
        """prompt [M, C_sam], image_index [M] (rows of ``features``) → multimask logits [M, 3, h, w]."""
        return self.grounding_encoder.decode(prompt, features, image_index)

    def logits_to_masks(self, best_logits: torch.Tensor, sizes: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
        """best_logits [M, h, w] → M bool masks [H, W] (bilinear h→S_sam→(H, W), sigmoid > 0.5)."""
        return logits_to_masks(best_logits, list(sizes), self.config.sam_image_size)

"""``Sa2VAQwenProcessor``: the Qwen-VL family's inputs (upstream ``Sa2VAChatModelQwen.predict_forward``).

Per image, as upstream's predict path: the image is first resized to a multiple of 28 px with at most 16384 and at
least 4 tokens' worth of pixels (``smart_resize``, bicubic: what upstream's ``qwen_vl_utils.process_vision_info``
does), then the checkpoint's Qwen image processor turns it into patches ``pixel_values [P, C·t·p²]`` and
``image_grid_thw [3]`` with upstream's pixel budget (512·28² .. 2048·28²); the SAM2 input is the direct 1024 px
resize as in the InternVL family. The image block is ``<|vision_start|>`` + one ``<|image_pad|>`` per LLM image
token + ``<|vision_end|>`` before the user text (upstream's message puts the image first and drops ``<image>``), and
the user turn is the tokenizer's chat template when it has one (upstream calls ``apply_chat_template``), else
qwen_chat.

The family has no region (visual-prompt) input upstream (its SFT configs leave the visual-prompt data out, "not
supported yet"), so its ``<vp>`` tokens were never trained and a mask-pooled region prompt would be an input the LLM
never learned to read. A region is instead drawn into the image (``region_outline``, a ``drawn_region.RegionOutline``:
its outline in red), which the base Qwen-VL models' visual-prompt ability can read, and the caption question names the
outline. ``caption_prompt`` / ``region_cells`` (the InternVL region-token path) raise.

It answers the calls the shared pipeline makes of a processor; where the InternVL processor speaks of tiles
(``n_tiles``), this one's count is LLM image tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
from xtuner.utils import PROMPT_TEMPLATE

from .constants import IMAGE_PLACEHOLDER, SEG_TOKEN
from .drawn_region import RegionOutline
from .processor import Sa2VAProcessor
from .prompts import RES_EVAL_PROMPT
from .tiling import check_rgb_image, sam_pixel_values
from .tokenizer import load_tiny_tokenizer, load_tokenizer

QWEN_VISION_START, QWEN_VISION_END, QWEN_IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
# upstream predict_forward: the pre-resize of qwen_vl_utils (factor 28, 4..16384 tokens), then the processor's budget
PRE_RESIZE_FACTOR = 28
PRE_RESIZE_PIXELS = (4 * 28 * 28, 16384 * 28 * 28)
PROCESSOR_PIXELS = (512 * 28 * 28, 2048 * 28 * 28)
# Qwen-VL's vision markers, in the order they are appended to the tiny tokenizer (tiny_qwen_vl_tokenizer)
QWEN_VL_VISION_TOKENS = (QWEN_VISION_START, QWEN_VISION_END, QWEN_IMAGE_PAD, "<|video_pad|>")


def tiny_qwen_vl_tokenizer():
    """The shipped tiny tokenizer with Qwen-VL's vision markers appended as special tokens: the text side of the tiny
    Qwen-VL presets and of ``bench rl-step`` on this family's presets (its ids fit inside every released vocabulary;
    only the texts differ)."""
    tokenizer = load_tiny_tokenizer()
    tokenizer.add_tokens(list(QWEN_VL_VISION_TOKENS), special_tokens=True)
    return tokenizer


def vision_token_fields(tokenizer) -> dict[str, int]:
    """The config.json fields naming the vision markers (what transformers' Qwen-VL code finds images by), as
    ``tokenizer``'s ids."""
    start, end, pad, video = (tokenizer.convert_tokens_to_ids(t) for t in QWEN_VL_VISION_TOKENS)
    return {"image_token_id": pad, "video_token_id": video, "vision_start_token_id": start, "vision_end_token_id": end}


@dataclass(frozen=True)
class QwenImageInputs:
    """One image for both paths.

    pixel_values: float [P, C·t·p²], the Qwen vision patches. image_grid_thw: long [3] (t, h, w) in patches.
    g_pixel_values: float [3, S_sam, S_sam], 0..255, the SAM2 input. size: (H, W) of the original image.
    n_tiles: LLM image tokens, t·h·w / merge² (the shared pipeline's name for an image's token block).
    """

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    g_pixel_values: torch.Tensor
    size: tuple[int, int]
    n_tiles: int


class Sa2VAQwenProcessor:
    """Tokenizer + Qwen image processor, with upstream predict_forward's image budget."""

    prompt_length_multiple: int | None = None
    """As ``Sa2VAProcessor.prompt_length_multiple``."""

    def __init__(self, tokenizer: Any, image_processor: Any, *, sam_image_size: int = 1024,
                 min_pixels: int = PROCESSOR_PIXELS[0], max_pixels: int = PROCESSOR_PIXELS[1],
                 region_outline: RegionOutline | None = None) -> None:
        for token in (QWEN_VISION_START, QWEN_VISION_END, QWEN_IMAGE_PAD, SEG_TOKEN):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise ValueError(f"tokenizer does not know {token!r}: use the processor saved with the Sa2VA-Qwen "
                                 "checkpoint (a Qwen-VL tokenizer with Sa2VA's special tokens)")
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.template_name = "qwen_chat"
        self.template = PROMPT_TEMPLATE.qwen_chat  # stop words (<|im_end|>, <|endoftext|>) and the fallback turn
        self.sam_image_size = sam_image_size
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.region_outline = region_outline or RegionOutline()  # loop 1's region input: the region drawn in
        self.merge_size = int(image_processor.merge_size)
        self.seg_token_id = tokenizer.convert_tokens_to_ids(SEG_TOKEN)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
            tokenizer.convert_tokens_to_ids("<|endoftext|>")

    @classmethod
    def from_config(cls, tokenizer: Any, config: Any, image_processor: Any = None, **overrides: Any
                    ) -> "Sa2VAQwenProcessor":
        """From a ``Sa2VAQwenConfig``: a Qwen image processor with the vision tower's patch / merge / temporal sizes
        unless ``image_processor`` (the checkpoint's own, e.g. ``AutoImageProcessor.from_pretrained``) is given."""
        if image_processor is None:
            from transformers import Qwen2VLImageProcessor

            vision = config.data["vision_config"]
            image_processor = Qwen2VLImageProcessor(
                patch_size=int(vision["patch_size"]), merge_size=int(vision.get("spatial_merge_size", 2)),
                temporal_patch_size=int(vision.get("temporal_patch_size", 2)))
        return cls(tokenizer, image_processor, sam_image_size=config.sam_image_size, **overrides)

    @classmethod
    def from_pretrained(cls, path: Any, config: Any, **overrides: Any) -> "Sa2VAQwenProcessor":
        """The processor upstream's converter saves beside a Sa2VA-Qwen checkpoint: the tokenizer (with its chat
        template) and the image processor of the local directory ``path`` (nothing is downloaded)."""
        from transformers import AutoImageProcessor

        tokenizer = load_tokenizer(path)
        image_processor = AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
        return cls(tokenizer, image_processor, sam_image_size=config.sam_image_size, **overrides)

    # ----------------------------------------------------------------------------------- images
    def preprocess_image(self, image: Image.Image, where: str = "image") -> QwenImageInputs:
        check_rgb_image(image, where)
        height, width = smart_resize(image.height, image.width, factor=PRE_RESIZE_FACTOR,
                                     min_pixels=PRE_RESIZE_PIXELS[0], max_pixels=PRE_RESIZE_PIXELS[1])
        resized = image.resize((width, height), Image.BICUBIC)
        out = self.image_processor(images=[resized], return_tensors="pt", min_pixels=self.min_pixels,
                                   max_pixels=self.max_pixels)
        grid = out["image_grid_thw"][0].long()  # [3]
        return QwenImageInputs(pixel_values=out["pixel_values"], image_grid_thw=grid,
                               g_pixel_values=sam_pixel_values(image, self.sam_image_size),
                               size=(image.height, image.width), n_tiles=int(grid.prod()) // self.merge_size ** 2)

    def image_token_count(self, n_tiles: int) -> int:
        """``<|image_pad|>`` tokens of an image: its ``n_tiles`` (this family counts LLM image tokens)."""
        return n_tiles

    # ------------------------------------------------------------------------------------- text
    def expand_image(self, text: str, n_tiles: int, region_cells: Any = None) -> str:
        """Drop the single ``<image>`` and put the image block first, as upstream's message does."""
        if region_cells is not None:
            raise ValueError("the Qwen-VL family has no region (visual-prompt) token input, as upstream's "
                             "Sa2VAChatModelQwen; describe a region by drawing it into the image (region_outline: "
                             "what describe_masks does for this family)")
        if text.count(IMAGE_PLACEHOLDER) != 1:
            raise ValueError(f"user text must contain '<image>' exactly once, got {text.count(IMAGE_PLACEHOLDER)} in "
                             f"{text[:80]!r}")
        block = QWEN_VISION_START + QWEN_IMAGE_PAD * self.image_token_count(n_tiles) + QWEN_VISION_END
        return block + text.replace(IMAGE_PLACEHOLDER, "")

    def template_user_turn(self, text: str, round_index: int = 1) -> str:
        """The user turn and the assistant header: the tokenizer's chat template, else xtuner's qwen_chat."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return self.template.INSTRUCTION.format(input=text, round=round_index)

    def segment_text(self, n_tiles: int, expression: str, question: str | None = None) -> str:
        """Referring-segmentation user text (the RES eval prompt, or ``question`` with ``{class_name}``)."""
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"segment prompt: expression {expression!r} must be a non-empty string")
        text = RES_EVAL_PROMPT.format(sent=expression) if question is None else question.format(class_name=expression)
        if IMAGE_PLACEHOLDER not in text:
            text = IMAGE_PLACEHOLDER + "\n" + text
        return self.expand_image(text, n_tiles)

    def segment_prompt(self, n_tiles: int, expression: str, question: str | None = None) -> str:
        return self.template_user_turn(self.segment_text(n_tiles, expression, question))

    def caption_prompt(self, n_tiles: int, region_cells: Any, question: str | None = None) -> str:
        raise ValueError("the Qwen-VL family has no region (visual-prompt) token input, as upstream's "
                         "Sa2VAChatModelQwen; describe a region by drawing it into the image (region_outline: "
                         "what describe_masks does for this family)")

    def region_cells(self, *args: Any, **kwargs: Any):
        raise ValueError("the Qwen-VL family has no region (visual-prompt) token input, as upstream's "
                         "Sa2VAChatModelQwen; describe a region by drawing it into the image (region_outline: "
                         "what describe_masks does for this family)")

    def tokenize_prompts(self, prompts: Sequence[str], pad_to_multiple_of: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ``input_ids`` [N, L] and bool ``attention_mask`` [N, L], as the InternVL processor (its
        ``pad_to_multiple_of`` / ``prompt_length_multiple`` buckets included)."""
        return Sa2VAProcessor.tokenize_prompts(self, prompts, pad_to_multiple_of)

"""Sa2VA processor: images → tiles, masks → region cells, text → templated prompts and token ids.

Everything the upstream model does to its inputs before the forward pass, in one place
(docs/sa2va_internals.md §2, §3, §5):

* ``preprocess_image``: dynamic tiling + ImageNet normalisation, and the SAM2 direct resize.
  Tile budget (``from_config``'s ``tile_budget``). Upstream Sa2VA's inference path tiles with 1..12
  tiles plus a thumbnail whatever config.json says: HF ``Sa2VAChatModel.preparing_for_generation`` sets
  ``min_dynamic_patch=1``, ``max_dynamic_patch=12``, ``use_thumbnail=True`` (with 448 px tiles, ratio 0.5)
  before ``predict_forward``, and config.json's ``max_dynamic_patch`` (default 6) is never read there.
  ``"upstream"`` uses those tile counts, so a 640×480 image gives a 4×3 grid + thumbnail = 13 tiles, the
  prompts the released models were evaluated with; ``"config"`` reads ``min/max_dynamic_patch`` and
  ``use_thumbnail`` from the config; ``"auto"`` (default) is ``"upstream"`` for a checkpoint with
  upstream's tile geometry (448 px tiles, downsample 0.5: every released Sa2VA) and ``"config"`` for any
  other (e.g. the tiny preset's 224 px tiles, which upstream's inference path could not run). Explicit
  ``min_dynamic_patch=`` / ``max_dynamic_patch=`` / ``use_thumbnail=`` overrides win over all three.
* ``region_cells``: a region mask → the g×g token grid by nearest point sampling,
  cell (r, c) ← pixel (⌊r·H/g⌋, ⌊c·W/g⌋) (``F.interpolate(mode='nearest')``, as upstream).
* ``caption_text`` / ``segment_text``: user text with ``<image>`` expanded into the image block
  (plus the region string for captions), as HF ``predict_forward`` builds it;
  ``caption_prompt`` / ``segment_prompt`` wrap it in the template's INSTRUCTION.
* ``tokenize_prompts``: left-padded batch for generation. ``encode_fn``: SFT ids/labels with
  xtuner's ``template_map_fn`` + ``encode_fn`` (= upstream ``video_lisa_encode_fn``).
* ``sft_collate``: the ``video_lisa_collate_fn`` batch layout.
* ``region_outline``: the other region input, the region drawn into a copy of the image (``drawn_region.py``).

Empty-region rule. A region whose mask hits no grid sample point gets 0 region tokens upstream
(an empty ``<vp></vp>``), so the model sees nothing of it. Policy ``empty_region``:
``'raise'`` (default) raises ValueError naming the sample; ``'keep'`` reproduces upstream's empty
``<vp></vp>``; ``'dilate_to_one_cell'`` switches on the single cell whose area-pooled bin
(``adaptive_avg_pool2d``) holds the largest foreground fraction (first in row-major order on ties).
An all-background mask is always an error, except under ``'keep'``.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.nn.utils.rnn import pad_sequence
from xtuner.dataset.map_fns import template_map_fn
from xtuner.dataset.utils import encode_fn as xtuner_encode_fn
from xtuner.dataset.utils import get_bos_eos_token_ids
from xtuner.utils import PROMPT_TEMPLATE

from .constants import (
    DEFAULT_PAD_TOKEN_INDEX,
    IGNORE_INDEX,
    IMAGE_PLACEHOLDER,
    IMG_CONTEXT_TOKEN,
    SEG_TOKEN,
)
from .drawn_region import RegionOutline
from .input_check import InputCheck, nearest_cells, region_grid_size
from .lengths import bucket_length, check_length_multiple
from .prompts import REGION_CAPTION_EVAL_PROMPT, RES_EVAL_PROMPT, image_block, region_string
from .tiling import TilingSettings, check_rgb_image, normalise_tiles, sam_pixel_values, tile_image
from .tokenizer import check_sa2va_tokenizer

EMPTY_REGION_POLICIES = ("raise", "keep", "dilate_to_one_cell")
# Tiling of upstream Sa2VA's inference path (HF preparing_for_generation), whatever config.json says,
# and the tile geometry it runs with (used by tile_budget="auto" to recognise an upstream checkpoint).
UPSTREAM_INFERENCE_TILING = {"min_dynamic_patch": 1, "max_dynamic_patch": 12, "use_thumbnail": True}
UPSTREAM_TILE_GEOMETRY = {"image_size": 448, "downsample_ratio": 0.5}
TILE_BUDGETS = ("auto", "upstream", "config")


@dataclass(frozen=True)
class ImageInputs:
    """One image, preprocessed for both paths.

    pixel_values: float [n_tiles, 3, S, S], ImageNet-normalised tiles (thumbnail last if n_tiles > 1).
    g_pixel_values: float [3, S_sam, S_sam], 0..255, the SAM2 input.
    size: (H, W) of the original image. n_tiles: number of LLM tiles.
    """

    pixel_values: torch.Tensor
    g_pixel_values: torch.Tensor
    size: tuple[int, int]
    n_tiles: int


@dataclass(frozen=True)
class VideoInputs:
    """One clip of T frames, preprocessed for both paths (upstream ``predict_forward(video=...)``).

    pixel_values: float [n, 3, S, S], one ImageNet-normalised S×S tile per MLLM frame (the first n frames, each
        resized whole: no dynamic tiling, no thumbnail).
    g_pixel_values: float [T, 3, S_sam, S_sam], 0..255, every frame's SAM2 input.
    size: (H, W) shared by all frames.
    """

    pixel_values: torch.Tensor
    g_pixel_values: torch.Tensor
    size: tuple[int, int]

    @property
    def num_frames(self) -> int:
        """T."""
        return self.g_pixel_values.shape[0]

    @property
    def num_mllm_frames(self) -> int:
        """n, the frames the language model sees."""
        return self.pixel_values.shape[0]


class Sa2VAProcessor:
    """Prepares Sa2VA inputs; all template strings come from xtuner's ``PROMPT_TEMPLATE[template]``."""

    prompt_length_multiple: int | None = None
    """``tokenize_prompts`` left-pads every batch to a multiple of this (None: to the batch's longest prompt); the
    GRPO trainer sets it from ``GRPOConfig.prompt_length_multiple``."""

    def __init__(self, tokenizer: Any, *, template: str, image_size: int = 448, patch_size: int = 14,
                 downsample_ratio: float = 0.5, min_dynamic_patch: int = 1, max_dynamic_patch: int = 12,
                 use_thumbnail: bool = True, sam_image_size: int = 1024,
                 empty_region: str = "raise", region_outline: RegionOutline | None = None) -> None:
        name = str(template).replace("-", "_")  # upstream normalises config.template the same way
        if name.startswith("internvl"):  # InternVL's own conversation names (internvl2_5 in InternVL3 configs)
            raise ValueError(f"template={template!r} is an InternVL base model's, not a Sa2VA checkpoint's: point at "
                             "the Sa2VA checkpoint, whose config.json names its SFT template (qwen_chat for the "
                             "InternVL3 family, docs/sa2va_internals.md §9.2)")
        if name not in PROMPT_TEMPLATE:
            raise ValueError(f"template={template!r} is not in xtuner PROMPT_TEMPLATE; Sa2VA releases use "
                             "'qwen_chat', 'phi3_chat' or 'internlm2_chat' (read it from config.template)")
        if image_size % patch_size or (image_size // patch_size) * downsample_ratio % 1:
            raise ValueError(f"image_size={image_size}, patch_size={patch_size}, downsample_ratio="
                             f"{downsample_ratio}: (image_size/patch_size)*downsample_ratio must be a whole "
                             "number of tokens per side")
        if empty_region not in EMPTY_REGION_POLICIES:
            raise ValueError(f"empty_region={empty_region!r}: expected one of {EMPTY_REGION_POLICIES}")
        check_sa2va_tokenizer(tokenizer)
        bos_ids, eos_ids = get_bos_eos_token_ids(tokenizer)
        if bos_ids is None or eos_ids is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no BOS/EOS for xtuner's encode_fn; "
                             "load the fast tokenizer (Qwen2TokenizerFast) or set bos/eos tokens")
        self.tokenizer = tokenizer
        self.template_name = name
        self.template = PROMPT_TEMPLATE[name]
        self.tiling = TilingSettings(image_size, min_dynamic_patch, max_dynamic_patch, use_thumbnail)
        self.patch_size = patch_size
        self.downsample_ratio = downsample_ratio
        self.sam_image_size = sam_image_size
        self.empty_region = empty_region
        self.region_outline = region_outline or RegionOutline()  # the 'drawn' region input (drawn_region.py)
        self.region_grid_size = region_grid_size(image_size, patch_size, downsample_ratio)  # g, e.g. 448/14·0.5 = 16
        self.tokens_per_tile = self.region_grid_size**2  # 256 for 448/14/0.5
        self.bos_token_ids, self.eos_token_ids = list(bos_ids), list(eos_ids)
        self.img_context_token_id = tokenizer.convert_tokens_to_ids(IMG_CONTEXT_TOKEN)
        self.seg_token_id = tokenizer.convert_tokens_to_ids(SEG_TOKEN)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

    @classmethod
    def from_config(cls, tokenizer: Any, config: Any, *, tile_budget: str = "auto",
                    **overrides: Any) -> "Sa2VAProcessor":
        """Read template / force_image_size / downsample_ratio, vision_config.patch_size and sam_image_size
        from a Sa2VAConfig (never guessed). Tile count and thumbnail follow ``tile_budget`` (module doc):
        ``"upstream"`` = upstream inference's 1..12 tiles + thumbnail, ``"config"`` = the config's
        ``*_dynamic_patch`` / ``use_thumbnail``, ``"auto"`` = upstream's for a 448 px / ratio 0.5 checkpoint,
        else the config's. Keyword ``overrides`` win over all of them."""
        if tile_budget not in TILE_BUDGETS:
            raise ValueError(f"tile_budget={tile_budget!r}: expected one of {TILE_BUDGETS} ('upstream' tiles as "
                             "upstream Sa2VA inference does, 'config' reads max_dynamic_patch from config.json)")
        geometry = {"image_size": int(config.force_image_size or config.vision_config.image_size),
                    "downsample_ratio": float(config.downsample_ratio)}
        if tile_budget == "auto":
            tile_budget = "upstream" if geometry == UPSTREAM_TILE_GEOMETRY else "config"
        tiling = dict(UPSTREAM_INFERENCE_TILING) if tile_budget == "upstream" else dict(
            min_dynamic_patch=int(config.min_dynamic_patch), max_dynamic_patch=int(config.max_dynamic_patch),
            use_thumbnail=bool(config.use_thumbnail))
        kwargs = dict(template=config.template, **geometry, patch_size=int(config.vision_config.patch_size),
                      **tiling, sam_image_size=int(getattr(config, "sam_image_size", 1024)))
        kwargs.update(overrides)
        return cls(tokenizer, **kwargs)

    @property
    def preprocessing_settings(self) -> tuple:
        """What ``preprocess_image`` and ``region_cells`` depend on: inputs prepared ahead of the step
        (``data.prepared``) are this processor's only when these are equal."""
        return (type(self).__name__, self.tiling, self.sam_image_size, self.region_grid_size, self.empty_region)

    # ----------------------------------------------------------------------------------- images
    def preprocess_image(self, image: Image.Image, where: str = "image") -> ImageInputs:
        """Tiles for the LLM and the direct-resized SAM2 input of one RGB PIL image."""
        check_rgb_image(image, where)
        tiles = tile_image(image, self.tiling)
        return ImageInputs(pixel_values=normalise_tiles(tiles),
                           g_pixel_values=sam_pixel_values(image, self.sam_image_size),
                           size=(image.height, image.width), n_tiles=len(tiles))

    def preprocess_video(self, frames: Sequence[Image.Image], mllm_frames: int, where: str = "video") -> VideoInputs:
        """The first ``mllm_frames`` frames as one S×S tile each (bicubic resize of the whole frame) and every frame's
        direct-resized SAM2 input. All frames must share one size (upstream asserts it)."""
        if len(frames) == 0 or mllm_frames < 1:
            raise ValueError(f"{where}: a video needs at least one frame and mllm_frames >= 1, got {len(frames)} "
                             f"frames and mllm_frames={mllm_frames}")
        one_tile = TilingSettings(self.tiling.image_size, 1, 1, False)  # the whole frame resized to S×S
        for t, frame in enumerate(frames):
            check_rgb_image(frame, f"{where} frame {t}")
            if frame.size != frames[0].size:
                raise ValueError(f"{where}: frame {t} is {frame.size[0]}x{frame.size[1]} (W x H) but frame 0 is "
                                 f"{frames[0].size[0]}x{frames[0].size[1]}; all frames of a video share one size")
        tiles = [tile for frame in frames[:mllm_frames] for tile in tile_image(frame, one_tile)]
        return VideoInputs(pixel_values=normalise_tiles(tiles),
                           g_pixel_values=torch.stack([sam_pixel_values(f, self.sam_image_size) for f in frames]),
                           size=(frames[0].height, frames[0].width))

    def expand_video(self, text: str, n_frames: int) -> str:
        """Replace the single ``<image>`` by one single-tile image block per MLLM frame, joined by ``'\n'`` (the
        video layout of ``predict_forward``; one frame gives the image path's one-tile block)."""
        if text.count(IMAGE_PLACEHOLDER) != 1:
            raise ValueError(f"user text must contain '<image>' exactly once, got "
                             f"{text.count(IMAGE_PLACEHOLDER)} in {text[:80]!r}")
        block = image_block(self.image_token_count(1))
        return text.replace(IMAGE_PLACEHOLDER, "\n".join([block] * n_frames))

    def image_token_count(self, n_tiles: int) -> int:
        """<IMG_CONTEXT> tokens in the image block: n_tiles · tokens_per_tile."""
        return n_tiles * self.tokens_per_tile

    # ---------------------------------------------------------------------------------- regions
    def region_cells(self, gt_mask: np.ndarray | torch.Tensor, *, sample_id: str | None = None,
                     size: tuple[int, int] | None = None, empty_region: str | None = None) -> torch.Tensor:
        """bool [g, g] region-token cells of one mask [H, W] (nearest point sampling, upstream rule).

        ``size`` = expected (H, W) (the image's), checked when given. ``empty_region`` overrides the
        processor policy for this call (see the module docstring).
        """
        where = f"sample {sample_id!r}" if sample_id is not None else "gt_mask"
        policy = self.empty_region if empty_region is None else empty_region
        if policy not in EMPTY_REGION_POLICIES:
            raise ValueError(f"empty_region={policy!r}: expected one of {EMPTY_REGION_POLICIES}")
        mask = _as_binary_mask(gt_mask, where)  # float [H, W] in {0, 1}
        if size is not None and tuple(mask.shape) != tuple(size):
            raise ValueError(f"{where}: gt_mask shape {tuple(mask.shape)} != image size (H, W) {tuple(size)}")
        g = self.region_grid_size
        cells = nearest_cells(mask, g)  # [g, g]
        if bool(cells.any()) or policy == "keep":
            return cells
        if not bool(mask.any()):
            raise ValueError(f"{where}: gt_mask has no foreground pixels; fix or drop the annotation")
        if policy == "raise":
            raise ValueError(
                f"{where}: region mask ({int(mask.sum())} px in {mask.shape[0]}x{mask.shape[1]}) hits none "
                f"of the {g}x{g} sample points, so it would get 0 region tokens. Pass empty_region="
                "'keep' (upstream behaviour, empty <vp></vp>) or 'dilate_to_one_cell', or drop the sample")
        pooled = F.adaptive_avg_pool2d(mask[None, None], (g, g))[0, 0]  # [g, g] foreground fraction
        cells = torch.zeros(g * g, dtype=torch.bool)
        cells[int(torch.argmax(pooled.flatten()))] = True  # argmax returns the first maximum
        return cells.view(g, g)

    @property
    def input_check(self) -> InputCheck:
        """The limits a sample must meet to become a prompt here (image side, region on the grid), for datasets to
        apply while loading (``data.base.RegionDataset.set_input_check``)."""
        return InputCheck(self.region_grid_size, self.empty_region)

    def _region_stack(self, region_cells: Any) -> torch.Tensor:
        """bool [N, g, g] from one [g, g] grid, a [N, g, g] stack or a list of [g, g] grids."""
        if isinstance(region_cells, (list, tuple)):
            region_cells = torch.stack([torch.as_tensor(c) for c in region_cells])
        cells = torch.as_tensor(region_cells).bool()
        if cells.dim() == 2:
            cells = cells[None]
        g = self.region_grid_size
        if cells.dim() != 3 or tuple(cells.shape[1:]) != (g, g) or cells.shape[0] == 0:
            raise ValueError(f"region_cells shape {tuple(cells.shape)}: expected [{g}, {g}] or [N, {g}, {g}] "
                             "with N >= 1 (use Sa2VAProcessor.region_cells on each mask)")
        return cells

    # ------------------------------------------------------------------------------------- text
    def expand_image(self, text: str, n_tiles: int, region_cells: Any = None) -> str:
        """Replace the single ``<image>`` by the image block (+ ``'\\n'`` + region string), as
        ``predict_forward`` does with ``mask_prompts``."""
        if text.count(IMAGE_PLACEHOLDER) != 1:
            raise ValueError(f"user text must contain '<image>' exactly once, got "
                             f"{text.count(IMAGE_PLACEHOLDER)} in {text[:80]!r}")
        replacement = image_block(self.image_token_count(n_tiles))
        if region_cells is not None:
            counts = [int(c) for c in self._region_stack(region_cells).flatten(1).sum(1)]  # [N]
            if self.empty_region != "keep" and 0 in counts:
                raise ValueError(f"region{counts.index(0) + 1} has 0 cells; empty regions need "
                                 "empty_region='keep' (see Sa2VAProcessor docstring)")
            replacement += "\n" + region_string(counts)
        return text.replace(IMAGE_PLACEHOLDER, replacement)

    def caption_text(self, n_tiles: int, region_cells: Any, question: str | None = None) -> str:
        """Region-caption user text. ``question=None`` is the RefCOCOg eval prompt (``<image>\\nPlease
        give me a short description ... region1.``); a question without ``<image>`` follows the region
        string directly, which is the Osprey training form."""
        text = REGION_CAPTION_EVAL_PROMPT if question is None else question
        if IMAGE_PLACEHOLDER not in text:
            text = IMAGE_PLACEHOLDER + text
        return self.expand_image(text, n_tiles, region_cells)

    def segment_text(self, n_tiles: int, expression: str, question: str | None = None) -> str:
        """Referring-segmentation user text: the RES eval prompt (``question=None``) or a
        SEG_QUESTIONS template (``{class_name}`` ← expression) after ``<image>\\n`` (RefCOCO training)."""
        return self.expand_image(self._segment_question(expression, question), n_tiles)

    @staticmethod
    def _segment_question(expression: str, question: str | None) -> str:
        """The referring-segmentation user text with its ``<image>`` placeholder still in it."""
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"segment prompt: expression {expression!r} must be a non-empty string")
        if question is None:
            return RES_EVAL_PROMPT.format(sent=expression)
        text = question.format(class_name=expression)
        return text if IMAGE_PLACEHOLDER in text else IMAGE_PLACEHOLDER + "\n" + text

    def template_user_turn(self, text: str, round_index: int = 1) -> str:
        """The template's INSTRUCTION around ``text`` (no SYSTEM: Sa2VA never uses one)."""
        return self.template.INSTRUCTION.format(input=text, round=round_index)

    def caption_prompt(self, n_tiles: int, region_cells: Any, question: str | None = None) -> str:
        """Full templated user turn for region captioning (ends with the assistant header)."""
        return self.template_user_turn(self.caption_text(n_tiles, region_cells, question))

    def segment_prompt(self, n_tiles: int, expression: str, question: str | None = None) -> str:
        """Full templated user turn for referring segmentation."""
        return self.template_user_turn(self.segment_text(n_tiles, expression, question))

    def video_segment_prompt(self, n_frames: int, expression: str, question: str | None = None) -> str:
        """Full templated user turn for referring segmentation in a clip: the image RES text with one single-tile
        block per MLLM frame (:meth:`expand_video`); one frame gives :meth:`segment_prompt` of a one-tile image."""
        return self.template_user_turn(self.expand_video(self._segment_question(expression, question), n_frames))

    # ------------------------------------------------------------------------------- token ids
    def tokenize_prompts(self, prompts: Sequence[str], pad_to_multiple_of: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ``input_ids`` [N, L] (long) and ``attention_mask`` [N, L] (bool).

        Each prompt is encoded like ``predict_forward`` (``add_special_tokens=True``: nothing for Qwen,
        ``<s>`` for InternLM2); pads are ``pad_token_id`` on the left so generation continues every
        row from its last real token. L is the longest prompt rounded up to a multiple of ``pad_to_multiple_of``
        (default: ``self.prompt_length_multiple``; None: not rounded). The extra columns are padding like any other:
        hidden by the attention mask, and positions count only attended tokens, so they change no value.
        """
        if isinstance(prompts, str) or len(prompts) == 0:
            raise ValueError("tokenize_prompts: expected a non-empty list of prompt strings")
        multiple = self.prompt_length_multiple if pad_to_multiple_of is None else pad_to_multiple_of
        check_length_multiple("tokenize_prompts: pad_to_multiple_of", multiple)
        encoded = [self.tokenizer.encode(p, add_special_tokens=True) for p in prompts]
        length = bucket_length(max(len(ids) for ids in encoded), multiple)
        input_ids = torch.full((len(encoded), length), self.pad_token_id, dtype=torch.long)  # [N, L]
        attention_mask = torch.zeros((len(encoded), length), dtype=torch.bool)  # [N, L]
        for row, ids in enumerate(encoded):
            input_ids[row, length - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, length - len(ids):] = True
        return input_ids, attention_mask

    def encode_fn(self, example: dict, max_length: int) -> dict[str, list[int]]:
        """SFT ids and labels of a conversation, with ``video_lisa_encode_fn`` semantics.

        ``example['conversation']`` = [{'input': user text with the image already expanded,
        'output': answer}, ...]. Per turn: BOS if pending (xtuner ``get_bos_eos_token_ids``), templated
        input (labels IGNORE_INDEX), output + SUFFIX (supervised), SEP (IGNORE_INDEX). Right-truncated
        to ``max_length``; truncation that would cut image or region tokens raises instead (the model
        could not splice the vision features; upstream silently repeats them).
        """
        where = f"sample {example.get('sample_id')!r}" if example.get("sample_id") else "example"
        turns = example.get("conversation")
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: 'conversation' must be a non-empty list of {{'input', 'output'}} turns")
        for index, turn in enumerate(turns):
            if not isinstance(turn.get("input"), str) or not isinstance(turn.get("output"), str):
                raise ValueError(f"{where}: turn {index} needs str 'input' and 'output', got {sorted(turn)}")
            if IMAGE_PLACEHOLDER in turn["input"]:
                raise ValueError(f"{where}: turn {index} still contains '<image>'; expand it first with "
                                 "Sa2VAProcessor.expand_image / caption_text / segment_text")
        if max_length < 1:
            raise ValueError(f"max_length={max_length}: expected >= 1")
        templated = template_map_fn({"conversation": copy.deepcopy(turns)}, self.template)
        full = xtuner_encode_fn(templated, self.tokenizer, max_length=10**9, input_ids_with_output=True)
        n_context = sum(i == self.img_context_token_id for i in full["input_ids"])
        kept = {key: ids[:max_length] for key, ids in full.items()}
        if sum(i == self.img_context_token_id for i in kept["input_ids"]) != n_context:
            raise ValueError(f"{where}: max_length={max_length} cuts image/region tokens "
                             f"({len(full['input_ids'])} tokens); raise max_length or use fewer tiles")
        return kept

    @staticmethod
    def sft_collate(instances: Sequence[dict]) -> dict:
        """Batch SFT items in the ``video_lisa_collate_fn`` layout (module function ``sft_collate``)."""
        return sft_collate(instances)


def _as_binary_mask(gt_mask: Any, where: str) -> torch.Tensor:
    """float [H, W] in {0, 1} from a bool / 0-1 numeric 2-D array or tensor."""
    if not isinstance(gt_mask, (np.ndarray, torch.Tensor)):
        raise TypeError(f"{where}: gt_mask must be a numpy array or torch tensor, got {type(gt_mask).__name__}")
    mask = torch.as_tensor(np.asarray(gt_mask) if isinstance(gt_mask, np.ndarray) else gt_mask)
    if mask.dim() != 2 or min(mask.shape) < 1:
        raise ValueError(f"{where}: gt_mask shape {tuple(mask.shape)}: expected a non-empty 2-D [H, W] mask")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{where}: gt_mask values must be 0/1 (or bool); threshold soft masks first")
    return mask.float()


def sft_collate(instances: Sequence[dict], pad_index: int = DEFAULT_PAD_TOKEN_INDEX) -> dict:
    """``video_lisa_collate_fn`` layout: ``{'data': {...}, 'data_samples': None}``.

    data: input_ids [B, L] (right-padded with ``pad_index`` = xtuner's 0, not the tokenizer pad id),
    labels [B, L] (padded with IGNORE_INDEX), attention_mask [B, L] bool (True on real tokens),
    position_ids [B, L] = arange(L) per row; with images: pixel_values ([B, n, 3, S, S] if all samples
    have the same tile count, else a list of [n_b, 3, S, S]) and frames_per_batch (one int per sample
    that has g_pixel_values); g_pixel_values (flat list of [3, S_sam, S_sam]); masks (list of
    [N, H, W] uint8, one per segmentation sample); vp_overall_mask (bool [sum of tiles], samples
    without regions contribute all-False); prompt_masks (list of bool [N, g, g]).
    Other item keys (sample_id, task, ...) are not batched.
    """
    if len(instances) == 0:
        raise ValueError("sft_collate: got an empty batch")
    for index, item in enumerate(instances):
        if len(item["input_ids"]) != len(item["labels"]) or len(item["input_ids"]) == 0:
            raise ValueError(f"sft_collate: item {index} ({item.get('sample_id')!r}) has "
                             f"{len(item['input_ids'])} input_ids and {len(item['labels'])} labels")
    input_ids = [torch.as_tensor(item["input_ids"], dtype=torch.long) for item in instances]
    labels = [torch.as_tensor(item["labels"], dtype=torch.long) for item in instances]
    lengths = [len(ids) for ids in input_ids]
    batch_ids = pad_sequence(input_ids, batch_first=True, padding_value=pad_index)  # [B, L]
    batch_size, seq_len = batch_ids.shape
    data: dict[str, Any] = {
        "input_ids": batch_ids,
        "attention_mask": torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None],  # [B, L]
        "position_ids": torch.arange(seq_len).unsqueeze(0).repeat(batch_size, 1),  # [B, L]
        "labels": pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX),  # [B, L]
    }
    if any(item.get("pixel_values") is not None for item in instances):
        _collate_images(instances, data)
    masks = [torch.stack([torch.as_tensor(m) for m in item["masks"]])
             if isinstance(item["masks"], (list, tuple)) else torch.as_tensor(item["masks"])
             for item in instances if item.get("masks") is not None]  # each [N, H, W]
    if masks:
        data["masks"] = masks
    return {"data": data, "data_samples": None}


def _collate_images(instances: Sequence[dict], data: dict) -> None:
    """Add pixel_values, frames_per_batch, g_pixel_values, vp_overall_mask, prompt_masks to data."""
    pixel_values, vp_overall_mask, frames_per_batch, g_pixel_values = [], [], [], []
    for index, item in enumerate(instances):
        if item.get("pixel_values") is None:
            raise ValueError(f"sft_collate: item {index} ({item.get('sample_id')!r}) has no pixel_values "
                             "while others do; text-only samples cannot be mixed in this layout")
        pixel_values.append(item["pixel_values"])
        vp = item.get("vp_overall_mask")
        vp_overall_mask.append(torch.zeros(len(item["pixel_values"]), dtype=torch.bool) if vp is None
                               else torch.as_tensor(vp).bool())
        g = item.get("g_pixel_values")
        if g is not None:
            frames = list(g) if isinstance(g, (list, tuple)) else [g]
            g_pixel_values += frames
            frames_per_batch.append(len(frames))
    same_shape = all(p.shape == pixel_values[0].shape for p in pixel_values)
    data["pixel_values"] = torch.stack(pixel_values) if same_shape else pixel_values  # [B, n, 3, S, S]
    data["frames_per_batch"] = frames_per_batch
    if g_pixel_values:
        data["g_pixel_values"] = g_pixel_values
    if any(item.get("vp_overall_mask") is not None for item in instances):
        data["vp_overall_mask"] = torch.cat(vp_overall_mask)  # [sum n_b]
    prompt_masks = [torch.as_tensor(item["prompt_masks"]).bool() for item in instances
                    if item.get("prompt_masks") is not None]
    if prompt_masks:
        data["prompt_masks"] = prompt_masks

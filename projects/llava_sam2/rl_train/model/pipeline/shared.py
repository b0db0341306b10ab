"""The model pipeline every caller runs: the GRPO loops (grpo/), the held-out evaluation (evaluation/tasks.py),
``predict`` (model/pipeline/inference.py) and the prompt-selection line (prompt_rl/segment.py).

::

    PIL images ─ encode_images ─> EncodedImages   InternViT tokens (pixel shuffled) + SAM2 features, once each
    prompt ids ─ prompt_embeds ─> inputs_embeds   <IMG_CONTEXT> ← mlp1(ViT tokens) of the row's image (+ regions)
      ├─ sample_text (decoding/text_decoding.py)  sampled or greedy token ids, cut at the stop words
      │    └─ completion_texts / answer_texts     prompt-ready text / upstream's ``prediction``
      ├─ greedy_answers                           greedy answer + one mask per fed-back [SEG] (PromptRow → Answer)
      │    ├─ segment_texts                       the partner task "segment a text": RES prompt → answer + masks
      │    └─ describe_masks                      the partner task "describe a mask": region prompt (region tokens,
      │                                           or the region drawn into the image) → caption
      ├─ generation.completion_logprobs           teacher-forced log-probs of given answers (the GRPO loss)
      └─ forced_seg_prompts                       teacher-forced fixed answer → its [SEG] state → SAM2 prompt
           └─ forced_answer_seg_prompts / forced_answer_masks   from prompt ids, and on to the SAM2 decoder

A ``[SEG]`` mask is always: the final-norm state of the ``[SEG]`` input position → ``text_hidden_fcs`` → SAM2
mask decoder on the image's cached features (best of multimask by predicted IoU) → ``logits_to_masks`` at the
image size (bilinear h → S_sam → (H, W), sigmoid > 0.5), as upstream ``predict_forward``.

``mlp1`` is trainable and differs between weight sets (policy / EMA partner / reference, model A / model B), so
``EncodedImages`` stops before it: each pass projects ``tile_embeds = model.project_vision(encoded.vit_tokens)``
under the weights in effect and passes it in. Prompt rows name their image (``images`` / ``PromptRow.image``),
so rows that share an image share its cached features.

The two partner tasks of the cycle (``segment_texts``, ``describe_masks``) are written once here: the GRPO loops'
EMA partner (grpo/passes.py) and the held-out evaluation's cycle tasks (evaluation/tasks.py) both run them, with one
convention: an empty text gets no answer (no mask), and so does an empty mask (no caption).

The Qwen-VL family (``network.qwen_vl.Sa2VAQwenModel``, ``model.family == "qwen_vl"``) takes two seams here: its
images are encoded into the Qwen vision inputs (kept per image, ``EncodedImages.vision_inputs``) beside the same SAM2
features, and its greedy answers are decoded by transformers' ``generate`` (``qwen_vl_decode``: M-RoPE positions and
Qwen3-VL's deepstack are transformers' code); the answers, ``[SEG]`` states and masks after that are the code below.

Every InternVL decode goes through ``decoding.sample_text`` (one call site of ``fast_generation.decode_completions``),
and every greedy answer through :func:`greedy_answers`, which sees each row's image: rows about one image share its
prefilled image block (:func:`image_prefix_prompts`), and the fast decoder runs on merged LoRA weights.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..decoding.generation import Completions, SharedPrefix, completion_hidden
from ..decoding.grouped_scoring import grouped_completion_hidden, uses_compiled_layers
from ..decoding.text_decoding import (
    TextDecoding, answer_texts, completion_texts, eval_mode, fed_back_seg_positions, host_completions, sample_text)
from ..network.grounding import GroundingFeatures, MaskDecoderOutput
from ..text.drawn_region import check_region_input
from ..text.lengths import bucket_length
from .qwen_vl_decode import qwen_vl_completions
from .qwen_vl_prompts import qwen_vl_answer_states, qwen_vl_sample_text

SEG_ANSWER = "Sure, [SEG]."  # one of Sa2VA's five RES answers: the default teacher-forced answer

# which fed-back [SEG] tokens of an answer get a mask: positions [t_1, t_2, ...] -> the kept ones
SEG_MASK_RULES = {"first": lambda positions: positions[:1], "all": lambda positions: positions}


@dataclass
class EncodedImages:
    """Frozen-encoder outputs of I images (no grad).

    Attributes:
        image_sizes: I pairs (H, W) of the original images.
        tile_start: I + 1 offsets: image i owns ``vit_tokens[tile_start[i]:tile_start[i + 1]]``.
        vit_tokens: ``[n_tiles_total, t, 4C]`` ViT tokens after pixel shuffle, image by image (thumbnail last
            within an image); None for the Qwen-VL family.
        grounding: SAM2 ``GroundingFeatures`` of the I images.
        vision_inputs: Qwen-VL family only: per image ``(pixel_values [P_i, K], image_grid_thw [3])``; its
            ``tile_start`` counts LLM image tokens.
        source_images: the PIL images (``describe_masks(region_input='drawn')`` draws a region into a copy).
    """

    image_sizes: list[tuple[int, int]]
    tile_start: list[int]
    vit_tokens: Tensor | None
    grounding: GroundingFeatures
    vision_inputs: list[tuple[Tensor, Tensor]] | None = field(default=None, kw_only=True)
    source_images: list | None = field(default=None, kw_only=True)

    @property
    def num_images(self) -> int:
        """I."""
        return len(self.image_sizes)

    def n_tiles(self, image: int) -> int:
        """LLM tiles of image ``image``."""
        return self.tile_start[image + 1] - self.tile_start[image]

    def tiles(self, tile_embeds: Tensor, image: int) -> Tensor:
        """Rows of ``tile_embeds [n_tiles_total, t, D]`` that belong to ``image``: ``[n_i, t, D]``."""
        return tile_embeds[self.tile_start[image]:self.tile_start[image + 1]]


@torch.no_grad()
def encode_images(model, processor, images: Sequence, where: Sequence[str],
                  inputs: Sequence | None = None) -> EncodedImages:
    """Preprocess I PIL images (``where``: one name per image for error messages) and run both frozen encoders
    once, one batched call each.

    ``inputs``: per image its ``processor.preprocess_image`` output made ahead (``data.prepared``, in the
    DataLoader workers), or None to preprocess it here."""
    if len(images) == 0 or len(images) != len(where) or (inputs is not None and len(inputs) != len(images)):
        raise ValueError(f"encode_images: got {len(images)} images, {len(where)} names and "
                         f"{'no' if inputs is None else len(inputs)} preprocessed inputs; pass one name (the sample "
                         "id) per image, at least one image")
    ready = inputs if inputs is not None else [None] * len(images)
    inputs = [x if x is not None else processor.preprocess_image(image, where=name)
              for image, name, x in zip(images, where, ready)]
    device = model.device
    is_qwen_vl = is_qwen_vl_model(model)
    with eval_mode(model):
        vit_tokens = None if is_qwen_vl else \
            model.encode_vision(host_to_device([x.pixel_values for x in inputs], device))  # [n, t, 4C]
        grounding = model.encode_grounding(host_to_device([x.g_pixel_values for x in inputs], device, stack=True))
    return EncodedImages(image_sizes=[tuple(x.size) for x in inputs],
                         tile_start=np.cumsum([0] + [x.n_tiles for x in inputs]).tolist(),
                         vit_tokens=vit_tokens, grounding=grounding,
                         vision_inputs=[(x.pixel_values, x.image_grid_thw) for x in inputs] if is_qwen_vl else None,
                         source_images=list(images))


def host_to_device(tensors: Sequence[Tensor], device, *, stack: bool = False) -> Tensor:
    """``torch.cat(tensors)`` (``stack``: ``torch.stack``) on ``device``. To a CUDA device the host tensors are
    joined into pinned memory and copied without blocking the host (torch's pinned allocator keeps the buffer until
    the copy is done; kernels queued after it on the stream see the data)."""
    device = torch.device(device)
    join = torch.stack if stack else torch.cat
    if not all(t.device.type == "cpu" for t in tensors):
        return join(list(tensors)).to(device)
    first, to_cuda = tensors[0], device.type == "cuda"
    shape = (len(tensors), *first.shape) if stack else (sum(t.shape[0] for t in tensors), *first.shape[1:])
    joined = torch.empty(shape, dtype=first.dtype, pin_memory=to_cuda)
    join(list(tensors), out=joined)
    return joined.to(device, non_blocking=True)  # pinned on CUDA; on the CPU the same tensor


def is_qwen_vl_model(model) -> bool:
    """The Qwen-VL family (its LLM is fed by transformers' Qwen-VL code, not by ``inputs_embeds``)."""
    return getattr(model, "family", None) == "qwen_vl"


def image_fills(model, encoded: EncodedImages, tile_embeds: Tensor, images: Sequence[int],
                region_cells: Sequence[Tensor | None] | None = None) -> list[Tensor]:
    """``<IMG_CONTEXT>`` fill of each prompt row: its image's tiles (+ the region tokens of ``region_cells[row]``).

    Args:
        tile_embeds: ``[n_tiles_total, t, D]`` = ``model.project_vision(encoded.vit_tokens)`` under the weights of
            the pass (carries grad in the loss pass).
        images: image row of every prompt row.
        region_cells: per prompt row a bool ``[g, g]`` grid (or ``[N, g, g]`` for N regions), or None.
    Returns:
        one ``[k_row, D]`` tensor per prompt row (``model.build_image_embeds``).
    """
    cells = region_cells if region_cells is not None else [None] * len(images)
    stacks = [None if c is None else c if c.dim() == 3 else c[None] for c in cells]  # [N, g, g] per row
    return [model.build_image_embeds(encoded.tiles(tile_embeds, i), c) for i, c in zip(images, stacks)]


def prompt_embeds(model, encoded: EncodedImages, tile_embeds: Tensor, prompt_ids: Tensor, images: Sequence[int],
                  region_cells: Sequence[Tensor | None] | None = None) -> Tensor:
    """``inputs_embeds [n, L, D]`` of left-padded prompts ``[n, L]`` with their image (and region) tokens."""
    return model.embed_inputs(prompt_ids, image_fills(model, encoded, tile_embeds, images, region_cells))


def _left_pad(rows: Sequence[Tensor], pad_id: int, multiple: int | None = None) -> tuple[Tensor, Tensor]:
    """Token rows → left-padded ids ``[n, L]`` and attention ``[n, L]`` (bool); L is the longest row rounded up to
    ``multiple`` (``text.lengths.bucket_length``)."""
    length = bucket_length(max(len(row) for row in rows), multiple)
    ids = rows[0].new_full((len(rows), length), pad_id)
    attention = torch.zeros(len(rows), length, dtype=torch.bool, device=ids.device)
    for r, row in enumerate(rows):
        ids[r, length - len(row):], attention[r, length - len(row):] = row, True
    return ids, attention


def image_prefix_prompts(model, encoded: EncodedImages, tile_embeds: Tensor, prompt_ids: Tensor, attention: Tensor,
                         images: Sequence[int], region_cells: Sequence[Tensor | None] | None,
                         pad_id: int, pad_to_multiple_of: int | None = None
                         ) -> tuple[SharedPrefix, Tensor, Tensor] | None:
    """Split prompt rows after their image's tokens, so that rows about one image share one prefilled prefix.

    Row r of the left-padded ids ``[n, L]`` (host tensors: the cut is found row by row) is cut after its k_r-th
    ``<IMG_CONTEXT>``, k_r = its image's tile tokens: the prefix (template header, ``<img>``, image tokens) depends
    only on the image, the rest (``</img>``, region tokens, question, assistant header) on the row. Rows with the
    same image and prefix ids share one prefix. Both parts are left padded to a multiple of ``pad_to_multiple_of``
    (the processor's ``prompt_length_multiple``; None: to their longest row).

    Returns ``(SharedPrefix over the U distinct prefixes [U, P, D], rest embeddings [n, S, D], rest attention
    [n, S])``, or None when a row has fewer ``<IMG_CONTEXT>`` tokens than its image's tiles (no image block to share).
    """
    fills = image_fills(model, encoded, tile_embeds, images, region_cells)  # per row [k_r + regions, D]
    keys, prefixes, rests, rest_fills, index = {}, [], [], [], []
    for r, image in enumerate(images):
        row = prompt_ids[r][attention[r].bool()]  # [L_r] without padding
        k = encoded.tiles(tile_embeds, image).shape[:2].numel()  # image tokens of the row's image
        context = (row == model.img_context_token_id).nonzero().flatten()
        if len(context) < k:
            return None
        cut = int(context[k - 1]) + 1
        key = (image, tuple(row[:cut].tolist()))
        if key not in keys:
            keys[key] = len(prefixes)
            prefixes.append((row[:cut], fills[r][:k]))
        index.append(keys[key])
        rests.append(row[cut:])
        rest_fills.append(fills[r][k:])
    device = model.device
    prefix_ids, prefix_attention = (host_to_device([x], device) for x in _left_pad(
        [ids for ids, _ in prefixes], pad_id, pad_to_multiple_of))  # [U, P]
    rest_ids, rest_attention = (host_to_device([x], device)
                                for x in _left_pad(rests, pad_id, pad_to_multiple_of))  # [n, S]
    prefix = SharedPrefix(model.embed_inputs(prefix_ids, [fill for _, fill in prefixes]), prefix_attention,
                          torch.tensor(index, device=device))
    return prefix, model.embed_inputs(rest_ids, rest_fills), rest_attention


@dataclass
class PromptRow:
    """One question about one encoded image.

    Attributes:
        image: row of the image in :class:`EncodedImages`.
        text: the templated user turn with the image block (and region string) expanded
            (``processor.segment_prompt`` / ``caption_prompt`` / ``template_user_turn(expand_image(...))``).
        region_cells: the bool ``[g, g]`` (or ``[N, g, g]``) cells given to the text (their tokens fill the
            region slots), or None.
    """

    image: int
    text: str
    region_cells: Tensor | None = None


@dataclass
class Answer:
    """A greedy answer.

    Attributes:
        text: ``decode(ids, skip_special_tokens=False).strip()`` (stop token included: upstream ``prediction``).
        plain: the answer as prompt text (``decoding.completion_texts``: what a partner model is given).
        num_tokens: generated tokens (after the textual stop cut).
        is_truncated: no stop within ``max_new_tokens``.
        num_seg: fed-back ``[SEG]`` tokens (each can give one mask).
        seg_masks: bool ``[H, W]`` CPU masks of the kept ``[SEG]`` tokens (``SEG_MASK_RULES``), in answer order;
            empty when masks were not asked for, not decoded (``image_masks=False``) or no ``[SEG]`` was fed back.
        seg_prompts: the SAM2 prompts ``[C_sam]`` (``text_hidden_fcs`` of the ``[SEG]`` states) of the same kept
            ``[SEG]`` tokens, on the model's device (the video path propagates them over the frames).
    """

    text: str
    plain: str
    num_tokens: int
    is_truncated: bool
    num_seg: int
    seg_masks: list[Tensor] = field(default_factory=list)
    seg_prompts: list[Tensor] = field(default_factory=list)


def _answer_masks(model, encoded: EncodedImages, images: Sequence[int], embeds: Tensor, attention: Tensor,
                  out: Completions, positions: list[list[int]], rule: str, prefix: SharedPrefix | None = None,
                  image_masks: bool = True) -> tuple[list[list[Tensor]], list[list[Tensor]]]:
    """Per row, the SAM2 prompt ``[C_sam]`` and (``image_masks``) the bool ``[H, W]`` mask of each kept fed-back
    ``[SEG]``; the SAM2 decoder runs once for all of them."""
    kept = [(row, t) for row, row_positions in enumerate(positions) for t in SEG_MASK_RULES[rule](row_positions)]
    masks: list[list[Tensor]] = [[] for _ in positions]
    prompts: list[list[Tensor]] = [[] for _ in positions]
    if not kept:
        return masks, prompts
    hidden = out.hidden  # [n, T, D]: the decode's own states of the fed-back tokens (upstream reads them from generate)
    if hidden is None:  # a decoder without states: one teacher-forced pass over prompt + answer
        if prefix is not None:
            embeds, attention = prefix.full_prompts(embeds, attention)  # [n, P + S, D]
        hidden = completion_hidden(model.language_model, embeds, attention, out.ids, out.completion_mask)
    owner, t = (list(x) for x in zip(*kept))
    seg_prompt = model.seg_hidden_to_prompt(hidden[owner, t])  # [M, C_sam]
    for row, prompt in zip(owner, seg_prompt):
        prompts[row].append(prompt)
    if not image_masks:
        return masks, prompts
    image_index = torch.tensor([images[row] for row in owner], device=seg_prompt.device)  # [M]
    best_logits = model.decode_masks(seg_prompt, encoded.grounding, image_index).best_logits  # [M, h, w]
    sizes = [encoded.image_sizes[images[row]] for row in owner]
    for row, pred_mask in zip(owner, to_host(model.logits_to_masks(best_logits, sizes))):
        masks[row].append(pred_mask)
    return masks, prompts


def to_host(tensors: Sequence[Tensor]) -> list[Tensor]:
    """``[t.cpu() for t in tensors]`` (one dtype) in one device read instead of one per tensor; the results are views
    of one host buffer."""
    if not tensors:
        return []
    flat = torch.cat([t.reshape(-1) for t in tensors]).cpu()
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


@torch.no_grad()
def greedy_answers(model, processor, encoded: EncodedImages, rows: Sequence[PromptRow], *, max_new_tokens: int,
                   decoding: TextDecoding | None = None, seg_masks: str | None = None,
                   tile_embeds: Tensor | None = None, chunk_size: int | None = None,
                   use_decoder_states: bool = True, prefill_by_image: bool = True,
                   image_masks: bool = True) -> list[Answer]:
    """Greedy answers of prompt rows about encoded images (upstream ``predict_forward`` per row), batched.

    Per chunk of at most ``chunk_size`` rows: each ``row.text`` → left-padded ids → :func:`prompt_embeds` → greedy
    decode (``decoding.decode_backend``, default the fast path) → textual stop cut → texts; with ``seg_masks`` (a
    key of ``SEG_MASK_RULES``) one mask per kept fed-back ``[SEG]``, all of a chunk in one SAM2 decoder call.

    Args:
        decoding: stop criteria and decoder (default: ``TextDecoding.from_processor(processor)``).
        tile_embeds: ``model.project_vision(encoded.vit_tokens)`` under the weights in effect (default: computed).
        use_decoder_states: read ``[SEG]`` states from the decode (as upstream reads them from ``generate``);
            False recomputes them by one teacher-forced pass over prompt + answer (equal up to float reordering).
        prefill_by_image: rows about one image share its prefilled image block (:func:`image_prefix_prompts`;
            U·P + n·S prompt tokens instead of n·(P + S), equal up to float reordering); False prefills every row
            whole.
        image_masks: with ``seg_masks``, also decode each kept ``[SEG]``'s mask on its row's image; False keeps only
            their SAM2 prompts (``Answer.seg_prompts``: the video path decodes them over its frames instead).

    The Qwen-VL family decodes each chunk on its seam (M-RoPE positions, Qwen3-VL's deepstack) with the fast backends
    (``qwen_vl_prompts.qwen_vl_sample_text``: each prompt prefilled once, its image through the vision tower once per
    chunk), or with transformers' ``generate`` under ``'reference'`` (``qwen_vl_decode``, upstream's decoder), and
    always reads the ``[SEG]`` states from the decode, as upstream: ``tile_embeds``, ``use_decoder_states`` and
    ``prefill_by_image`` do not apply to it.
    """
    if seg_masks is not None and seg_masks not in SEG_MASK_RULES:
        raise ValueError(f"greedy_answers: seg_masks={seg_masks!r}; expected None or one of {sorted(SEG_MASK_RULES)}")
    decoding = decoding or TextDecoding.from_processor(processor)
    step = max(1, len(rows) if chunk_size is None else chunk_size)
    answers: list[Answer] = []
    is_qwen_vl = is_qwen_vl_model(model)
    with eval_mode(model):
        tiles = None if is_qwen_vl else \
            model.project_vision(encoded.vit_tokens) if tile_embeds is None else tile_embeds  # [n_tiles, t, D]
        for r0 in range(0, len(rows), step):
            chunk = rows[r0:r0 + step]
            images = [row.image for row in chunk]
            ids, attention = processor.tokenize_prompts([row.text for row in chunk])  # [n, L] on the host
            cells = [row.region_cells for row in chunk]
            if is_qwen_vl:  # the family seam, decode states always kept (docstring)
                if any(c is not None for c in cells):
                    raise ValueError("greedy_answers: the Qwen-VL family has no region input (region_cells given)")
                if decoding.decode_backend == "reference":
                    out = qwen_vl_completions(model, encoded, images, ids, attention, decoding,
                                              max_new_tokens=max_new_tokens, return_hidden=seg_masks is not None)
                else:
                    out = qwen_vl_sample_text(model, encoded, images, ids, attention, decoding, num_generations=1,
                                              max_new_tokens=max_new_tokens, do_sample=False,
                                              return_hidden=seg_masks is not None)
                answers += _answers(model, encoded, images, None, None, out, decoding, seg_masks, None, image_masks)
                continue
            bucket = getattr(processor, "prompt_length_multiple", None)
            split = image_prefix_prompts(model, encoded, tiles, ids, attention, images, cells,
                                         processor.pad_token_id, bucket) if prefill_by_image else None
            if split is None:
                ids, attention = ids.to(model.device), attention.to(model.device)
                split = None, prompt_embeds(model, encoded, tiles, ids, images, cells), attention
            prefix, embeds, attention = split
            out = sample_text(model, embeds, attention, decoding, max_new_tokens=max_new_tokens, do_sample=False,
                              return_hidden=seg_masks is not None and use_decoder_states, prefix=prefix)
            answers += _answers(model, encoded, images, embeds, attention, out, decoding, seg_masks, prefix,
                                image_masks)
    return answers


def _answers(model, encoded: EncodedImages, images: Sequence[int], embeds: Tensor | None, attention: Tensor | None,
             out: Completions, decoding: TextDecoding, seg_masks: str | None, prefix: SharedPrefix | None,
             image_masks: bool) -> list[Answer]:
    """A decoded chunk → its :class:`Answer` rows (texts, fed-back ``[SEG]`` positions, their prompts and masks)."""
    host = host_completions(out)  # the texts, lengths and [SEG] positions from one device read
    positions = fed_back_seg_positions(host, model.seg_token_id)
    masks, prompts = ([[] for _ in images], [[] for _ in images]) if seg_masks is None else \
        _answer_masks(model, encoded, images, embeds, attention, out, positions, seg_masks, prefix, image_masks)
    lengths, texts = host.completion_mask.sum(-1).tolist(), completion_texts(host, decoding)
    return [Answer(text, plain, int(n), bool(truncated), len(p), m, q)
            for text, plain, n, truncated, p, m, q in zip(answer_texts(host, decoding), texts, lengths,
                                                          host.is_truncated.tolist(), positions, masks, prompts)]


def segment_texts(model, processor, encoded: EncodedImages, texts: Sequence[str | None], images: Sequence[int], *,
                  max_new_tokens: int, seg_masks: str, question: str | None = None,
                  decoding: TextDecoding | None = None, tile_embeds: Tensor | None = None,
                  chunk_size: int | None = None) -> list[Answer | None]:
    """The partner task "segment a text": per text, the greedy answer to its RES prompt
    (``processor.segment_prompt`` with ``question``) about image ``images[n]``, with one mask per kept fed-back
    ``[SEG]`` (``seg_masks``, a key of ``SEG_MASK_RULES``); None for an empty text (nothing to ground). One
    :func:`greedy_answers` call over the non-empty texts, in order (its other arguments as there)."""
    kept = [n for n, text in enumerate(texts) if text]
    rows = [PromptRow(images[n], processor.segment_prompt(encoded.n_tiles(images[n]), texts[n], question))
            for n in kept]
    answers: list[Answer | None] = [None] * len(texts)
    for n, answer in zip(kept, greedy_answers(model, processor, encoded, rows, max_new_tokens=max_new_tokens,
                                              decoding=decoding, seg_masks=seg_masks, tile_embeds=tile_embeds,
                                              chunk_size=chunk_size)):
        answers[n] = answer
    return answers


@dataclass
class RegionAnswer:
    """A greedy answer about a region: the ``answer`` and the bool ``[g, g]`` ``region_cells`` its prompt showed
    (``is_drawn``: the bool ``[H, W]`` mask drawn into its image instead; the prompt had no region tokens)."""

    answer: Answer
    region_cells: Tensor
    is_drawn: bool = False

    @property
    def region_tokens(self) -> int:
        """Region tokens the prompt held (0 for a drawn region)."""
        return 0 if self.is_drawn else int(self.region_cells.sum())


def describe_masks(model, processor, encoded: EncodedImages, masks: Sequence, images: Sequence[int],
                   sample_ids: Sequence[str], *, max_new_tokens: int, empty_region: str | None,
                   question: str | None = None, decoding: TextDecoding | None = None,
                   tile_embeds: Tensor | None = None, chunk_size: int | None = None,
                   region_input: str | None = None) -> list[RegionAnswer | None]:
    """The partner task "describe a mask": per bool ``[H, W]`` mask (tensor or array) of image ``images[n]``, its
    region cells (``processor.region_cells`` at the image's size; ``empty_region`` for a mask that hits no grid point,
    e.g. ``'dilate_to_one_cell'``: the one cell it covers most) and the greedy answer to the region-caption prompt
    (``processor.caption_prompt`` with ``question``); None for a missing or all-False mask (no region to describe).
    One :func:`greedy_answers` call over the non-empty masks, in order, without masks.

    ``region_input``: ``'native'`` (the region tokens above; the InternVL family's default) or ``'drawn'`` (the
    region drawn into a copy of the image, ``pipeline/drawn_regions.py``; ``question`` must then name the outline;
    the Qwen-VL family's default and only input, upstream never trained its region tokens)."""
    check_region_input(region_input, "describe_masks")
    kept = [n for n, mask in enumerate(masks) if mask is not None and bool(mask.any())]
    is_qwen_vl = is_qwen_vl_model(model)
    if is_qwen_vl and region_input == "native":
        raise ValueError("describe_masks: the Qwen-VL family has no native region input (upstream never trained its "
                         "region tokens); use region_input='drawn' (its default)")
    if region_input == "drawn" or is_qwen_vl:
        from .drawn_regions import describe_drawn_regions  # it builds on this module's greedy_answers

        return describe_drawn_regions(model, processor, encoded, masks, images, sample_ids, kept,
                                      max_new_tokens=max_new_tokens, question=question, decoding=decoding,
                                      tile_embeds=tile_embeds, chunk_size=chunk_size)
    rows = []
    for n in kept:
        image = images[n]
        cells = processor.region_cells(masks[n], sample_id=sample_ids[n], size=encoded.image_sizes[image],
                                       empty_region=empty_region)  # [g, g]
        rows.append(PromptRow(image, processor.caption_prompt(encoded.n_tiles(image), cells, question), cells))
    described: list[RegionAnswer | None] = [None] * len(masks)
    for n, row, answer in zip(kept, rows, greedy_answers(model, processor, encoded, rows,
                                                         max_new_tokens=max_new_tokens, decoding=decoding,
                                                         tile_embeds=tile_embeds, chunk_size=chunk_size)):
        described[n] = RegionAnswer(answer, row.region_cells)
    return described


def seg_answer_ids(tokenizer, answer: str, seg_token_id: int, where: str = "seg_answer") -> tuple[Tensor, int]:
    """``(ids [A] long, seg_index)``: a teacher-forced answer and the position of its single ``[SEG]``."""
    ids = tokenizer.encode(answer, add_special_tokens=False)
    positions = [t for t, token in enumerate(ids) if token == seg_token_id]
    if len(positions) != 1:
        raise ValueError(f"{where}={answer!r} holds {len(positions)} [SEG] tokens; it must hold exactly one, e.g. "
                         f"{SEG_ANSWER!r} (an upstream SFT answer).")
    return torch.tensor(ids, dtype=torch.long), positions[0]


def forced_seg_prompts(model, embeds: Tensor, attention: Tensor, answer_ids: Tensor, seg_index: Tensor) -> Tensor:
    """SAM2 prompts ``[n, C_sam]`` of teacher-forced answers: ``text_hidden_fcs(h[n, seg_index[n]])``.

    One teacher-forced pass over ``[prompt | answer]``; carries grad outside ``no_grad``. When the LM's layers are
    compiled for the loss pass (``grouped_scoring.compile_group_layers``) the pass runs through those layer calls
    (``grouped_completion_hidden``: the prompt, then the answer), so the compiled graphs and partial checkpointing
    serve it; eager, one transformers forward over the joined sequence (``completion_hidden``) launches half the
    layer calls.

    Args:
        embeds: ``[n, L, D]`` prompt embeddings (:func:`prompt_embeds`); attention: ``[n, L]`` left padded.
        answer_ids: ``[n, A]`` long; seg_index: ``[n]`` long, the ``[SEG]`` position of each answer.
    """
    lm = model.language_model
    states = grouped_completion_hidden if uses_compiled_layers(lm) else completion_hidden
    hidden = states(lm, embeds, attention, answer_ids, torch.ones_like(answer_ids, dtype=torch.bool))  # [n, A, D]
    rows = torch.arange(len(seg_index), device=hidden.device)  # [n]
    return model.seg_hidden_to_prompt(hidden[rows, seg_index])  # [n, C_sam]


def forced_answer_seg_prompts(model, encoded: EncodedImages, tile_embeds: Tensor, prompt_ids: Tensor,
                              attention: Tensor, images: Sequence[int], answer_ids: Tensor,
                              seg_index: Tensor) -> Tensor:
    """SAM2 prompts ``[n, C_sam]`` of n left-padded prompts ``[n, L]`` (rows about ``images``) answered with
    ``answer_ids [n, A]`` (``[SEG]`` at ``seg_index [n]``): :func:`prompt_embeds` → :func:`forced_seg_prompts`.
    The Qwen-VL family (``tile_embeds`` None) reads the state from its own teacher-forced pass
    (``qwen_vl_prompts.qwen_vl_answer_states``: M-RoPE positions, deepstack)."""
    if is_qwen_vl_model(model):
        hidden = qwen_vl_answer_states(model, encoded, images, prompt_ids, attention, answer_ids)  # [n, A, D]
        rows = torch.arange(len(seg_index), device=hidden.device)  # [n]
        return model.seg_hidden_to_prompt(hidden[rows, seg_index.to(hidden.device)])  # [n, C_sam]
    embeds = prompt_embeds(model, encoded, tile_embeds, prompt_ids, images)  # [n, L, D]
    return forced_seg_prompts(model, embeds, attention, answer_ids, seg_index)  # [n, C_sam]


def forced_answer_masks(model, encoded: EncodedImages, tile_embeds: Tensor, prompt_ids: Tensor, attention: Tensor,
                        images: Sequence[int], answer_ids: Tensor, seg_index: int) -> MaskDecoderOutput:
    """Forced answer → SAM2 mask: the decoder output (multimask, ``best_logits [n, h, w]`` by predicted IoU) of n
    RES prompts ``[n, L]`` (left padded, on the model's device) all answered with the fixed ``answer_ids [A]`` (its
    ``[SEG]`` at ``seg_index``), on the cached features of ``images``. Carries grad outside ``no_grad`` (through
    LoRA, ``mlp1``, ``text_hidden_fcs`` and the decoder)."""
    n = prompt_ids.shape[0]
    prompts = forced_answer_seg_prompts(model, encoded, tile_embeds, prompt_ids, attention, images,
                                        answer_ids[None].expand(n, -1),
                                        torch.full((n,), seg_index, device=prompt_ids.device))  # [n, C_sam]
    image_index = torch.tensor(list(images), dtype=torch.long, device=prompts.device)  # [n]
    return model.decode_masks(prompts, encoded.grounding, image_index)

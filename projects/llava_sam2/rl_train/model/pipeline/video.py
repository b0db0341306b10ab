"""Video inference with upstream ``predict_forward(video=...)`` semantics, on the shared pipeline (docs/architecture.md,
"Video inference").

::

    T frames ─ encode_video ─> EncodedVideo    the first n = min(5, T) frames → InternViT (one S×S tile each),
                                               all T frames → SAM2 (kept with the memory inputs), once each
    text ─ video_prompt ─> PromptRow           n single-tile image blocks joined by '\\n', in the template
       └─ greedy_answers (shared.py)           the greedy answer and each fed-back [SEG]'s SAM2 prompt
            └─ video_masklet_logits            SAM2 propagation: the prompt on frames 0..n-1 (memory-free, as the
                                               image path), memory attention on frames n..T-1 → [M, T, h, w]
                 └─ masklet_masks              bilinear h → S_sam → (H, W), sigmoid > 0.5 → bool [T, H, W]

The clip is one "image" of :class:`~.shared.EncodedImages` whose n tiles are the MLLM frames (so every prompt,
prefill and decode piece of ``shared.py`` runs unchanged), with the SAM2 features of all T frames as its grounding
rows (frame t at row t; the image row 0 reads frame 0). A one-frame video is therefore the image path with a single
tile: same prompt, same answer, and its masklet is the image path's mask (the memory is written but never read).

Differs from upstream as ``predict`` does: runs in the model's dtype. Upstream also rounds two things to bf16 whatever
the model dtype (the SAM2 normalisation constants and the stored memory features); both are no-ops under upstream's
own bf16 inference and are not copied here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..decoding.text_decoding import TextDecoding, eval_mode
from ..network.grounding import GroundingFeatures, upsample_logits
from .shared import Answer, EncodedImages, PromptRow, greedy_answers

MLLM_FRAMES = 5  # frames the language model sees (upstream predict_forward: the first five)


@dataclass
class EncodedVideo:
    """Frozen-encoder outputs of one clip (no grad).

    Attributes:
        encoded: the clip as one image: ``vit_tokens`` of its n MLLM frames (one tile each, frame order),
            ``image_sizes`` = [(H, W)], ``grounding`` = SAM2 features of all T frames with the memory inputs.
        num_mllm_frames: n.
    """

    encoded: EncodedImages
    num_mllm_frames: int

    @property
    def num_frames(self) -> int:
        """T."""
        return self.encoded.grounding.num_images

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the frames."""
        return self.encoded.image_sizes[0]


@torch.no_grad()
def encode_video(model, processor, frames: Sequence, where: str = "video",
                 mllm_frames: int = MLLM_FRAMES) -> EncodedVideo:
    """Preprocess T PIL frames (one size) and run both frozen encoders once: InternViT on the first
    ``mllm_frames``, SAM2 on all of them (one batched call each)."""
    inputs = processor.preprocess_video(frames, mllm_frames, where=where)
    device = model.device
    with eval_mode(model):
        vit_tokens = model.encode_vision(inputs.pixel_values.to(device))  # [n, t, 4C]
        grounding = model.encode_grounding(inputs.g_pixel_values.to(device), keep_memory_inputs=True)  # T frames
    n = inputs.num_mllm_frames
    return EncodedVideo(EncodedImages(image_sizes=[inputs.size], tile_start=[0, n], vit_tokens=vit_tokens,
                                      grounding=grounding), n)


def video_prompt(processor, video: EncodedVideo, text: str) -> PromptRow:
    """The templated user turn of ``text`` (``<image>`` once) about the clip: one image block per MLLM frame."""
    return PromptRow(0, processor.template_user_turn(processor.expand_video(text, video.num_mllm_frames)))


def video_masklet_logits(model, video: EncodedVideo, seg_prompts: Tensor) -> Tensor:
    """Masklet logits ``[M, T, h, w]`` (fp32) of M SAM2 prompts ``[M, C_sam]`` over the clip: every prompt on the
    n MLLM frames, SAM2 memory propagation to the rest (``Sa2VAModel.propagate_masklets``)."""
    with eval_mode(model):
        return model.propagate_masklets(seg_prompts, video.encoded.grounding, video.num_mllm_frames)


def masklet_masks(model, logits: Tensor, size: tuple[int, int]) -> Tensor:
    """One masklet's logits ``[T, h, w]`` → bool ``[T, H, W]`` by the image path's chain (bilinear h → S_sam →
    (H, W), sigmoid > 0.5)."""
    return upsample_logits(logits, size, model.config.sam_image_size).sigmoid() > 0.5


@torch.no_grad()
def predict_video_answer(model, processor, frames: Sequence, text: str, *, max_new_tokens: int = 2048,
                         decode_backend: str = "reference", mllm_frames: int = MLLM_FRAMES
                         ) -> tuple[Answer, Tensor | None, EncodedVideo]:
    """The greedy answer to ``text`` about ``frames``, its masklet logits ``[M, T, h, w]`` (one per fed-back
    ``[SEG]``; None without one) and the encoded clip."""
    video = encode_video(model, processor, frames, mllm_frames=mllm_frames)
    answer = greedy_answers(model, processor, video.encoded, [video_prompt(processor, video, text)],
                            max_new_tokens=max_new_tokens,
                            decoding=TextDecoding.from_processor(processor, decode_backend), seg_masks="all",
                            use_decoder_states=False, image_masks=False)[0]
    logits = video_masklet_logits(model, video, torch.stack(answer.seg_prompts)) if answer.seg_prompts else None
    return answer, logits, video


def predict_video(
    model: Any,
    processor: Any,
    frames: Sequence[Any],
    text: str,
    max_new_tokens: int = 2048,
    decode_backend: str = "reference",
    mllm_frames: int = MLLM_FRAMES,
) -> dict[str, Any]:
    """Greedy answer to ``text`` (``<image>`` once) about a clip of PIL ``frames`` and one masklet per ``[SEG]``.

    Args:
        model: a Sa2VAModel with a bound tokenizer; processor: the Sa2VAProcessor built from its config.
        frames: T RGB PIL frames of one size, in time order (sampling a longer video is the caller's choice).
        max_new_tokens / decode_backend: as ``predict``.
        mllm_frames: frames the language model sees (upstream: 5).

    Returns:
        ``{"prediction": str, "prediction_masks": [np.ndarray bool [T, H, W] per fed-back [SEG]]}`` (upstream's keys;
        a ``[SEG]`` that is the last generated token gets no masklet, as in ``predict``).
    """
    answer, logits, video = predict_video_answer(model, processor, frames, text, max_new_tokens=max_new_tokens,
                                                 decode_backend=decode_backend, mllm_frames=mllm_frames)
    masks = [] if logits is None else [masklet_masks(model, m, video.size).cpu().numpy() for m in logits]
    return {"prediction": answer.text, "prediction_masks": masks}


# ---- a batch of clips (the GRPO video step) -------------------------------------------------------------------


def select_frames(grounding: GroundingFeatures, rows: Sequence[int]) -> GroundingFeatures:
    """The SAM2 features of frames ``rows`` (any order, repeats allowed) as the rows of a new
    ``GroundingFeatures``; the memory inputs are kept when present."""
    index = torch.as_tensor(list(rows), dtype=torch.long, device=grounding.image_embed.device)
    return GroundingFeatures(
        image_embed=grounding.image_embed[index], high_res_feats=[f[index] for f in grounding.high_res_feats],
        backbone_embed=None if grounding.backbone_embed is None else grounding.backbone_embed[index],
        backbone_pos=grounding.backbone_pos)


def frame_range(grounding: GroundingFeatures, start: int, stop: int) -> GroundingFeatures:
    """Frames ``[start, stop)`` of ``grounding`` as views (no copy)."""
    return GroundingFeatures(
        image_embed=grounding.image_embed[start:stop], high_res_feats=[f[start:stop] for f in grounding.high_res_feats],
        backbone_embed=None if grounding.backbone_embed is None else grounding.backbone_embed[start:stop],
        backbone_pos=grounding.backbone_pos)


@dataclass
class EncodedClips:
    """C clips encoded once each, laid out so that the image functions of ``shared.py`` run on them unchanged.

    ``vit_tokens`` holds, in order, the MLLM frames of clip 0, of clip 1, ..., then one extra tile per requested
    still frame (:func:`encode_clips`'s ``still_frames``).

    Attributes:
        clips: image row c = clip c: its tiles are its n_c MLLM frames (``image_sizes[c]`` its frame size), so a
            prompt row about clip c (:func:`video_prompt`'s layout) fills its image blocks from them. Its
            ``grounding`` holds every frame of every clip, clip c's frame t at row ``frame_start[c] + t``: frame
            rows, not image rows, so only the functions here read it.
        frame_start: C + 1 offsets of the clips' frames in ``clips.grounding``.
        stills: image row s = still frame s as a one-tile image (tiles: the extra tiles of ``vit_tokens``, which
            ``clips`` shares), with that frame's SAM2 features as its grounding row; None without still frames.
    """

    clips: EncodedImages
    frame_start: list[int]
    stills: EncodedImages | None

    @property
    def num_clips(self) -> int:
        return self.clips.num_images

    def num_mllm_frames(self, clip: int) -> int:
        return self.clips.n_tiles(clip)

    def num_frames(self, clip: int) -> int:
        return self.frame_start[clip + 1] - self.frame_start[clip]

    def video(self, clip: int) -> EncodedVideo:
        """Clip ``clip`` alone as :func:`encode_video` gives it (views of the shared tensors)."""
        t0, t1 = self.tile_range(clip)
        f0, f1 = self.frame_start[clip], self.frame_start[clip + 1]
        return EncodedVideo(EncodedImages(image_sizes=[self.clips.image_sizes[clip]], tile_start=[0, t1 - t0],
                                          vit_tokens=self.clips.vit_tokens[t0:t1],
                                          grounding=frame_range(self.clips.grounding, f0, f1)), t1 - t0)

    def tile_range(self, clip: int) -> tuple[int, int]:
        return self.clips.tile_start[clip], self.clips.tile_start[clip + 1]

    def frame_images(self, clips: Sequence[int], frames: Sequence[int]) -> EncodedImages:
        """MLLM frame ``frames[r]`` of clip ``clips[r]`` as one-tile image row r (tiles and SAM2 rows gathered,
        a copy): the image functions' view of single frames the language model has seen."""
        for clip, frame in zip(clips, frames):
            if not 0 <= frame < self.num_mllm_frames(clip):
                raise ValueError(f"frame_images: frame {frame} of clip {clip} is not one of its "
                                 f"{self.num_mllm_frames(clip)} MLLM frames")
        tiles = [self.clips.tile_start[c] + f for c, f in zip(clips, frames)]
        index = torch.as_tensor(tiles, dtype=torch.long, device=self.clips.vit_tokens.device)
        return EncodedImages(image_sizes=[self.clips.image_sizes[c] for c in clips],
                             tile_start=list(range(len(tiles) + 1)), vit_tokens=self.clips.vit_tokens[index],
                             grounding=select_frames(self.clips.grounding,
                                                     [self.frame_start[c] + f for c, f in zip(clips, frames)]))


@torch.no_grad()
def encode_clips(model, processor, clips: Sequence[Sequence], where: Sequence[str],
                 still_frames: Sequence[tuple[int, int]] = (), mllm_frames: int = MLLM_FRAMES) -> EncodedClips:
    """Both frozen encoders once per frame: InternViT in one batched call on the first ``mllm_frames`` frames of
    every clip and on each still frame ``(clip, t)`` that is not one of them (a still frame that is an MLLM frame
    reuses that frame's tokens); SAM2 on every frame (with the memory inputs), one call per clip, so that the
    encoder's transient memory is that of T frames, not of all the step's frames at once.

    Args:
        clips: C lists of PIL frames (one size within a clip); where: one name per clip for error messages.
        still_frames: ``(clip, frame)`` pairs to expose as one-tile images (``EncodedClips.stills``), in order.
    """
    if len(clips) == 0 or len(clips) != len(where):
        raise ValueError(f"encode_clips: got {len(clips)} clips and {len(where)} names; pass one name (the sample "
                         "id) per clip, at least one clip")
    inputs = [processor.preprocess_video(frames, mllm_frames, where=name) for frames, name in zip(clips, where)]
    counts = [len(x.pixel_values) for x in inputs]
    tile_start = np.cumsum([0] + counts).tolist()
    extra_pixels, still_tiles = [], []  # tiles to encode beyond the MLLM frames; position of every still's tile
    for clip, frame in still_frames:
        if frame < counts[clip]:
            still_tiles.append(tile_start[clip] + frame)
        else:
            extra = processor.preprocess_video([clips[clip][frame]], 1, where=f"{where[clip]} frame {frame}")
            extra_pixels.append(extra.pixel_values)
            still_tiles.append(tile_start[-1] + len(extra_pixels) - 1)
    device = model.device
    with eval_mode(model):
        vit_tokens = model.encode_vision(torch.cat([x.pixel_values for x in inputs] + extra_pixels).to(device))
        per_clip = [model.encode_grounding(x.g_pixel_values.to(device), keep_memory_inputs=True) for x in inputs]
    grounding = GroundingFeatures(  # every frame of every clip, clip after clip
        image_embed=torch.cat([g.image_embed for g in per_clip]),
        high_res_feats=[torch.cat(level) for level in zip(*(g.high_res_feats for g in per_clip))],
        backbone_embed=torch.cat([g.backbone_embed for g in per_clip]), backbone_pos=per_clip[0].backbone_pos)
    del per_clip
    frame_start = np.cumsum([0] + [len(frames) for frames in clips]).tolist()
    sizes = [tuple(x.size) for x in inputs]
    stills = None
    if still_frames:
        # still tiles are appended after the extra encodes, so that their rows are consecutive (one tile each)
        first = len(vit_tokens)
        vit_tokens = torch.cat([vit_tokens, vit_tokens[torch.as_tensor(still_tiles, device=vit_tokens.device)]])
        stills = EncodedImages(image_sizes=[sizes[c] for c, _ in still_frames],
                               tile_start=list(range(first, first + len(still_frames) + 1)), vit_tokens=vit_tokens,
                               grounding=select_frames(grounding, [frame_start[c] + t for c, t in still_frames]))
    encoded = EncodedImages(image_sizes=sizes, tile_start=tile_start, vit_tokens=vit_tokens, grounding=grounding)
    return EncodedClips(clips=encoded, frame_start=frame_start, stills=stills)


def largest_mask_frames(model, clips: EncodedClips, clip_rows: Sequence[int], seg_prompts: Tensor) -> list[int]:
    """Per prompt row r (SAM2 prompt ``seg_prompts[r]`` about clip ``clip_rows[r]``), the MLLM frame where its mask
    (the image path's: decoder on that frame, best of multimask, at the frame size) has the most pixels, the
    earliest on a tie. Frames the language model has not seen are not candidates."""
    owners, frames = [], []
    for r, clip in enumerate(clip_rows):
        for t in range(clips.num_mllm_frames(clip)):
            owners.append(r)
            frames.append(clips.frame_start[clip] + t)
    index = torch.as_tensor(frames, dtype=torch.long, device=seg_prompts.device)
    logits = model.decode_masks(seg_prompts[owners], clips.clips.grounding, index).best_logits  # [R, h, w]
    masks = model.logits_to_masks(logits, [clips.clips.image_sizes[clip_rows[r]] for r in owners])
    areas: list[list[int]] = [[] for _ in clip_rows]
    for r, mask in zip(owners, masks):
        areas[r].append(int(mask.sum()))
    return [int(np.argmax(a)) for a in areas]


def segment_texts_in_clips(model, processor, clips: EncodedClips, texts: Sequence[str | None],
                           clip_rows: Sequence[int], *, max_new_tokens: int, question: str | None = None,
                           decoding: TextDecoding | None = None, tile_embeds: Tensor | None = None,
                           chunk_size: int | None = None) -> tuple[list[Answer | None], list[Tensor | None]]:
    """The partner task "segment a text" in a clip: per text, the greedy answer to its video RES prompt
    (``processor.video_segment_prompt`` over the clip's MLLM frames) and the masklet bool ``[T, H, W]`` (on the
    model's device) of its first fed-back ``[SEG]`` (SAM2 propagation over every frame, all masklets of a clip in one
    batched propagation). None for an empty text (no answer) and for an answer without a fed-back ``[SEG]`` (no
    masklet).
    """
    kept = [n for n, text in enumerate(texts) if text]
    rows = [PromptRow(clip_rows[n], processor.video_segment_prompt(clips.num_mllm_frames(clip_rows[n]), texts[n],
                                                                   question)) for n in kept]
    answers: list[Answer | None] = [None] * len(texts)
    if rows:
        for n, answer in zip(kept, greedy_answers(model, processor, clips.clips, rows, max_new_tokens=max_new_tokens,
                                                  decoding=decoding, seg_masks="first", tile_embeds=tile_embeds,
                                                  chunk_size=chunk_size, image_masks=False)):
            answers[n] = answer
    masklets: list[Tensor | None] = [None] * len(texts)
    for clip in sorted(set(clip_rows)):
        owners = [n for n in kept if clip_rows[n] == clip and answers[n].seg_prompts]
        if not owners:
            continue
        video = clips.video(clip)
        logits = video_masklet_logits(model, video, torch.stack([answers[n].seg_prompts[0] for n in owners]))
        for n, masklet in zip(owners, logits):  # [T, h, w] each
            masklets[n] = masklet_masks(model, masklet, video.size)
    return answers, masklets

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

import torch
from torch import Tensor

from ..decoding.text_decoding import TextDecoding, eval_mode
from ..network.grounding import upsample_logits
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

"""SAM2 grounding head from the ``sam2`` package classes (docs/sa2va_internals.md §1.7, §2.2, §4.3).

``GroundingEncoder.sam2_model`` is a ``SAM2Base`` with the SAM 2.0 Hiera-L flags Sa2VA builds from
``sam2_hiera_l.yaml`` (sizes from ``config.grounding``), so its state-dict keys match
``grounding_encoder.sam2_model.*`` of the HF checkpoints (``.gamma`` ↔ ``.g_weight`` aside, see
checkpoints/hf_checkpoint.py). Image path: image encoder once per image, then the prompt encoder + mask decoder per
``[SEG]`` (``decode``). Video path (``propagate``, docs/architecture.md "Video inference"): the ``[SEG]`` prompt on
the conditioning frames (memory-free, as the image path), then SAM2's memory attention and memory encoder carry the
object to every later frame (a masklet).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from sam2.modeling.backbones.hieradet import Hiera
from sam2.modeling.backbones.image_encoder import FpnNeck, ImageEncoder
from sam2.modeling.memory_attention import MemoryAttention, MemoryAttentionLayer
from sam2.modeling.memory_encoder import CXBlock, Fuser, MaskDownSampler, MemoryEncoder
from sam2.modeling.position_encoding import PositionEmbeddingSine
from sam2.modeling.sam2_base import SAM2Base
from sam2.modeling.sam.transformer import RoPEAttention
from torch import nn
from transformers.modeling_utils import no_init_weights

from ..text.constants import IMAGENET_MEAN, IMAGENET_STD
from .sam2_seams import encode_memory, memory_conditioned_embed


@dataclass
class GroundingFeatures:
    """Frozen SAM2 image features of B images, computed once per image per step.

    image_embed: [B, C, e, e] level-2 FPN map + ``no_mem_embed`` (C = SAM2 hidden, e = S_sam / 16).
    high_res_feats: raw FPN levels 0 and 1, [B, C, 4e, 4e] and [B, C, 2e, 2e]; the trainable
        ``conv_s0`` / ``conv_s1`` skips are applied inside ``decode_masks``.
    backbone_embed: the raw level-2 map [B, C, e, e] (without ``no_mem_embed``): what the memory encoder and the
        memory attention read (video path); None unless encoded with ``keep_memory_inputs=True``.
    backbone_pos: its sine position encoding [1, C, e, e] (the same for every frame), or None.
    """

    image_embed: torch.Tensor
    high_res_feats: list[torch.Tensor]
    backbone_embed: torch.Tensor | None = None
    backbone_pos: torch.Tensor | None = None

    @property
    def num_images(self) -> int:
        return self.image_embed.shape[0]


@dataclass
class MaskDecoderOutput:
    """SAM2 decoder output for M prompts (multimask on, as upstream for a prompt without points).

    low_res_logits: [M, 3, h, w] float32 (h = 4e); iou_scores: [M, 3] (sigmoid); best_index: [M]
    argmax of iou_scores; best_logits: [M, h, w] = low_res_logits[m, best_index[m]];
    object_score_logits: [M, 1] (computed, not used to blank masks, as in Sa2VA).
    best_token: [M, C] the decoder's output token of the kept mask (the object pointer's input, video path).
    """

    low_res_logits: torch.Tensor
    iou_scores: torch.Tensor
    best_index: torch.Tensor
    best_logits: torch.Tensor
    object_score_logits: torch.Tensor
    best_token: torch.Tensor | None = None


def _sine(num_pos_feats: int) -> PositionEmbeddingSine:
    return PositionEmbeddingSine(num_pos_feats=num_pos_feats, normalize=True, scale=None, temperature=10000)


def _memory_attention(g: dict[str, Any]) -> MemoryAttention:
    hidden, feat = g["hidden_dim"], g["image_size"] // g["backbone_stride"]
    ma = g["memory_attention"]

    def rope(**extra: Any) -> RoPEAttention:
        return RoPEAttention(rope_theta=10000.0, feat_sizes=[feat, feat], embedding_dim=hidden, num_heads=1,
                             downsample_rate=1, dropout=0.1, **extra)

    layer = MemoryAttentionLayer(
        activation="relu", cross_attention=rope(rope_k_repeat=True, kv_in_dim=g["mem_dim"]), d_model=hidden,
        dim_feedforward=ma["dim_feedforward"], dropout=0.1, pos_enc_at_attn=False,
        pos_enc_at_cross_attn_keys=True, pos_enc_at_cross_attn_queries=False, self_attention=rope(),
    )
    return MemoryAttention(d_model=hidden, pos_enc_at_input=True, layer=layer, num_layers=ma["num_layers"])


def build_sam2(g: dict[str, Any]) -> SAM2Base:
    """SAM2Base with the SAM 2.0 Hiera-L flags of Sa2VA, sized by the resolved grounding dict.

    Under a meta default device the module is built on CPU without weight init and moved to meta:
    Hiera calls ``.item()`` and RoPEAttention moves tables to CUDA while constructing, which meta
    tensors do not allow.
    """
    if torch.empty(0).device.type == "meta":
        with torch.device("cpu"), no_init_weights():
            return _build_sam2(g).to("meta")
    return _build_sam2(g)


def _build_sam2(g: dict[str, Any]) -> SAM2Base:
    t, hidden, mem_dim = g["trunk"], g["hidden_dim"], g["mem_dim"]
    trunk = Hiera(embed_dim=t["embed_dim"], num_heads=t["num_heads"], stages=t["stages"],
                  global_att_blocks=t["global_att_blocks"],
                  window_pos_embed_bkg_spatial_size=t["window_pos_embed_bkg_spatial_size"],
                  window_spec=t["window_spec"])
    neck = FpnNeck(position_encoding=_sine(hidden), d_model=hidden, backbone_channel_list=trunk.channel_list,
                   fpn_top_down_levels=[2, 3], fpn_interp_model="nearest")
    memory_attention = _memory_attention(g)
    memory_encoder = MemoryEncoder(
        out_dim=mem_dim, position_encoding=_sine(mem_dim),
        mask_downsampler=MaskDownSampler(embed_dim=hidden, kernel_size=3, stride=2, padding=1),
        fuser=Fuser(CXBlock(dim=hidden, kernel_size=7, padding=3, layer_scale_init_value=1e-6, use_dwconv=True),
                    num_layers=g["memory_encoder"]["fuser_layers"]),
        in_dim=hidden,
    )
    return SAM2Base(
        image_encoder=ImageEncoder(trunk=trunk, neck=neck, scalp=1), memory_attention=memory_attention,
        memory_encoder=memory_encoder, num_maskmem=g["num_maskmem"], image_size=g["image_size"],
        backbone_stride=g["backbone_stride"], sigmoid_scale_for_mem_enc=20.0, sigmoid_bias_for_mem_enc=-10.0,
        use_mask_input_as_output_without_sam=True, directly_add_no_mem_embed=True,
        use_high_res_features_in_sam=True, multimask_output_in_sam=True, iou_prediction_use_sigmoid=True,
        use_obj_ptrs_in_encoder=True, add_tpos_enc_to_obj_ptrs=False, only_obj_ptrs_in_the_past_for_eval=True,
        pred_obj_scores=True, pred_obj_scores_mlp=True, fixed_no_obj_ptr=True, multimask_output_for_tracking=True,
        use_multimask_token_for_obj_ptr=True, multimask_min_pt_num=0, multimask_max_pt_num=1,
        use_mlp_for_obj_ptr_proj=True, compile_image_encoder=False,
        sam_mask_decoder_extra_args={"dynamic_multimask_via_stability": True,
                                     "dynamic_multimask_stability_delta": 0.05,
                                     "dynamic_multimask_stability_thresh": 0.98},
    )


def no_prompt_embeddings(sam: SAM2Base, M: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``sam_prompt_encoder`` returns for "no points, no box, no mask" (SAM2's
    ``_forward_sam_heads`` with ``point_inputs=None``): one label −1 point plus the pad point, both
    embedded as ``not_a_point_embed``, and ``no_mask_embed`` broadcast over the e×e grid.

    Built from the two embeddings directly so that it also runs in bf16 without autocast (the
    encoder's Fourier features would mix fp32 coordinates with bf16 weights); a test checks it
    equals the prompt encoder output in fp32.
    """
    enc = sam.sam_prompt_encoder
    C = enc.embed_dim
    h, w = enc.image_embedding_size
    sparse = enc.not_a_point_embed.weight.reshape(1, 1, C).expand(M, 2, C)  # [M, 2, C]
    dense = enc.no_mask_embed.weight.reshape(1, C, 1, 1).expand(M, C, h, w)  # [M, C, e, e]
    return sparse, dense


class GroundingEncoder(nn.Module):
    """Holds ``sam2_model`` so keys read ``grounding_encoder.sam2_model.*`` as upstream."""

    def __init__(self, grounding: dict[str, Any]):
        super().__init__()
        self.sam2_model = build_sam2(grounding)

    def preprocess(self, g_pixel_values: torch.Tensor) -> torch.Tensor:
        """0..255 RGB [B, 3, S, S] → (x / 255 − mean) / std in the encoder's dtype."""
        dtype = self.sam2_model.no_mem_embed.dtype
        x = g_pixel_values.to(dtype) / 255.0
        mean = torch.tensor(IMAGENET_MEAN, dtype=dtype, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, dtype=dtype, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def encode(self, g_pixel_values: torch.Tensor, keep_memory_inputs: bool = False) -> GroundingFeatures:
        """``keep_memory_inputs``: also keep the raw level-2 map and its position encoding (``propagate`` needs
        them; the image path does not, so it does not hold the extra map)."""
        sam = self.sam2_model
        size = sam.image_size
        if g_pixel_values.ndim != 4 or tuple(g_pixel_values.shape[1:]) != (3, size, size):
            raise ValueError(
                f"g_pixel_values must be [B, 3, {size}, {size}] with 0..255 values, got {tuple(g_pixel_values.shape)}"
            )
        dtype = sam.no_mem_embed.dtype
        fpn = sam.image_encoder(self.preprocess(g_pixel_values))["backbone_fpn"]  # 3 levels, high-res first
        fpn = [level.to(dtype) for level in fpn]  # the FPN top-down sum is upcast to fp32 inside sam2
        B, C = fpn[-1].shape[:2]
        image_embed = fpn[-1] + sam.no_mem_embed.view(1, C, 1, 1)  # [B, C, e, e]
        if not keep_memory_inputs:
            return GroundingFeatures(image_embed=image_embed, high_res_feats=[fpn[0], fpn[1]])
        position = sam.image_encoder.neck.position_encoding(fpn[-1][:1]).to(dtype)  # [1, C, e, e]
        return GroundingFeatures(image_embed=image_embed, high_res_feats=[fpn[0], fpn[1]], backbone_embed=fpn[-1],
                                 backbone_pos=position)

    def decode(self, prompt: torch.Tensor, features: GroundingFeatures, image_index: torch.Tensor) -> MaskDecoderOutput:
        """Sparse prompt = [not_a_point, pad point, e] with e = the [SEG] prompt; dense = no_mask_embed."""
        sam = self.sam2_model
        M = prompt.shape[0]
        if prompt.ndim != 2 or prompt.shape[1] != sam.hidden_dim:
            raise ValueError(f"prompt must be [M, {sam.hidden_dim}], got {tuple(prompt.shape)}")
        image_index = torch.as_tensor(image_index, dtype=torch.long, device=prompt.device).reshape(-1)
        if image_index.numel() != M:
            raise ValueError(f"image_index has {image_index.numel()} entries for {M} prompts")
        if M and bool(((image_index < 0) | (image_index >= features.num_images)).any()):  # one device read
            raise ValueError(f"image_index {image_index.tolist()} out of range for {features.num_images} images")
        if M == 0:  # no [SEG] in any rollout: empty outputs of the right shapes
            return _empty_output(sam, prompt.device)
        return self._decode_heads(features.image_embed[image_index], features, image_index, prompt)

    def _decode_heads(self, image_embed: torch.Tensor, features: GroundingFeatures, image_index: torch.Tensor,
                      prompt: torch.Tensor | None) -> MaskDecoderOutput:
        """The mask decoder on ``image_embed [M, C, e, e]`` with the skips of ``features[image_index]``; sparse
        prompt = [not_a_point, pad point] (+ ``prompt [M, C]`` as a third token when given)."""
        sam = self.sam2_model
        M = image_embed.shape[0]
        decoder = sam.sam_mask_decoder
        s0 = decoder.conv_s0(features.high_res_feats[0])[image_index]  # [M, C/8, 4e, 4e]
        s1 = decoder.conv_s1(features.high_res_feats[1])[image_index]  # [M, C/4, 2e, 2e]
        sparse, dense = no_prompt_embeddings(sam, M)  # [M, 2, C], [M, C, e, e]
        if prompt is not None:
            sparse = torch.cat([sparse, prompt[:, None].to(sparse.dtype)], dim=1)  # [M, 3, C]
        with _half_autocast(sparse):  # sam2 builds the Fourier PE grid in fp32 whatever the weights' dtype
            image_pe = sam.sam_prompt_encoder.get_dense_pe().to(sparse.dtype)  # [1, C, e, e]
        logits, iou, tokens, obj = decoder(
            image_embeddings=image_embed, image_pe=image_pe, sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense, multimask_output=True, repeat_image=False, high_res_features=[s0, s1],
        )
        logits = logits.float()  # [M, 3, h, w]
        best = iou.argmax(dim=-1)  # [M]
        rows = torch.arange(M, device=logits.device)
        best_logits = logits[rows, best]  # [M, h, w]
        return MaskDecoderOutput(logits, iou, best, best_logits, obj, best_token=tokens[rows, best])  # tokens [M, 3, C]

    def object_pointer(self, best_token: torch.Tensor, object_score_logits: torch.Tensor) -> torch.Tensor:
        """SAM2's object pointer ``[M, C]`` of a decoded mask: the projected output token of the kept mask, replaced
        by the learned ``no_obj_ptr`` where the object score says "absent" (a hard switch, as SAM2 at inference)."""
        sam = self.sam2_model
        pointer = sam.obj_ptr_proj(best_token)  # [M, C]
        present = (object_score_logits > 0).to(pointer.dtype)  # [M, 1]
        return present * pointer + (1 - present) * sam.no_obj_ptr

    def propagate(self, prompt: torch.Tensor, features: GroundingFeatures, num_cond_frames: int,
                  clip_index: torch.Tensor | None = None, num_clips: int = 1) -> torch.Tensor:
        """Masklet logits ``[M, T, h, w]`` (fp32) of M ``[SEG]`` prompts ``[M, C]`` over the T frames of
        ``features`` (encoded with ``keep_memory_inputs=True``), as Sa2VA's SAM2 video predictor.

        Several clips of T frames each can be tracked in one pass: ``features`` then holds ``num_clips`` clips
        stacked clip-major (row ``c·T + t`` is frame t of clip c) and ``clip_index`` ``[M]`` names each prompt's
        clip; every prompt reads only its own clip's frames and memories (the bank's rows are the prompts).

        Frames ``0 .. num_cond_frames - 1`` are conditioning frames: each is decoded with the prompt and no memory,
        exactly as the image path (``decode``). Every later frame is decoded without a prompt from its features
        fused with the memory bank (``sam2_seams.memory_conditioned_embed``). After each frame its best mask is
        encoded into the bank (``sam2_seams.encode_memory``) with its object pointer. The M prompts are M objects
        tracked side by side (batch rows; Sa2VA tracks each ``[SEG]`` in its own session, which is the same
        computation). The SAM2 weights must be in eval mode (SAM2 reads its memory bank differently in training).
        """
        sam = self.sam2_model
        M = prompt.shape[0]
        if num_clips < 1 or features.num_images % num_clips:
            raise ValueError(f"propagate: {features.num_images} frames do not split into num_clips={num_clips} "
                             "clips of equal length")
        T = features.num_images // num_clips
        if clip_index is None:
            clip_index = torch.zeros(M, dtype=torch.long, device=prompt.device)
        if tuple(clip_index.shape) != (M,):
            raise ValueError(f"propagate: clip_index must be [M={M}], got {tuple(clip_index.shape)}")
        first_frame = clip_index.to(device=prompt.device, dtype=torch.long) * T  # [M] row of each prompt's frame 0
        if features.backbone_embed is None or features.backbone_pos is None:
            raise ValueError("propagate needs the frames encoded with keep_memory_inputs=True")
        if not 1 <= num_cond_frames <= T:
            raise ValueError(f"num_cond_frames={num_cond_frames} must be in 1..{T} (the frames given)")
        if prompt.ndim != 2 or prompt.shape[1] != sam.hidden_dim or M == 0:
            raise ValueError(f"prompt must be [M >= 1, {sam.hidden_dim}], got {tuple(prompt.shape)}")
        if sam.training:
            raise ValueError("propagate runs SAM2 in eval mode (wrap the call in decoding.text_decoding.eval_mode)")
        e = features.image_embed.shape[-2:]
        position = features.backbone_pos.flatten(2).permute(2, 0, 1).expand(-1, M, -1)  # [e·e, M, C]
        bank: dict[str, dict] = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
        masklet = []
        for t in range(T):
            frame = first_frame + t  # [M] feature rows of frame t of each prompt's clip
            vision = features.backbone_embed[frame].flatten(2).permute(2, 0, 1)  # [e·e, M, C]
            is_cond = t < num_cond_frames
            if is_cond:
                out = self._decode_heads(features.image_embed[frame], features, frame, prompt)
            else:
                fused = memory_conditioned_embed(sam, t, vision, position, tuple(e), bank, T)  # [M, C, e, e]
                out = self._decode_heads(fused, features, frame, None)
            masklet.append(out.best_logits)  # [M, h, w]
            high_res = F.interpolate(out.best_logits[:, None], size=(sam.image_size, sam.image_size),
                                     mode="bilinear", align_corners=False)  # [M, 1, S, S]
            memory, memory_pos = encode_memory(sam, vision, tuple(e), high_res.to(vision.dtype),
                                               out.object_score_logits, from_prompt=is_cond)
            bank["cond_frame_outputs" if is_cond else "non_cond_frame_outputs"][t] = {
                "maskmem_features": memory, "maskmem_pos_enc": memory_pos,
                "obj_ptr": self.object_pointer(out.best_token, out.object_score_logits)}
        return torch.stack(masklet, dim=1)  # [M, T, h, w]


def _empty_output(sam: SAM2Base, device: torch.device) -> MaskDecoderOutput:
    h = sam.image_size // sam.backbone_stride * 4
    logits = torch.zeros(0, 3, h, h, device=device)
    return MaskDecoderOutput(logits, torch.zeros(0, 3, device=device), torch.zeros(0, dtype=torch.long, device=device),
                             logits[:, 0], torch.zeros(0, 1, device=device))


def _half_autocast(like: torch.Tensor):
    """bf16/fp16 autocast when the SAM2 weights are half precision; a no-op for fp32 weights."""
    if like.dtype in (torch.bfloat16, torch.float16):
        return torch.autocast(device_type=like.device.type, dtype=like.dtype)
    return contextlib.nullcontext()


def upsample_logits(low_res_logits: torch.Tensor, size: tuple[int, int], sam_image_size: int) -> torch.Tensor:
    """Released upsampling chain of M masks' logits of one output size: ``[M, h, w]`` → bilinear h → S_sam →
    bilinear S_sam → (H, W) (align_corners False) → fp32 ``[M, H, W]``. ``> 0`` on it is the released binary mask; other
    thresholds are what prompt_rl's post-processing tunes."""
    x = low_res_logits.float()[:, None]  # [M, 1, h, w]
    x = F.interpolate(x, size=(sam_image_size, sam_image_size), mode="bilinear", align_corners=False)
    x = F.interpolate(x, size=tuple(int(v) for v in size), mode="bilinear", align_corners=False)  # [M, 1, H, W]
    return x[:, 0]


def logits_to_masks(best_logits: torch.Tensor, sizes: list[tuple[int, int]], sam_image_size: int) -> list[torch.Tensor]:
    """Released chain: ``upsample_logits`` of each mask to its own size, sigmoid > 0.5.

    best_logits [M, h, w]; sizes: M pairs (H, W) → M bool masks [H, W].
    """
    if len(sizes) != best_logits.shape[0]:
        raise ValueError(f"logits_to_masks got {best_logits.shape[0]} logits but {len(sizes)} sizes")
    return [upsample_logits(logit[None], size, sam_image_size)[0].sigmoid() > 0.5  # [H, W]
            for logit, size in zip(best_logits.float(), sizes)]

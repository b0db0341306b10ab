"""The ``sam2`` internals the grounding head's video path uses (``grounding.GroundingEncoder.propagate``).

SAM2's video predictor keeps its memory bank in a session dict and reads images from disk; Sa2VA's masklet needs only
the two steps underneath it, which ``SAM2Base`` offers as private methods. Each has a canary in
``tests/test_model_seams.py`` that fails, naming the installed sam2 version, when an upgrade changes its arguments.

* ``memory_conditioned_embed``: ``SAM2Base._prepare_memory_conditioned_features`` for a frame that is not a
  conditioning frame: the frame's top-level features cross-attend (memory attention) to the memory bank, i.e. the
  conditioning frames' memories, the last ``num_maskmem - 1`` tracked frames' memories and the object pointers of
  the past frames (the bank is the ``{"cond_frame_outputs", "non_cond_frame_outputs"}`` dict of per-frame
  ``{"maskmem_features", "maskmem_pos_enc", "obj_ptr"}``).
* ``encode_memory``: ``SAM2Base._encode_new_memory``: a frame's features and its predicted mask logits at
  ``image_size`` → the memory features and their position encoding.
"""
from __future__ import annotations

import importlib.metadata

from sam2.modeling.sam2_base import SAM2Base
from torch import Tensor

SAM2_VERSION = importlib.metadata.version("sam2")
MEMORY_CONDITIONED_METHOD = "_prepare_memory_conditioned_features"
ENCODE_MEMORY_METHOD = "_encode_new_memory"


def memory_conditioned_embed(sam: SAM2Base, frame_index: int, vision_feats: Tensor, vision_pos: Tensor,
                             feat_size: tuple[int, int], memory_bank: dict, num_frames: int) -> Tensor:
    """``[B, C, e, e]`` features of frame ``frame_index`` fused with ``memory_bank`` (B objects).

    ``vision_feats`` / ``vision_pos``: the frame's raw top-level FPN map and its sine encoding, flattened
    ``[e·e, B, C]``."""
    return getattr(sam, MEMORY_CONDITIONED_METHOD)(
        frame_idx=frame_index, is_init_cond_frame=False, current_vision_feats=[vision_feats],
        current_vision_pos_embeds=[vision_pos], feat_sizes=[feat_size], output_dict=memory_bank,
        num_frames=num_frames)


def encode_memory(sam: SAM2Base, vision_feats: Tensor, feat_size: tuple[int, int], high_res_logits: Tensor,
                  object_score_logits: Tensor, from_prompt: bool) -> tuple[Tensor, list[Tensor]]:
    """``(maskmem_features [B, C_mem, e, e], maskmem_pos_enc)`` of a frame (``vision_feats`` ``[e·e, B, C]``) and
    its mask logits ``[B, 1, S, S]``; ``from_prompt``: the frame is a conditioning frame."""
    return getattr(sam, ENCODE_MEMORY_METHOD)(
        current_vision_feats=[vision_feats], feat_sizes=[feat_size], pred_masks_high_res=high_res_logits,
        object_score_logits=object_score_logits, is_mask_from_pts=from_prompt)

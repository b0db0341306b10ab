"""Sa2VAModel: InternViT + pixel shuffle + mlp1 + causal LM + SAM2 + text_hidden_fcs.

Submodules are named as the HF checkpoint keys (docs/sa2va_internals.md §1.1): ``vision_model``,
``language_model``, ``mlp1``, ``grounding_encoder.sam2_model``, ``text_hidden_fcs``. The methods
implement docs/architecture.md (model/ → grpo/, engine/): frozen encoders run without grad, the
trainable pieces (``mlp1``, LLM, ``text_hidden_fcs``, SAM2 mask decoder) are plain differentiable calls. The
grounding steps (``[SEG]`` → SAM2) are the families' shared ``seg_head.SegGroundingMixin``.
Differs from upstream Sa2VA: no monolithic ``forward(data)``; callers compose these steps, and a
``<IMG_CONTEXT>`` count mismatch raises instead of repeating/truncating features (§4.2).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..text.constants import IMG_CONTEXT_TOKEN, SEG_TOKEN
from .configuration import Sa2VAConfig
from .grounding import GroundingEncoder
from .language import build_language_model
from .seg_head import SegGroundingMixin, build_text_hidden_fcs
from .vision import InternVisionModel, build_mlp1, pixel_shuffle


class Sa2VAModel(SegGroundingMixin, nn.Module):
    def __init__(self, config: Sa2VAConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        if not isinstance(config, Sa2VAConfig):
            raise TypeError(f"Sa2VAModel expects a Sa2VAConfig, got {type(config).__name__}")
        self.config = config
        D = config.llm_hidden_size
        self.vision_model = InternVisionModel(config.vision_config)
        self.language_model = build_language_model(config.llm_config, attn_implementation)
        self.mlp1 = build_mlp1(config.vit_hidden_size, config.downsample_ratio, D)
        self.grounding_encoder = GroundingEncoder(config.grounding)
        self.text_hidden_fcs = build_text_hidden_fcs(D, config.sam_hidden_dim)
        self.img_context_token_id: int | None = None
        self.seg_token_id: int | None = None
        self.lm_head_tied = False  # set by the loader when a checkpoint has no LM head (§8.10)

    # ------------------------------------------------------------------ small helpers
    @property
    def device(self) -> torch.device:
        return self.mlp1[1].weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.mlp1[1].weight.dtype

    @property
    def num_image_token(self) -> int:
        return self.config.num_image_token

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.language_model.get_output_embeddings()

    def bind_tokenizer(self, tokenizer) -> None:
        """Read ``<IMG_CONTEXT>`` / ``[SEG]`` ids and check the tokenizer fits the embedding table."""
        rows = self.get_input_embeddings().weight.shape[0]
        if len(tokenizer) > rows:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the LLM embedding has {rows} rows "
                "(llm_config.vocab_size); use the tokenizer saved with this checkpoint"
            )
        ids = {}
        for token in (IMG_CONTEXT_TOKEN, SEG_TOKEN):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id or token_id >= rows:
                raise ValueError(f"tokenizer does not know {token!r} (got id {token_id}); add Sa2VA's special tokens")
            ids[token] = int(token_id)
        self.img_context_token_id = ids[IMG_CONTEXT_TOKEN]
        self.seg_token_id = ids[SEG_TOKEN]

    # ------------------------------------------------------------------ vision path
    @torch.no_grad()
    def encode_vision(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [n_tiles, 3, S, S] → ViT tokens after pixel shuffle [n_tiles, t, k²C]."""
        hidden = self.vision_model(pixel_values.to(self.vision_model.embeddings.patch_embedding.weight.dtype),
                                   select_layer=self.config.select_layer)
        tokens = hidden[:, 1:]  # drop CLS: [n, R², C]
        n, P, C = tokens.shape
        R = int(round(P**0.5))
        grid = pixel_shuffle(tokens.reshape(n, R, R, C), self.config.downsample_ratio, self.config.ps_version)
        return grid.reshape(n, -1, grid.shape[-1])  # [n, t, k²C]

    def project_vision(self, vit_tokens: torch.Tensor) -> torch.Tensor:
        """mlp1: [n_tiles, t, k²C] → [n_tiles, t, D]."""
        return self.mlp1(vit_tokens.to(self.dtype))

    def build_image_embeds(self, tile_embeds: torch.Tensor, region_cells: torch.Tensor | Sequence | None = None
                           ) -> torch.Tensor:
        """One sample's ``<IMG_CONTEXT>`` fill (reference §3.4 step 3, §4.2).

        tile_embeds [n_tiles, t, D] (projected, thumbnail last); region_cells bool [N, g, g] (or a list
        of [g, g]). Returns [n_tiles·t + Σ k_i, D]: every tile's tokens, then for each region the
        thumbnail's tokens at its True cells in row-major order (k_i = cells of region i).
        """
        n, t, D = tile_embeds.shape
        parts = [tile_embeds.reshape(n * t, D)]  # [n·t, D]
        if region_cells is not None and len(region_cells):
            cells = region_cells if torch.is_tensor(region_cells) else torch.stack([torch.as_tensor(c) for c in region_cells])
            g = self.config.region_grid_size
            if cells.ndim != 3 or tuple(cells.shape[1:]) != (g, g):
                raise ValueError(f"region_cells must be bool [N, {g}, {g}], got {tuple(cells.shape)}")
            # the cells' positions where the cells live (the step's are host tensors, so no device read), one
            # gather on the device: regions in order, each one's cells row-major
            cell_index = cells.reshape(len(cells), g * g).to(torch.bool).nonzero()[:, 1]  # [Σ k_i]
            thumb = tile_embeds[-1]  # [t, D]
            parts.append(thumb[cell_index.to(thumb.device, non_blocking=True)])  # [Σ k_i, D]
        return torch.cat(parts, dim=0)

    def embed_inputs(self, input_ids: torch.Tensor, image_embeds: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """inputs_embeds [B, L, D] = token embeddings with ``<IMG_CONTEXT>`` rows of sample b replaced,
        in order, by ``image_embeds[b]`` [k_b, D]. A count mismatch raises ValueError."""
        if self.img_context_token_id is None:
            raise ValueError("call model.bind_tokenizer(tokenizer) before embed_inputs")
        B, L = input_ids.shape
        if len(image_embeds) != B:
            raise ValueError(f"embed_inputs got {len(image_embeds)} image_embeds entries for a batch of {B}")
        embeds = self.get_input_embeddings()(input_ids)  # [B, L, D]
        is_ctx = input_ids == self.img_context_token_id  # [B, L]
        found = is_ctx.sum(dim=1).tolist()
        fills = []
        for b, (n_found, fill) in enumerate(zip(found, image_embeds)):
            n_expected = 0 if fill is None else fill.shape[0]
            if n_found != n_expected:
                raise ValueError(
                    f"sample {b}: input_ids hold {n_found} {IMG_CONTEXT_TOKEN} tokens but image_embeds[{b}] has "
                    f"{n_expected} rows; the prompt's image block and region tokens must match the tiles/regions"
                )
            if fill is not None and n_expected:
                fills.append(fill.to(embeds.dtype))
        if not fills:
            return embeds
        # row-major over (b, position); a masked scatter, unlike boolean-mask assignment, needs no device read
        return embeds.masked_scatter(is_ctx[..., None], torch.cat(fills, dim=0))

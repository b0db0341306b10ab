"""InternViT tile encoder, pixel shuffle and the ``mlp1`` projector (reference/sa2va.md §1.4-§1.5).

Module names equal the HF checkpoint keys under ``vision_model.``: ``embeddings.{class_embedding,
patch_embedding, position_embedding}`` and ``encoder.layers.{i}.{attn.qkv, attn.proj, attn.q_norm,
attn.k_norm, mlp.fc1, mlp.fc2, norm1, norm2, ls1, ls2}``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from .configuration import SubConfig


class VisionRMSNorm(nn.Module):
    """y = w · x / sqrt(mean(x²) + eps), computed in fp32 like upstream InternRMSNorm."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _norm(kind: str, dim: int, eps: float) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps) if kind == "layer_norm" else VisionRMSNorm(dim, eps)


class VisionEmbeddings(nn.Module):
    """Conv patchify (k = s = patch) + CLS token + learned positions (bicubic-resized off-grid)."""

    def __init__(self, cfg: SubConfig):
        super().__init__()
        C, p = cfg.hidden_size, cfg.patch_size
        self.grid = cfg.image_size // p
        self.class_embedding = nn.Parameter(torch.zeros(1, 1, C))
        self.patch_embedding = nn.Conv2d(cfg.num_channels, C, kernel_size=p, stride=p)
        self.position_embedding = nn.Parameter(torch.zeros(1, self.grid**2 + 1, C))

    def _patch_positions(self, h: int, w: int) -> torch.Tensor:
        pos = self.position_embedding[:, 1:]  # [1, grid², C]
        if (h, w) == (self.grid, self.grid):
            return pos
        C = pos.shape[-1]
        pos = pos.float().reshape(1, self.grid, self.grid, C).permute(0, 3, 1, 2)  # [1, C, grid, grid]
        pos = F.interpolate(pos, size=(h, w), mode="bicubic", align_corners=False)
        return pos.reshape(1, C, h * w).transpose(1, 2).to(self.position_embedding.dtype)  # [1, h·w, C]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype))  # [n, C, h, w]
        n, _, h, w = patches.shape
        patches = patches.flatten(2).transpose(1, 2)  # [n, h·w, C]
        cls = self.class_embedding.expand(n, 1, -1).to(dtype)
        pos = torch.cat([self.position_embedding[:, :1], self._patch_positions(h, w)], dim=1)
        return torch.cat([cls, patches], dim=1) + pos.to(dtype)  # [n, 1 + h·w, C]


class VisionAttention(nn.Module):
    """Bidirectional MHA; fused qkv split as [q | k | v] with heads contiguous.

    With ``qk_normalization`` q and k are RMS-normalised over the full width C (all heads at once).
    """

    def __init__(self, cfg: SubConfig):
        super().__init__()
        C = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        if C % self.num_heads:
            raise ValueError(f"vision_config.hidden_size={C} is not divisible by num_attention_heads={self.num_heads}")
        self.qkv = nn.Linear(C, 3 * C, bias=bool(cfg.qkv_bias))
        self.qk_normalization = bool(cfg.qk_normalization)
        if self.qk_normalization:
            self.q_norm = VisionRMSNorm(C, cfg.layer_norm_eps)
            self.k_norm = VisionRMSNorm(C, cfg.layer_norm_eps)
        self.proj = nn.Linear(C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, L, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 × [n, L, C]
        if self.qk_normalization:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(n, L, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))  # [n, heads, L, C/heads]
        out = F.scaled_dot_product_attention(q, k, v)  # scale = head_dim^-0.5
        return self.proj(out.transpose(1, 2).reshape(n, L, C))


class VisionMLP(nn.Module):
    def __init__(self, cfg: SubConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = ACT2FN[cfg.hidden_act]
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    """x = x + ls1 ⊙ Attn(norm1(x));  x = x + ls2 ⊙ MLP(norm2(x))."""

    def __init__(self, cfg: SubConfig):
        super().__init__()
        C = cfg.hidden_size
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)
        self.norm1 = _norm(cfg.norm_type, C, cfg.layer_norm_eps)
        self.norm2 = _norm(cfg.norm_type, C, cfg.layer_norm_eps)
        self.ls1 = nn.Parameter(cfg.initializer_factor * torch.ones(C))
        self.ls2 = nn.Parameter(cfg.initializer_factor * torch.ones(C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x)) * self.ls1
        return x + self.mlp(self.norm2(x)) * self.ls2


class VisionEncoder(nn.Module):
    def __init__(self, cfg: SubConfig):
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))


class InternVisionModel(nn.Module):
    """InternViT; ``forward`` returns the tokens of layer ``select_layer`` (CLS included)."""

    def __init__(self, cfg: SubConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = VisionEmbeddings(cfg)
        self.encoder = VisionEncoder(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Random init for fresh models (loading overwrites every tensor)."""
        emb = self.embeddings
        if emb.class_embedding.is_meta:
            return
        nn.init.trunc_normal_(emb.class_embedding, std=0.02)
        nn.init.trunc_normal_(emb.position_embedding, std=0.02)

    def forward(self, pixel_values: torch.Tensor, select_layer: int = -1) -> torch.Tensor:
        """pixel_values [n, 3, S, S] → hidden [n, 1 + (S/p)², C].

        ``select_layer`` indexes the hidden-state list [embeddings, layer 1, ..., layer N] (-1 = last).
        """
        if pixel_values.ndim != 4:
            raise ValueError(f"pixel_values must be [n_tiles, 3, S, S], got shape {tuple(pixel_values.shape)}")
        layers = self.encoder.layers
        stop = select_layer % (len(layers) + 1)  # index into [emb, l1..lN]
        x = self.embeddings(pixel_values)
        for layer in layers[:stop]:
            x = layer(x)
        return x


def pixel_shuffle(x: torch.Tensor, ratio: float, ps_version: str = "v2") -> torch.Tensor:
    """Merge each k×k block of a token grid into one token, k = 1/ratio.

    x [n, R, R, C] → [n, R/k, R/k, k²·C]; the k²·C vector concatenates the block's inputs in
    (row offset, col offset) order (0,0), (0,1), (1,0), (1,1) for k = 2. ``v1`` returns the grid
    transposed (rows ↔ cols), as upstream's legacy version does.
    """
    n, R, R2, C = x.shape
    k = int(round(1 / ratio))
    if R != R2 or R % k:
        raise ValueError(f"pixel_shuffle needs a square grid divisible by {k}, got {R}x{R2}")
    g = R // k
    x = x.reshape(n, g, k, g, k, C).permute(0, 1, 3, 2, 4, 5)  # [n, gi, gj, di, dj, C]
    x = x.reshape(n, g, g, k * k * C)  # [n, g, g, k²C]
    if ps_version == "v1":
        x = x.transpose(1, 2)
    return x.contiguous()


def build_mlp1(vit_hidden: int, downsample_ratio: float, llm_hidden: int) -> nn.Sequential:
    """mlp1 = LayerNorm(k²C) → Linear(k²C→D) → GELU → Linear(D→D); keys mlp1.{0,1,3}."""
    width = vit_hidden * int(round(1 / downsample_ratio)) ** 2
    return nn.Sequential(
        nn.LayerNorm(width),
        nn.Linear(width, llm_hidden),
        nn.GELU(),
        nn.Linear(llm_hidden, llm_hidden),
    )

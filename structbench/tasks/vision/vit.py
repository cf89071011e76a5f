"""ViT-Small for small images (Dosovitskiy et al., ICLR 2021; the "S" size of Touvron et al.'s DeiT).

The 4-bit Shampoo paper trains "ViT-Small, patch 4" on CIFAR-100 (Appendix G) without giving its sizes; its
reference code builds timm's `VisionTransformer(embed_dim=384, depth=12, num_heads=6, drop_path_rate=0.1)` with
patch size image_size // 8 (4 at 32x32). This module follows that configuration and timm's defaults:

- patch embedding: a `patch_size` x `patch_size` conv with stride `patch_size` (with bias), flattened to tokens;
- a learned class token prepended, learned position embeddings added (one per patch plus the class token);
- `depth` pre-norm blocks `x + drop_path(attn(ln(x)))`, `x + drop_path(mlp(ln(x)))`; attention with a biased
  fused qkv projection, `heads` heads computed by `F.scaled_dot_product_attention`, and an output projection;
  MLP `Linear(D, mlp_ratio*D)`, GELU, `Linear(mlp_ratio*D, D)`; LayerNorm eps 1e-6;
- stochastic depth rising linearly from 0 in the first block to `drop_path` in the last (training only);
- a final LayerNorm, the class token's features, and a linear head (registered last).

Initialisation as timm's default: Linear weights N(0, 0.02) truncated at +-2, zero biases; position embeddings
N(0, 0.02); class token N(0, 1e-6); the patch conv keeps PyTorch's default.

Two storage choices so the parameter partition routes these tensors as the paper-agnostic default expects (to the
fallback, not the matrix optimizer): the position table is an `nn.Embedding` (kind "embedding"), and the class
token a 1-D vector of size D (kind "vector"). Neither changes the function or the parameter count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from structbench.errors import UsageError


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., ECCV 2016): drop a sample's residual branch with probability `rate`."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, drop_path: float) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    """Patch embedding, class token, position embeddings, transformer blocks, final norm, linear head."""

    def __init__(
        self,
        *,
        in_channels: int,
        image_size: int,
        num_classes: int,
        patch_size: int = 4,
        embed_dim: int = 384,
        depth: int = 12,
        heads: int = 6,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.1,
    ) -> None:
        super().__init__()
        if patch_size < 1 or image_size % patch_size:
            raise UsageError(f"vit-small: image_size {image_size} is not divisible by patch_size {patch_size}.")
        if heads < 1 or embed_dim % heads:
            raise UsageError(f"vit-small: embed_dim {embed_dim} is not divisible by heads {heads}.")
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(embed_dim))
        self.pos_embed = nn.Embedding(num_patches + 1, embed_dim)
        rates = [drop_path * i / (depth - 1) if depth > 1 else 0.0 for i in range(depth)]
        self.blocks = nn.Sequential(*(Block(embed_dim, heads, mlp_ratio, rate) for rate in rates))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed.weight, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(tokens.shape[0], 1, -1)
        tokens = torch.cat((cls, tokens), dim=1) + self.pos_embed.weight
        return self.head(self.norm(self.blocks(tokens))[:, 0])

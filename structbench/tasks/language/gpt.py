"""GPT-2 as nanoGPT builds it (Karpathy, karpathy/nanoGPT `model.py`; Radford et al., 2019).

- token and learned position embeddings (`nn.Embedding`), summed, then dropout;
- `n_layer` pre-LayerNorm blocks `x + attn(ln_1(x))`, `x + mlp(ln_2(x))`;
- attention: one fused q/k/v projection `c_attn` (3d x d), `n_head` heads, causal
  `F.scaled_dot_product_attention`, output projection `c_proj`, residual dropout;
- MLP: `c_fc` (d -> 4d), exact (erf) GELU as nanoGPT, `c_proj` (4d -> d), dropout;
- a final LayerNorm `ln_f` and a bias-free LM head `lm_head`, registered last so the parameter partition sees it as
  the output head; with `tie_weights` the head and the token embedding are one `nn.Parameter` (GPT-2 ties them).

Initialisation as nanoGPT: linear and embedding weights N(0, init_std), biases zero, LayerNorms at (1, 0), and the
two residual output projections (`attn.c_proj`, `mlp.c_proj`) N(0, init_std / sqrt(2 * n_layer)) (GPT-2 paper,
Sec. 2.3). Module names follow nanoGPT (`transformer.wte`, `transformer.h.0.attn.c_attn`, ...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from structbench.tasks.language.configs import ModelConfig


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with nanoGPT's fused q/k/v projection (q, k, v in that order)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        heads = self.c_attn(x).view(batch, tokens, 3, self.n_head, width // self.n_head).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(
            heads[0], heads[1], heads[2], dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(out.transpose(1, 2).reshape(batch, tokens, width)))


class MLP(nn.Module):
    """GPT-2's position-wise MLP: Linear(d, f), GELU, Linear(f, d), dropout."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, config.ffn_dim, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(config.ffn_dim, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT: `forward(idx[B, T]) -> logits[B, T, vocab_size]` at every position."""

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, config.d_model),
                "wpe": nn.Embedding(config.max_seq_len, config.d_model),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                "ln_f": nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.d_model, vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer["wte"].weight
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = std / math.sqrt(2 * self.config.n_layer)
        for block in self.transformer["h"]:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        tokens = idx.shape[1]
        if tokens > self.config.max_seq_len:
            raise ValueError(f"sequence of {tokens} tokens exceeds max_seq_len {self.config.max_seq_len}")
        positions = torch.arange(tokens, device=idx.device)
        x = self.transformer["drop"](self.transformer["wte"](idx) + self.transformer["wpe"](positions))
        for block in self.transformer["h"]:
            x = block(x)
        return self.lm_head(self.transformer["ln_f"](x))

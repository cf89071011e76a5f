"""LLaMA-style decoder (Touvron et al., 2023) as the GaLore configurations build it with HF `LlamaForCausalLM`.

- token embedding `nn.Embedding` (no learned positions);
- `n_layer` pre-norm blocks `x + self_attn(input_layernorm(x))`, `x + mlp(post_attention_layernorm(x))`;
- RMSNorm (Zhang & Sennrich, 2019): `x / sqrt(mean(x^2) + eps) * weight`, computed in float32;
- attention: separate `q_proj`, `k_proj`, `v_proj`, `o_proj` (d x d), rotary position embeddings (Su et al., RoFormer)
  on q and k, causal `F.scaled_dot_product_attention`;
- SwiGLU MLP (Shazeer, 2020): `down_proj(silu(gate_proj(x)) * up_proj(x))`;
- no biases and an untied, bias-free LM head `lm_head` (registered last, so the parameter partition sees it as the
  output head), as GaLore's `configs/llama_*.json` (HF's `tie_word_embeddings` default False).

Rotary convention: HF / GPT-NeoX "rotate half": channel i of a head is paired with channel i + head_dim/2 and the pair
is rotated by the angle `position * rope_theta ** (-2i / head_dim)`. (Meta's reference pairs adjacent channels; the two
differ by a fixed permutation of the q/k projection rows, so the function class is the same.)

Initialisation as HF `LlamaPreTrainedModel._init_weights`: linear and embedding weights N(0, init_std) (GaLore's
initializer_range 0.02), RMSNorm scales 1. Module names follow HF (`model.layers.0.self_attn.q_proj`, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from structbench.tasks.language.configs import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale, normalising in float32 (as Meta's and HF's LLaMA)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Rotation angles `positions[..., None] * theta ** (-2i / head_dim)`, i < head_dim / 2, in float32."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    return positions.to(torch.float32)[..., None] * theta**-exponents


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[..., i], x[..., i + head_dim/2]) of `x[..., T, head_dim]` by `angles[T, head_dim/2]`."""
    first, second = x.float().chunk(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).type_as(x)


class Attention(nn.Module):
    """Multi-head causal self-attention with rotary embeddings on q and k."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        width = config.d_model
        self.q_proj = nn.Linear(width, width, bias=config.bias)
        self.k_proj = nn.Linear(width, width, bias=config.bias)
        self.v_proj = nn.Linear(width, width, bias=config.bias)
        self.o_proj = nn.Linear(width, width, bias=config.bias)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(x).view(batch, tokens, self.n_head, width // self.n_head).transpose(1, 2)

        q = apply_rope(heads(self.q_proj), angles)
        k = apply_rope(heads(self.k_proj), angles)
        out = F.scaled_dot_product_attention(
            q, k, heads(self.v_proj), dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, width))


class SwiGLU(nn.Module):
    """LLaMA's gated MLP: `down_proj(silu(gate_proj(x)) * up_proj(x))`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.ffn_dim, bias=config.bias)
        self.up_proj = nn.Linear(config.d_model, config.ffn_dim, bias=config.bias)
        self.down_proj = nn.Linear(config.ffn_dim, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-RMSNorm block; `dropout` (0 in the GaLore configs) acts on both residual branches."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        x = x + self.resid_dropout(self.self_attn(self.input_layernorm(x), angles))
        return x + self.resid_dropout(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    """LLaMA causal LM: `forward(idx[B, T]) -> logits[B, T, vocab_size]` at every position."""

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.model = nn.ModuleDict(
            {
                "embed_tokens": nn.Embedding(vocab_size, config.d_model),
                "layers": nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layer)),
                "norm": RMSNorm(config.d_model, config.norm_eps),
            }
        )
        self.lm_head = nn.Linear(config.d_model, vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.model["embed_tokens"].weight
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        tokens = idx.shape[1]
        if tokens > self.config.max_seq_len:
            raise ValueError(f"sequence of {tokens} tokens exceeds max_seq_len {self.config.max_seq_len}")
        angles = rope_angles(torch.arange(tokens, device=idx.device), self.config.head_dim, self.config.rope_theta)
        x = self.model["embed_tokens"](idx)
        for layer in self.model["layers"]:
            x = layer(x, angles)
        return self.lm_head(self.model["norm"](x))

"""Named decoder-only model configurations and their parameter counts by formula.

Sources of the named shapes:

- `gpt2-124m`: GPT-2 small (Radford et al., 2019) as nanoGPT builds it (karpathy/nanoGPT `model.py` `GPTConfig`,
  `config/train_gpt2.py`): 12 layers, 12 heads, width 768, block 1024, vocabulary 50257, biases on, head tied to the
  token embedding; 124,439,808 parameters. The FISMO (Sec. 6), 4-bit Shampoo (App. G, OpenWebText) and ASGO (Sec. 7.2)
  papers train this model.
- `gpt-shakespeare-char`: the NanoGPT character model of the ASGO paper (Sec. 7.1, App. C.1; its code:
  infinity-stars/ASGO): 6 layers, 6 heads, width 384, block 256, vocabulary 65, dropout 0.2, biases on.
- `llama-60m`, `llama-130m`, `llama-350m`, `llama-1b`: the GaLore LLaMA configurations (jiaweizzhao/GaLore
  `configs/llama_{60m,130m,350m,1b}.json`: vocabulary 32000, RMSNorm eps 1e-6, initializer range 0.02, max sequence
  length 1024, untied head), which the RACS/Alice paper (Table 10), SUMO (Sec. 4) and 4-bit Shampoo (App. G) follow.
  Table 10 of the RACS/Alice paper prints hidden/intermediate/heads/layers 512/1376/8/8, 768/2048/12/12 and
  1024/2736/16/24; its 1.3B row (4096/5461/24/32) contradicts the paper's own 1273M + 65M parameter split (App. F.4),
  which GaLore's 1B shape (2048/5461/32 heads/24 layers) reproduces, so `llama-1b` uses GaLore's shape.
- `gpt-tiny`, `llama-tiny`: CPU-sized models, structbench's choice for minutes on a CPU (2 layers, 4 heads,
  width 128; the
  LLaMA intermediate width 344 keeps the 60M model's ratio 1376/512).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from structbench.errors import UsageError

FAMILIES = ("gpt", "llama")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only language model; the vocabulary comes from the data.

    family: "gpt" (nanoGPT's GPT-2: learned positions, LayerNorm, GELU MLP) or "llama" (RMSNorm, RoPE, SwiGLU).
    d_ff: MLP hidden width; None means 4 * d_model, GPT-2's rule (a llama config must set it).
    tie_weights: the LM head shares the token-embedding matrix.
    bias: biases in every linear layer except the LM head, and in LayerNorm (gpt).
    dropout: on attention probabilities and residual branches (gpt: also on the embeddings); 0 in every paper model
        except `gpt-shakespeare-char`.
    rope_theta: rotary base (llama only). norm_eps: LayerNorm / RMSNorm epsilon.
    max_seq_len: longest input; the number of learned positions (gpt).
    init_std: standard deviation of the normal init of linear and embedding weights.
    reference_vocab_size: the vocabulary the source used (for reports and parameter counts at paper scale).
    """

    family: str
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int | None = None
    tie_weights: bool = False
    bias: bool = False
    dropout: float = 0.0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 1024
    init_std: float = 0.02
    reference_vocab_size: int = 256
    source: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UsageError(f"model family {self.family!r} is not one of {', '.join(FAMILIES)}.")
        for name in ("n_layer", "n_head", "d_model", "max_seq_len", "reference_vocab_size"):
            require_positive_int(name, getattr(self, name))
        for name in ("tie_weights", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        if self.d_ff is not None:
            require_positive_int("d_ff", self.d_ff)
        elif self.family == "llama":
            raise UsageError("a llama model needs d_ff (the SwiGLU intermediate width).")
        if self.d_model % self.n_head:
            raise UsageError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}.")
        if self.family == "llama" and self.head_dim % 2:
            raise UsageError(f"rotary embeddings need an even head dimension, got {self.head_dim}.")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"dropout must lie in [0, 1), got {self.dropout}.")
        for name in ("rope_theta", "norm_eps", "init_std"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, got {getattr(self, name)}.")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head

    @property
    def ffn_dim(self) -> int:
        """MLP hidden width: `d_ff`, else GPT-2's 4 * d_model."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model


def require_positive_int(name: str, value: Any) -> None:
    """Raise `UsageError` unless `value` is an int (not a bool) greater than zero."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name} must be a positive integer, got {value!r}.")


_GALORE = "GaLore configs/llama_{}.json (RACS/Alice Table 10, SUMO Sec. 4, 4-bit Shampoo App. G)"


def _llama(n_layer: int, n_head: int, d_model: int, d_ff: int, size: str) -> ModelConfig:
    return ModelConfig(
        family="llama",
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        d_ff=d_ff,
        norm_eps=1e-6,
        max_seq_len=1024,
        reference_vocab_size=32000,
        source=_GALORE.format(size),
    )


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "gpt2-124m": ModelConfig(
        family="gpt",
        n_layer=12,
        n_head=12,
        d_model=768,
        tie_weights=True,
        bias=True,
        max_seq_len=1024,
        reference_vocab_size=50257,
        source="nanoGPT GPTConfig / config/train_gpt2.py (GPT-2 small; FISMO, 4-bit Shampoo, ASGO Sec. 7.2)",
    ),
    "gpt-shakespeare-char": ModelConfig(
        family="gpt",
        n_layer=6,
        n_head=6,
        d_model=384,
        tie_weights=True,
        bias=True,
        dropout=0.2,
        max_seq_len=256,
        reference_vocab_size=65,
        source="ASGO Sec. 7.1 / App. C.1 NanoGPT on Shakespeare-char (infinity-stars/ASGO: dropout 0.2, bias on)",
    ),
    "gpt-tiny": ModelConfig(
        family="gpt",
        n_layer=2,
        n_head=4,
        d_model=128,
        tie_weights=True,
        bias=True,
        max_seq_len=128,
        reference_vocab_size=256,
        source="structbench's CPU size (2 layers, width 128), byte vocabulary",
    ),
    "llama-60m": _llama(8, 8, 512, 1376, "60m"),
    "llama-130m": _llama(12, 12, 768, 2048, "130m"),
    "llama-350m": _llama(24, 16, 1024, 2736, "350m"),
    "llama-1b": _llama(24, 32, 2048, 5461, "1b"),
    "llama-tiny": ModelConfig(
        family="llama",
        n_layer=2,
        n_head=4,
        d_model=128,
        d_ff=344,
        norm_eps=1e-6,
        max_seq_len=128,
        reference_vocab_size=256,
        source="CPU tier (RACS/Alice spec 6.3: width 128, intermediate ratio 1376/512), byte vocabulary",
    ),
}


def resolve_config(name: str, *, seq_len: int, **overrides: Any) -> ModelConfig:
    """The named configuration with `overrides` applied, sized for inputs of `seq_len` tokens.

    `max_seq_len` becomes `seq_len` unless overridden (then it must be at least `seq_len`), as nanoGPT's block size
    is the training context.
    """
    if name not in MODEL_CONFIGS:
        raise UsageError(f"unknown language model {name!r}; valid: {', '.join(MODEL_CONFIGS)}.")
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise UsageError(f"unknown model field(s) {', '.join(unknown)}; valid: {', '.join(fields)}.")
    require_positive_int("seq_len", seq_len)
    config = dataclasses.replace(MODEL_CONFIGS[name], **{"max_seq_len": seq_len, **overrides})
    if seq_len > config.max_seq_len:
        raise UsageError(f"seq_len {seq_len} exceeds max_seq_len {config.max_seq_len}.")
    return config


def count_params(config: ModelConfig, vocab_size: int) -> int:
    """Number of distinct parameters of the model `config` describes, by formula (a tied head counts once).

    gpt (nanoGPT): token table V*d and position table S*d; per block two LayerNorms (d scale, + d shift with bias),
    fused q/k/v (3d x d) and output (d x d) projections, MLP d -> f -> d; a final LayerNorm; head V*d unless tied.
    llama (GaLore / HF LlamaForCausalLM): token table V*d; per block two RMSNorm scales (d each), q/k/v/o (d x d each),
    SwiGLU gate and up (f x d) and down (d x f); a final RMSNorm; head V*d unless tied.
    """
    require_positive_int("vocab_size", vocab_size)
    d, f, b, n_layer = config.d_model, config.ffn_dim, int(config.bias), config.n_layer
    head = 0 if config.tie_weights else vocab_size * d
    if config.family == "gpt":
        norm = d + b * d
        attention = 4 * d * d + b * 4 * d
        mlp = 2 * d * f + b * (f + d)
        return vocab_size * d + config.max_seq_len * d + n_layer * (2 * norm + attention + mlp) + norm + head
    attention = 4 * d * d + b * 4 * d
    mlp = 3 * d * f + b * (2 * f + d)
    return vocab_size * d + n_layer * (2 * d + attention + mlp) + d + head


def training_flops_per_token(config: ModelConfig, vocab_size: int, seq_len: int) -> int:
    """Model FLOPs of one training token (forward and backward) by the formula of Chowdhery et al. (PaLM, arXiv
    2204.02311, App. B): 6 N + 12 L H Q T, N the weights that multiply activations (per block the attention's four
    d x d projections and the MLP's matrices, and the LM head V x d, which multiplies even when tied to the
    embedding; not the embedding lookup, norms or biases), L layers, H Q = d_model, T = `seq_len` (attention's
    scores and values over the whole context; a causal model computes half of it, which the formula, like PaLM's
    MFU, does not credit)."""
    require_positive_int("vocab_size", vocab_size)
    require_positive_int("seq_len", seq_len)
    d, f = config.d_model, config.ffn_dim
    mlp = (2 if config.family == "gpt" else 3) * d * f
    matmul_weights = config.n_layer * (4 * d * d + mlp) + vocab_size * d
    return 6 * matmul_weights + 12 * config.n_layer * d * seq_len

"""Decoder-only language models by name: `build_model(name, vocab_size=..., seq_len=...)`.

The model maps token ids `idx[B, T]` (int64) to next-token logits `[B, T, vocab_size]` at every position; the caller
computes the loss. Families: `gpt` (nanoGPT's GPT-2, `gpt.py`) and `llama` (LLaMA as in the GaLore configs,
`llama.py`); named shapes and their sources are in `configs.py`. In every model the token tables are `nn.Embedding`
and the LM head is an `nn.Linear` registered last, so `structbench.optim.partition` routes embeddings and the head to
the fallback optimizer and the hidden matrices to the structured one.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from structbench.tasks.language.configs import (
    MODEL_CONFIGS,
    ModelConfig,
    count_params,
    require_positive_int,
    resolve_config,
)
from structbench.tasks.language.gpt import GPT
from structbench.tasks.language.llama import Llama

__all__ = ["MODEL_CONFIGS", "ModelConfig", "build_model", "count_params", "resolve_config"]


def build_model(name: str, *, vocab_size: int, seq_len: int, **overrides: Any) -> nn.Module:
    """The named model for a `vocab_size` vocabulary and inputs of up to `seq_len` tokens.

    `overrides` replace fields of the named `ModelConfig` (e.g. `n_layer=2`, `tie_weights=True`); an unknown name or
    field raises `UsageError` listing the valid ones. The resolved configuration is the model's `config` attribute,
    so `count_params(model.config, vocab_size)` counts its parameters. Build under `torch.device("meta")` to inspect
    a large model without allocating it.
    """
    config = resolve_config(name, seq_len=seq_len, **overrides)
    require_positive_int("vocab_size", vocab_size)
    if config.family == "gpt":
        return GPT(config, vocab_size)
    return Llama(config, vocab_size)

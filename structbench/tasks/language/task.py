"""Next-token language modelling on a real corpus: a decoder model, random training windows, held-out perplexity.

The corpus is read and tokenized through :func:`structbench.data.token_cache.prepare_tokens` (cached on disk,
memory-mapped; the split into training, validation and test documents is recorded) and held on the device. Each
training call draws `batch_size` windows of `seq_len + 1` tokens at seeded random offsets of the training split;
evaluation is the mean next-token cross entropy (nats per token) over the first `eval_tokens` tokens of the
validation split and, apart, of the test split, each cut into consecutive windows; its metric is the perplexity
exp(loss). `val_fraction` is the fraction of documents held out, divided into the two (`split_corpus`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from structbench.data.token_cache import TokenData, prepare_tokens
from structbench.errors import UsageError
from structbench.tasks.base import EvalResult, TaskContext, TaskDef, check_memory, to_device
from structbench.tasks.language.configs import count_params, resolve_config
from structbench.tasks.language.models import MODEL_CONFIGS, build_model

SWITCHES = ("auto", "on", "off")
TIE_CHOICES = ("default", "on", "off")

DEFAULTS: dict[str, Any] = {
    "corpus": "shakespeare",
    "text_field": "text",
    "val_fraction": 0.1,
    "split_seed": 0,
    "tokenizer": "byte",
    "vocab_size": 4096,
    "tokenizer_dir": "",
    "model": "llama-tiny",
    "seq_len": 128,
    "n_layer": 0,
    "n_head": 0,
    "d_model": 0,
    "tie_weights": "default",
    "dropout": -1.0,
    "autocast": "auto",
    "compile": "off",
    "eval_tokens": 32768,
    "eval_batch_size": 16,
}
"""`n_layer`, `n_head`, `d_model` 0 and `dropout` -1 keep the named model's value; `vocab_size` is the BPE
tokenizer's size (other tokenizers fix their own); `tokenizer_dir` holds GPT-2's encoder.json + vocab.bpe."""


def _switch(name: str, value: str, device: torch.device) -> bool:
    if value not in SWITCHES:
        raise UsageError(f"task_args.{name} must be one of {', '.join(SWITCHES)}, got {value!r}.")
    return device.type == "cuda" if value == "auto" else value == "on"


def model_overrides(args: dict[str, Any]) -> dict[str, Any]:
    """The named model's fields the suite overrides (zero / -1 / "default" keep the model's own)."""
    overrides: dict[str, Any] = {key: int(args[key]) for key in ("n_layer", "n_head", "d_model") if args[key]}
    if args["tie_weights"] not in TIE_CHOICES:
        raise UsageError(f"task_args.tie_weights must be one of {', '.join(TIE_CHOICES)}, got {args['tie_weights']!r}.")
    if args["tie_weights"] != "default":
        overrides["tie_weights"] = args["tie_weights"] == "on"
    if args["dropout"] >= 0:
        overrides["dropout"] = float(args["dropout"])
    return overrides


def _tokenizer_options(args: dict[str, Any]) -> dict[str, Any]:
    if args["tokenizer"] == "bpe":
        return {"vocab_size": int(args["vocab_size"])}
    if args["tokenizer"] == "gpt2" and args["tokenizer_dir"]:
        return {"dir": args["tokenizer_dir"]}
    return {}


def prepare(args: dict[str, Any], data_root: Path) -> TokenData:
    """The suite's corpus tokenized (read from the on-disk cache after the first time)."""
    _check_args(args)
    return prepare_tokens(
        args["corpus"],
        args["tokenizer"],
        data_root,
        val_fraction=float(args["val_fraction"]),
        split_seed=int(args["split_seed"]),
        corpus_options={"text_field": args["text_field"]},
        tokenizer_options=_tokenizer_options(args),
    )


def _check_args(args: dict[str, Any]) -> None:
    if args["model"] not in MODEL_CONFIGS:
        raise UsageError(f"unknown model {args['model']!r}; valid: {', '.join(sorted(MODEL_CONFIGS))}.")
    for key in ("seq_len", "eval_tokens", "eval_batch_size"):
        if int(args[key]) < 1:
            raise UsageError(f"task_args.{key} must be >= 1, got {args[key]}.")
    if not 0.0 < float(args["val_fraction"]) < 1.0:
        raise UsageError(f"task_args.val_fraction must lie in (0, 1), got {args['val_fraction']}.")


class LanguageModelTask:
    metric_name = "perplexity"
    metric_mode: Literal["min", "max"] = "min"
    item_unit = "tokens"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        tokens = prepare(args, ctx.data_root)
        _check_corpus_length(args, tokens)
        self.seq_len = int(args["seq_len"])
        self.data_source = tokens.source
        self.train_tokens = torch.from_numpy(np.asarray(tokens.train, dtype=np.int32)).to(ctx.device)
        self.val_tokens = torch.from_numpy(np.asarray(tokens.val, dtype=np.int32)).to(ctx.device)
        self.test_tokens = torch.from_numpy(np.asarray(tokens.test, dtype=np.int32)).to(ctx.device)
        torch.manual_seed(ctx.seed)
        self.model = build_model(
            args["model"], vocab_size=tokens.vocab_size, seq_len=self.seq_len, **model_overrides(args)
        ).to(ctx.device)
        self.autocast = _switch("autocast", args["autocast"], ctx.device)
        compiled = _switch("compile", args["compile"], ctx.device)
        self.compiled = compiled
        self.forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(self.model) if compiled else self.model
        self.shard = ctx.shard
        self.device = ctx.device
        self.batch_size = ctx.batch_size
        self.items_per_call = ctx.batch_size * self.seq_len
        self.steps_per_epoch = max(1, len(self.train_tokens) // self.items_per_call)
        self.eval_tokens = min(int(args["eval_tokens"]), len(self.val_tokens) - 1)
        self.test_eval_tokens = min(int(args["eval_tokens"]), len(self.test_tokens) - 1)
        self.eval_batch_size = int(args["eval_batch_size"])
        self.batch_gen = torch.Generator().manual_seed(ctx.seed + 1)
        self.resolved_args = {
            **args,
            "autocast": "bf16" if self.autocast else "off",
            "compile": "on" if compiled else "off",
            "vocab_size": tokens.vocab_size,
            "model_config": dataclasses.asdict(self.model.config),
            "eval_tokens": self.eval_tokens,
            "test_eval_tokens": self.test_eval_tokens,
            "data": tokens.record,
        }

    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(
        self, windows: torch.Tensor, model: Callable[[torch.Tensor], torch.Tensor], reduction: str = "mean"
    ) -> torch.Tensor:
        inputs, targets = windows[:, :-1].long(), windows[:, 1:].long()
        with self._precision():
            logits = model(inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction)

    def train_loss(self, step: int) -> torch.Tensor:
        starts = torch.randint(len(self.train_tokens) - self.seq_len - 1, (self.batch_size,), generator=self.batch_gen)
        starts = self.shard.take(starts)
        offsets = torch.arange(self.seq_len + 1)
        windows = self.train_tokens[to_device(starts[:, None] + offsets, self.device)]
        return self._loss(windows, self.forward) * self.shard.weight(len(starts), self.batch_size)

    def distribute(self, ddp_module: torch.nn.Module) -> None:
        """Train through the DistributedDataParallel wrapper (compiled when the task compiles its model)."""
        self.forward = torch.compile(ddp_module) if self.compiled else ddp_module

    def stream_state(self) -> dict[str, Any]:
        return {"batch_gen": self.batch_gen.get_state()}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.batch_gen.set_state(state["batch_gen"])

    def _eval_windows(self, tokens: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """Consecutive windows covering the first `count` predictions of an evaluation split's `tokens`."""
        starts = list(range(0, count, self.seq_len))
        for first in range(0, len(starts), self.eval_batch_size):
            batch = starts[first : first + self.eval_batch_size]
            lengths = [min(self.seq_len, count - s) for s in batch]
            if len(set(lengths)) == 1:
                yield torch.stack([tokens[s : s + lengths[0] + 1] for s in batch])
            else:
                yield from (tokens[s : s + n + 1][None] for s, n in zip(batch, lengths, strict=True))

    def _mean_loss(self, tokens: torch.Tensor, count: int) -> float:
        total = 0.0
        for windows in self._eval_windows(tokens, count):
            total += float(self._loss(windows, self.model, reduction="sum"))
        return total / count

    def evaluate(self) -> EvalResult:
        """Runs the eager model even when training is compiled: the compiled graph is only ever called at the training
        shape, so evaluation batches of other shapes do not recompile it (nor make `compile_s` depend on order)."""
        loss = self._mean_loss(self.test_tokens, self.test_eval_tokens)
        val_loss = self._mean_loss(self.val_tokens, self.eval_tokens)
        return EvalResult(
            loss=loss,
            metric=math.exp(min(loss, 700.0)),
            val_loss=val_loss,
            val_metric=math.exp(min(val_loss, 700.0)),
        )


def _check_corpus_length(args: dict[str, Any], tokens: TokenData) -> None:
    seq_len = int(args["seq_len"])
    if min(len(tokens.train), len(tokens.val), len(tokens.test)) <= seq_len + 1:
        raise UsageError(
            f"corpus {args['corpus']!r} is too short for seq_len {seq_len}: {len(tokens.train)} training, "
            f"{len(tokens.val)} validation and {len(tokens.test)} test tokens."
        )


def _preflight(args: dict[str, Any], data_root: Path, batch_size: int) -> None:
    """Read and tokenize the corpus once before any run, so missing data or vocabularies fail early (exit 2); check
    that it is longer than a window and that the model's parameters fit in this machine's memory."""
    tokens = prepare(args, data_root)
    _check_corpus_length(args, tokens)
    config = resolve_config(args["model"], seq_len=int(args["seq_len"]), **model_overrides(args))
    params = count_params(config, tokens.vocab_size)
    check_memory(f"language model {args['model']!r}: its {params} float32 parameters", 4 * params)


LANGUAGE_MODEL = TaskDef(
    name="language-model",
    summary="decoder LM (GPT-2 / LLaMA style) on a real corpus; eval loss in nats per token and perplexity",
    defaults=DEFAULTS,
    build=LanguageModelTask,
    preflight=_preflight,
    metric_name=LanguageModelTask.metric_name,
    distributable=True,
)

"""Language-model benchmarks of issue #8: harness overhead, training tokens/s, and peak memory per optimizer.

Three parts, each selected by its flag (none given: all three):

- `--overhead`: steps/s of `structbench.execution.runner.execute` against a bare hand-written loop on the same suite,
  in the same process, alternating the two `--repeats` times. The bare loop draws the task's training windows itself —
  `batch_size / grad_accum` windows of `seq_len + 1` tokens at offsets from the task's own generator
  (`task.batch_gen`, seeded as the harness seeds it), gathered from the same on-device token tensor — runs the
  task's forward under the same bf16 autocast, cross entropy, backward once per micro-batch (`budget.grad_accum`,
  losses scaled by 1/grad_accum), clips the global gradient norm when `budget.grad_clip` > 0, and steps the
  optimizer and the schedule. Both exclude the first step and evaluation (`budget.eval_every=0`). Target:
  harness / bare >= 0.99 (medians of 7 interleaved repeats by default; the spread is printed).
- `--throughput`: the harness rows' `throughput_per_s` (training tokens over the clocked steps, first excluded),
  with the device's name. For `--suite llama-60m --optim adamw` it is printed beside the paper's figure.
- `--memory`: one short harness run (`--memory-steps`) per optimizer of `--optims` (default: the suite's list):
  peak memory and its source (CUDA: max allocated; CPU: the process's peak RSS, indicative only), optimizer state
  bytes as held (measured) and from the registry's formula (analytic), median step time, tokens/s and its ratio to
  AdamW's run in the same table (same device, same process), status.

`--throughput` also prints model FLOPs per token (PaLM's 6N + 12LdT, `training_flops_per_token`), the achieved
FLOP/s and, for bf16-autocast runs on a device in `PEAK_BF16_DENSE_FLOPS`, the model FLOPs utilisation: a figure
that compares across GPUs, where raw tokens/s against another paper's hardware does not.

The reference figure: Adam's LLaMA-60M throughput, 97,748 tokens/s on A100 GPUs, from the RACS/Alice paper
(arXiv 2502.07752; Gong, Scetbon, Ma, Meeds, "Towards Efficient Optimizer Design for
LLM via Structured Fisher Approximation with a Low-Rank Extension"), Table 2, 60M column: "Throughput(TP)/Effect TP
(Adam) 97748/97748", whose caption says "The TP is the number of training tokens processed per second". Its setup
(§7.1 and App. F.2, digits as printed once): LLaMA pre-training on C4; the 60M model is hidden 512, intermediate
1376, 8 heads, 8 layers, 10K steps, 1.3B tokens (Table 10); "We use context length of 256 and batch size of 128
with 4 gradient accumulations, apart from 60M and 1.3B (batch size 256 with 2 gradient accumulations)"; "For all
model parameters, optimizer states, we use BF16 format"; "All experiments are conduced on NVIDIA A100 GPUs". The
number of A100s behind the figure is not stated. structbench's `llama-60m` differs: float32 weights and states
under bf16 autocast, a 32,000-entry BPE on the Shakespeare plays instead of C4 with its tokenizer. Usage:

    python -m benchmarks.lm_throughput                                   # shakespeare-llama, AdamW, CPU-sized
    python -m benchmarks.lm_throughput --memory --optims adamw muon racs --memory-steps 10
    python -m benchmarks.lm_throughput --suite llama-60m --steps 100    # on a GPU: against the paper's 97,748
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.deadline import Deadline, cut_note
from benchmarks.harness import (
    OVERHEAD_TARGET,
    REPEATS,
    alternate,
    autocast_for,
    bare_setup,
    harness_row,
    release,
    report_overhead,
    row_rate,
    timed_rate,
    timing_overrides,
)
from structbench import measure
from structbench.data import resolve_data_root
from structbench.execution.runner import execute
from structbench.plan import spec
from structbench.plan.spec import SuiteSpec
from structbench.tasks.base import to_device
from structbench.tasks.language.configs import ModelConfig, training_flops_per_token

PAPER_TOKENS_PER_S = 97_748
PAPER_SUITE, PAPER_OPTIM = "llama-60m", "adamw"
PAPER_SETUP = (
    "RACS/Alice paper Table 2, Adam on LLaMA-60M, C4, context 256, batch 256 x 2 accumulations, "
    "BF16 weights and states, NVIDIA A100 (count not stated)"
)
MIB = 2**20
PEAK_BF16_DENSE_FLOPS = (
    ("H200", 989.5e12),
    ("H100 PCIe", 756e12),
    ("H100", 989.5e12),
    ("A100", 312e12),
)
"""Dense BF16 tensor-core peaks by device name (first match wins), from NVIDIA's datasheets, which print the
sparse figure (H200 and H100 SXM 1,979 TFLOPS, H100 PCIe 1,513, A100 624): half of it."""


def peak_bf16_flops(device_name: str) -> float | None:
    """The device's dense BF16 peak, None for a device not in `PEAK_BF16_DENSE_FLOPS`."""
    return next((peak for name, peak in PEAK_BF16_DENSE_FLOPS if name in device_name), None)


def utilisation(tokens_per_s: float, resolved: dict[str, Any], device_name: str) -> str:
    """Model FLOPs utilisation of a run whose resolved task arguments are `resolved` (its spec's
    `task_args_resolved`: model configuration, vocabulary, context, autocast), as text: model FLOPs per token
    (`training_flops_per_token`) x tokens/s over the device's BF16 peak, for runs under bf16 autocast on a device
    whose peak is known; else why not."""
    config = ModelConfig(**resolved["model_config"])
    per_token = training_flops_per_token(config, resolved["vocab_size"], resolved["seq_len"])
    achieved = per_token * tokens_per_s
    head = f"model FLOPs {per_token / 1e6:.1f}M per token (PaLM's 6N + 12LdT), {achieved / 1e12:.2f} TFLOP/s"
    peak = peak_bf16_flops(device_name)
    if resolved["autocast"] != "bf16":
        return f"{head}; no MFU: autocast {resolved['autocast']}, the BF16 peak does not apply"
    if peak is None:
        return f"{head}; no MFU: {device_name}'s BF16 peak is not in the table"
    return f"{head}, MFU {achieved / peak:.1%} of {device_name}'s dense BF16 peak {peak / 1e12:.0f} TFLOP/s"


def bare_rate(suite: SuiteSpec, optim_name: str, seed: int, device: torch.device, data_root: Path) -> float:
    """Steps per second of a hand-written loop drawing the task's windows itself, first step excluded."""
    budget = suite.budget
    accum, clip = budget["grad_accum"], budget["grad_clip"]
    micro = budget["batch_size"] // accum
    task, optimizer, scheduler = bare_setup(suite, optim_name, seed, device, data_root, micro)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    tokens, generator, seq_len = task.train_tokens, task.batch_gen, task.seq_len
    offsets = torch.arange(seq_len + 1)
    autocast = autocast_for(task.autocast, device)
    task.model.train()

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for _ in range(accum):
            starts = torch.randint(len(tokens) - seq_len - 1, (micro,), generator=generator)
            windows = tokens[to_device(starts[:, None] + offsets, device)]
            with autocast:
                logits = task.forward(windows[:, :-1].long())
            loss = F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].long().flatten())
            (loss / accum if accum > 1 else loss).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        scheduler.step()

    return timed_rate(budget["steps"], device, train_step)


def _mib(value: int | None, decimals: int) -> str:
    return "-" if value is None else f"{value / MIB:.{decimals}f}"


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} CPUs"


def overhead_and_rows(
    suite: SuiteSpec, optim_name: str, args: argparse.Namespace, device: torch.device, data_root: Path, bare: bool
) -> list[dict[str, Any]]:
    """Harness rows of `--repeats` runs, alternated with bare-loop runs and the overhead reported when `bare`."""
    rows: list[dict[str, Any]] = []

    def harness() -> float:
        row = harness_row(suite, optim_name, args.seed, device, data_root)
        rows.append(row)
        return row_rate(row)

    if not bare:
        for repeat in range(args.repeats):
            print(f"  repeat {repeat}  {'harness':<8} {harness():9.2f} steps/s")
            release(device)
        return rows
    rates = alternate(args.repeats, lambda: bare_rate(suite, optim_name, args.seed, device, data_root), harness, device)
    ratio = report_overhead(rates)
    verdict = "met" if ratio >= OVERHEAD_TARGET else "NOT met"
    print(f"overhead target harness / bare >= {OVERHEAD_TARGET} (medians {ratio:.4f}): {verdict}")
    return rows


def report_throughput(rows: list[dict[str, Any]], suite: SuiteSpec, optim_name: str, device: torch.device) -> None:
    device_name = measure.environment(device)["device_name"]
    tokens_per_step = suite.budget["batch_size"] * suite.task_args["seq_len"]
    clocked = [row["throughput_per_s"] for row in rows]
    wall = [(row["steps"] - 1) * tokens_per_step / row["train_s"] for row in rows]
    resolved = json.loads(rows[0]["spec"])["task_args_resolved"]
    autocast = resolved["autocast"]
    print(f"throughput on {device_name} ({suite.name}, {optim_name}, autocast {autocast}), median of {len(rows)}:")
    print(
        f"  {statistics.median(clocked):,.0f} tokens/s (row throughput_per_s: clocked steps; runs "
        f"{', '.join(f'{v:,.0f}' for v in clocked)})"
    )
    print(f"  {statistics.median(wall):,.0f} tokens/s over train_s (wall, with the per-step bookkeeping)")
    print(f"  {utilisation(statistics.median(clocked), resolved, device_name)}")
    if suite.name == PAPER_SUITE and optim_name == PAPER_OPTIM:
        ratio = statistics.median(clocked) / PAPER_TOKENS_PER_S
        versus = f"measured / paper {ratio:.3f}" if device.type == "cuda" else "no ratio: not a GPU"
        print(f"  paper, as context only: {PAPER_TOKENS_PER_S:,} tokens/s ({PAPER_SETUP}); {versus}")
        print(
            "  the two differ in GPU model and count, weight and state precision, data and tokenizer: the ratio "
            "says nothing about structbench; MFU and the ratio to AdamW on this device (memory table) do"
        )


def memory_table(
    suite: SuiteSpec, seed: int, device: torch.device, data_root: Path, deadline: Deadline
) -> list[dict[str, Any]]:
    """One harness run per optimizer of the suite, printed as a row of the table as each ends; none started after
    `deadline` (named as left out)."""
    print(
        f"{'optimizer':<13} {'status':<12} {'peak MiB':>10} {'source':<6} {'state MiB':>10} {'analytic MiB':>12} "
        f"{'step ms':>9} {'tokens/s':>10} {'/ AdamW':>8}"
    )
    rows = []
    adamw_tokens = None
    for index, optim_name in enumerate(suite.optims):
        if deadline.passed():
            print(cut_note(list(suite.optims[index:])), flush=True)
            break
        row = execute(suite, optim_name, seed, device, data_root).row
        rows.append(row)
        step_ms = row["step_time_median_s"] * 1e3
        tokens = row["throughput_per_s"]
        if optim_name == "adamw":
            adamw_tokens = tokens
        versus = "-" if tokens is None or not adamw_tokens else f"{tokens / adamw_tokens:.3f}"
        print(
            f"{optim_name:<13} {row['status']:<12} {_mib(row['peak_mem_bytes'], 1):>10} {row['peak_mem_source']:<6} "
            f"{_mib(row['state_bytes'], 3):>10} {_mib(row['analytic_state_bytes'], 3):>12} {step_ms:>9.1f} "
            f"{'-' if tokens is None else f'{tokens:,.0f}':>10} {versus:>8}"
        )
        release(device)
    for row in rows:
        if row["status"] != "ok":
            print(f"  {row['optim']} {row['status']}: {(row['error'] or '').strip().splitlines()[-1]}")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overhead", action="store_true", help="harness vs bare loop")
    parser.add_argument("--throughput", action="store_true", help="tokens/s of the harness runs")
    parser.add_argument("--memory", action="store_true", help="peak and state memory per optimizer")
    parser.add_argument("--suite", default="shakespeare-llama")
    parser.add_argument("--optim", default="adamw", help="optimizer of the overhead and throughput runs")
    parser.add_argument("--optims", nargs="+", default=[], help="optimizers of the memory table (default: suite's)")
    parser.add_argument("--steps", type=int, default=300, help="steps of each overhead / throughput run")
    parser.add_argument("--memory-steps", type=int, default=20, help="steps of each memory run")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="suite override key=value")
    parser.add_argument("--budget-s", type=float, default=None, help="memory table: start no run after this many s")
    args = parser.parse_args(argv)
    everything = not (args.overhead or args.throughput or args.memory)

    device = measure.resolve_device(args.device)
    data_root = resolve_data_root(args.data_dir)
    device_name = measure.environment(device)["device_name"]
    print(f"device {device} ({device_name}), torch threads {torch.get_num_threads()}, {_load()}")
    memory_rows: list[dict[str, Any]] = []
    if everything or args.overhead or args.throughput:
        (suite,), _ = spec.load_suites(
            args.suite, timing_overrides(args.steps, args.overrides), [args.optim], [args.seed]
        )
        budget, task_args = suite.budget, suite.task_args
        print(
            f"suite {suite.name}: model {task_args['model']}, seq_len {task_args['seq_len']}, batch "
            f"{budget['batch_size']} sequences in {budget['grad_accum']} micro-batches, grad_clip "
            f"{budget['grad_clip']}, autocast {task_args['autocast']}, compile {task_args['compile']}; optimizer "
            f"{args.optim}, {args.steps} steps (first excluded)"
        )
        rows = overhead_and_rows(suite, args.optim, args, device, data_root, everything or args.overhead)
        if everything or args.throughput:
            report_throughput(rows, suite, args.optim, device)
    if everything or args.memory:
        overrides = timing_overrides(args.memory_steps, args.overrides)
        (suite,), _ = spec.load_suites(args.suite, overrides, args.optims, [args.seed])
        print(f"memory: suite {suite.name}, {args.memory_steps} steps per optimizer (first excluded from times)")
        memory_rows = memory_table(suite, args.seed, device, data_root, Deadline.after(args.budget_s))
    print(f"notes: {_load()} at the end.")
    if device.type != "cuda":
        print(
            f"  no CUDA device: the issue's {PAPER_SUITE} + AdamW tokens/s on an H100 (against the paper's "
            f"{PAPER_TOKENS_PER_S:,} on an A100) was not measured; CPU tokens/s are not comparable with it."
        )
    if any(row["peak_mem_source"] == "rss" for row in memory_rows):
        print(
            "  peak memory 'rss' is the process's peak resident set from just before the optimizer is built to the "
            "run's end, evaluation included (interpreter, torch, corpus, model, activations, and what earlier runs "
            "left in the allocator): indicative only."
        )


if __name__ == "__main__":
    main()

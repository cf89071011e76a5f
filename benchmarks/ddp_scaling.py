"""Data-parallel scaling of one run: training tokens/s without torch.distributed, and as a DDP job at each world size.

In one invocation, on the same suite and optimizer (same global batch, so the same experiment at every world size):

- `no DDP`: the run in this process (`structbench.execution.runner.execute`), as `structbench run` runs it;
- `DDP xN`: the run as a torchrun job of N processes (`structbench.execution.torchrun.run_torchrun`, what
  `structbench run --nproc-per-node N` does), gloo on CPU, nccl on CUDA (N must not exceed the GPUs).

Each figure is the stored row's `throughput_per_s`: training tokens of the global batch over rank 0's clocked steps
(the first step excluded; evaluation not clocked). On CPU the cores are divided among the ranks (torch threads =
cores / N), so a world size of N uses the same cores as one process. Printed: tokens/s per configuration, the DDP
overhead at world size 1 (no-DDP tokens/s over DDP x1 tokens/s) and the scaling efficiency of each world size N
(tokens/s at N over N times the tokens/s at 1, both DDP). The rows land in a temporary store.

    python -m benchmarks.ddp_scaling                                   # shakespeare-llama, AdamW, CPU, N = 1, 2
    python -m benchmarks.ddp_scaling --device cuda --nproc 1 2 4 8 --steps 200
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from structbench import measure
from structbench.data.root import resolve_data_root
from structbench.execution import local
from structbench.execution.job import Job
from structbench.execution.runner import execute
from structbench.execution.torchrun import run_torchrun
from structbench.plan import grid, spec
from structbench.store import write as store


def suite_for(name: str, optim_name: str, steps: int, extra: list[str]) -> Any:
    overrides = ["budget.epochs=0", f"budget.steps={steps}", "budget.eval_every=0", f"budget.log_every={steps}"]
    [suite], _ = spec.load_suites(name, [*overrides, *extra], [optim_name], [0])
    return suite


def distributed_rate(cell: grid.Cell, device: str, data_root: Path, nproc: int, out: Path) -> float:
    job = Job(
        cell=cell,
        device=device,
        data_root=str(data_root),
        out=str(out),
        executor="torchrun",
        parallel_runs=1,
        threads=local.threads_per_worker(nproc) if device == "cpu" else None,
        nproc_per_node=nproc,
    )
    finished = run_torchrun(job)
    if finished.row is None or finished.row["status"] != "ok":
        log = out / ".distributed" / f"{cell.key}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
        raise SystemExit(f"DDP x{nproc} failed: {finished.failure or finished.row['error']}\n{tail}")
    return float(finished.row["throughput_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="shakespeare-llama")
    parser.add_argument("--optim", default="adamw")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="suite override key=value")
    args = parser.parse_args()

    suite = suite_for(args.suite, args.optim, args.steps, args.overrides)
    device = measure.resolve_device(args.device)
    data_root = resolve_data_root(None)
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ddp-scaling-") as tmp:
        store.prepare(Path(tmp))
        row = execute(suite, args.optim, 0, device, data_root).row
        if row["status"] != "ok":
            raise SystemExit(f"the single-process run failed: {row['error']}")
        rates["no DDP"] = float(row["throughput_per_s"])
        for nproc in args.nproc:
            key = grid.run_key(suite, args.optim, 0, device.type, nproc)
            cell = grid.Cell(suite, args.optim, 0, key, "")
            rates[f"DDP x{nproc}"] = distributed_rate(cell, device.type, data_root, nproc, Path(tmp))
    name = measure.device_name(device)
    unit = row["throughput_unit"]
    print(f"{args.suite}, {args.optim}, {args.steps} steps, global batch {suite.budget['batch_size']}, on {name}")
    print(f"{'configuration':>14} {unit:>14}")
    for label, rate in rates.items():
        print(f"{label:>14} {rate:14.1f}")
    if "DDP x1" in rates:
        print(f"DDP overhead at world size 1 (no DDP / DDP x1): {rates['no DDP'] / rates['DDP x1']:.3f}")
        for nproc in args.nproc:
            if nproc > 1:
                efficiency = rates[f"DDP x{nproc}"] / (nproc * rates["DDP x1"])
                print(f"scaling efficiency at world size {nproc} (rate / ({nproc} x DDP x1 rate)): {efficiency:.3f}")
    print(f"torch {torch.__version__}; timings from one run each: repeat on a quiet machine before quoting them.")


if __name__ == "__main__":
    main()

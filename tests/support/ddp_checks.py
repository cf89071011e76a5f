"""Checks of DDP training run on every rank of one torchrun job (2 processes, gloo); rank 0 writes the findings as
JSON to argv[1] and tests/execution/test_distributed.py asserts on them. One job for all checks: each launch
costs seconds.

1. Every registered optimizer (its replicated form) under DDP: each rank trains on its half of the conformance
   kit's batches; the parameters must be bit-identical on both ranks and bit-identical to a single-process run whose
   gradient is set to (g_half0 / 2 + g_half1 / 2), what DDP's all-reduce computes (scaling by 1/2 is exact in
   binary floating point, and a sum of two terms is rounded once whatever the order).
2. Each optimizer with the `distributed` switch: "shard" against "replicate" on a stack of four equal matrices
   (parameters, and each rank's state bytes of the structured part).
3. The runner end to end: shakespeare-llama (tiny) and the digits MLP at world size 2 against world size 1 (rank 0
   alone), the final parameters captured from the runner's training loop.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from structbench import measure, optim
from structbench.execution import loop, runner
from structbench.execution.distributed import SINGLE, Comm
from structbench.optim import conformance
from structbench.plan import spec
from structbench.tasks.base import Shard

STEPS = conformance.STEPS


def half(tensor: torch.Tensor, rank: int) -> torch.Tensor:
    return Shard(rank, 2).take(tensor)


def build(name: str, model: nn.Module, **extra: Any) -> torch.optim.Optimizer:
    return optim.make_optimizer(name, model, **{**optim.get(name).check_hparams, **extra})


def replicated(name: str) -> dict[str, Any]:
    return {"distributed": "replicate"} if "distributed" in optim.get(name).defaults else {}


def train_ddp(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, batch: Any) -> None:
    ddp = DistributedDataParallel(model)
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(half(x, rank)).float(), half(y, rank)).backward()
        optimizer.step()


def train_averaged(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    """One process: the gradient of each half of the batch, then (g0 / 2 + g1 / 2) as DDP's averaged gradient."""
    for step in range(STEPS):
        x, y = batch(step)
        halves = []
        for rank in (0, 1):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(half(x, rank)).float(), half(y, rank)).backward()
            halves.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *halves, strict=True):
            p.grad = g0 / 2 + g1 / 2
        optimizer.step()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_all_ranks(tensor: torch.Tensor) -> bool:
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, tensor)
    return all(torch.equal(copies[0], c) for c in copies)


def check_optimizers(rank: int) -> dict[str, Any]:
    found = {}
    for name in optim.names():
        model = conformance.toy_model()
        train_ddp(model, build(name, model, **replicated(name)), rank, conformance.toy_batch)
        entry: dict[str, Any] = {"ranks_identical": same_on_all_ranks(flat(model))}
        if rank == 0:
            reference = conformance.toy_model()
            train_averaged(reference, build(name, reference, **replicated(name)), conformance.toy_batch)
            entry["max_abs_diff"] = float((flat(model) - flat(reference)).abs().max())
            entry["bit_identical"] = torch.equal(flat(model), flat(reference))
        found[name] = entry
    return found


class Stack(nn.Module):
    """Four equal hidden matrices and a head (which the hybrids route to their fallback)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.ModuleList(nn.Linear(16, 16, bias=False) for _ in range(4))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return self.head(h)


def stack_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2000 + step)
    return torch.randn(8, 16, generator=gen), torch.randint(3, (8,), generator=gen)


def structured_bytes(optimizer: torch.optim.Optimizer) -> int:
    parts = getattr(optimizer, "parts", {"all": optimizer})
    return sum(measure.state_bytes(part) for name, part in parts.items() if name != "fallback")


def largest_param_state(optimizer: torch.optim.Optimizer) -> int:
    """The state bytes of the parameter whose state is largest, over the structured part."""
    parts = getattr(optimizer, "parts", {"all": optimizer})
    sizes = [
        sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
        for name, part in parts.items()
        if name != "fallback"
        for state in part.state.values()
    ]
    return max(sizes)


def check_sharding(rank: int) -> dict[str, Any]:
    found = {}
    for name in optim.names():
        if "distributed" not in optim.get(name).defaults:
            continue
        runs = {}
        for mode in ("replicate", "shard"):
            torch.manual_seed(0)
            model = Stack()
            optimizer = build(name, model, distributed=mode)
            train_ddp(model, optimizer, rank, stack_batch)
            runs[mode] = (flat(model), structured_bytes(optimizer), optimizer)
        found[name] = {
            "bit_identical": torch.equal(runs["shard"][0], runs["replicate"][0]),
            "max_abs_diff": float((runs["shard"][0] - runs["replicate"][0]).abs().max()),
            "ranks_identical": same_on_all_ranks(runs["shard"][0]),
            "state_bytes": {mode: runs[mode][1] for mode in runs},
            "param_scale": float(runs["replicate"][0].abs().max()),
            "largest_param_state": largest_param_state(runs["replicate"][2]),
        }
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, {n: v["state_bytes"] for n, v in found.items()})
    for name in found:
        found[name]["state_bytes_per_rank"] = [g[name] for g in gathered]
    return found


SUITES = {
    "shakespeare-llama": [
        "task_args.seq_len=32",
        "task_args.eval_tokens=64",
        "budget.batch_size=8",
        "budget.steps=3",
        "budget.eval_every=0",
        "budget.log_every=1",
        "hparams.sgd.lr=0.5",
    ],
    "digits": ["budget.epochs=0", "budget.steps=3", "budget.batch_size=64", "budget.log_every=1", "hparams.sgd.lr=0.1"],
}


def capture_final_params(sink: dict[str, torch.Tensor]) -> None:
    """Wrap the runner's training loop so that the trained model's parameters, and the loss of its first training
    call (this rank's share), land in `sink`."""
    original = loop.train

    def train(task: Any, *args: Any, **kwargs: Any) -> Any:
        sink["initial"] = flat(task.model).clone()
        sink.pop("first_loss", None)
        loss_of = task.train_loss

        def recorded(step: int) -> torch.Tensor:
            loss = loss_of(step)
            sink.setdefault("first_loss", loss.detach().clone())
            return loss

        task.train_loss = recorded
        result = original(task, *args, **kwargs)
        sink["final"] = flat(task.model).clone()
        return result

    loop.train = train


def check_runner(rank: int, data_root: Path) -> dict[str, Any]:
    sink: dict[str, torch.Tensor] = {}
    capture_final_params(sink)
    comm = Comm(rank, 2, "gloo")
    found = {}
    for name, overrides in SUITES.items():
        [suite], _ = spec.load_suites(name, overrides, ["sgd"], [0])
        two = runner.execute(suite, "sgd", 0, torch.device("cpu"), data_root, comm=comm, run_id="ddp")
        two_params = sink["final"]
        shares: list[Any] = [None, None]
        dist.all_gather_object(shares, float(sink["first_loss"]))
        if rank != 0:
            continue
        one = runner.execute(suite, "sgd", 0, torch.device("cpu"), data_root, comm=SINGLE)
        tokens = suite.budget["batch_size"] * (suite.task_args.get("seq_len", 1) if name != "digits" else 1)
        found[name] = {
            "status": [two.row["status"], one.row["status"]],
            "max_abs_diff": float((two_params - sink["final"]).abs().max()),
            "max_update": float((sink["final"] - sink["initial"]).abs().max()),
            "reduction_length": tokens,
            "steps": suite.budget["steps"],
            "world_size": two.row["world_size"],
            "train_loss": [two.row["final_train_loss"], one.row["final_train_loss"]],
            "first_loss_per_rank": shares,
            "first_loss_one_process": float(sink["first_loss"]),
        }
    dist.barrier()
    return found


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as data_root:
        findings = {
            "optimizers": check_optimizers(rank),
            "sharding": check_sharding(rank),
            "runner": check_runner(rank, Path(data_root)),
        }
    if rank == 0:
        out.write_text(json.dumps(findings))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Per-matrix optimizer work shared across the ranks of a torch.distributed job (`distributed = "shard"`).

Under data parallelism every rank holds the same averaged gradients, so a matrix optimizer that keeps its whole state
on every rank (`"replicate"`) repeats the same per-matrix work (orthogonalizations, inverse roots,
eigendecompositions) on each rank. With `"shard"` each parameter of a group is owned by one rank: only its owner
steps it (and so only its owner holds its state), then every owner sends its updated parameters to all the others.
This is the scheme of modded-nanogpt's distributed Muon (KellerJordan/modded-nanogpt, `train_gpt.py`: each rank
orthogonalizes every world_size-th matrix, then an all_gather), of the distributed Muon of Moonlight (Liu et al.
2025, arXiv:2502.16982) and of Distributed Shampoo's assignment of preconditioner blocks to workers
(facebookresearch/optimizers, `distributed_shampoo/distributed_shampoo.py`; Shi et al. 2023, arXiv:2309.06497).

Ownership balances the elements each rank steps: parameters taken largest first, each to the rank with the fewest
elements so far (ties to the lower rank, then the earlier parameter), a deterministic assignment every rank computes
alike. Since each parameter's update depends on that parameter's gradient and state alone, the owner computes
exactly what every rank computes under `"replicate"`, and the exchange copies its bytes: the two modes give
bit-identical parameters whenever the optimizer's step treats each matrix on its own (on CPU with `batch_matrices`
off; stacking a different set of same-shape matrices into one batched kernel may round differently).

The exchange is one broadcast per owning rank of its updated parameters flattened into one buffer (per dtype): an
all_gather of shares of different sizes, which gloo's all_gather does not take. Outside a torch.distributed job, or
at world size 1, `"shard"` is `"replicate"`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from structbench.optim.hparams import Declaration, option, ours

MODES = ("replicate", "shard")

DISTRIBUTED = Declaration(
    option(
        "distributed",
        "shard",
        MODES,
        ours("in a torch.distributed job each rank steps its share of the matrices, then sends them: same algorithm"),
    )
)
"""The switch an optimizer whose step is per-matrix declares to take part in sharding (see the module docstring)."""


def owners(sizes: Sequence[int], world_size: int) -> list[int]:
    """The owning rank of each of the parameters with these element counts: largest first, to the least loaded rank."""
    load = [0] * world_size
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


def world() -> tuple[int, int]:
    """(rank, world size) of the torch.distributed job this process is in; (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def step_group(step: Callable[[dict[str, Any]], None], group: dict[str, Any]) -> None:
    """Run `step` (an optimizer's per-group update) on `group` as its `distributed` switch says."""
    rank, world_size = world()
    if group.get("distributed", "replicate") != "shard" or world_size == 1:
        step(group)
        return
    live = [p for p in group["params"] if p.grad is not None]
    owner = owners([p.numel() for p in live], world_size)
    step({**group, "params": [p for p, r in zip(live, owner, strict=True) if r == rank]})
    share(live, owner)


def share(params: Sequence[torch.Tensor], owner: Sequence[int]) -> None:
    """Every rank's copy of `params` set to its owner's: one broadcast per owning rank and dtype."""
    by_source: dict[tuple[int, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for param, rank in zip(params, owner, strict=True):
        by_source[(rank, param.dtype)].append(param)
    for (rank, _), owned in sorted(by_source.items(), key=lambda item: (item[0][0], str(item[0][1]))):
        flat = _flatten_dense_tensors([p.detach() for p in owned])
        dist.broadcast(flat, src=rank)
        if rank != dist.get_rank():
            for param, value in zip(owned, _unflatten_dense_tensors(flat, owned), strict=True):
                param.detach().copy_(value)

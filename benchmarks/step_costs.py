"""What each optimizer's step would cost on a GPU, counted on this machine (structbench/optim/cost_profile.py): per
step, kernel launches, host reads (device synchronisations on a GPU; reads of CPU counters apart), decompositions,
matmul FLOPs by dtype and new bytes, for the steady state, the refresh step and the mean over the optimizer's full
refresh interval (its default), on GPT-2-small's weights (per layer 768x768 twice, 3072x768, 768x3072), with the
switches that resolve by device set as on CUDA (`cost_profile.AS_ON_CUDA`):

    python -m benchmarks.step_costs                      # 12 layers at a quarter of the widths (6 min on 2 cores)
    python -m benchmarks.step_costs --divisor 1 --optim fismo --optim muon
    python -m benchmarks.step_costs --layers 1           # one layer: seconds

Launches, host reads and decompositions per step depend on the number of matrices and their shapes' grouping, not on
their widths (as long as the widths stay above the optimizers' size thresholds); FLOPs and bytes are those of the
shapes given (a quarter of the widths: 1/16 of the matrix-product FLOPs).

Counts do not depend on the device; the time they cost does (about 5-10 us per launch on a GPU, a synchronisation
per host read, one cuSOLVER call per matrix for most decompositions): the table says where a GPU's time would go,
not how long a step takes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence

import torch

from benchmarks.arguments import Parser, at_least
from structbench import optim
from structbench.optim import cost_profile
from structbench.optim.cost_profile import Profile, StepCost

COLUMNS = (
    "optimizer", "interval", "launches steady/refresh/amortised", "per matrix", "host reads steady",
    "counter reads", "deferred reads", "decompositions steady | per refresh", "GFLOP amortised by dtype",
    "MB new amortised",
)  # fmt: skip


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=at_least(1), default=12, help="GPT-2-small layers (4 matrices each)")
    parser.add_argument("--divisor", type=at_least(1), default=4, help="divide every width by this")
    parser.add_argument("--optim", action="append", default=None, help="an optimizer (repeatable; default: all)")
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.optim or []) - set(optim.names()))
    if unknown:
        parser.error(f"unknown optimizer(s) {', '.join(unknown)}; known: {', '.join(optim.names())}")
    if 768 % args.divisor:
        parser.error(f"--divisor {args.divisor} does not divide the width 768")
    return args


def shapes(layers: int, divisor: int) -> list[tuple[int, int]]:
    d = 768 // divisor
    return [s for _ in range(layers) for s in ((d, d), (d, d), (4 * d, d), (d, 4 * d))]


def listed(counts: Counter[str]) -> str:
    return ", ".join(f"{n}x {what}" for what, n in counts.items()) or "none"


def row(profile: Profile) -> list[str]:
    def launches(cost: StepCost) -> float:
        return cost.launches

    amortised = profile.amortised(launches)
    flops = {dtype: profile.amortised(lambda cost, d=dtype: cost.flops[d]) for dtype in profile.refresh.flops}
    flops |= {dtype: profile.amortised(lambda cost, d=dtype: cost.flops[d]) for dtype in profile.steady.flops}
    refresh_only = profile.refresh.decompositions - profile.steady.decompositions
    return [
        profile.name,
        str(profile.interval),
        f"{profile.steady.launches}/{profile.refresh.launches}/{amortised:.0f}",
        f"{amortised / profile.matrices:.1f}",
        listed(profile.steady.host_reads),
        str(profile.steady.counter_reads),
        str(profile.steady.deferred_reads),
        f"{listed(profile.steady.decompositions)} | {listed(refresh_only)}",
        ", ".join(f"{dtype} {value / 1e9:.3g}" for dtype, value in sorted(flops.items())) or "0",
        f"{profile.amortised(lambda cost: cost.bytes_allocated) / 1e6:.1f}",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    weights = shapes(args.layers, args.divisor)
    print(f"{len(weights)} matrices ({args.layers} GPT-2-small layer(s), widths / {args.divisor}); counts per step")
    print(" | ".join(COLUMNS))
    for name in args.optim or optim.names():
        print(" | ".join(row(cost_profile.profile(name, weights))), flush=True)
        print(f"  {name} done", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Optimizer-step time of every registered optimizer, as ratios measured side by side in one process.

For each shape set (GPT-2-small-like layers; a ResNet-18's conv and linear weights) it times
`optimizer.step()` alone — gradients are fixed, so the backward pass is not measured — and prints:

- each optimizer's steady-state step (median), its refresh step (median; the step that recomputes roots,
  eigenbases or projections) and the mean step amortised over its full default refresh interval, with the ratio
  of the amortised step to `torch.optim.AdamW(foreach=True)`'s and to our `muon`'s. The refreshes are timed at a
  shortened interval (at most `cost_profile.SHORT_INTERVAL` steps, the rest of the settings unchanged), which steps
  refresh being known from the cost profile's counts (`cost_profile.Profile.refresh_phases`); the amortised step is
  steady + (refresh - steady) / interval, so a 500-step interval is covered without running 500 steps;
- beside each, what its step costs on a GPU as counted on the CPU by `structbench.optim.cost_profile` (kernel
  launches per step amortised, host reads in the steady state, decompositions per refresh), at the same shapes with
  widths / `COUNT_DIVISOR` (counts do not depend on widths);
- for optimizers with an independent implementation of the same algorithm (torch.optim.Muon,
  pytorch-optimizer's SOAP, Shampoo and GaLore), our time over theirs under settings that match, by
  median and by mean. The two are stepped alternately (ours, theirs, theirs, ours, ...), so load from
  other processes falls on both alike.

The independent implementations are compared at the settings given (default intervals), by median and by mean over
`--steps`; means include the refreshes that fall inside that window. `--threads` sets torch's intra-op threads
(default: torch's own choice); on a machine whose cores are busy with other work, multi-threaded step
times mostly measure how often each op's threads wait for a descheduled peer.

`--quick` times every optimizer in well under a minute on two CPU cores, by the same side-by-side method on smaller
shapes: one GPT-2-small layer and the ResNet-18 filters at a quarter of their widths (192x192 x2, 768x192, 192x768;
16 to 128 channels), 4 timed steps after 1 warm-up (covering the interval-2 refreshes of the Shampoo comparison), on
one thread (so that it does not wait on a second core other work holds).
An independent implementation that is not installed is named in its optimizer's row as "not installed". Usage:

    python -m benchmarks.optim_step --quick
    python -m benchmarks.optim_step --shapes gpt2-small --layers 2 --steps 12
    python -m benchmarks.optim_step --device cuda --layers 12 --steps 50      # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks import arguments
from benchmarks.deadline import Deadline, cut_note
from structbench import optim
from structbench.optim import cost_profile
from structbench.optim.partition import matrix_shape

Shapes = list[tuple[int, ...]]


def gpt2_small(layers: int, divisor: int = 1) -> Shapes:
    """Per layer: attention in/out (768x768 each), MLP up (3072x768) and down (768x3072); every width / `divisor`."""
    d = 768 // divisor
    return [s for _ in range(layers) for s in ((d, d), (d, d), (4 * d, d), (d, 4 * d))]


def resnet18(layers: int, divisor: int = 1) -> Shapes:
    """The conv filters and classifier of a CIFAR ResNet-18 (`layers` is ignored), channels / `divisor`."""
    widths = [w // divisor for w in (64, 128, 256, 512)]
    shapes: Shapes = [(widths[0], 3, 3, 3)]
    previous = widths[0]
    for stage, width in enumerate(widths):
        for block in range(2):
            stride_block = stage > 0 and block == 0
            shapes.append((width, previous if block == 0 else width, 3, 3))
            shapes.append((width, width, 3, 3))
            if stride_block:
                shapes.append((width, previous, 1, 1))
        previous = width
    shapes.append((10, widths[-1]))
    return shapes


SHAPE_SETS: dict[str, Callable[[int, int], Shapes]] = {"gpt2-small": gpt2_small, "resnet18": resnet18}


@dataclass
class Oracle:
    """An independent implementation of one of our optimizers, and the settings under which they match."""

    label: str
    ours: dict[str, Any]
    build: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
    matrices_only: bool = False
    variants: tuple[dict[str, Any], ...] = ({},)
    """Further settings of ours, each timed against the independent implementation in the same rounds."""


PYTORCH_OPTIMIZER = {
    "soap": "pytorch_optimizer.SOAP",
    "shampoo": "pytorch_optimizer.ScalableShampoo",
    "galore": "pytorch_optimizer.GaLore",
}
"""Our optimizers that pytorch-optimizer (PyPI `pytorch-optimizer`) implements independently."""


def oracles() -> tuple[dict[str, Oracle], dict[str, str]]:
    """The independent implementations installed here, and for each one missing, why (by our optimizer's name)."""
    found: dict[str, Oracle] = {}
    missing: dict[str, str] = {}
    if hasattr(torch.optim, "Muon"):  # torch >= 2.9
        found["muon"] = Oracle(
            "torch.optim.Muon",
            {"weight_decay": 0.0, "ns_dtype": "bfloat16"},  # torch.optim.Muon runs Newton-Schulz in bf16 everywhere
            lambda ps: torch.optim.Muon(ps, lr=0.02, momentum=0.95, weight_decay=0.0, adjust_lr_fn="original"),
            matrices_only=True,
            variants=({"batch_matrices": "off"}, {"batch_matrices": "on"}),
        )
    else:
        missing["muon"] = f"torch.optim.Muon not installed (not in torch {torch.__version__}; needs 2.9)"
    try:
        import pytorch_optimizer as po
    except ImportError:
        for name, label in PYTORCH_OPTIMIZER.items():
            missing[name] = f"{label} not installed (pip install pytorch-optimizer)"
        return found, missing
    found["soap"] = Oracle(
        "pytorch_optimizer.SOAP",
        {"precondition_frequency": 10},
        lambda ps: po.SOAP(ps, lr=3e-3, betas=(0.95, 0.95), weight_decay=0.01, precondition_frequency=10),
        matrices_only=True,
    )
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting

    found["shampoo"] = Oracle(
        "pytorch_optimizer.ScalableShampoo",
        {"stat_interval": 2, "root_interval": 2, "root_method": "eigh", "sgd_weight_decay": 0.0},
        lambda ps: po.ScalableShampoo(
            ps,
            lr=0.1,
            betas=(0.9, 0.95),
            moving_average_for_momentum=False,
            weight_decay=0.0,
            decoupled_learning_rate=True,
            start_preconditioning_step=1,
            preconditioning_compute_steps=2,
            statistics_compute_steps=2,
            block_size=1200,
            shape_interpretation=False,
            graft_type=LayerWiseGrafting.SGD,
            nesterov=False,
            matrix_eps=1e-6,
            use_svd=True,
        ),
        matrices_only=True,
    )
    found["galore"] = Oracle(
        "pytorch_optimizer.GaLore",
        {},
        lambda ps: po.GaLore(
            [{"params": ps, "rank": 128, "update_proj_gap": 200, "scale": 0.25, "projection_type": "std"}],
            lr=0.01,
        ),
        matrices_only=True,
    )
    return found, missing


def make_params(shapes: Sequence[tuple[int, ...]], device: torch.device, matrices: bool) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes:
        shape = matrix_shape(shape) if matrices else shape
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(device))
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(device)
        params.append(p)
    return params


class OracleError(Exception):
    """The independent implementation raised while stepping (its own solver failures)."""


def oracle_step(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """`optimizer.step`, its RuntimeErrors raised as OracleError so that they are told apart from ours."""

    def step() -> None:
        try:
            optimizer.step()
        except RuntimeError as exc:
            raise OracleError(str(exc).splitlines()[0]) from exc

    return step


def time_steps(optimizer: torch.optim.Optimizer, device: torch.device, warmup: int, steps: int) -> list[float]:
    (times,) = time_alternately([optimizer.step], device, warmup, steps)
    return times


def time_alternately(
    step_fns: Sequence[Callable[[], object]], device: torch.device, warmup: int, steps: int
) -> list[list[float]]:
    """Times of each step function, called in turn (the order reversed every round, so none always goes first)."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for step in step_fns:
        for _ in range(warmup):
            step()
    times: list[list[float]] = [[] for _ in step_fns]
    for round_index in range(steps):
        order = list(enumerate(step_fns))
        for index, step in order if round_index % 2 == 0 else reversed(order):
            sync()
            start = time.perf_counter()
            step()
            sync()
            times[index].append(time.perf_counter() - start)
    return times


def ours(name: str, params: list[torch.nn.Parameter], overrides: dict[str, Any]) -> torch.optim.Optimizer:
    return optim.make_optimizer(name, [(f"p{i}", p) for i, p in enumerate(params)], **overrides)


@dataclass(frozen=True)
class StepTimes:
    """An optimizer's step times in seconds: steady state, refresh step and the mean over its default interval."""

    steady: float
    refresh: float | None
    amortised: float


def amortised_times(times: Sequence[float], cycle: int, phases: set[int], interval: int) -> StepTimes:
    """`times` of whole cycles of `cycle` steps whose `phases` (index mod cycle) refresh: steady = the median of the
    other steps; each refresh phase adds its median over steady once per cycle, that is once per `interval` steps
    at the default interval."""
    if not phases:
        median = statistics.median(times)
        return StepTimes(median, None, median)
    steady = statistics.median(t for i, t in enumerate(times) if i % cycle not in phases)
    extra = sum(statistics.median(times[p::cycle]) - steady for p in sorted(phases))
    return StepTimes(steady, steady + extra, steady + extra / interval)


def time_refresh_cycles(
    name: str, shapes: Shapes, device: torch.device, warmup: int, steps: int, counted: cost_profile.Profile
) -> StepTimes:
    """Times of optimizer `name` (its defaults on `device`) started like its cost profile (`counted`): the shortened
    interval, one step and one untimed cycle, then `warmup` and `steps` rounded up to whole cycles, the first
    untimed."""
    interval, hparams = cost_profile.shortened_hparams(name, {})
    cycle = counted.cycle
    optimizer = ours(name, make_params(shapes, device, False), hparams)
    whole = -(-warmup // cycle) * cycle
    times = time_steps(optimizer, device, 1 + cycle + whole, -(-steps // cycle) * cycle)
    return amortised_times(times, cycle, counted.refresh_phases(), interval)


COUNT_DIVISOR = {"gpt2-small": 12, "resnet18": 4}
"""Widths / this for the cost profile's counts (GPT-2-small at 64 and 256, ResNet-18 at 16 to 128 channels): counts
do not depend on widths above the optimizers' size thresholds, and the smaller shapes count in seconds."""


def counts(counted: cost_profile.Profile) -> str:
    """The cost profile's launches (amortised), steady-state host reads and decompositions per refresh, as text."""
    refresh_only = counted.refresh.decompositions - counted.steady.decompositions
    return (
        f"{counted.amortised(lambda cost: cost.launches):.0f} launches, "
        f"{counted.steady.reads} host reads, {sum(counted.steady.decompositions.values())} decompositions steady"
        f" + {sum(refresh_only.values())} per refresh"
    )


def compare_with_oracle(
    name: str, oracle: Oracle, shapes: Shapes, device: torch.device, warmup: int, steps: int
) -> str:
    """Ours (each variant) and the independent implementation stepped in turn; their time ratios as text."""
    mine = [
        ours(name, make_params(shapes, device, oracle.matrices_only), {**oracle.ours, **v}) for v in oracle.variants
    ]
    theirs = oracle.build(make_params(shapes, device, oracle.matrices_only))
    try:
        *mine_times, theirs_times = time_alternately(
            [*(opt.step for opt in mine), oracle_step(theirs)], device, warmup, steps
        )
    except OracleError as exc:
        return f"   {oracle.label} failed: {exc}"
    their_median, their_mean = statistics.median(theirs_times), statistics.mean(theirs_times)
    parts = []
    for variant, times in zip(oracle.variants, mine_times, strict=True):
        median = statistics.median(times)
        parts.append(
            f"ours{variant or ''}/{oracle.label} = {median / their_median:.2f} by median, "
            f"{statistics.mean(times) / their_mean:.2f} by mean ({median * 1e3:.1f} vs {their_median * 1e3:.1f} ms)"
        )
    return f"   [ours with {oracle.ours or 'defaults'}] " + "; ".join(parts)


QUICK = {"divisor": 4, "layers": 1, "steps": 4, "warmup": 1, "threads": 1}
FULL = {"divisor": 1, "layers": 12, "steps": 20, "warmup": 2, "threads": None}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = arguments.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--optim", action="append", help="optimizer (repeatable); default: all registered")
    parser.add_argument("--shapes", choices=[*SHAPE_SETS, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="smaller shapes and fewer steps (under a minute on a CPU)")
    parser.add_argument("--layers", type=arguments.at_least(1), help="GPT-2 layers in the shape set (default 12)")
    parser.add_argument("--steps", type=arguments.at_least(1), help="timed steps (default 20; 4 with --quick)")
    parser.add_argument("--warmup", type=arguments.at_least(0), help="untimed steps first (default 2; 1 with --quick)")
    parser.add_argument("--device", type=arguments.device, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=arguments.at_least(1), help="threads (default: torch's; 1 with --quick)")
    parser.add_argument(
        "--budget-s", type=arguments.at_least(1), help="start no optimizer after this many seconds (default: no limit)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.optim or []) - set(optim.names()))
    if unknown:
        parser.error(f"unknown optimizer {', '.join(unknown)}; registered: {', '.join(optim.names())}")
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device: torch.device = args.device
    deadline = Deadline.after(args.budget_s)
    names = args.optim or optim.names()
    sets = list(SHAPE_SETS) if args.shapes == "all" else [args.shapes]
    print(
        f"device: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, steps {args.steps} after {args.warmup} warm-up"
        + (", --quick: widths / 4" if args.quick else "")
    )
    found, missing = oracles()
    for set_name in sets:
        shapes = SHAPE_SETS[set_name](args.layers, args.divisor)
        numel = sum(torch.Size(s).numel() for s in shapes)
        print(f"\n## {set_name}: {len(shapes)} tensors, {numel / 1e6:.2f}M parameters")
        counted_shapes = SHAPE_SETS[set_name](args.layers, max(args.divisor, COUNT_DIVISOR[set_name]))
        baseline = time_steps(
            torch.optim.AdamW(make_params(shapes, device, False), foreach=True), device, args.warmup, args.steps
        )
        base = statistics.median(baseline)
        muon = time_refresh_cycles(
            "muon", shapes, device, args.warmup, args.steps, cost_profile.profile("muon", counted_shapes)
        ).amortised
        print(
            f"{'optimizer':<20}{'steady ms':>10}{'refresh ms':>11}{'amortised':>10}{'interval':>9}{'/ AdamW':>8}"
            f"{'/ Muon':>7}   counted on the CPU (widths / {COUNT_DIVISOR[set_name]})   independent implementation"
        )
        ms = f"{base * 1e3:.2f}"
        print(f"{'adamw-foreach':<20}{ms:>10}{'-':>11}{ms:>10}{1:>9}{1.0:>8.2f}{base / muon:>7.2f}")
        for index, name in enumerate(names):
            if deadline.passed():
                print(cut_note([f"{later} ({set_name})" for later in names[index:]]), flush=True)
                break
            counted = cost_profile.profile(name, counted_shapes)
            times = time_refresh_cycles(name, shapes, device, args.warmup, args.steps, counted)
            refresh = "-" if times.refresh is None else f"{times.refresh * 1e3:.2f}"
            line = (
                f"{name:<20}{times.steady * 1e3:>10.2f}{refresh:>11}{times.amortised * 1e3:>10.2f}"
                f"{counted.interval:>9}{times.amortised / base:>8.2f}{times.amortised / muon:>7.2f}   {counts(counted)}"
            )
            oracle = found.get(name)
            if oracle is not None:
                line += compare_with_oracle(name, oracle, shapes, device, args.warmup, args.steps)
            elif name in missing:
                line += f"   {missing[name]}"
            print(line, flush=True)

if __name__ == "__main__":
    main()

"""Step time of the matrix-root optimizers against Muon, side by side in one process: FISMO with its default
Newton–Schulz roots and with eigendecomposition roots, ASGO and Alice, on GPT-2-small layer shapes (per layer
768x768 x2, 3072x768, 768x3072).

The optimizers are stepped in turn (the order reversed every round, so load from other processes falls on all
alike) on the same sequence of fresh random gradients of scale `--grad-scale` (FISMO's factors, hence how often a
warm-started root must be refreshed, depend on it). The table gives each mean step time (a step that refreshes
FISMO's roots costs more than one that keeps them, so the mean over the timed steps is the ratio that counts) and
its ratio to Muon's mean, the median beside it, and the targets: FISMO at most 3x Muon, ASGO at most 1.5x. FISMO at
root_tol 1e-4 shows the cost of refreshing the large roots at nearly every step (its probe check fails sooner). After
it, FISMO's Newton–Schulz run is compared with its eigendecomposition run (same start, same gradients): the
eigendecomposition fallbacks counted and the relative parameter difference. Usage:

    python -m benchmarks.matrix_roots --layers 1 --steps 8 --threads 1
    python -m benchmarks.matrix_roots --device cuda --layers 12 --steps 20     # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.optim_step import gpt2_small, make_params, ours, time_alternately

CONFIGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("muon", "muon", {}),
    ("fismo (newton)", "fismo", {}),
    ("fismo root eigh", "fismo", {"root_method": "eigh"}),
    ("fismo root_tol 1e-4", "fismo", {"root_tol": 1e-4}),
    ("asgo", "asgo", {}),
    ("alice", "alice", {}),
)
TARGETS = {"fismo (newton)": 3.0, "asgo": 1.5}
"""Step time over Muon's that each optimizer should stay within."""


def gradient_sequence(
    shapes: Sequence[tuple[int, ...]], count: int, scale: float, device: torch.device
) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [[(torch.randn(s, generator=gen) * scale).to(device) for s in shapes] for _ in range(count)]


def stepper(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], grads: list[list[torch.Tensor]]):
    """optimizer.step on the next gradient set of `grads` (assigning them costs no arithmetic)."""
    position = iter(range(len(grads)))

    def step() -> None:
        for p, g in zip(params, grads[next(position)], strict=True):
            p.grad = g
        optimizer.step()

    return step


def relative_difference(a: list[torch.nn.Parameter], b: list[torch.nn.Parameter]) -> float:
    num = sum(float((x.detach() - y.detach()).square().sum()) for x, y in zip(a, b, strict=True))
    den = sum(float(y.detach().square().sum()) for y in b)
    return (num / den) ** 0.5


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1, help="transformer layers (default 1)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per optimizer (default 8)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--grad-scale", type=float, default=1e-3, help="gradient entries ~ N(0, scale^2)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.steps < 1 or args.warmup < 0 or not args.grad_scale > 0:
        parser.error("--layers and --steps must be >= 1, --warmup >= 0 and --grad-scale > 0")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = gpt2_small(args.layers)
    grads = gradient_sequence(shapes, args.warmup + args.steps, args.grad_scale, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device: {device} ({name}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{len(shapes)} matrices, steps {args.steps} after {args.warmup} warm-up, gradient scale {args.grad_scale:g}"
    )
    runs: list[tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]] = []
    steps: list[Callable[[], None]] = []
    for _, registered, overrides in CONFIGS:
        params = make_params(shapes, device, True)
        optimizer = ours(registered, params, overrides)
        runs.append((optimizer, params))
        steps.append(stepper(optimizer, params, grads))
    times = time_alternately(steps, device, args.warmup, args.steps)
    muon_mean, muon_median = statistics.fmean(times[0]), statistics.median(times[0])
    print(f"{'optimizer':<20}{'mean ms':>10}{'/ muon':>9}{'median ms':>11}{'/ muon':>9}   target")
    for (label, _, _), measured in zip(CONFIGS, times, strict=True):
        mean, median = statistics.fmean(measured), statistics.median(measured)
        target = TARGETS.get(label)
        verdict = "" if target is None else f"<= {target:g}x: {'met' if mean / muon_mean <= target else 'NOT met'}"
        print(
            f"{label:<20}{mean * 1e3:>10.1f}{mean / muon_mean:>9.2f}{median * 1e3:>11.1f}{median / muon_median:>9.2f}"
            f"   {verdict}"
        )
    (newton_opt, newton_params), eigh_params = runs[1], runs[2][1]
    fallbacks = newton_opt.parts["structured"].root_fallbacks
    print(
        f"fismo newton vs eigh after {args.warmup + args.steps} steps: relative parameter difference "
        f"{relative_difference(newton_params, eigh_params):.2e}, eigendecomposition fallbacks {fallbacks}"
    )


if __name__ == "__main__":
    main()

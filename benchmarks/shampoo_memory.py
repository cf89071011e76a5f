"""Optimizer-state bytes of `shampoo` vs `shampoo-4bit` (and the naive 4-bit baseline) from the registry's
exact formulas (checked against measured bytes by the conformance kit), on ResNet-18 and GPT-2-small shapes.

    python -m benchmarks.shampoo_memory        # from the repository root

The ratio is taken over the preconditioner state alone (total minus the SGD-momentum buffer of 4 bytes per
parameter, which all three share); the 4-bit Shampoo paper reports 32 bits vs about 4.5 bits per element.
"""

from __future__ import annotations

import math

from benchmarks.optim_step import SHAPE_SETS
from structbench import optim


def state_bytes(name: str, shapes: list[tuple[int, ...]]) -> int:
    entry = optim.get(name)
    hparams = optim.resolve_hparams(name, {})
    return entry.state_bytes(shapes, [], hparams)


def main() -> None:
    names = ("shampoo", "shampoo-4bit", "shampoo-4bit-naive")
    print("preconditioner state (MiB), excluding the shared SGD-momentum buffer")
    print(f"{'shape set':<12}{'params':>9}" + "".join(f"{n:>20}" for n in names) + f"{'32-bit / 4-bit':>16}")
    for set_name, make in SHAPE_SETS.items():
        shapes = make(12)
        params = sum(math.prod(s) for s in shapes)
        sizes = [state_bytes(n, shapes) - 4 * params for n in names]
        cells = "".join(f"{b / 2**20:>20.1f}" for b in sizes)
        print(f"{set_name:<12}{params / 1e6:>8.1f}M{cells}{sizes[0] / sizes[1]:>15.2f}x")


if __name__ == "__main__":
    main()

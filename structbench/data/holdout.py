"""A validation subset held out of an image dataset's training split.

The test split is what the report compares optimizers on, so choosing anything (a hyperparameter setting, when a
target is reached) on it would tune on the test set. An image task therefore trains on the training split minus a
validation subset: `round(fraction * N)` of the N training examples (at least one when the fraction is positive,
leaving at least one), the first ones of `torch.randperm(N)` drawn from a CPU generator seeded with the split seed.
The split depends on the split seed only, not on the run's seed, so every run of a suite (each optimizer, each seed)
holds out the same examples. A fraction of 0 holds out nothing.

An evaluation subset (`task_args.eval_examples`, for a quick check on a CPU) is drawn the same way from the test split
and from the validation subset, each by its own generator seeded with the split seed: the first `count` examples of
`torch.randperm(N)`, kept in the split's order, the same for every run of a suite.
"""

from __future__ import annotations

import torch

from structbench.data.splits import ArraySplit


def validation_count(size: int, fraction: float) -> int:
    """How many of `size` training examples a fraction holds out (module docstring)."""
    if fraction <= 0 or size < 2:
        return 0
    return min(size - 1, max(1, round(fraction * size)))


def hold_out(train: ArraySplit, fraction: float, seed: int) -> tuple[ArraySplit, ArraySplit | None]:
    """(the examples trained on, the validation subset or None), each in the split's original order."""
    count = validation_count(len(train), fraction)
    if count == 0:
        return train, None
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    held = torch.zeros(len(train), dtype=torch.bool)
    held[order[:count]] = True
    kept = ArraySplit(train.inputs[~held], train.labels[~held])
    return kept, ArraySplit(train.inputs[held], train.labels[held])


def evaluation_subset(split: ArraySplit, count: int, seed: int) -> ArraySplit:
    """The `count` examples of `split` an evaluation subset keeps (module docstring); the whole split when `count` is 0
    or not smaller than it."""
    if count <= 0 or count >= len(split):
        return split
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
    kept = order[:count].sort().values
    return ArraySplit(split.inputs[kept], split.labels[kept])

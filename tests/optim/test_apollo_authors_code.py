"""APOLLO against the authors' released code, transcribed in float64 (issue 36 item 4).

Reference: zhuhanqing/APOLLO at 76b34725abcbd45aa47d8fdf831c8b5ba6d34dde, `apollo_torch/apollo.py` lines 130-217 with
its defaults scale_front=False and disable_nl=False (lines 53-54), `apollo_torch/svd_projector.py` lines 50-60 and
122-141 (transcribed in tests/support/authors_lowrank.py). Switches: refresh_schedule "reference" (the code's 0-based
counter), reproject_moments False, limiter True, scaled_gradient "raw"; scaling "channel" (APOLLO) or "tensor"
(APOLLO-Mini). The limiter's psi + 1e-8 of the code against structbench's psi is a relative 1e-8 here.

Apollo-svd is compared through every refresh. For the random projection (Apollo-mini) the authors' seed chain
(`random_projector.py` lines 42-56: next_seed advances a torch.randint stream from the parameter's index) is not
reproduced: structbench hashes (proj_seed, index, step), as its docstring says. What is deterministic is compared:
the authors' computation fed, at each of its refreshes, structbench's projection of that refresh (the same
N(0, 1/r) Gaussian matrix), everything after the draw being the authors'. Twelve steps, T = 3; tolerance
`authors_lowrank.tolerance` (the authors' own float32 run's distance from float64, times 8)."""

from __future__ import annotations

import pytest
import torch

from structbench.optim.apollo import Apollo, projection_seed, random_projection
from structbench.optim.galore import projects_right
from tests.support.authors_lowrank import (
    SHAPES,
    STEPS,
    Settings,
    as_matrix,
    gradients,
    largest_relative_gap,
    ours_path,
    reference_mode,
    reference_path,
    tolerance,
)


@pytest.mark.parametrize("scaling", ["channel", "tensor"])
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_apollo_svd_follows_the_authors_code(kind: str, scaling: str) -> None:
    """Apollo-svd's W_t - W_0 within the float32 rounding allowance of the authors' computation at every step, on
    wide, tall, square and conv-shaped parameters (before issue 36 the wide and conv cases drifted from step 5)."""
    shape = SHAPES[kind]
    settings = Settings(scale_type=scaling)
    w0 = gradients(shape, 1, seed=300)[0]
    grads = gradients(shape, STEPS, seed=301)
    hparams = reference_mode(settings) | {"projection": "svd", "scaling": scaling}
    ours, _ = ours_path(Apollo, w0, grads, **hparams)
    reference = reference_path(w0, grads, settings, "apollo", torch.float64)
    assert largest_relative_gap(ours, reference) <= tolerance(w0, grads, settings, "apollo")
    assert float(reference[-1].abs().max()) > 1e-2


def structbench_draws(shape: tuple[int, ...], rank: int):
    """The projection structbench's Apollo draws at a refresh at 0-based step `step` (parameter index 0, proj_seed
    0): the reference is fed these, since the authors' seed chain is theirs alone."""
    matrix_shape = tuple(as_matrix(torch.empty(shape)).shape)
    right = projects_right(matrix_shape, "std")
    return lambda step: random_projection(matrix_shape, rank, right, projection_seed(0, 0, step + 1))


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_apollo_mini_follows_the_authors_code_given_the_draws(kind: str) -> None:
    """Apollo-mini (rank 1, tensor-wise scaling, random projection) against the authors' computation on the same
    projections, through four refreshes."""
    shape = SHAPES[kind]
    settings = Settings(rank=1, scale=128.0, scale_type="tensor")
    w0 = gradients(shape, 1, seed=400)[0]
    grads = gradients(shape, STEPS, seed=401)
    hparams = reference_mode(settings) | {"projection": "random", "scaling": "tensor", "proj_seed": 0}
    ours, _ = ours_path(Apollo, w0, grads, **hparams)
    draws = structbench_draws(shape, settings.rank)
    reference = reference_path(w0, grads, settings, "apollo", torch.float64, draws)
    assert largest_relative_gap(ours, reference) <= tolerance(w0, grads, settings, "apollo", draws)
    assert float(reference[-1].abs().max()) > 1e-2

"""SUMO's batched subspace refresh (Blocks 1 and 1.1 for a stack of matrices) against independent facts.

- Stacked against alone: the matrices due at a step whose oriented gradients have one shape, across parameter
  shapes (a 12 x 8 and an 8 x 12 weight both give 12 x 8 under proj_side "paper"), are refreshed as one stack; each
  gets the basis it gets in an optimizer of its own, bit for bit (the exact truncated SVD runs one LAPACK call per
  matrix on the same bytes either way), and its rotated moment within the products' rounding bound (below) of the
  alone one's (a batched and a single product may round differently). A matrix refreshed for the first time in the
  same stack as matrices rotating gets its own first basis and a moment of its projected gradient only.
- A failed SVD in a stack: found matrix by matrix, the others installed as alone, the failed one keeps its basis and
  moment and is counted.
- Exact counts: the refresh step's launches beyond the steady step's do not grow with the number of same-shape
  matrices, and two parameter shapes that give one oriented shape cost what one shape does (one stack: every
  decomposition of the refresh runs on all of them at once).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import structbench.optim.sumo as sumo_module
from structbench.errors import SolverError
from structbench.optim import cost_profile
from structbench.optim.sumo import Sumo
from tests.support.newton_schulz import gamma

F64 = torch.float64
MU = 0.9


def _optimizer(params: list[nn.Parameter], **overrides: object) -> Sumo:
    settings: dict[str, object] = {"lr": 0.01, "rank": 3, "momentum": MU, "update_freq": 2, "subspace": "exact"}
    settings.update(overrides)
    return Sumo(params, **settings)  # type: ignore[arg-type]


def _gradients(shapes: dict[str, tuple[int, ...]], steps: int, seed: int) -> list[dict[str, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{name: torch.randn(shape, generator=gen) for name, shape in shapes.items()} for _ in range(steps)]


def _run(
    shapes: dict[str, tuple[int, ...]], grads: list[dict[str, Tensor]], absent: dict[str, int]
) -> tuple[dict[str, nn.Parameter], Sumo, list[dict[str, dict[str, Tensor]]]]:
    """One optimizer over the parameters of `shapes`; `absent[name]` = the steps before that parameter has a
    gradient. Returns the parameters, the optimizer and each step's (basis, moment) per parameter, cloned."""
    params = {name: nn.Parameter(torch.zeros(shape)) for name, shape in shapes.items()}
    optimizer = _optimizer(list(params.values()))
    states = []
    for t, step_grads in enumerate(grads):
        for name, p in params.items():
            p.grad = step_grads[name].clone() if t >= absent.get(name, 0) else None
        optimizer.step()
        states.append(
            {
                name: {key: optimizer.state[p][key].clone() for key in ("basis", "moment")}
                for name, p in params.items()
                if "basis" in optimizer.state[p]
            }
        )
    return params, optimizer, states


def _oriented(grad: Tensor) -> Tensor:
    """G_o under proj_side "paper": the (out, in*kh*kw) view, transposed when it is wide."""
    matrix = grad.reshape(grad.size(0), -1).to(F64)
    return matrix if matrix.size(0) >= matrix.size(1) else matrix.mT


SHAPES = {
    "tall_a": (12, 8),
    "wide_a": (8, 12),
    "tall_b": (12, 8),
    "wide_b": (8, 12),
    "late": (12, 8),
    "filter": (4, 2, 2, 2),
    "narrow": (8, 4),
}
"""Two oriented shapes: 12 x 8 (the tall, the wide transposed, and `late`, whose first gradient comes at the refresh
step t = 2, so that its first basis is installed in the same stack as the others' rotations) and 8 x 4 (the conv
filter's 4 x 8 view transposed, and an 8 x 4 weight)."""


def test_a_stacked_refresh_of_mixed_shapes_matches_each_matrix_refreshed_alone() -> None:
    grads = _gradients(SHAPES, steps=3, seed=11)
    absent = {"late": 2}
    _, stacked, together = _run(SHAPES, grads, absent)
    for name in SHAPES:
        alone = _run({name: SHAPES[name]}, grads, {name: absent.get(name, 0)})[2]
        start = absent.get(name, 0)
        for t in range(start, 3):
            assert torch.equal(together[t][name]["basis"], alone[t][name]["basis"]), (name, t)
        if name == "late":  # first basis at t = 2: M = Q^T G_o, one product, the same in both
            assert torch.equal(together[2][name]["moment"], alone[2][name]["moment"])
            continue
        # t = 1 (no refresh): M = mu M + Q^T G_o by the same per-matrix operations on the same bytes
        assert torch.equal(together[1][name]["moment"], alone[1][name]["moment"]), name
        # t = 2: M = fl(fl(mu fl(fl(Q_2^T Q_1) M_1)) + fl(Q_2^T G_o)); each run's result is within
        # gamma_{k+r+2} (mu |Q_2^T| |Q_1| |M_1| + |Q_2^T| |G_o|) of the exact value entrywise (Higham (3.13) for the
        # product chain, inner sizes k and r, plus the scaling and the sum), so the two differ by at most twice that.
        old_basis, old_moment = (together[1][name][key].to(F64) for key in ("basis", "moment"))
        new_basis = together[2][name]["basis"].to(F64)
        k, r = new_basis.shape
        magnitude = MU * new_basis.abs().mT @ old_basis.abs() @ old_moment.abs()
        magnitude += new_basis.abs().mT @ _oriented(grads[2][name]).abs()
        bound = 2 * gamma(k + r + 2) * magnitude
        difference = (together[2][name]["moment"].to(F64) - alone[2][name]["moment"].to(F64)).abs()
        assert bool((difference <= bound).all()), (name, float((difference - bound).max()))
    assert stacked.solver_failures == 0


def test_a_failed_svd_in_a_stack_is_found_and_the_others_are_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = {"first": (12, 8), "failing": (8, 12), "last": (12, 8)}
    grads = _gradients(shapes, steps=3, seed=12)
    marker = 7.0  # no Gaussian draw here is exactly 7: it marks the failing matrix's gradient at t = 2
    grads[2]["failing"][0, 0] = marker
    original = sumo_module.linalg.truncated_svd

    def failing(g: Tensor, rank: int, **kwargs: object) -> tuple[Tensor, Tensor, Tensor]:
        if g.size(-2) == 12 and bool((g == marker).any()):  # a refresh stack holding the marked gradient
            raise SolverError("test")
        return original(g, rank, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sumo_module.linalg, "truncated_svd", failing)
    _, optimizer, together = _run(shapes, grads, {})
    for name in ("first", "last"):
        alone = _run({name: shapes[name]}, grads, {})[2]
        assert torch.equal(together[2][name]["basis"], alone[2][name]["basis"])
    assert torch.equal(together[2]["failing"]["basis"], together[1]["failing"]["basis"])
    params = list(optimizer.param_groups[0]["params"])
    assert optimizer.solver_failures == 1
    assert [int(optimizer.state[p]["refresh_failures"]) for p in params] == [0, 1, 0]


def _refresh_extra(shapes: list[tuple[int, int]]) -> tuple[int, set[int]]:
    """Launches of a refresh step (t = 3 at update_freq 3) beyond those of the steady step before it (t = 2), and the
    batch sizes of the refresh's decompositions."""
    params = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    optimizer = _optimizer(params, update_freq=3, subspace="randomized")
    gen = torch.Generator().manual_seed(13)

    def step() -> None:
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()

    step()
    step()
    steady, refresh = cost_profile.count(step, optimizer), cost_profile.count(step, optimizer)
    assert not steady.decompositions and refresh.decompositions
    batches = {int(key.split("(")[1].split(",")[0]) for key in refresh.decompositions}
    return refresh.launches - steady.launches, batches


def test_the_refresh_launches_do_not_grow_with_the_number_of_same_shape_matrices() -> None:
    few, few_batches = _refresh_extra([(12, 8)] * 2)
    many, many_batches = _refresh_extra([(12, 8)] * 6)
    mixed, mixed_batches = _refresh_extra([(12, 8), (8, 12)] * 3)
    assert few == many == mixed
    assert few_batches == {2} and many_batches == {6} and mixed_batches == {6}

"""SUMO's polar factor by the quintic polar iteration (linalg.polar_newton_schulz, SUMO's default polar_method) against
independent facts.

- The step count: linalg.polar_steps is the fewest steps of the scalar map f(x) = x (15 - 10 x^2 + 3 x^4) / 8, written
  out here, that bring x0 within tol of 1 (in |x^2 - 1|).
- Agreement with the float64 SVD polar factor U V^T on well- and ill-conditioned matrices (cond up to 1e3 in float32,
  1e5 in float64): the exact iteration maps each singular value through f^K and keeps the singular vectors, so
  ||X - U V^T||_F = sqrt(sum_i (1 - f^K(s_i / ||M||_F))^2) in exact arithmetic, plus the rounding that
  tests/support/newton_schulz.ns_bound carries through the steps.
- In SUMO: a 20-step run with refreshes stays within the summed per-step bounds of the run with the exact SVD; a
  rank-deficient moment (which fails the check) takes the iterate for one step and the SVD path's update from the
  next step on, each counted in root_fallbacks; a pending check survives state_dict; a non-finite moment gives zero
  updates and then SolverError; the steady step reads no value on the host and decomposes nothing.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import structbench.optim.sumo as sumo_module
from structbench.errors import SolverError
from structbench.optim import cost_profile, linalg, registry
from structbench.optim.sumo import Sumo
from tests.support.newton_schulz import U32, gamma, ns_bound
from tests.support.steps import step_change

F64 = torch.float64
U64 = 2.0**-53
C = 4
"""LAPACK's "modestly growing" p(d) taken as C d (as in tests/optim/test_sumo.py): an SVD of a matrix with largest side
d is exact for A + E, ||E||_2 <= C d u ||A||_2, with factors within C d u of orthonormal."""
LR, ALPHA = 0.05, 2.0


def _f(x: float) -> float:
    return x * (15 - 10 * x**2 + 3 * x**4) / 8


def _mapped(x: float, steps: int) -> float:
    for _ in range(steps):
        x = _f(x)
    return x


def _with_spectrum(rows: int, cols: int, s: list[float], seed: int) -> Tensor:
    """U diag(s) V^T (float64) with U, V orthonormal from the QR of Gaussians."""
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, len(s), generator=gen, dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(s), generator=gen, dtype=F64))
    return (u * torch.tensor(s, dtype=F64)) @ v.T


def _exact_polar(m: Tensor) -> Tensor:
    u, _, vh = torch.linalg.svd(m.to(F64), full_matrices=False)
    return u @ vh


def _iteration_bound(m: Tensor, steps: int, u: float) -> float:
    """Frobenius bound on ||X^ - U V^T|| for `steps` steps from X0 = M / ||M||_F (M wide, full rank, values exact in
    precision u): the exact iteration's distance sqrt(sum (1 - f^K(x_i))^2), x_i = s_i / ||M||_F, plus ns_bound's
    rounding (the normalisation's u per entry of X0, ||X0||_F = 1, as the input error) and the norm's own relative
    error delta <= gamma_{rn + 1}, a common factor of all x_i, which moves each f^K(x_i) by at most delta: f(x) / x
    decreases on [0, 1], so x f'(x) <= f(x), which carries over to f^K, and |d f^K(x)| <= x (f^K)'(x) delta <= f^K(x)
    delta <= delta."""
    s = [float(v) for v in torch.linalg.svdvals(m.to(F64))]
    norm = math.sqrt(sum(v * v for v in s))
    x = [v / norm for v in s]
    rows, cols = m.shape[-2:]
    exact = math.sqrt(sum((1 - _mapped(v, steps)) ** 2 for v in x))
    norm = gamma(rows * cols + 1, u) * math.sqrt(len(x))
    return exact + ns_bound(x, rows, cols, linalg.NS_POLAR_QUINTIC, steps, 1.01 * u, u) + norm


def _svd_bound(m: Tensor, u: float) -> float:
    """Frobenius bound on ||polar_masked(M) - U V^T|| for the exact method in precision u (M wide r x n, full rank,
    kept singular values): the SVD's backward error 3 C n u sqrt(r) ||M||_2 (factors and reconstruction) divided by
    s_r, x2 (Li), and U V^T's own rounding 2 sqrt(r) C n u + r gamma_r."""
    s = torch.linalg.svdvals(m.to(F64))
    r, n = m.shape[-2:]
    backward = 2 * 3 * C * n * u * math.sqrt(r) * float(s[0]) / float(s[-1])
    return backward + 2 * math.sqrt(r) * C * n * u + r * gamma(r, u)


# --------------------------------------------------------------------------------------------------
# linalg: step count and agreement with the float64 SVD


@pytest.mark.parametrize("smallest", [1.0, 0.3, 1e-2, 3.8e-6, 1e-9])
@pytest.mark.parametrize("tol", [1e-1, 5e-4, 1e-8])
def test_polar_steps_is_the_fewest_steps_of_the_scalar_map(smallest: float, tol: float) -> None:
    steps = linalg.polar_steps(smallest, tol)
    assert abs(_mapped(smallest, steps) ** 2 - 1) <= tol
    assert steps == 0 or abs(_mapped(smallest, steps - 1) ** 2 - 1) > tol


def test_sumo_step_counts_are_those_its_docstring_states() -> None:
    def count(r: int, n: int) -> int:
        return linalg.polar_steps(max(r, n) * torch.finfo(torch.float32).eps / math.sqrt(r), 1e-3 / 2)

    assert (count(4, 64), count(4, 768), count(128, 5461)) == (22, 18, 18)


@pytest.mark.parametrize(
    ("dtype", "cond"),
    [(torch.float32, c) for c in (1.0, 10.0, 1e2, 1e3)] + [(F64, c) for c in (1.0, 1e3, 1e5)],
)
@pytest.mark.parametrize("shape", [(4, 64), (6, 20)])
def test_iteration_agrees_with_the_float64_svd_polar(dtype: torch.dtype, cond: float, shape: tuple[int, int]) -> None:
    """Enough steps for the smallest singular value (polar_steps from s_r / ||M||_F): within `_iteration_bound` of the
    float64 U V^T (float32: <= 1e-2 at cond 1e3; float64: <= 1e-9), converged, and the returned residual is X's own.
    Four steps fewer leave the smallest singular value far from 1 at cond >= 10 (the last check)."""
    rows, cols = shape
    s = [float(v) for v in torch.logspace(0, -math.log10(cond), rows, dtype=F64)]
    m = _with_spectrum(rows, cols, s, seed=int(cond) % 97 + rows).to(dtype)
    m64 = m.to(F64)
    smallest = float(torch.linalg.svdvals(m64)[-1] / torch.linalg.matrix_norm(m64))
    u = U32 if dtype == torch.float32 else U64
    steps = linalg.polar_steps(smallest * (1 - 1e-3), 1e-6)
    found = linalg.polar_newton_schulz(m, steps, tol=1e-3)
    assert found.polar.dtype == dtype and bool(found.converged)
    error = float(torch.linalg.matrix_norm(found.polar.to(F64) - _exact_polar(m64)))
    # The float64 reference is within _svd_bound(m, 2^-53) of the exact U V^T.
    assert error <= _iteration_bound(m, steps, u) + _svd_bound(m64, U64)
    # The residual ||X X^T - I||_F / sqrt(r) as computed (a Gram of inner size n: gamma_n ||X||_F^2 <= gamma_n r 1.01
    # entrywise sums, then the difference and norm add a few u) against X's own in float64.
    x = found.polar.to(F64)
    own = float(torch.linalg.matrix_norm(x @ x.T - torch.eye(rows, dtype=F64))) / math.sqrt(rows)
    assert float(found.residual) == pytest.approx(own, abs=gamma(cols + 4, u) * rows * 1.01, rel=0)
    if cond >= 10:
        short = linalg.polar_newton_schulz(m, steps - 4, tol=1e-3)
        gap = 1 - _mapped(smallest * (1 + 1e-3), steps - 4)
        assert float(torch.linalg.matrix_norm(short.polar.to(F64) - _exact_polar(m64))) >= gap - _iteration_bound(
            m, steps - 4, u
        )
        assert gap > 0.05


def test_iteration_keeps_zero_and_flags_rank_deficiency() -> None:
    """A zero G gives X = 0 (not NaN), unconverged; a rank-1 G with three rows converges along its one direction
    (u1^T X v1 within the step's rounding of 1), and its other singular values stay in [0, 1] (f maps [0, 1] into
    itself): the check fails."""
    zero = linalg.polar_newton_schulz(torch.zeros(2, 3, 8), 20, tol=1e-3)
    assert torch.equal(zero.polar, torch.zeros(2, 3, 8)) and not bool(zero.converged.any())
    m = _with_spectrum(3, 12, [2.0], seed=5).float()
    found = linalg.polar_newton_schulz(m, 22, tol=1e-3)
    assert not bool(found.converged)
    u, _, vh = torch.linalg.svd(m.to(F64), full_matrices=False)
    along = float(u[:, 0] @ found.polar.to(F64) @ vh[0])
    # ns_bound for the converged direction alone (x = 1 up to the noise, which enters its rounding only): <= 1e-4.
    assert along == pytest.approx(1.0, abs=ns_bound([1.0], 3, 12, linalg.NS_POLAR_QUINTIC, 22, 1.01 * U32))
    singular = torch.linalg.svdvals(found.polar.to(F64))
    assert float(singular.max()) <= 1 + 22 * gamma(12 + 5) * 3


# --------------------------------------------------------------------------------------------------
# SUMO with the iteration


def _optimizer(params: list[nn.Parameter], **overrides: object) -> Sumo:
    settings: dict[str, object] = {"lr": LR, "alpha": ALPHA, "rank": 3, "update_freq": 1000, "subspace": "exact"}
    settings.update(overrides)
    return Sumo(params, **settings)  # type: ignore[arg-type]


def test_twenty_steps_stay_within_the_summed_bounds_of_the_svd_method() -> None:
    """float32, W 48 x 20 (left side, moments 4 x 20), r = 4, refresh every 5 steps, limiter on, fixed gradients: the
    bases and moments of both runs are the same operations on the same values (they do not depend on W or O), so W
    differs only by the applied updates: per step scale ||Q||_2 (||O_it - U V^T|| + ||O_svd - U V^T||), each bounded
    from that step's moment (`_iteration_bound`, `_svd_bound`), plus each run's addmm rounding gamma_{r+2} (|W| +
    scale) per entry. The limiter leaves both alone: ||O||_F = 2 within about 1e-2 at every step (checked), never 1.1x
    the previous. Muon's quintic instead of the convergent one is off by >= 0.05 scale a step (these moments are well
    conditioned: the step count is tested below)."""
    shape, rank, steps = (48, 20), 4, 20
    gen = torch.Generator().manual_seed(11)
    grads = [torch.randn(shape, generator=gen) for _ in range(steps)]
    params = [nn.Parameter(torch.zeros(shape)) for _ in range(2)]
    runs = [
        _optimizer([params[0]], rank=rank, update_freq=5),
        _optimizer([params[1]], rank=rank, update_freq=5, polar_method="svd"),
    ]
    scale = ALPHA * LR * math.sqrt(max(shape))
    count = linalg.polar_steps(max(rank, shape[1]) * torch.finfo(torch.float32).eps / math.sqrt(rank), 1e-3 / 2)
    bound = 0.0
    for g in grads:
        deltas = [step_change(run, p, g) for run, p in zip(runs, params, strict=True)]
        moment = runs[0].state[params[0]]["moment"]
        assert torch.equal(moment, runs[1].state[params[1]]["moment"])
        direction = _iteration_bound(moment, count, U32) + _svd_bound(moment, U32)
        assert direction <= 1e-2
        largest = max(float(p.detach().abs().max()) for p in params)
        bound += scale * (1 + C * shape[0] * U32) * direction + 2 * gamma(rank + 2) * (largest + scale)
        # ||Q O||_F = ||O||_F within `direction` of sqrt(r) = 2 (Q within C d u of orthonormal), read back through the
        # addmm's gamma_{r+2} (|W| + scale) per entry, sqrt(m n) of it in Frobenius.
        readback = direction + C * shape[0] * U32 * 2 + math.sqrt(48 * 20) * gamma(rank + 2) * (largest + scale) / scale
        for delta in deltas:
            assert float(torch.linalg.matrix_norm(delta)) / scale == pytest.approx(2.0, abs=readback)
    assert float((params[0] - params[1]).detach().abs().max()) <= bound
    assert runs[0].root_fallbacks == 0


def test_the_default_step_count_reaches_the_smallest_singular_value_the_svd_keeps() -> None:
    """float64, W 40 x 20, r = 4, a rank-4 gradient with singular values 1, 0.1, 1e-3, 5e-6: the smallest is twice the
    SVD path's threshold max(r, n) eps_float32 s_1 = 2.4e-6, so the SVD keeps it and the default step count must bring
    it to 1. Both runs orthogonalize the same moment: their updates differ by at most scale (1 + C d u) times
    `_iteration_bound` + `_svd_bound` (~1e-8 at cond 2e5) plus each run's addmm rounding. Five steps fewer leave that
    direction at f^19(5e-6) ~ 0.8, off by ~0.2 scale."""
    shape, rank = (40, 20), 4
    g = _with_spectrum(*shape, [1.0, 0.1, 1e-3, 5e-6], seed=12)
    params = [nn.Parameter(torch.zeros(shape, dtype=F64)) for _ in range(2)]
    runs = [_optimizer([params[0]], rank=rank), _optimizer([params[1]], rank=rank, polar_method="svd")]
    deltas = [step_change(run, p, g) for run, p in zip(runs, params, strict=True)]
    moment = runs[0].state[params[0]]["moment"]
    assert torch.equal(moment, runs[1].state[params[1]]["moment"])
    count = linalg.polar_steps(max(rank, shape[1]) * torch.finfo(torch.float32).eps / math.sqrt(rank), 1e-3 / 2)
    scale = ALPHA * LR * math.sqrt(max(shape))
    direction = _iteration_bound(moment, count, U64) + _svd_bound(moment, U64)
    atol = scale * (1 + C * shape[0] * U64) * direction + 2 * gamma(rank + 2, U64) * scale
    torch.testing.assert_close(deltas[0], deltas[1], atol=atol, rtol=0)


def test_a_converged_check_ends_an_svd_failure_streak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 1's rank-1 moment fails its check; step 2's SVD fallback raises (zero update, streak 1) while its moment,
    now full rank, passes the iteration's check; reading that check at step 3 ends the streak (a failure later is
    not 'in a row')."""
    param = nn.Parameter(torch.zeros(16, 12))
    optimizer = _optimizer([param])
    gen = torch.Generator().manual_seed(9)
    step_change(optimizer, param, _rank_one())

    def failing(m: Tensor) -> Tensor:
        raise SolverError("test")

    with monkeypatch.context() as patch:
        patch.setattr(sumo_module, "polar_masked", failing)
        assert torch.equal(step_change(optimizer, param, 30 * torch.randn(16, 12, generator=gen)), torch.zeros(16, 12))
    assert optimizer.solver_failures == 1 and int(optimizer.state[param]["orth_failures"]) == 1
    step_change(optimizer, param, 30 * torch.randn(16, 12, generator=gen))
    assert int(optimizer.state[param]["orth_failures"]) == 0 and optimizer.root_fallbacks == 1


def _rank_one(shape: tuple[int, int] = (16, 12)) -> Tensor:
    return _with_spectrum(*shape, [2.5], seed=7).float()


def test_a_failed_check_takes_the_svd_from_the_next_step_and_is_counted() -> None:
    """A rank-1 gradient, r = 3 (float32): the moment's two other singular values are rounding noise, which the SVD
    path drops (test_sumo.py) and the iteration maps into [0, 1). Step 1 uses the iterate: along u1 v1^T the update
    is the SVD path's within ns_bound, elsewhere it may differ by its noise directions, <= sqrt(2) scale. Its check
    fails, so steps 2 and 3 compute the SVD (root_fallbacks 1, 2) and equal the SVD run's updates up to each run's
    addmm rounding; once the moment is full rank and well conditioned the checks pass and the count stops."""
    shape = (16, 12)
    scale = ALPHA * LR * math.sqrt(max(shape))
    params = [nn.Parameter(torch.zeros(shape)) for _ in range(2)]
    iterative, exact = _optimizer([params[0]]), _optimizer([params[1]], polar_method="svd")
    g = _rank_one(shape)
    first = [step_change(run, p, g) for run, p in ((iterative, params[0]), (exact, params[1]))]
    u, _, vh = torch.linalg.svd(g.to(F64), full_matrices=False)
    along = float(u[:, 0] @ first[0].to(F64) @ vh[0]) / -scale
    assert along == pytest.approx(1.0, abs=ns_bound([1.0], 3, 12, linalg.NS_POLAR_QUINTIC, 25, 1.01 * U32) + 1e-5)
    assert float(torch.linalg.matrix_norm(first[0] - first[1])) <= math.sqrt(2) * scale * (1 + 1e-3)
    assert iterative.root_fallbacks == 0
    for expected in (1, 2):
        deltas = [step_change(run, p, g) for run, p in ((iterative, params[0]), (exact, params[1]))]
        largest = max(float(p.detach().abs().max()) for p in params)
        # The same polar_masked on the same moment (bit-identical O); the addmm into different W rounds by
        # gamma_{r+2} (|W| + scale) per run, and reading each step back as a difference adds u |W|.
        atol = 2 * gamma(3 + 2) * (largest + scale) + 2 * U32 * largest
        torch.testing.assert_close(deltas[0], deltas[1], atol=atol, rtol=0)
        assert iterative.root_fallbacks == expected
        assert int(iterative.state[params[0]]["root_fallbacks"]) == expected
    gen = torch.Generator().manual_seed(3)
    counts = []
    for _ in range(4):
        step_change(iterative, params[0], 3 * torch.randn(shape, generator=gen))
        counts.append(iterative.root_fallbacks)
    assert counts[0] == 3 and counts[-1] == counts[1] == 3


def test_the_run_records_the_fallbacks_through_the_hybrid_optimizer() -> None:
    """`structbench.execution.record` reads optimizer.root_fallbacks: the hybrid sums its parts'."""
    net = nn.Sequential(nn.Linear(12, 16, bias=False), nn.Linear(16, 12, bias=False))
    optimizer, routing = registry.build_with_routing("sumo", net, {"rank": 3, "head_to_fallback": False})
    assert routing.structured
    for _ in range(2):
        for p in net.parameters():
            p.grad = _rank_one(tuple(p.shape))
        optimizer.step()
    assert optimizer.root_fallbacks == len(routing.structured)


def test_a_pending_check_survives_state_dict() -> None:
    """The check of step 1 fails; a copy resumed from the state_dict taken after it falls back at step 2 as the
    original does (bit-identical), and taking the state_dict does not change the original's run."""
    shape = (16, 12)
    params = [nn.Parameter(torch.zeros(shape)) for _ in range(3)]
    first, untouched = _optimizer([params[0]]), _optimizer([params[2]])
    for run, p in ((first, params[0]), (untouched, params[2])):
        step_change(run, p, _rank_one(shape))
    saved = first.state_dict()
    params[1].data.copy_(params[0].detach())
    resumed = _optimizer([params[1]])
    resumed.load_state_dict(saved)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    deltas = [step_change(run, p, g) for run, p in zip((first, resumed, untouched), params, strict=True)]
    assert torch.equal(deltas[0], deltas[1]) and torch.equal(deltas[0], deltas[2])
    assert first.root_fallbacks == resumed.root_fallbacks == untouched.root_fallbacks == 1


def test_a_non_finite_moment_gives_zero_updates_then_solver_error() -> None:
    """The iterate of a NaN moment is replaced by zero; its check fails, and the SVD of the (still NaN) moment fails
    at each following step: zero updates, counted, the third failure in a row raises."""
    param = nn.Parameter(torch.zeros(12, 8))
    optimizer = _optimizer([param])
    step_change(optimizer, param, torch.randn(12, 8, generator=torch.Generator().manual_seed(6)))
    nan = torch.full((12, 8), float("nan"))
    optimizer.state[param]["moment"].fill_(float("nan"))
    for failures in (0, 1, 2):
        assert torch.equal(step_change(optimizer, param, nan), torch.zeros(12, 8))
        assert optimizer.solver_failures == failures
    with pytest.raises(SolverError, match="3 times in a row"):
        step_change(optimizer, param, nan)


def test_a_steady_step_reads_nothing_on_the_host_and_decomposes_nothing() -> None:
    """Full-rank gradients, no refresh due: the previous step's check is read as a deferred read (a posted copy), no
    other value is read on the host and no decomposition runs; with a fallback due, its SVD is counted."""
    params = [nn.Parameter(torch.zeros(24, 10)) for _ in range(3)]
    optimizer = _optimizer(params)
    gen = torch.Generator().manual_seed(8)

    def step() -> None:
        for p in params:
            p.grad = torch.randn(24, 10, generator=gen)
        optimizer.step()

    step()
    cost = cost_profile.count(step, optimizer)
    assert cost.reads == 0 and cost.deferred_reads == 1 and not cost.decompositions
    optimizer.state[params[1]][sumo_module.POLAR_DUE] = True
    cost = cost_profile.count(step, optimizer)
    assert sum(cost.decompositions.values()) >= 1 and optimizer.root_fallbacks == 1

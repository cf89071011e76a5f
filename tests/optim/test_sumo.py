"""Tests for structbench.optim.sumo against independent facts.

- Hand-derived steps (float64 parameters; the references use float64 torch.linalg.svd written out here):
  the first update is -alpha lr s U_r V_r^T (the polar factor of the best rank-r approximation, whatever basis
  the SVD returns, since Q polar(Q^T G) = polar(Q Q^T G)); the second is -alpha lr s polar(P (mu G0 + G1)) with
  P the projector on G0's top-r singular space, from the left or from the right by side.
- Moment rotation (Block 1.1): at a refresh the moment in the full space, Q M, keeps exactly its projection on
  the new subspace; when the subspace only changes basis, Q M is the plain heavy-ball sum of the gradients.
- Refresh timing: the basis is recomputed at t = 0, K, 2K, ... of each parameter's own step count.
- Norm-growth limiter: update norms by hand, ||Q O||_F = ||O||_F = sqrt(rank M), capped at 1.1x the previous.
- SUMO vs SUMO-NS5: Newton-Schulz keeps singular vectors and maps each singular value through the scalar
  polynomial, so their difference is predicted by that scalar map; the cubic iteration obeys Lemma 3.2.
- State bytes: the paper's Table 1 count (m + n) r floats per matrix plus the scalar state, measured.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor, nn

import structbench.optim.sumo as sumo_module
from structbench import measure
from structbench.errors import SolverError
from structbench.optim import registry
from structbench.optim.sumo import Sumo
from tests.support.newton_schulz import gamma
from tests.support.steps import step_change

F64 = torch.float64
LR, ALPHA, MU = 0.05, 2.0, 0.9


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _with_spectrum(rows: int, cols: int, s: list[float], seed: int) -> Tensor:
    """U diag(s) V^T (float64) with U, V orthonormal from the QR of Gaussians."""
    gen = _gen(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, len(s), generator=gen, dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(s), generator=gen, dtype=F64))
    return (u * torch.tensor(s, dtype=F64)) @ v.T


def _gradient(rows: int, cols: int, seed: int) -> Tensor:
    """Full-rank gradient with well-separated singular values 1, 0.8, 0.64, ... (unique singular subspaces)."""
    k = min(rows, cols)
    return _with_spectrum(rows, cols, [0.8**i for i in range(k)], seed)


def _polar(a: Tensor) -> Tensor:
    """U V^T over the nonzero singular values (a partial isometry for a rank-deficient A)."""
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    rank = int((s > 1e-10 * s[0]).sum())
    return u[:, :rank] @ vh[:rank]


def _top_left(g: Tensor, r: int) -> Tensor:
    u, _, _ = torch.linalg.svd(g, full_matrices=False)
    return u[:, :r] @ u[:, :r].T


def _top_right(g: Tensor, r: int) -> Tensor:
    _, _, vh = torch.linalg.svd(g, full_matrices=False)
    return vh[:r].T @ vh[:r]


def _optimizer(params: list[nn.Parameter], **overrides: object) -> Sumo:
    settings: dict[str, object] = {
        "lr": LR,
        "alpha": ALPHA,
        "rank": 3,
        "momentum": MU,
        "update_freq": 1000,
        "subspace": "exact",
    }
    settings.update(overrides)
    return Sumo(params, **settings)  # type: ignore[arg-type]


def _scale(shape: tuple[int, int]) -> float:
    return ALPHA * LR * math.sqrt(max(shape))


# Rounding-error bounds behind the tolerances (Higham, "Accuracy and Stability of Numerical Algorithms"). Float64
# parameters run SUMO in float64 (u = 2^-53), float32 ones in float32 (u = 2^-24); a product with inner size k errs by
# <= gamma_k |A| |B| entrywise (C-S: <= gamma_k for unit rows, gamma_k sqrt(r) ||B||_F in norm against an r-column
# orthonormal factor); an SVD of a matrix with largest side d is exact for A + E, ||E||_2 <= c d u ||A||_2, with factors
# within c d u of orthonormal, c = C = 4 (LAPACK's "modestly growing" p(d), taken as 4 d); the top-r singular space
# then tilts by sin(theta) <= ||E|| / (s_r - s_{r+1}) (Wedin); ||polar(A + E) - polar(A)||_F <= 2 ||E||_F / s_min(A)
# (Li). The float64 references computed here are exact to those orders.
U64, U32 = 2.0**-53, 2.0**-24
C = 4


def _tilt(g: Tensor, r: int, u: float = U64, randomized: bool = False) -> float:
    """sin(theta) bound between the computed top-r left singular space of g (oriented, k x n) and the exact one, plus
    c d u for the basis's distance from orthonormal. Randomized (width r + 5, two power steps) on a rank-r g: the
    sketch basis Q spans range(G W) + E, W an orthonormal basis of range(G^T) up to its own small error
    (sigma_min(V^T W) >= 1/2): ||(I - Q Q^T) G|| <= 2 ||E|| with ||E|| <= (gamma_n sqrt(r w) + c k u) ||G||, which the
    small SVD's top-r space keeps (its backward error over sigma_r adds c n u ||G||)."""
    s = torch.linalg.svdvals(g.to(F64))
    k, n = g.shape
    d = max(k, n)
    gap = float(s[r - 1] - (s[r] if r < len(s) else 0.0))
    tilt = C * d * u * float(s[0]) / gap
    if randomized:
        residual = 2 * (gamma(n, u) * math.sqrt(r * (r + 5)) + C * k * u) * float(s[0]) + 2 * C * k * u * float(s[0])
        tilt += residual / float(s[r - 1])
    return tilt + C * d * u


def _direction_bound(target: Tensor, tilt: float, terms: float, u: float = U64) -> float:
    """Frobenius bound on ||Q^ O^ - polar(P M)|| for SUMO's update direction: basis Q^ (tilted from the exact top-r
    space P by `tilt`) times polar_masked of the computed moment M^ (r x n), `target` = P M the exact projected moment
    (rank r, oriented), `terms` the sum of the Frobenius norms of the gradients summed into M. With Q' the orthonormal
    basis next to Q^: Q' polar(Q'^T M) = polar(Q' Q'^T M), which is within 2 tilt ||M||_F / s_r of polar(P M);
    M^ - Q'^T M <= (c d u + gamma_k sqrt(r) + 4 u) terms (Q^'s distance, the projection, the moment's EMA rounding)
    and the SVD's backward error 3 c n u sqrt(r) ||M|| enter divided by s_r, x2 (Li); U V^T's own rounding
    2 sqrt(r) c n u + r gamma_r; Q^ - Q' adds c d u sqrt(r)."""
    k, n = target.shape
    s = torch.linalg.svdvals(target.to(F64))
    r = int((s > s[0] * 1e-12).sum())
    d = max(k, n)
    moment = float(torch.linalg.matrix_norm(target, ord=2))
    perturbation = (C * d * u + gamma(k, u) * math.sqrt(r) + 4 * u) * terms + 3 * C * n * u * math.sqrt(r) * moment
    bound = 2 * (tilt * terms + perturbation) / float(s[r - 1])
    return bound + 2 * math.sqrt(r) * C * n * u + r * gamma(r, u) + C * d * u * math.sqrt(r)


def _oriented(g: Tensor, shape: tuple[int, int], proj_side: str) -> Tensor:
    """G in SUMO's frame: G itself when the basis is on the left, else G^T."""
    return g if sumo_module.projects_left(shape, proj_side) else g.T


def _projected(g: Tensor, source: Tensor, r: int) -> Tensor:
    """P g with P the projector onto the top-r left singular space of `source` (both oriented, float64)."""
    u, _, _ = torch.linalg.svd(source, full_matrices=False)
    return u[:, :r] @ (u[:, :r].T @ g)


def _step_tolerance(direction: float, scale: float, w0: float, r: int, u: float = U64, decay: bool = False) -> float:
    """Entrywise tolerance of W - step Q O (one addmm: gamma_{r+2} (|W| + |step| |Q| |O|), |Q| |O| <= 1 by C-S) given
    the direction's Frobenius bound; a decay W (1 - lr wd) before it adds 2 u |W|."""
    return scale * direction + gamma(r + 2, u) * (w0 + scale) + (2 * u * w0 if decay else 0.0)


# --------------------------------------------------------------------------------------------------
# hand-derived steps


@pytest.mark.parametrize("proj_side", ["paper", "galore"])
@pytest.mark.parametrize("shape", [(24, 10), (10, 24), (12, 12)])
def test_first_step_is_polar_of_best_rank_r_approximation(shape: tuple[int, int], proj_side: str) -> None:
    """t = 0: M = Q^T G, so Q O = polar(Q Q^T G) = U_r V_r^T on either side; wd acts on the pre-update W."""
    w0 = torch.randn(*shape, generator=_gen(0), dtype=F64)
    param = nn.Parameter(w0.clone())
    optimizer = _optimizer([param], weight_decay=0.3, proj_side=proj_side)
    g = _gradient(*shape, seed=1)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    expected = -_scale(shape) * u[:, :3] @ vh[:3] - LR * 0.3 * w0
    # float64 SUMO against U_3 V_3^T: `_direction_bound` (tilt over the gap s_3 - s_4 = 0.128, s_3 = 0.64 for the
    # moment's polar factor) times the step, plus the addmm and the decay: ~1e-13. Another rank, side or a missing
    # shape scale is off by O(step); weight decay on the updated W by LR^2 0.3 |dW| ~ 1e-3 |W|.
    g_o = _oriented(g, shape, proj_side)
    direction = _direction_bound(_projected(g_o, g_o, 3), _tilt(g_o, 3), float(torch.linalg.matrix_norm(g)))
    atol = _step_tolerance(direction, _scale(shape), float(w0.abs().max()), 3, decay=True)
    torch.testing.assert_close(step_change(optimizer, param, g), expected, atol=atol, rtol=0)


@pytest.mark.parametrize("momentum_form", ["sum", "ema"])
@pytest.mark.parametrize(
    ("shape", "proj_side", "left"),
    [((24, 10), "paper", True), ((10, 24), "paper", False), ((24, 10), "galore", False), ((10, 24), "left", True)],
)
def test_second_step_orthogonalizes_the_projected_momentum(
    shape: tuple[int, int], proj_side: str, left: bool, momentum_form: str
) -> None:
    """t = 1 without refresh: Q O = polar(P (mu G0 + G1)) (left) or polar((mu G0 + G1) P) (right), P from G0.

    App. C's EMA form (beta M + (1 - beta) G^) differs by the factor (1 - beta), which the SVD removes.
    """
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    optimizer = _optimizer([param], proj_side=proj_side, momentum_form=momentum_form)
    g0, g1 = _gradient(*shape, seed=2), _gradient(*shape, seed=3)
    step_change(optimizer, param, g0)
    moment = MU * g0 + g1
    projected = _top_left(g0, 3) @ moment if left else moment @ _top_right(g0, 3)
    expected = -_scale(shape) * _polar(projected)
    # As for the first step, with the basis from G0 and the projected moment's s_3 (W starts at the first update;
    # the EMA form's (1 - mu) scales M and the bound alike). A basis from G1, or no rotation-free sum, is off by O(1).
    g0_o, m_o = (g0, moment) if left else (g0.T, moment.T)
    terms = MU * float(torch.linalg.matrix_norm(g0)) + float(torch.linalg.matrix_norm(g1))
    direction = _direction_bound(_projected(m_o, g0_o, 3), _tilt(g0_o, 3), terms)
    w_max = float(param.detach().abs().max())
    torch.testing.assert_close(
        step_change(optimizer, param, g1), expected, atol=_step_tolerance(direction, _scale(shape), w_max, 3), rtol=0
    )


def test_conv_filter_steps_like_its_matrix_view() -> None:
    filt = nn.Parameter(torch.zeros(6, 2, 3, 3, dtype=F64))
    g = _gradient(6, 18, seed=4)
    delta = step_change(_optimizer([filt]), filt, g.reshape(6, 2, 3, 3))
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    expected = -_scale((6, 18)) * u[:, :3] @ vh[:3]
    # The first-step bound of the (6, 18) view (wide: projected from the right). A kh x kw view is off by O(1).
    g_o = _oriented(g, (6, 18), "paper")
    direction = _direction_bound(_projected(g_o, g_o, 3), _tilt(g_o, 3), float(torch.linalg.matrix_norm(g)))
    atol = _step_tolerance(direction, _scale((6, 18)), 0.0, 3)
    torch.testing.assert_close(delta.reshape(6, 18), expected, atol=atol, rtol=0)


def test_shape_scale_none_is_algorithm_1_as_printed() -> None:
    shape = (20, 8)
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    g = _gradient(*shape, seed=5)
    delta = step_change(_optimizer([param], shape_scale="none"), param, g)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    # The first-step bound with step alpha lr; the shape scale would multiply the update by sqrt(20).
    direction = _direction_bound(_projected(g, g, 3), _tilt(g, 3), float(torch.linalg.matrix_norm(g)))
    torch.testing.assert_close(
        delta, -ALPHA * LR * u[:, :3] @ vh[:3], atol=_step_tolerance(direction, ALPHA * LR, 0.0, 3), rtol=0
    )


def test_randomized_subspace_is_exact_for_a_low_rank_gradient() -> None:
    """A gradient of rank <= r lies in the range of the Gaussian sketch: both subspaces give U V^T."""
    shape = (30, 16)
    g = _with_spectrum(*shape, [3.0, 2.0, 1.0], seed=6)
    deltas = []
    for subspace in ("randomized", "exact"):
        param = nn.Parameter(torch.zeros(*shape, dtype=F64))
        deltas.append(step_change(_optimizer([param], subspace=subspace), param, g))
    # Both bases span range(G) up to `_tilt` (rank 3 = r: the gap is s_3 = 1; randomized adds the sketch's residual),
    # so both steps are within the first-step bound of -step polar(G): ~1e-13. A sketch that misses part of range(G)
    # is off by O(step).
    terms = float(torch.linalg.matrix_norm(g))
    bounds = [
        _step_tolerance(_direction_bound(g, _tilt(g, 3, randomized=randomized), terms), _scale(shape), 0.0, 3)
        for randomized in (True, False)
    ]
    torch.testing.assert_close(deltas[0], deltas[1], atol=sum(bounds), rtol=0)
    torch.testing.assert_close(deltas[1], -_scale(shape) * _polar(g), atol=bounds[1], rtol=0)


def test_rank_deficient_moment_moves_only_along_its_range() -> None:
    """A rank-1 gradient with r = 3: the update is -alpha lr s u1 v1^T, not along arbitrary singular vectors."""
    shape = (16, 12)
    g = _with_spectrum(*shape, [2.5], seed=7)
    param = nn.Parameter(torch.zeros(*shape))
    delta = step_change(_optimizer([param], polar_method="svd"), param, g.float())
    # float32 this time, the exact polar method (the iteration's first step differs: test_sumo_polar.py): M = Q^T G
    # has rank 1, polar_masked drops its two rounding-level singular values (else the
    # update would take two arbitrary unit directions, O(step)), leaving the first-step bound for the rank-1 target
    # (its s_1 = 2.5 as s_min) with u = 2^-24, the first basis vector's tilt over the gap s_1 - 0 (the others only
    # meet G's null space) and the cast of G (u ||G||_F / s_1 = u).
    tilt = _tilt(g, 1, U32) + U32
    direction = _direction_bound(g, tilt, float(torch.linalg.matrix_norm(g)), U32)
    atol = _step_tolerance(direction, _scale(shape), 0.0, 3, U32)
    torch.testing.assert_close(delta.double(), -_scale(shape) * _polar(g), atol=atol, rtol=0)


def test_zero_gradient_gives_no_update() -> None:
    param = nn.Parameter(torch.ones(10, 6))
    assert torch.equal(step_change(_optimizer([param]), param, torch.zeros(10, 6)), torch.zeros(10, 6))


# --------------------------------------------------------------------------------------------------
# moment rotation (Block 1.1)


@pytest.mark.parametrize(("shape", "left"), [((20, 9), True), ((9, 20), False)])
def test_rotation_keeps_the_moments_projection_on_the_new_subspace(shape: tuple[int, int], left: bool) -> None:
    """Refresh every step: full moment after step t+1 = mu P_new (Q M)_t + P_new G_{t+1} (P_new from G_{t+1})."""
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    optimizer = _optimizer([param], update_freq=1)
    for t in range(4):
        previous = optimizer.full_moment(param)
        g = _gradient(*shape, seed=10 + t)
        step_change(optimizer, param, g)
        if previous is None:
            continue
        carried = MU * previous + g
        expected = _top_left(g, 3) @ carried if left else carried @ _top_right(g, 3)
        # From the optimizer's own previous Q M (float64): the new basis tilts by `_tilt` (P^ - P <= that + 2 c d u),
        # and R M, mu M + Q^T G and Q M round by gamma_d sqrt(r) relative each (C-S): ~1e-14. A moment kept in the
        # old basis, or reset, is off by O(|M|).
        g_o = g if left else g.T
        size = MU * float(torch.linalg.matrix_norm(previous)) + float(torch.linalg.matrix_norm(g))
        d = max(shape)
        atol = (_tilt(g_o, 3) + 2 * C * d * U64 + 4 * gamma(d, U64) * math.sqrt(3)) * size
        torch.testing.assert_close(optimizer.full_moment(param), expected, atol=atol, rtol=0)


@pytest.mark.parametrize("subspace", ["randomized", "exact"])
def test_rotation_is_lossless_when_the_span_is_unchanged(subspace: str) -> None:
    """Gradients G_t = U A_t share one rank-3 column space; each refresh returns a different basis of it
    (the singular vectors of each G_t). Rotated, Q M equals the heavy-ball sum sum_s mu^(t-s) G_s exactly;
    kept unrotated ("keep", GaLore's behaviour) it does not."""
    shape, gen = (18, 11), _gen(20)
    u, _ = torch.linalg.qr(torch.randn(shape[0], 3, generator=gen, dtype=F64))
    grads = [u @ torch.randn(3, shape[1], generator=gen, dtype=F64) for _ in range(5)]
    defects = {}

    def tilt(g: Tensor) -> float:
        return _tilt(g, 3, randomized=subspace == "randomized")

    bound = 0.0
    for transform in ("rotate", "keep"):
        param = nn.Parameter(torch.zeros(*shape, dtype=F64))
        optimizer = _optimizer([param], update_freq=1, subspace=subspace, moment_transform=transform)
        heavy_ball = torch.zeros(shape, dtype=F64)
        worst, drift = 0.0, 0.0
        for g in grads:
            step_change(optimizer, param, g)
            heavy_ball = MU * heavy_ball + g
            moment = optimizer.full_moment(param)
            assert moment is not None
            worst = max(worst, float((moment - heavy_ball).abs().max()))
            # Each refresh's basis spans U's columns up to `_tilt` (rank 3, gap s_3(G_t)), which drops at most that
            # times the carried sum, and each step's rotation, sum and Q M round by 4 gamma_d sqrt(r) of it; older
            # errors are carried scaled by mu: ~1e-14 per step. Keeping M unrotated loses O(|M|) (checked below).
            drift = MU * drift + (tilt(g) + 2 * C * 18 * U64 + 4 * gamma(18, U64) * math.sqrt(3)) * float(
                torch.linalg.matrix_norm(heavy_ball) + torch.linalg.matrix_norm(g)
            )
            bound = max(bound, drift)
        defects[transform] = worst
    assert defects["rotate"] <= bound
    assert defects["keep"] > 0.1


def test_reset_transform_restarts_the_moment_at_each_refresh() -> None:
    shape = (14, 8)
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    optimizer = _optimizer([param], update_freq=2, moment_transform="reset")
    grads = [_gradient(*shape, seed=30 + t) for t in range(3)]
    for g in grads:
        step_change(optimizer, param, g)
    # Reset at t = 2: Q M = Q Q^T G_2, within (`_tilt` + 2 c d u + 2 gamma_d sqrt(r)) ||G_2|| of P G_2 (~1e-14); a
    # moment carried over the refresh adds mu P (G_0 + mu G_1)... of O(|G|).
    size = float(torch.linalg.matrix_norm(grads[2]))
    atol = (_tilt(grads[2], 3) + 2 * C * 14 * U64 + 2 * gamma(14, U64) * math.sqrt(3)) * size
    torch.testing.assert_close(optimizer.full_moment(param), _top_left(grads[2], 3) @ grads[2], atol=atol, rtol=0)


# --------------------------------------------------------------------------------------------------
# refresh timing


def test_refresh_at_multiples_of_k_of_each_parameters_own_step_count() -> None:
    """K = 3: refreshes at t = 0, 3, 6, 9. A parameter without a gradient keeps its t (and its basis). A refresh
    writes the new basis into the state's tensor: seen as a change of its values (each call's gradient is new)."""
    a = nn.Parameter(torch.zeros(12, 7))
    b = nn.Parameter(torch.zeros(12, 7))
    optimizer = _optimizer([a, b], update_freq=3)
    refreshed: dict[str, list[int]] = {"a": [], "b": []}
    last: dict[str, Tensor | None] = {"a": None, "b": None}
    for call in range(10):
        live = {"a": a} if call in (4, 5) else {"a": a, "b": b}
        a.grad, b.grad = None, None
        for name, p in live.items():
            p.grad = _gradient(12, 7, seed=40 + call + (name == "b")).float()
        optimizer.step()
        for name, p in (("a", a), ("b", b)):
            basis = optimizer.state[p]["basis"].clone()
            if last[name] is None or not torch.equal(basis, last[name]):
                refreshed[name].append(call)
            last[name] = basis
    assert refreshed["a"] == [0, 3, 6, 9]
    # b skips calls 4 and 5, so its t = 3 falls on call 3 and t = 6 on call 8
    assert refreshed["b"] == [0, 3, 8]
    assert int(optimizer.state[a]["step"]) == 10 and int(optimizer.state[b]["step"]) == 8


# --------------------------------------------------------------------------------------------------
# norm-growth limiter (Block 3)


def _limiter_run(norm_limiter: bool, steps: int = 10) -> tuple[list[float], list[Tensor], list[Tensor]]:
    """Rank-1 G0 (||O_0||_F = 1), then full-rank gradients (||O_t||_F = sqrt(4) = 2); refresh every step."""
    shape = (16, 12)
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    optimizer = _optimizer([param], rank=4, update_freq=1, norm_limiter=norm_limiter)
    grads = [_with_spectrum(*shape, [2.0], seed=50)] + [_gradient(*shape, seed=51 + t) for t in range(steps - 1)]
    deltas = [step_change(optimizer, param, g) for g in grads]
    return [float(torch.linalg.matrix_norm(d)) / _scale(shape) for d in deltas], deltas, grads


def _norm_tolerance(deltas: list[Tensor]) -> float:
    """|| Q O ||_F / step of the applied updates (16 x 12, r = 4, float64): O's singular values are within
    2 c n u + r gamma_r of 1 (U, V within c n u of orthonormal, the product), Q adds c d u, the limiter's factor
    3 u; reading the step back as W_t - W_{t-1} adds the addmm's gamma_{r+2} (|W| + step) per entry, sqrt(m n) of it
    in Frobenius. All relative to norms <= 2."""
    n, d, r = 12, 16, 4
    largest = float(torch.stack([w.abs() for w in itertools.accumulate(deltas)]).max()) / _scale((16, 12))
    relative = 2 * C * n * U64 + r * gamma(r, U64) + C * d * U64 + 3 * U64
    return 2 * relative + math.sqrt(16 * 12) * gamma(r + 2, U64) * (largest + 1)


def test_limiter_caps_growth_at_gamma_of_the_applied_previous_norm() -> None:
    norms, deltas, grads = _limiter_run(norm_limiter=True)
    expected = [min(2.0, 1.1**t) for t in range(len(norms))]  # 1, 1.1, 1.21, ..., 1.9487, then sqrt(4) = 2
    # ~1e-13 (`_norm_tolerance`); capping at the unlimited norm, or at 1.1x the unlimited previous one, misses >= 0.1.
    assert norms == pytest.approx(expected, abs=_norm_tolerance(deltas), rel=0)
    # t = 1: the direction is the unlimited one, polar(P_1 (mu G0 + G1)), scaled by 1.1 / 2: the first-step bound for
    # that target (the rotation R M is one more product like the projection: terms counted twice) and the limiter's
    # 3 u. Another scale factor (1.1, or 1.1 / ||O_0||) is off by >= 10%.
    target = _projected(MU * grads[0] + grads[1], grads[1], 4)
    terms = 2 * (MU * float(torch.linalg.matrix_norm(grads[0])) + float(torch.linalg.matrix_norm(grads[1])))
    bound = 0.55 * _direction_bound(target, _tilt(grads[1], 4), terms) + 3 * U64
    largest = float(deltas[0].abs().max())
    atol = _step_tolerance(bound, _scale((16, 12)), largest, 4)
    direction = _polar(_top_left(grads[1], 4) @ (MU * grads[0] + grads[1]))
    torch.testing.assert_close(deltas[1], -_scale((16, 12)) * 0.55 * direction, atol=atol, rtol=0)


def test_limiter_off_gives_full_orthogonal_steps() -> None:
    norms, deltas, _ = _limiter_run(norm_limiter=False, steps=4)
    assert norms == pytest.approx([1.0, 2.0, 2.0, 2.0], abs=_norm_tolerance(deltas), rel=0)  # a limited 1.1: 0.9 off


# --------------------------------------------------------------------------------------------------
# SUMO vs SUMO-NS5


def _ns_scalar(x: float, steps: int, coefficients: tuple[float, float, float]) -> float:
    a, b, c = coefficients
    for _ in range(steps):
        x = a * x + b * x**3 + c * x**5
    return x


def _first_step_update(shape: tuple[int, int], g: Tensor, **overrides: object) -> Tensor:
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    return step_change(_optimizer([param], rank=4, **overrides), param, g) / _scale(shape)


def _ns_difference_bound(g: Tensor, r: int, coefficients: tuple[float, float, float], top: float) -> float:
    """Bound on |(||Q^ NS(M^) - Q^ polar(M^)||_F) - (the exact scalar prediction from s_1..s_r)| for float64 first
    steps (/ step) of SUMO on g (32 x 20, left): both runs share Q^ and M^ (the same float64 ops). M^'s singular
    values are within e = (tilt + 2 c d u + gamma_k sqrt(r)) ||G|| of s_i, which moves the prediction by <= L^5 2 e /
    ||s|| (x = s / ||s||, L = max |f'| on [0, `top`], the iterates' range); NS's own rounding: X0's relative error
    (2 e / ||M|| + the norm's c n u + u) grows by <= L per step, each step adds R = gamma_{n+r+2} F (|a| + 3 |b| F^2 +
    4 |c| F^4), F = top sqrt(r) >= ||X||_F, grown by L per later step; the polar side `_direction_bound`; reading
    both back from W (addmm) 2 gamma_{r+2} per entry, sqrt(m n) in Frobenius."""
    a, b, c = coefficients
    m, n = g.shape
    d, k = max(m, n), m
    grid = torch.linspace(0.0, top, 2001, dtype=F64)
    lipschitz = float((a + 3 * b * grid**2 + 5 * c * grid**4).abs().max()) * 1.01  # |f''| < 110: < 1% off the grid
    s = torch.linalg.svdvals(g)
    norm = float(s[:r].norm())
    e = (_tilt(g, r) + 2 * C * d * U64 + gamma(k, U64) * math.sqrt(r)) * float(s[0])
    f = top * math.sqrt(r)
    step_rounding = gamma(n + r + 2, U64) * f * (abs(a) + 3 * abs(b) * f**2 + 4 * abs(c) * f**4)
    start = 2 * e / norm + C * n * U64 + U64
    ns = lipschitz**5 * start + step_rounding * sum(lipschitz**i for i in range(5))
    prediction = lipschitz**5 * 2 * e / norm * math.sqrt(r)
    target = _projected(g, g, r)
    polar = _direction_bound(target, _tilt(g, r), float(torch.linalg.matrix_norm(g)))
    return ns + prediction + polar + 2 * gamma(r + 2, U64) * math.sqrt(m * n)


@pytest.mark.parametrize("cond", [1.0, 3.0, 30.0])
def test_ns5_differs_from_svd_by_the_scalar_newton_schulz_error(cond: float) -> None:
    """M = Q^T G has G's top-4 singular values s; Muon's NS5 from X0 = M / ||M||_F maps each s_i / ||s|| through
    five steps of x -> 3.4445 x - 4.7750 x^3 + 2.0315 x^5 and keeps the singular vectors, so
    ||Q NS5(M) - Q U V^T||_F = sqrt(sum_i (f^5(s_i / ||s||) - 1)^2) — nonzero even at cond 1."""
    shape = (32, 20)
    s = [float(v) for v in torch.logspace(0, -math.log10(cond), 4, dtype=F64)] + [0.01] * 16
    g = _with_spectrum(*shape, s, seed=60)
    svd = _first_step_update(shape, g)
    ns5 = _first_step_update(shape, g, orth="ns_quintic")
    norm = math.sqrt(sum(v * v for v in s[:4]))
    predicted = math.sqrt(sum((_ns_scalar(v / (norm + 1e-7), 5, (3.4445, -4.7750, 2.0315)) - 1) ** 2 for v in s[:4]))
    # float64 rounding of both runs and of M's singular values (`_ns_difference_bound`: NS5 may amplify by L^5 ~ 1e3,
    # still <= 7e-9). Another normalisation (spectral) or step count changes the difference by >= 1e-2.
    tolerance = _ns_difference_bound(g, 4, (3.4445, -4.7750, 2.0315), 1.21)
    assert float(torch.linalg.matrix_norm(ns5 - svd)) == pytest.approx(predicted, abs=tolerance, rel=0)
    assert predicted > 0.05


@pytest.mark.parametrize("cond", [1.5, 3.0, 10.0])
def test_cubic_ns_difference_obeys_lemma_3_2(cond: float) -> None:
    """Cubic NS from X0 = M / ||M||_2 (the lemma's setting): within sqrt(r - 1) (1 - 1/kappa)^(2^5),
    kappa = cond(M M^T) = cond^2, and equal to the scalar prediction."""
    shape = (32, 20)
    top = [float(v) for v in torch.logspace(0, -math.log10(cond), 4, dtype=F64)]
    g = _with_spectrum(*shape, [*top, *([top[-1] / 2] * 16)], seed=61)
    svd = _first_step_update(shape, g)
    cubic = _first_step_update(shape, g, orth="ns_cubic", ns_normalize="spectral")
    difference = float(torch.linalg.matrix_norm(cubic - svd))
    predicted = math.sqrt(sum((_ns_scalar(v / (top[0] + 1e-7), 5, (1.5, -0.5, 0.0)) - 1) ** 2 for v in top))
    # As for NS5 (the cubic's slope is <= 1.5 on [0, 1]; the spectral norm's SVD is in X0's c n u): <= 3e-11.
    tolerance = _ns_difference_bound(g, 4, (1.5, -0.5, 0.0), 1.0)
    assert difference == pytest.approx(predicted, abs=tolerance, rel=0)
    assert difference <= math.sqrt(3) * (1 - 1 / cond**2) ** 32 + tolerance


def test_sumo_ns5_entry_is_sumo_with_the_quintic() -> None:
    sumo, ns5 = registry.get("sumo"), registry.get("sumo-ns5")
    assert sumo.defaults["orth"] == "svd" and ns5.defaults["orth"] == "ns_quintic"
    assert {k: v for k, v in ns5.defaults.items() if k != "orth"} == {
        k: v for k, v in sumo.defaults.items() if k != "orth"
    }


# --------------------------------------------------------------------------------------------------
# state, dtypes, failures, validation


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.up = nn.Linear(40, 96)
        self.down = nn.Linear(96, 40)
        self.head = nn.Linear(40, 5)


def test_state_bytes_are_table_1s_count_plus_scalars() -> None:
    """Per matrix: basis + moment = (m + n) r float32 (Table 1), prev_norm (4 B), four int64 counters (32 B);
    biases and the head go to torch AdamW (2 float32 moments + a float32 step each)."""
    net = _Net()
    hp = {"rank": 6, "update_freq": 2}
    optimizer, routing = registry.build_with_routing("sumo", net, hp)
    gen = _gen(70)
    for _ in range(3):
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()
    matrices = [(8, 27), (96, 40), (40, 96)]
    expected = sum(4 * 6 * (m + n) + 4 + 32 for m, n in matrices)
    fallback = [(8,), (96,), (40,), (5, 40), (5,)]
    expected += sum(2 * 4 * math.prod(s) + 4 for s in fallback)
    assert measure.state_bytes(optimizer) == expected
    shapes = dict(net.named_parameters())
    analytic = registry.get("sumo").state_bytes(
        [tuple(shapes[n].shape) for n in routing.structured],
        [tuple(shapes[n].shape) for n in routing.fallback],
        registry.resolve_hparams("sumo", hp),
    )
    assert analytic == expected


def test_state_is_table_1s_and_below_galores() -> None:
    """Table 1 (m >= n): SUMO keeps nr + mr floats per matrix, GaLore 2nr + mr (one moment fewer)."""
    shapes = [(768, 768), (3072, 768), (768, 3072)]
    r = 128
    sumo_bytes = sumo_module.sumo_state_bytes(shapes, [], {"rank": r})
    assert sumo_bytes - len(shapes) * 36 == 4 * sum(min(m, n) * r + max(m, n) * r for m, n in shapes)
    assert sumo_bytes < 4 * sum(2 * min(m, n) * r + max(m, n) * r for m, n in shapes)


def test_bfloat16_parameters_keep_float32_state() -> None:
    param = nn.Parameter(torch.randn(12, 8).to(torch.bfloat16))
    optimizer = _optimizer([param], update_freq=1)
    for seed in range(2):
        step_change(optimizer, param, _gradient(12, 8, seed=80 + seed).to(torch.bfloat16))
    state = optimizer.state[param]
    assert param.dtype == torch.bfloat16
    assert {k: v.dtype for k, v in state.items()} == {
        "step": torch.int64,
        "refresh_failures": torch.int64,
        "orth_failures": torch.int64,
        "root_fallbacks": torch.int64,
        "prev_norm": torch.float32,
        "basis": torch.float32,
        "moment": torch.float32,
    }


def test_step_never_mutates_the_gradient() -> None:
    param = nn.Parameter(torch.randn(12, 8))
    optimizer = _optimizer([param])
    param.grad = _gradient(12, 8, seed=90).float()
    before = param.grad.clone()
    optimizer.step()
    assert torch.equal(param.grad, before)


def test_failed_refresh_keeps_basis_is_retried_and_raises_on_the_third(monkeypatch: pytest.MonkeyPatch) -> None:
    param = nn.Parameter(torch.zeros(12, 8))
    optimizer = _optimizer([param], update_freq=2)
    step_change(optimizer, param, _gradient(12, 8, seed=91).float())
    basis = optimizer.state[param]["basis"]
    original = sumo_module.linalg.truncated_svd

    def failing(g: Tensor, rank: int, **kwargs: object) -> tuple[Tensor, Tensor, Tensor]:
        if g.size(-2) == 12:  # the gradient's refresh, not the r x n moment's SVD
            raise SolverError("test")
        return original(g, rank, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sumo_module.linalg, "truncated_svd", failing)
    step_change(optimizer, param, _gradient(12, 8, seed=92).float())  # t = 1: no refresh due
    delta = step_change(optimizer, param, _gradient(12, 8, seed=93).float())  # t = 2: refresh fails
    assert optimizer.solver_failures == 1 and optimizer.state[param]["basis"] is basis
    assert float(delta.abs().max()) > 0  # the step still happens in the old subspace
    step_change(optimizer, param, _gradient(12, 8, seed=94).float())  # t = 3: retried, fails again
    assert optimizer.solver_failures == 2
    with pytest.raises(SolverError, match="3 times in a row"):
        step_change(optimizer, param, _gradient(12, 8, seed=95).float())


def test_failed_orthogonalization_gives_a_zero_update(monkeypatch: pytest.MonkeyPatch) -> None:
    param = nn.Parameter(torch.zeros(12, 8))
    optimizer = _optimizer([param], polar_method="svd")
    step_change(optimizer, param, _gradient(12, 8, seed=96).float())

    def failing(m: Tensor) -> Tensor:
        raise SolverError("test")

    monkeypatch.setattr(sumo_module, "polar_masked", failing)
    assert torch.equal(step_change(optimizer, param, _gradient(12, 8, seed=97).float()), torch.zeros(12, 8))
    assert optimizer.solver_failures == 1 and int(optimizer.state[param]["orth_failures"]) == 1


def test_rejects_vectors_and_bad_hyperparameters() -> None:
    with pytest.raises(ValueError, match="matrices"):
        Sumo([nn.Parameter(torch.zeros(5))])
    for bad in ({"orth": "qr"}, {"proj_side": "up"}, {"rank": 0}, {"momentum": 1.0}, {"nl_gamma": 0.5}):
        with pytest.raises(ValueError):
            Sumo([nn.Parameter(torch.zeros(4, 4))], **bad)  # type: ignore[arg-type]


def test_non_contiguous_conv_filter_is_updated_in_place() -> None:
    """A channels-last filter is not contiguous: its (out, in*kh*kw) view would be a copy."""
    g = _gradient(6, 18, seed=98).reshape(6, 2, 3, 3)
    deltas = []
    for memory_format in (torch.contiguous_format, torch.channels_last):
        filt = nn.Parameter(torch.zeros(6, 2, 3, 3, dtype=F64).contiguous(memory_format=memory_format))
        deltas.append(step_change(_optimizer([filt]), filt, g))
    assert not filt.is_contiguous()
    # The same Q and O (the same float64 ops); the contiguous filter takes one addmm, the channels-last one a product
    # then an add: each within gamma_{r+2} |step| of the exact step (C-S: |Q| |O| <= 1). An update written to a copy
    # of the filter leaves it unchanged (checked below).
    torch.testing.assert_close(deltas[1], deltas[0], atol=2 * gamma(5, U64) * _scale((6, 18)), rtol=0)
    assert float(deltas[1].abs().max()) > 0

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

import math

import pytest
import torch
from torch import Tensor, nn

import structbench.optim.sumo as sumo_module
from structbench import measure
from structbench.errors import SolverError
from structbench.optim import registry
from structbench.optim.sumo import Sumo

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


def _step(optimizer: torch.optim.Optimizer, param: nn.Parameter, grad: Tensor) -> Tensor:
    """One step with `grad`; returns the parameter change."""
    before = param.detach().clone()
    param.grad = grad.clone().to(param.dtype)
    optimizer.step()
    return param.detach() - before


def _scale(shape: tuple[int, int]) -> float:
    return ALPHA * LR * math.sqrt(max(shape))


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
    torch.testing.assert_close(_step(optimizer, param, g), expected, atol=1e-5 * _scale(shape), rtol=0)


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
    _step(optimizer, param, g0)
    moment = MU * g0 + g1
    projected = _top_left(g0, 3) @ moment if left else moment @ _top_right(g0, 3)
    expected = -_scale(shape) * _polar(projected)
    torch.testing.assert_close(_step(optimizer, param, g1), expected, atol=1e-5 * _scale(shape), rtol=0)


def test_conv_filter_steps_like_its_matrix_view() -> None:
    filt = nn.Parameter(torch.zeros(6, 2, 3, 3, dtype=F64))
    g = _gradient(6, 18, seed=4)
    delta = _step(_optimizer([filt]), filt, g.reshape(6, 2, 3, 3))
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    expected = -_scale((6, 18)) * u[:, :3] @ vh[:3]
    torch.testing.assert_close(delta.reshape(6, 18), expected, atol=1e-5 * _scale((6, 18)), rtol=0)


def test_shape_scale_none_is_algorithm_1_as_printed() -> None:
    shape = (20, 8)
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    g = _gradient(*shape, seed=5)
    delta = _step(_optimizer([param], shape_scale="none"), param, g)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    torch.testing.assert_close(delta, -ALPHA * LR * u[:, :3] @ vh[:3], atol=1e-6, rtol=0)


def test_randomized_subspace_is_exact_for_a_low_rank_gradient() -> None:
    """A gradient of rank <= r lies in the range of the Gaussian sketch: both subspaces give U V^T."""
    shape = (30, 16)
    g = _with_spectrum(*shape, [3.0, 2.0, 1.0], seed=6)
    deltas = []
    for subspace in ("randomized", "exact"):
        param = nn.Parameter(torch.zeros(*shape, dtype=F64))
        deltas.append(_step(_optimizer([param], subspace=subspace), param, g))
    torch.testing.assert_close(deltas[0], deltas[1], atol=1e-5 * _scale(shape), rtol=0)
    torch.testing.assert_close(deltas[1], -_scale(shape) * _polar(g), atol=1e-5 * _scale(shape), rtol=0)


def test_rank_deficient_moment_moves_only_along_its_range() -> None:
    """A rank-1 gradient with r = 3: the update is -alpha lr s u1 v1^T, not along arbitrary singular vectors."""
    shape = (16, 12)
    g = _with_spectrum(*shape, [2.5], seed=7)
    param = nn.Parameter(torch.zeros(*shape))
    delta = _step(_optimizer([param]), param, g.float())
    torch.testing.assert_close(delta.double(), -_scale(shape) * _polar(g), atol=1e-5 * _scale(shape), rtol=0)


def test_zero_gradient_gives_no_update() -> None:
    param = nn.Parameter(torch.ones(10, 6))
    assert torch.equal(_step(_optimizer([param]), param, torch.zeros(10, 6)), torch.zeros(10, 6))


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
        _step(optimizer, param, g)
        if previous is None:
            continue
        carried = MU * previous + g
        expected = _top_left(g, 3) @ carried if left else carried @ _top_right(g, 3)
        torch.testing.assert_close(optimizer.full_moment(param), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("subspace", ["randomized", "exact"])
def test_rotation_is_lossless_when_the_span_is_unchanged(subspace: str) -> None:
    """Gradients G_t = U A_t share one rank-3 column space; each refresh returns a different basis of it
    (the singular vectors of each G_t). Rotated, Q M equals the heavy-ball sum sum_s mu^(t-s) G_s exactly;
    kept unrotated ("keep", GaLore's behaviour) it does not."""
    shape, gen = (18, 11), _gen(20)
    u, _ = torch.linalg.qr(torch.randn(shape[0], 3, generator=gen, dtype=F64))
    grads = [u @ torch.randn(3, shape[1], generator=gen, dtype=F64) for _ in range(5)]
    defects = {}
    for transform in ("rotate", "keep"):
        param = nn.Parameter(torch.zeros(*shape, dtype=F64))
        optimizer = _optimizer([param], update_freq=1, subspace=subspace, moment_transform=transform)
        heavy_ball = torch.zeros(shape, dtype=F64)
        worst = 0.0
        for g in grads:
            _step(optimizer, param, g)
            heavy_ball = MU * heavy_ball + g
            moment = optimizer.full_moment(param)
            assert moment is not None
            worst = max(worst, float((moment - heavy_ball).abs().max()))
        defects[transform] = worst
    assert defects["rotate"] < 1e-5
    assert defects["keep"] > 0.1


def test_reset_transform_restarts_the_moment_at_each_refresh() -> None:
    shape = (14, 8)
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    optimizer = _optimizer([param], update_freq=2, moment_transform="reset")
    grads = [_gradient(*shape, seed=30 + t) for t in range(3)]
    for g in grads:
        _step(optimizer, param, g)
    torch.testing.assert_close(optimizer.full_moment(param), _top_left(grads[2], 3) @ grads[2], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------------
# refresh timing


def test_refresh_at_multiples_of_k_of_each_parameters_own_step_count() -> None:
    """K = 3: refreshes at t = 0, 3, 6, 9. A parameter without a gradient keeps its t (and its basis)."""
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
            basis = optimizer.state[p].get("basis")
            if basis is not last[name]:
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
    deltas = [_step(optimizer, param, g) for g in grads]
    return [float(torch.linalg.matrix_norm(d)) / _scale(shape) for d in deltas], deltas, grads


def test_limiter_caps_growth_at_gamma_of_the_applied_previous_norm() -> None:
    norms, deltas, grads = _limiter_run(norm_limiter=True)
    expected = [min(2.0, 1.1**t) for t in range(len(norms))]  # 1, 1.1, 1.21, ..., 1.9487, then sqrt(4) = 2
    assert norms == pytest.approx(expected, abs=1e-6)
    # t = 1: the direction is the unlimited one, polar(P_1 (mu G0 + G1)), scaled by 1.1 / 2
    direction = _polar(_top_left(grads[1], 4) @ (MU * grads[0] + grads[1]))
    torch.testing.assert_close(deltas[1], -_scale((16, 12)) * 0.55 * direction, atol=1e-5, rtol=0)


def test_limiter_off_gives_full_orthogonal_steps() -> None:
    norms, _, _ = _limiter_run(norm_limiter=False, steps=4)
    assert norms == pytest.approx([1.0, 2.0, 2.0, 2.0], abs=1e-6)


# --------------------------------------------------------------------------------------------------
# SUMO vs SUMO-NS5


def _ns_scalar(x: float, steps: int, coefficients: tuple[float, float, float]) -> float:
    a, b, c = coefficients
    for _ in range(steps):
        x = a * x + b * x**3 + c * x**5
    return x


def _first_step_update(shape: tuple[int, int], g: Tensor, **overrides: object) -> Tensor:
    param = nn.Parameter(torch.zeros(*shape, dtype=F64))
    return _step(_optimizer([param], rank=4, **overrides), param, g) / _scale(shape)


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
    assert float(torch.linalg.matrix_norm(ns5 - svd)) == pytest.approx(predicted, abs=1e-5)
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
    assert difference == pytest.approx(predicted, abs=1e-5)
    assert difference <= math.sqrt(3) * (1 - 1 / cond**2) ** 32 + 1e-5


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
    """Per matrix: basis + moment = (m + n) r float32 (Table 1), prev_norm (4 B), three int64 counters (24 B);
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
    expected = sum(4 * 6 * (m + n) + 4 + 24 for m, n in matrices)
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
    assert sumo_bytes - len(shapes) * 28 == 4 * sum(min(m, n) * r + max(m, n) * r for m, n in shapes)
    assert sumo_bytes < 4 * sum(2 * min(m, n) * r + max(m, n) * r for m, n in shapes)


def test_bfloat16_parameters_keep_float32_state() -> None:
    param = nn.Parameter(torch.randn(12, 8).to(torch.bfloat16))
    optimizer = _optimizer([param], update_freq=1)
    for seed in range(2):
        _step(optimizer, param, _gradient(12, 8, seed=80 + seed).to(torch.bfloat16))
    state = optimizer.state[param]
    assert param.dtype == torch.bfloat16
    assert {k: v.dtype for k, v in state.items()} == {
        "step": torch.int64,
        "refresh_failures": torch.int64,
        "orth_failures": torch.int64,
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
    _step(optimizer, param, _gradient(12, 8, seed=91).float())
    basis = optimizer.state[param]["basis"]
    original = sumo_module.linalg.truncated_svd

    def failing(g: Tensor, rank: int, **kwargs: object) -> tuple[Tensor, Tensor, Tensor]:
        if g.size(-2) == 12:  # the gradient's refresh, not the r x n moment's SVD
            raise SolverError("test")
        return original(g, rank, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sumo_module.linalg, "truncated_svd", failing)
    _step(optimizer, param, _gradient(12, 8, seed=92).float())  # t = 1: no refresh due
    delta = _step(optimizer, param, _gradient(12, 8, seed=93).float())  # t = 2: refresh fails
    assert optimizer.solver_failures == 1 and optimizer.state[param]["basis"] is basis
    assert float(delta.abs().max()) > 0  # the step still happens in the old subspace
    _step(optimizer, param, _gradient(12, 8, seed=94).float())  # t = 3: retried, fails again
    assert optimizer.solver_failures == 2
    with pytest.raises(SolverError, match="3 times in a row"):
        _step(optimizer, param, _gradient(12, 8, seed=95).float())


def test_failed_orthogonalization_gives_a_zero_update(monkeypatch: pytest.MonkeyPatch) -> None:
    param = nn.Parameter(torch.zeros(12, 8))
    optimizer = _optimizer([param])
    _step(optimizer, param, _gradient(12, 8, seed=96).float())

    def failing(m: Tensor) -> Tensor:
        raise SolverError("test")

    monkeypatch.setattr(sumo_module, "polar_masked", failing)
    assert torch.equal(_step(optimizer, param, _gradient(12, 8, seed=97).float()), torch.zeros(12, 8))
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
        deltas.append(_step(_optimizer([filt]), filt, g))
    assert not filt.is_contiguous()
    torch.testing.assert_close(deltas[1], deltas[0], atol=1e-12, rtol=0)
    assert float(deltas[1].abs().max()) > 0

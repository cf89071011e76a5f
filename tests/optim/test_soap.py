"""SOAP and Eigen-Adam (structbench.optim.soap) against hand-derived formulas, invariants and an oracle.

Expected values are computed here from the algorithms' equations with plain torch in float64:
SOAP as coded in nikhilvyas/SOAP soap.py, Eigen-Adam as printed in
Gong et al., Algorithm 7. The parity oracle is pytorch_optimizer.SOAP 4.1.0 (test-only dependency).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from pytorch_optimizer import SOAP as OracleSOAP
from torch import nn

import structbench.optim.soap as soap
from structbench import measure
from structbench.errors import SolverError
from structbench.optim import registry
from structbench.optim.precision import MATMUL_PRECISIONS, product_error_bound
from structbench.optim.soap import SOAP, EigenAdam
from tests.support.newton_schulz import gamma
from tests.support.steps import feed, random_grads

B1 = B2 = B3 = 0.95

# Rounding-error bounds behind the tolerances (Higham, "Accuracy and Stability of Numerical Algorithms"): float32 unit
# roundoff u = 2^-24; a product with inner size k errs by <= gamma_k |A| |B| entrywise, gamma_k = k u / (1 - k u);
# eigh and QR of a d x d matrix are backward stable, exact for A + E with ||E||_2 <= c d u ||A||_2 and factors within
# c d u of orthonormal, c = C = 4 (LAPACK's "modestly growing" p(d), taken as 4 d: the orthogonality defects measured
# here reach about 2 d u). torch.lerp rounds <= 4 times: |error| <= 4 u (|a| + |b|). Float64 references computed here
# add O(2^-53), left out.
U = 2.0**-24
C = 4


def _orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q.float()


def _spd(basis: torch.Tensor, eigenvalues: list[float]) -> torch.Tensor:
    u = basis.double()
    return (u @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ u.T).float()


def _descending_eigenbasis(a: torch.Tensor) -> torch.Tensor:
    _, vectors = torch.linalg.eigh(a)
    return vectors.flip(-1)


def _same_columns_up_to_sign(a: torch.Tensor, b: torch.Tensor, atol: float) -> None:
    signs = torch.sign(torch.diagonal(a.T @ b))
    torch.testing.assert_close(a * signs, b, rtol=0, atol=atol)


def _params(shapes: list[tuple[int, ...]], seed: int = 0, dtype: torch.dtype = torch.float32) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(*s, generator=gen).to(dtype)) for s in shapes]


# --- SOAP, reference order -------------------------------------------------------------------------------


def test_first_step_only_initialises_factors_and_basis():
    """Step 1 sets L = (1-b3) G G^T, R = (1-b3) G^T G, Q = their eigenvectors (descending); W is untouched."""
    (p,) = _params([(5, 7)])
    before = p.detach().clone()
    g = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    opt = SOAP([p], weight_decay=0.1)
    p.grad = g.clone()
    opt.step()
    assert torch.equal(p.detach(), before)
    assert torch.equal(p.grad, g)
    state = opt.state[p]
    g64 = g.double()
    sides = (("left", g64 @ g64.T, g64.abs() @ g64.abs().T), ("right", g64.T @ g64, g64.abs().T @ g64.abs()))
    for side, gg, magnitudes in sides:
        # (1 - b3) G G^T from zero by one baddbmm: the product (inner size <= 7), the scaling and its rounded constant,
        # gamma_9 (1 - b3) |G| |G|^T entrywise. A missing (1 - b3) is off by 20x.
        error = (state[f"gg_{side}"].double() - (1 - B3) * gg).abs()
        assert bool((error <= gamma(9) * (1 - B3) * magnitudes).all())
        # Q from float32 eigh (d <= 7): within c d u of orthonormal, so Q^T Q - I <= 2 c d u + (c d u)^2; Q^T L Q is
        # diagonal up to the backward error and both factors' distance, 3 c d u ||L||, and its diagonal (the
        # eigenvalues, by Weyl) is descending up to twice that. Unsorted or non-orthogonal bases miss by O(||L||).
        d = gg.size(0)
        norm = float(torch.linalg.matrix_norm(state[f"gg_{side}"].double(), ord=2))
        q = state[f"q_{side}"].double()
        eye = torch.eye(d, dtype=torch.float64)
        torch.testing.assert_close(q.T @ q, eye, rtol=0, atol=2 * C * d * U + (C * d * U) ** 2)
        rotated = q.T @ state[f"gg_{side}"].double() @ q
        diagonal = torch.diagonal(rotated)
        torch.testing.assert_close(rotated, torch.diag(diagonal), rtol=0, atol=3 * C * d * U * norm)
        slack = 6 * C * d * U * norm
        assert bool((diagonal[:-1] >= diagonal[1:] - slack).all()), "eigenvalues must be in descending order"
    assert torch.count_nonzero(state["exp_avg"]) == 0 and torch.count_nonzero(state["exp_avg_sq"]) == 0
    assert state["step"] == 0


def _known_state_step(momentum_in_eigenbasis: bool, matmul_precision: str = "float32"):
    """A SOAP step from a hand-set state: L = U_L diag(1..4) U_L^T, R = U_R diag(.5..4.5) U_R^T, Q = U; the refresh's
    QR is Householder's (the reference's), whose rounding the test bounds."""
    gen = torch.Generator().manual_seed(3)
    (p,) = _params([(4, 5)], seed=2)
    lr, wd, eps = 0.1, 0.01, 1e-8
    opt = SOAP(
        [p],
        lr=lr,
        weight_decay=wd,
        eps=eps,
        precondition_frequency=1,
        momentum_in_eigenbasis=momentum_in_eigenbasis,
        orthonormalize="householder",
        matmul_precision=matmul_precision,
    )
    p.grad = torch.randn(4, 5, generator=gen)
    opt.step()
    state = opt.state[p]
    u_left, u_right = _orthogonal(4, gen), _orthogonal(5, gen)
    state["gg_left"] = _spd(u_left, [1.0, 2.0, 3.0, 4.0])  # ascending on purpose: the refresh must re-sort
    state["gg_right"] = _spd(u_right, [0.5, 1.5, 2.5, 3.5, 4.5])
    state["q_left"], state["q_right"] = u_left.clone(), u_right.clone()
    state["exp_avg"] = torch.randn(4, 5, generator=gen)
    state["exp_avg_sq"] = torch.rand(4, 5, generator=gen) + 0.1
    known = {k: v.double().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    w0 = p.detach().double().clone()
    g = 0.3 * torch.randn(4, 5, generator=gen)
    p.grad = g.clone()
    opt.step()
    return opt.state[p], p.detach().double(), w0, g.double(), known, (lr, wd, eps)


def _rotation_error(precision: str) -> float:
    """c with |fl(Q_L^T X Q_R) - Q_L^T X Q_R| <= c |Q_L|^T |X| |Q_R| entrywise for the two products (inner sizes 4 and
    5) in `precision`: c1 + c2 + c1 c2, each c_k = precision.product_error_bound (the second product's operand is
    the first's rounded result, |P1_hat| <= (1 + c1) |Q_L|^T |X|)."""
    c1, c2 = product_error_bound(precision, 4), product_error_bound(precision, 5)
    return c1 + c2 + c1 * c2


@pytest.mark.parametrize(
    ("momentum_in_eigenbasis", "matmul_precision"),
    [(False, "float32"), (True, "float32"), *((False, p) for p in MATMUL_PRECISIONS[1:]), (True, "bfloat16")],
)
def test_step_is_adam_in_the_eigenbasis_then_refresh_sorts_and_permutes(momentum_in_eigenbasis, matmul_precision):
    state, w1, w0, g, known, (lr, wd, eps) = _known_state_step(momentum_in_eigenbasis, matmul_precision)
    ql, qr = known["q_left"], known["q_right"]
    rotated_g = ql.T @ g @ qr
    # Entrywise error bounds of the step (inputs are exact float32 numbers; products of inner size 4 and 5, run in
    # `matmul_precision`, each rotation by c = _rotation_error of its magnitudes): G' = Q_L^T G Q_R errs by
    # c |Q_L|^T |G| |Q_R| =: dr; m by lerp's 4 u (|m| + |G|), rotated (m' = Q_L^T m Q_R, carried through |Q| and one
    # more c) or lerped in the eigenbasis; v = b2 v + (1 - b2) G'^2 by (1 - b2) (2 |G'| dr + dr^2) + gamma_3 of its
    # terms; sqrt(v) by dv / (sqrt(v) + sqrt(v - dv)) (exact: |a - b| = |a^2 - b^2| / (a + b)), + eps and 2 u of it;
    # N = m' / den by (dm' + |N| dden) / (den - dden) + u |N| (exact for a quotient); the update Q_L N Q_R^T by
    # (1 + c) |Q_L| dN |Q_R|^T + c |Q_L| |N| |Q_R|^T; W by the step size times that, 2 u for the scaled add and 2 u
    # for the decay: <= 1e-5 in float32, about 2e-3 in bfloat16 (c = 0.012); a missing bias correction moves W by
    # >= 1e-2. (A rotation left in float32 would stay inside: test_soap_fast checks which products take the
    # precision.)
    c = _rotation_error(matmul_precision)
    qla, qra = ql.abs(), qr.abs()
    dr = c * qla.T @ g.abs() @ qra
    if momentum_in_eigenbasis:
        m_rot = B1 * known["exp_avg"] + (1 - B1) * rotated_g  # exp_avg is stored in the eigenbasis
        dm = 4 * U * (known["exp_avg"].abs() + rotated_g.abs() + dr) + (1 - B1) * dr
    else:
        m = B1 * known["exp_avg"] + (1 - B1) * g
        m_rot = ql.T @ m @ qr
        dm_raw = 4 * U * (known["exp_avg"].abs() + g.abs())
        dm = (1 + c) * qla.T @ dm_raw @ qra + c * qla.T @ m.abs() @ qra
    v = B2 * known["exp_avg_sq"] + (1 - B2) * rotated_g**2
    dv = (1 - B2) * (2 * rotated_g.abs() * dr + dr**2)
    dv += gamma(3) * (B2 * known["exp_avg_sq"] + (1 - B2) * rotated_g**2)
    den = v.sqrt() + eps
    dden = dv / (v.sqrt() + (v - dv).clamp_min(0).sqrt()) + 2 * U * den
    assert bool((dden < den).all()), "the bound needs the denominator's error below the denominator"
    normalized = m_rot / den
    dn = (dm + normalized.abs() * dden) / (den - dden) + U * normalized.abs()
    step_size = lr * math.sqrt(1 - B2) / (1 - B1)  # t = 1: the first step after the initialising one
    update = ql @ normalized @ qr.T
    du = (1 + c) * qla @ dn @ qra.T + c * qla @ normalized.abs() @ qra.T
    expected = (w0 - step_size * update) * (1 - lr * wd)
    bound = (1 - lr * wd) * (step_size * du + 2 * U * (w0.abs() + step_size * update.abs())) + 2 * U * expected.abs()
    assert bool(((w1 - expected).abs() <= bound).all())

    # After the update: L, R take the current gradient; precondition_frequency 1 refreshes at once. Each EMA is one
    # baddbmm: the product (inner size <= 5), two scalings with rounded constants and a sum, gamma_9 of the terms.
    gg_left = B3 * known["gg_left"] + (1 - B3) * g @ g.T
    gg_right = B3 * known["gg_right"] + (1 - B3) * g.T @ g
    dgg_left = gamma(9) * (B3 * known["gg_left"].abs() + (1 - B3) * g.abs() @ g.abs().T)
    dgg_right = gamma(9) * (B3 * known["gg_right"].abs() + (1 - B3) * g.abs().T @ g.abs())
    assert bool(((state["gg_left"].double() - gg_left).abs() <= dgg_left).all())
    assert bool(((state["gg_right"].double() - gg_right).abs() <= dgg_right).all())
    order_left = torch.argsort(torch.diagonal(ql.T @ gg_left @ ql), descending=True)
    order_right = torch.argsort(torch.diagonal(qr.T @ gg_right @ qr), descending=True)
    assert order_left.tolist() == [3, 2, 1, 0] and order_right.tolist() == [4, 3, 2, 1, 0]
    # The refresh only permutes v (exact), so v keeps the bound above; an unpermuted v is off by O(v).
    permuted_error = (state["exp_avg_sq"].double() - v[order_left][:, order_right]).abs()
    assert bool((permuted_error <= dv[order_left][:, order_right]).all())
    # Q <- qr(L^ Q_sorted) in float32 against qr(L Q_sorted) in float64: Y = L Q_sorted is off by
    # ||dL||_F + gamma_d || |L| |Q| ||_F, the QR adds its backward error c d u ||Y||_2 (sqrt(d) in Frobenius) and
    # c d u for Q's distance from orthonormal, and the Q factor moves by <= sqrt(2) ||Y^-1||_2 ||dY||_F (Sun's
    # first-order QR bound): <= 6e-5. A basis refreshed from the stale L or left unsorted is off by O(1).
    for side, gg, q, order, dgg in (
        ("left", gg_left, ql, order_left, dgg_left),
        ("right", gg_right, qr, order_right, dgg_right),
    ):
        d = q.size(0)
        y = gg @ q[:, order]
        dy = float(torch.linalg.matrix_norm(dgg)) + gamma(d) * float(torch.linalg.matrix_norm(gg.abs() @ q.abs()))
        dy += C * d * U * math.sqrt(d) * float(torch.linalg.matrix_norm(y, ord=2))
        inverse = float(torch.linalg.matrix_norm(torch.linalg.inv(y), ord=2))
        atol = math.sqrt(2) * inverse * dy + C * d * U * math.sqrt(d)
        new, _ = torch.linalg.qr(y)
        _same_columns_up_to_sign(state[f"q_{side}"].double(), new, atol=atol)
    if momentum_in_eigenbasis:  # rotated from the old basis to the new one
        # m' (bound dm) taken back with the old basis and forward with the new one: four products of inner size
        # <= 5, gamma_18 of |Q_L'|^T |Q_L| |m'| |Q_R|^T |Q_R'|, and the carried dm the same way.
        new_left_q, new_right_q = state["q_left"].double(), state["q_right"].double()
        m_new = new_left_q.T @ (ql @ m_rot @ qr.T) @ new_right_q
        carry = new_left_q.abs().T @ qla
        carry_right = qra.T @ new_right_q.abs()
        bound = carry @ (dm + gamma(18) * m_rot.abs()) @ carry_right
        assert bool(((state["exp_avg"].double() - m_new).abs() <= bound).all())
    else:
        assert bool(((state["exp_avg"].double() - m).abs() <= 4 * U * (known["exp_avg"].abs() + g.abs())).all())


def test_no_rotation_above_max_precond_dim_is_hf_adam_with_the_first_step_skipped():
    """max_precond_dim 0: no side is rotated, so SOAP is HF-style AdamW whose first step only initialises."""
    (p,) = _params([(3, 4)])
    lr, wd, eps = 0.05, 0.01, 1e-8
    opt = SOAP([p], lr=lr, weight_decay=wd, eps=eps, max_precond_dim=0)
    grads = random_grads([(3, 4)], 5, seed=4)
    w = p.detach().double().clone()
    m = torch.zeros(3, 4, dtype=torch.float64)
    v = torch.zeros_like(m)
    dm, dv, dw = torch.zeros_like(m), torch.zeros_like(m), torch.zeros_like(m)
    for call, (g,) in enumerate(grads):
        feed(opt, [p], [[g]])
        if call == 0:
            continue
        t, g64 = call, g.double()
        # Entrywise float32 error, carried along: lerp's 4 u (|m| + |g|) on m and b2 v + (1 - b2) g^2's gamma_5
        # (rounded constants, g g, the scaling and the sum), each scaled by b next step; N = m / (sqrt(v) + eps) by
        # (dm + |N| dden) / den + u |N| with dden = dv / (2 sqrt(v)) + 2 u den; W by the step size times that, 2 u for
        # the scaled add and 2 u for the decay, its own earlier error carried by 1 - lr wd. A missing bias
        # correction moves W by >= 1e-3.
        dm = B1 * dm + 4 * U * (m.abs() + g64.abs())
        m = B1 * m + (1 - B1) * g64
        dv = B2 * dv + gamma(5) * (B2 * v + (1 - B2) * g64**2)
        v = B2 * v + (1 - B2) * g64**2
        den = v.sqrt() + eps
        normalized = m / den
        dn = (dm + normalized.abs() * (dv / (2 * v.sqrt()) + 2 * U * den)) / den + U * normalized.abs()
        step_size = lr * math.sqrt(1 - B2**t) / (1 - B1**t)
        dw = (1 - lr * wd) * (dw + step_size * dn + 2 * U * (w.abs() + step_size * normalized.abs()))
        w = (w - step_size * normalized) * (1 - lr * wd)
        dw = dw + 2 * U * w.abs()
        assert bool(((p.detach().double() - w).abs() <= dw).all()), t
    assert set(opt.state[p]) == {"step", "failures_in_a_row", "exp_avg", "exp_avg_sq"}


def test_paper_momentum_and_momentum_in_eigenbasis_agree():
    """m kept in the eigenbasis and rotated only on refresh equals projecting the original-space m every step."""
    shapes = [(6, 6), (6, 6), (3, 9), (4, 2, 3, 3)]
    grads = random_grads(shapes, 9, seed=5)
    for base in ({}, {"basis_from_current_grad": True, "refresh": "eigh", "sides": "smaller"}):
        finals = []
        for in_eigenbasis in (False, True):
            params = _params(shapes)
            feed(SOAP(params, precondition_frequency=2, momentum_in_eigenbasis=in_eigenbasis, **base), params, grads)
            finals.append([p.detach() for p in params])
        for a, b in zip(*finals, strict=True):
            # (c) Measured, not bounded: a first-order bound divides the rotation's rounding by sqrt(v) entrywise, which
            # nothing keeps away from 0. Across AVX2, SSE4.2-only, AVX-only and MKL-compatible kernels the two
            # variants' weights differed by <= 1.02 u max|W| (about one float32 ulp of W); allowed 16 u max|W|. Another
            # rotation (a basis not refreshed in one variant) moves W by >= 1e-4.
            torch.testing.assert_close(a, b, rtol=0, atol=16 * U * float(b.abs().max()))


@pytest.mark.parametrize("batch_matrices", ["on", "off"])
def test_parity_with_pytorch_optimizer_soap(batch_matrices):
    """pytorch_optimizer.SOAP 4.1.0 against SOAP(basis_from_current_grad=False, refresh="qr", sides="both").

    Semantics shared: first step only initialises, t counts the later steps, L and R updated after the
    step, one power iteration + QR with the exp_avg_sq sort, HF eps and bias correction, decoupled wd.
    Remaining differences, none of which this configuration exercises beyond float32 rounding:
    - its first moment lives in the original space (our default, momentum_in_eigenbasis=False; the True
      switch is checked too, since the two are equal in exact arithmetic);
    - it counts t with the group step, equal to ours only when every parameter has a gradient from step 1
      (true here);
    - it keeps GG and Q in the parameter dtype (ours float32; the parameters here are float32), accumulates
      with lerp (ours baddbmm), runs eigh without symmetrising and adds 1e-30 I;
    - its weight decay is p *= 1 - lr*wd (same number); QR column signs may differ (the update is invariant);
    - normalize_gradient divides by RMS + eps (ours, like the reference, RMS + 1e-30): not exercised;
    - conv filters get one factor per dimension there (ours: the (out, in*kh*kw) view): 2-D only here.
    Matrices are square so that no factor has a null space, whose eigenbasis would be arbitrary.
    The tolerance is (c), measured, not bounded (the rotation's rounding is divided by sqrt(v) entrywise, which
    nothing keeps away from 0): across AVX2, SSE4.2-only, AVX-only and MKL-compatible kernels the weights differed by
    <= 1.55 u max|W| (u = 2^-24, about one float32 ulp of W); allowed 16 u max|W|. A different bias correction, eps
    placement or decay order moves W by >= 1e-4.
    """
    shapes = [(8, 8), (8, 8), (6, 6)]
    grads = random_grads(shapes, 12, seed=6)
    expected = _params(shapes)
    feed(OracleSOAP(expected, precondition_frequency=3), expected, grads)
    for in_eigenbasis in (False, True):
        params = _params(shapes)
        opt = SOAP(
            params, precondition_frequency=3, momentum_in_eigenbasis=in_eigenbasis, batch_matrices=batch_matrices
        )
        feed(opt, params, grads)
        for ours, theirs in zip(params, expected, strict=True):
            atol = 16 * U * float(theirs.detach().abs().max())
            torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=atol)


def test_one_sided_parity_with_pytorch_optimizer_soap():
    """One-sided SOAP (sides="left", reference order) against the oracle with max_precondition_dim = rows,
    which leaves the wider side unrotated; no bias correction, to cover that switch as well."""
    grads = random_grads([(6, 10)], 10, seed=7)
    expected = _params([(6, 10)])
    feed(OracleSOAP(expected, precondition_frequency=2, max_precondition_dim=6, correct_bias=False), expected, grads)
    params = _params([(6, 10)])
    feed(SOAP(params, precondition_frequency=2, sides="left", correct_bias=False), params, grads)
    # (c) as in the two-sided parity test: measured <= 0.47 u max|W| across the same kernels; allowed 16 u max|W|.
    atol = 16 * U * float(expected[0].detach().abs().max())
    torch.testing.assert_close(params[0].detach(), expected[0].detach(), rtol=0, atol=atol)


# --- Eigen-Adam ------------------------------------------------------------------------------------------


def _algorithm7(w0: torch.Tensor, grads: list[torch.Tensor], lr: float, every: int, eps: float) -> torch.Tensor:
    """Gong et al. Alg. 7 in float64 (+ eps in the denominator): Q_t EMA, EVD at t == 1 or t mod K == 0."""
    w = w0.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    stat = torch.zeros(w.size(0), w.size(0), dtype=torch.float64)
    basis = stat
    for t, g in enumerate(grads, start=1):
        g = g.double()
        stat = B3 * stat + (1 - B3) * g @ g.T
        if t == 1 or t % every == 0:
            basis = _descending_eigenbasis(stat)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * (basis.T @ g) ** 2
        w = w - lr * basis @ ((basis.T @ m) / (v.sqrt() + eps))
    return w


@pytest.mark.parametrize("shape", [(4, 7), (7, 4)])
def test_eigen_adam_follows_algorithm_7(shape):
    """Wide: rotate rows by EVD(E[G G^T]). Tall: the smaller side is the columns, i.e. Alg. 7 on G^T."""
    lr, every, eps = 0.05, 2, 1e-8
    grads = [g for (g,) in random_grads([shape], 6, seed=8)]
    (p,) = _params([shape])
    w0 = p.detach().clone()
    opt = EigenAdam([p], lr=lr, precondition_frequency=every, eps=eps)
    feed(opt, [p], [[g] for g in grads])
    if shape[0] <= shape[1]:
        expected = _algorithm7(w0, grads, lr, every, eps)
        assert set(opt.state[p]) >= {"gg_left", "q_left"} and "q_right" not in opt.state[p]
    else:
        expected = _algorithm7(w0.T, [g.T for g in grads], lr, every, eps).T
        assert set(opt.state[p]) >= {"gg_right", "q_right"} and "q_left" not in opt.state[p]
    # (c) Measured, not bounded (the rotation's rounding is divided by sqrt(v) entrywise, which nothing keeps away
    # from 0): against float64 Algorithm 7 the displacement W - W_0 was off by <= 35.5 u max|W - W_0| across AVX2,
    # SSE4.2-only, AVX-only and MKL-compatible kernels; allowed 10x. A basis from the previous statistic, or a
    # refresh off schedule, moves it by >= 1e-3 relative.
    moved = expected - w0.double()
    atol = 355 * U * float(moved.abs().max())
    torch.testing.assert_close(p.detach().double() - w0.double(), moved, rtol=0, atol=atol)


def test_eigen_adam_first_step_updates_with_the_current_gradients_basis():
    """Alg. 7 at t = 1: U = EVD(G G^T), m~ = (1-b1) U^T G, v = (1-b2) (U^T G)^2, so W moves by
    -lr (1-b1)/sqrt(1-b2) U sign(U^T G) (up to eps) -- no skipped step, no bias correction, no decay."""
    (p,) = _params([(3, 5)])
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(9))
    w0 = p.detach().double().clone()
    feed(EigenAdam([p], lr=0.01), [p], [[g]])
    u = _descending_eigenbasis(g.double() @ g.double().T)
    expected = w0 - 0.01 * (1 - B1) / math.sqrt(1 - B2) * u @ torch.sign(u.T @ g.double())
    # float32 eigh of (1 - b3) G G^T (d = 3): each eigenvector within sin(theta_i) <= 3 c d u lambda_max / gap_i of
    # u_i (backward error and distance from orthonormal; Davis–Kahan). Then r = U^T G is off by sin(theta_i) ||G|| +
    # gamma_3 |U|^T |G|; N = (1 - b1) r / (sqrt(1 - b2) |r| + eps) is flat in r away from 0 (slope <= (1 - b1) eps /
    # ((1 - b2) r^2)), so with every |r| > that error N keeps its signs. W moves by lr (|dU| |N| + |U| dN) plus
    # gamma_3 |U| |N| and 4 u (|W| + lr |U N|) for the product, the scaled add and the constant: <= 6e-7; an unsorted
    # or a previous-statistic basis changes the signs' pattern, O(lr).
    stat = (1 - B3) * g.double() @ g.double().T
    values = torch.linalg.eigvalsh(stat).flip(-1)
    gaps = torch.stack([(values[i] - torch.cat([values[:i], values[i + 1 :]])).abs().min() for i in range(3)])
    sines = 3 * C * 3 * U * values[0] / gaps
    r = u.T @ g.double()
    dr = sines[:, None] * torch.linalg.vector_norm(g.double(), dim=0) + gamma(3) * u.abs().T @ g.double().abs()
    assert bool((r.abs() > dr).all()), "an entry of U^T G within rounding of 0: its sign is not determined"
    scale = (1 - B1) / math.sqrt(1 - B2)
    normalized = scale * torch.sign(r)
    # N's distance from scale sign(r) itself (eps / sqrt(1 - b2) against |r|) is added to its rounding.
    dn = (1 - B1) * 1e-8 * dr / ((1 - B2) * (r.abs() - dr) ** 2) + scale * 1e-8 / (math.sqrt(1 - B2) * r.abs())
    step = u @ normalized
    bound = 0.01 * (sines.sum() * normalized.abs().amax(0) + u.abs() @ dn + gamma(3) * u.abs() @ normalized.abs())
    bound = bound + 4 * U * (w0.abs() + 0.01 * step.abs())
    assert bool(((p.detach().double() - expected).abs() <= bound).all())


# --- numerics, failures and bookkeeping -------------------------------------------------------------------


def test_eigh_failure_keeps_the_basis_counts_and_raises_on_the_third_in_a_row(monkeypatch):
    (p,) = _params([(3, 4)])
    opt = EigenAdam([p], precondition_frequency=1)
    calls = {"n": 0}
    real = soap.eigh_with_retry

    def flaky(a):
        calls["n"] += 1
        if calls["n"] in (1, 3, 4, 5):
            raise SolverError("injected")
        return real(a)

    monkeypatch.setattr(soap, "eigh_with_retry", flaky)
    grads = random_grads([(3, 4)], 5, seed=10)
    feed(opt, [p], grads[:1])  # t = 1: the initial EVD fails -> identity basis
    assert opt.solver_failures == 1
    assert torch.equal(opt.state[p]["q_left"], torch.eye(3))
    feed(opt, [p], grads[1:2])  # t = 2 succeeds and resets the count in a row
    assert opt.solver_failures == 1 and opt.state[p]["failures_in_a_row"] == 0
    kept = opt.state[p]["q_left"].clone()
    feed(opt, [p], grads[2:4])  # t = 3, 4 fail: the basis is kept
    assert opt.solver_failures == 3 and torch.equal(opt.state[p]["q_left"], kept)
    with pytest.raises(SolverError):
        feed(opt, [p], grads[4:5])


def test_qr_failure_keeps_the_basis_and_leaves_exp_avg_sq_unpermuted(monkeypatch):
    (p,) = _params([(4, 4)])
    opt = SOAP([p], precondition_frequency=1)
    grads = random_grads([(4, 4)], 2, seed=11)
    feed(opt, [p], grads[:1])
    basis = {k: opt.state[p][k].clone() for k in ("q_left", "q_right")}
    opt.param_groups[0]["orthonormalize"] = "householder"  # the reference's QR, made to fail below
    real_qr = torch.linalg.qr
    monkeypatch.setattr(torch.linalg, "qr", lambda a: (torch.full_like(a, float("nan")), real_qr(a)[1]))
    g = grads[1][0]
    rotated = basis["q_left"].T @ g @ basis["q_right"]
    feed(opt, [p], grads[1:2])
    state = opt.state[p]
    assert opt.solver_failures == 1 and state["failures_in_a_row"] == 1
    assert torch.equal(state["q_left"], basis["q_left"]) and torch.equal(state["q_right"], basis["q_right"])
    # Both rotations (the test's 2-D products, the optimizer's batched ones) are within gamma_8 |Q|^T |G| |Q| of
    # Q^T G Q; v = b2 0 + (1 - b2) r^2 adds (1 - b2) (2 |r| dr + dr^2) and gamma_3 for the product, the scaling and
    # the sum. A permuted v (the failed refresh's order applied anyway) is off by O(v).
    dr = 2 * gamma(8) * basis["q_left"].abs().T @ g.abs() @ basis["q_right"].abs()
    expected = (1 - B2) * rotated**2
    bound = (1 - B2) * (2 * rotated.abs() * dr + dr**2) + gamma(3) * expected
    assert bool(((state["exp_avg_sq"] - expected).abs() <= bound).all())


@pytest.mark.parametrize("batch_matrices", ["on", "off"])
def test_same_shape_matrices_batched_equal_separate_runs_and_late_gradients_start_fresh(batch_matrices):
    """Two same-shape matrices share one batched step ("on"; "off" steps them one at a time); the second gets its
    first gradient two steps late, so its first (initialising) step happens inside a batch where the other is
    already running."""
    shapes = [(5, 6), (5, 6)]
    grads = random_grads(shapes, 7, seed=12)
    params = _params(shapes)
    opt = SOAP(params, precondition_frequency=2, batch_matrices=batch_matrices)
    for k, step_grads in enumerate(grads):
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            p.grad = g.clone() if (i == 0 or k >= 2) else None
        if k == 2:
            late_before = params[1].detach().clone()
        opt.step()
        if k == 2:
            assert torch.equal(params[1].detach(), late_before), "a first step must not update"
    alone = _params(shapes)
    feed(SOAP([alone[0]], precondition_frequency=2), [alone[0]], [[g[0]] for g in grads])
    feed(SOAP([alone[1]], precondition_frequency=2), [alone[1]], [[g[1]] for g in grads[2:]])
    for a, b in zip(params, alone, strict=True):
        if batch_matrices == "off":  # (a) each matrix runs alone, the same ops in the same order as its own optimizer's
            assert torch.equal(a.detach(), b.detach())
        else:
            # (c) batched eigh / QR / matmuls accumulate in another order: measured bit-identical here on AVX2,
            # SSE4.2-only, AVX-only and MKL-compatible kernels; allowed 16 u max|W| as for the parity tests (the same
            # first-order argument fails: rounding is divided by sqrt(v)). A state mixed up between the two matrices
            # is off by O(lr).
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=16 * U * float(b.detach().abs().max()))


def test_bfloat16_parameters_keep_float32_state_and_follow_the_float32_run():
    """Gradients are bfloat16 numbers that do not depend on the weights, so both runs build bit-identical float32
    statistics and the same float32 updates, and the bfloat16 run differs from a float32 run from the same (bfloat16)
    start only by rounding the weights after each of its 5 updates (the first step only builds the basis): a half-ulp
    of a bfloat16 number w is at most u |w|, u = 2^-8 (8 significant bits), so 5 roundings add <= 5 * 2^-8 * max|w|
    along the way. Besides: each run rounds W - lr u and (1 - lr wd) W in float32, 2 * 2^-24 |w| per step and run,
    and the decay carries the earlier difference forward scaled by 1 - lr wd < 1. The bfloat16 weights that get
    rounded exceed the float32 run's by at most the difference itself (<= 5 * 2^-8 max|w|), hence the factor below.
    A bug in the bfloat16 path (weights not written back, an update applied in bfloat16 twice) moves them by a
    whole update, lr ~ 1e-2 per step."""
    shapes = [(6, 8), (4, 2, 3, 3)]
    grads = [[g.to(torch.bfloat16).float() for g in step] for step in random_grads(shapes, 6, seed=13)]
    start = _params(shapes, dtype=torch.bfloat16)
    runs = {dtype: [nn.Parameter(p.detach().to(dtype)) for p in start] for dtype in (torch.float32, torch.bfloat16)}
    opts = {dtype: SOAP(params, lr=0.01, precondition_frequency=2) for dtype, params in runs.items()}
    largest = [p.detach().abs() for p in runs[torch.float32]]
    for step_grads in grads:
        for dtype, params in runs.items():
            feed(opts[dtype], params, [step_grads])
        largest = [torch.maximum(m, p.detach().abs()) for m, p in zip(largest, runs[torch.float32], strict=True)]
    for dtype, opt in opts.items():
        assert all(p.dtype == dtype for p in runs[dtype])
        assert all(
            t.dtype == torch.float32 for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)
        )
    for a, b, m in zip(runs[torch.float32], runs[torch.bfloat16], largest, strict=True):
        bound = 5 * (2**-8 * (1 + 5 * 2**-8) + 4 * 2**-24) * m.double()
        assert bool(((b.detach().double() - a.detach().double()).abs() <= bound).all())


def test_rejects_vectors_skips_missing_gradients_and_returns_the_closure_loss():
    with pytest.raises(ValueError, match="1-D"):
        SOAP([nn.Parameter(torch.zeros(3))])
    a, b = _params([(3, 3), (3, 3)])
    opt = SOAP([a, b], weight_decay=0.5)
    before = b.detach().clone()
    seen: list[float] = []

    def closure() -> torch.Tensor:
        loss = (a**2).sum()
        a.grad = torch.autograd.grad(loss, a)[0]
        seen.append(float(loss.detach()))
        return loss

    returned = [float(opt.step(closure).detach()) for _ in range(3)]
    assert returned == seen
    assert torch.equal(b.detach(), before) and not opt.state[b]
    with pytest.raises(ValueError, match="sides"):
        SOAP([a], sides="top")
    with pytest.raises(ValueError, match="batch_matrices"):
        SOAP([a], batch_matrices="sometimes")


def test_state_bytes_match_the_format():
    """Hand counts: float32 exp_avg + exp_avg_sq (2*rows*cols), per rotated side of size k 2*k*k (GG and Q),
    ints carry no tensor bytes; torch AdamW: 2*numel floats + a float32 step per tensor (eigen-adam, soap's
    adamw_form 'torch'); soap's default fallback (the code's Adam, HFAdamW): 2*numel floats, its step an int."""
    structured = [(12, 64), (4, 2, 3, 3)]
    fallback = [(12,), (3, 20)]
    adamw = (2 * 12 + 1) * 4 + (2 * 60 + 1) * 4
    code_adam = 2 * 12 * 4 + 2 * 60 * 4
    soap_hp = registry.resolve_hparams("soap", {})
    eigen_hp = registry.resolve_hparams("eigen-adam", {})
    soap_bytes = 4 * (1536 + 288 + 8192) + 4 * (144 + 32 + 648)
    assert soap.state_bytes(structured, fallback, soap_hp) == soap_bytes + code_adam
    assert soap.state_bytes(structured, fallback, {**soap_hp, "adamw_form": "torch"}) == soap_bytes + adamw
    assert soap.state_bytes(structured, fallback, eigen_hp) == 4 * (1536 + 288) + 4 * (144 + 32) + adamw
    limited = {**soap_hp, "max_precond_dim": 10}
    assert soap.state_bytes(structured, fallback, limited) == 4 * 1536 + 4 * (144 + 32) + code_adam

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3, bias=False)
            self.hidden = nn.Linear(64, 12)
            self.head = nn.Linear(12, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.hidden(torch.relu(self.conv(x)).flatten(1)[:, :64])))

    torch.manual_seed(0)
    net = Net()
    opt = registry.make_optimizer("soap", net, precondition_frequency=2)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(2, 2, 6, 6)).square().sum().backward()
        opt.step()
    # structured: conv (4, 18) and hidden (12, 64); fallback: hidden.bias (12), head.weight (3, 12), head.bias (3)
    expected = 4 * (144 + 32 + 648) + 4 * (1536 + 288 + 8192) + (24 + 72 + 6) * 4
    assert measure.state_bytes(opt) == expected


def test_registry_entries():
    soap_entry, eigen_entry = registry.get("soap"), registry.get("eigen-adam")
    assert soap_entry.lr_keys == eigen_entry.lr_keys == ("lr", "adamw_lr")
    assert {
        k: soap_entry.defaults[k]
        for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "precondition_frequency", "max_precond_dim")
    } == {
        "lr": 3e-3,
        "beta1": 0.95,
        "beta2": 0.95,
        "eps": 1e-8,
        "weight_decay": 0.01,
        "precondition_frequency": 10,
        "max_precond_dim": 10000,
    }
    assert soap_entry.defaults["shampoo_beta"] == -1.0 and soap_entry.defaults["correct_bias"] is True
    assert eigen_entry.defaults["sides"] == "smaller" and eigen_entry.defaults["basis_from_current_grad"] is True
    assert all(k in d for d in (soap_entry.defaults, eigen_entry.defaults) for k in ("adamw_lr", "adamw_eps"))
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    opt = registry.make_optimizer("eigen-adam", model)
    assert isinstance(opt.parts["structured"], EigenAdam)
    assert [tuple(p.shape) for p in opt.parts["structured"].param_groups[0]["params"]] == [(6, 4)]


def test_resume_is_bit_identical_for_every_switch():
    shapes = [(5, 5), (5, 5), (3, 8)]
    grads = random_grads(shapes, 6, seed=14)
    variants = [
        {"momentum_in_eigenbasis": True},
        {"refresh": "eigh", "sides": "right"},
        {"basis_from_current_grad": True, "normalize_grads": True},
    ]
    for variant in variants:
        params = _params(shapes)
        opt = SOAP(params, precondition_frequency=2, **variant)
        feed(opt, params, grads[:3])
        saved = copy.deepcopy(opt.state_dict())
        resumed = [nn.Parameter(p.detach().clone()) for p in params]
        feed(opt, params, grads[3:])
        opt2 = SOAP(resumed, precondition_frequency=2, **variant)
        opt2.load_state_dict(saved)
        feed(opt2, resumed, grads[3:])
        assert all(torch.equal(a, b) for a, b in zip(params, resumed, strict=True)), variant

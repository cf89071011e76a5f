"""Alice / Alice-0 (Gong et al., Sec. 5, Alg. 2-4, 10) against independent facts: dense Kronecker forms of the
structured Fisher (Eq. 12, Eq. 19-21), Thm 5.1's optimum found numerically, GaLore's SVD subspace, Alg. 10 by
hand, and the Table 6 memory formula."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from structbench.optim import alice, memory
from structbench.optim.alice import Alice

LR, ALPHA = 0.1, 0.5
U32, U64 = 2.0**-24, 2.0**-53
"""float32 and float64 unit roundoffs. Alice's eigendecompositions of float64 matrices run in float64 and return
float32 eigenvectors (linalg.eigh_with_retry), so its basis U is a float64 eigenbasis with every entry rounded to
float32: U^T U - I <= 2 u32 sum_k |U_ki| |U_kj| <= 2 u32 entrywise (unit columns, Cauchy-Schwarz), plus the float64
eigh's own n u64. Every bound below starts from that."""


def gamma(n: int, u: float = U64) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of an n-term sum or dot product (float64 by default)."""
    return n * u / (1 - n * u)


def vec(g: torch.Tensor) -> torch.Tensor:
    """Column stacking (the paper's Vec)."""
    return g.T.reshape(-1)


def mat(v: torch.Tensor, m: int, n: int) -> torch.Tensor:
    return v.reshape(n, m).T


def inv_sqrt_psd(a: torch.Tensor) -> torch.Tensor:
    evals, evecs = torch.linalg.eigh(a)
    return evecs @ torch.diag(evals.rsqrt()) @ evecs.T


def block_diag_fisher(u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Diag_B(U D_1 U^T, ..., U D_n U^T) with D_i = Diag_v(d[:, i]) (Eq. 9 structure)."""
    return torch.block_diag(*[u @ torch.diag(d[:, i]) @ u.T for i in range(d.size(1))])


def run(grads: list[torch.Tensor], **kwargs: object) -> tuple[nn.Parameter, Alice, list[torch.Tensor]]:
    weight = nn.Parameter(torch.zeros_like(grads[0]))
    opt = Alice([weight], lr=LR, alpha=ALPHA, **kwargs)
    deltas = []
    for g in grads:
        before = weight.detach().clone()
        weight.grad = g.clone()
        opt.step()
        deltas.append(weight.detach() - before)
    return weight, opt, deltas


def test_full_rank_update_is_dense_square_root_ngd_eq12() -> None:
    # r = m, no compensation, beta1 = 0: Alg. 4 reduces to Eq. 12, Mat(F~^{-1/2} g) with F~ of Eq. 9-11.
    m, n, beta2 = 3, 4, 0.9
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(m, n, generator=gen, dtype=torch.float64) for _ in range(4)]
    _, opt, deltas = run(
        grads,
        rank=m,
        leading=m,
        beta1=0.0,
        beta2=beta2,
        update_interval=1000,
        compensation="none",
        switching="none",
    )
    u = next(iter(opt.state.values()))["basis"]
    torch.testing.assert_close(u.T @ u, torch.eye(m, dtype=torch.float64), rtol=0, atol=2 * U32 + m * U64)
    second = torch.zeros(m, n, dtype=torch.float64)
    for t, g in enumerate(grads):
        second = beta2 * second + (1 - beta2) * (u.T @ g).square()  # E[(U^T g_i)^2] as an EMA, no bias correction
        fisher = block_diag_fisher(u, second)
        expected = -LR * ALPHA * mat(inv_sqrt_psd(fisher) @ vec(g), m, n)
        # Alg. 4 computes U (U^T G / sqrt(v)), i.e. Mat(U D^-1/2 U^T g) block by block: the dense F~^-1/2 only for an
        # orthonormal U. With the optimizer's U (orthonormal to 2 u32, above) the two differ by `model`, computed
        # here in float64 (~1e-8); beyond it, float64 rounding: the 12 x 12 eigh's backward error 12 u64 ||F||
        # through x^-1/2 (cond(F)^(3/2) / 2 relative) and the step's few operations. A missing or extra bias
        # correction scales the step by >= 1.05.
        algorithm = -LR * ALPHA * u @ ((u.T @ g) / second.sqrt())
        model = (algorithm - expected).abs()
        kappa = float(torch.linalg.cond(fisher))
        rounding = (12 * kappa**1.5 / 2 + 16) * U64 * float(expected.abs().max())
        assert bool(((deltas[t] - expected).abs() <= model + rounding).all()), t


def test_first_moment_lives_in_low_rank_space() -> None:
    m, n, beta1 = 4, 6, 0.9
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(m, n, generator=gen, dtype=torch.float64) for _ in range(3)]
    _, opt, _ = run(grads, rank=2, leading=1, beta1=beta1, update_interval=1000)
    st = next(iter(opt.state.values()))
    u = st["basis"]
    weights = [(1 - beta1) * beta1 ** (2 - k) for k in range(len(grads))]
    expected = sum(w * (u.T @ g) for w, g in zip(weights, grads, strict=True))
    assert st["exp_avg"].shape == (2, n)
    # Both sides in float64 from the same U, in different orders: each U^T g an m-term dot product and at most 6
    # scalings and sums along the way, gamma_(m+6) |U|^T |g| per term, twice. An EMA in the m-dimensional
    # space (U m instead of m) or a missing (1 - beta1) changes the shape or scales by 10.
    bound = 2 * sum(w * gamma(m + 6) * (u.abs().T @ g.abs()) for w, g in zip(weights, grads, strict=True))
    assert bool(((st["exp_avg"] - expected).abs() <= bound).all())


def _compensation_objective(log_s: torch.Tensor, projector: torch.Tensor, fisher_c: torch.Tensor) -> torch.Tensor:
    s = log_s.exp()
    return torch.linalg.matrix_norm(torch.kron(torch.diag(s.pow(-2)), projector) - fisher_c).square()


def test_compensation_is_theorem_5_1_optimum() -> None:
    # The step's second term equals Mat((S* (x) U_c U_c^T) g), S* minimising ||S^{-2} (x) U_c U_c^T - F~_c||_F
    # over positive diagonal S (found here by L-BFGS on the dense 24 x 24 matrices), F~_c = Diag_B(U_c D_ci U_c^T).
    m, n, r = 4, 6, 2
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(m, n, generator=gen, dtype=torch.float64)
    _, opt, deltas = run([g], rank=r, leading=1, beta1=0.0, alpha_c=1.0)
    u = next(iter(opt.state.values()))["basis"]
    projector = torch.eye(m, dtype=torch.float64) - u @ u.T
    evals, evecs = torch.linalg.eigh(projector)
    u_c = evecs[:, evals > 0.5]
    fisher_c = block_diag_fisher(u_c, (u_c.T @ g).square())
    log_s = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    solver = torch.optim.LBFGS([log_s], lr=1.0, max_iter=500, tolerance_grad=1e-14, tolerance_change=1e-16)

    def closure() -> torch.Tensor:
        solver.zero_grad()
        loss = _compensation_objective(log_s, projector, fisher_c)
        loss.backward()
        return loss

    solver.step(closure)
    s_star = log_s.detach().exp()
    expected_comp = mat(torch.kron(torch.diag(s_star), projector) @ vec(g), m, n)
    sigma = u.T @ g
    low_rank = u @ (sigma / ((1 - 0.9) * sigma.square()).sqrt())
    comp = deltas[0] / (-LR * ALPHA) - low_rank
    # Two non-rounding effects, each bounded per column i (comp's column i is s_i (P g)_i):
    # - L-BFGS stops short: the objective is a sum of 1-D terms f_i(x_i), x = log s, convex near the optimum, so
    #   |x_i - x_i*| <= |f_i'| / f_i'' there (both by autograd), and s_i moves by s_i |dx_i|;
    # - Thm 5.1 assumes a projector: with the optimizer's U (U^T U - I = E, e = ||E||) P = I - U U^T has
    #   eigenvalues 1 and O(e), and the optimizer's p_i = ||g_i||^2 - ||U^T g_i||^2 = g_i^T P g_i differs from the
    #   theorem's g_i^T U_c U_c^T g_i, relatively, by <= 3 e kappa_i, kappa_i = ||g_i||^2 / p_i; s_i ~ p_i^-1/2.
    # Then float64 rounding (deltas / (-lr alpha) - low rank): 16 u64 of the terms. A compensation on the wrong
    # side, without the sqrt(m - r) factor or with (m - r) in place of it is off by >= 30%.
    loss = _compensation_objective(log_s, projector, fisher_c)
    (slope,) = torch.autograd.grad(loss, log_s, create_graph=True)
    curvature = torch.stack([torch.autograd.grad(slope[i], log_s, retain_graph=True)[0][i] for i in range(n)])
    assert bool((curvature > 0).all())
    dx = (slope.detach() / curvature.detach()).abs()
    e = float(torch.linalg.matrix_norm(u.T @ u - torch.eye(r, dtype=torch.float64), ord=2))
    kappa = g.square().sum(0) / (g.square().sum(0) - sigma.square().sum(0))
    rounding = 16 * U64 * (comp.abs() + low_rank.abs() + (deltas[0] / (LR * ALPHA)).abs())
    bound = expected_comp.abs() * (dx + 3 * e * kappa)[None, :] + rounding
    assert bool(((comp - expected_comp).abs() <= bound).all())


def test_step_one_basis_is_galore_svd_subspace() -> None:
    # EVD(G G^T, r) spans the top-r left singular subspace of G (GaLore's projection); not a zero-basis QR.
    m, n, r = 8, 12, 3
    gen = torch.Generator().manual_seed(3)
    low = torch.randn(m, r, generator=gen, dtype=torch.float64) @ torch.randn(r, n, generator=gen, dtype=torch.float64)
    g = low + 1e-3 * torch.randn(m, n, generator=gen, dtype=torch.float64)
    for beta3 in (0.999, 0.0):
        _, opt, _ = run([g], rank=r, leading=r, switching="none", beta3=beta3)
        u = next(iter(opt.state.values()))["basis"]
        svd_u = torch.linalg.svd(g)[0][:, :r]
        # U U^T is off the float64 projector by the float32 rounding of U's entries (2 u32, Cauchy-Schwarz on
        # the rows) and the float64 eigh and SVD subspaces by m u64 lambda_max / gap each (Davis-Kahan; gap =
        # lambda_r - lambda_(r+1) of G G^T ~ 10, lambda_max ~ 110). A zero-basis QR or the bottom r directions are
        # off by O(1).
        evals = torch.linalg.eigvalsh(g @ g.T)
        subspace = float(evals[-1] / (evals[-r] - evals[-r - 1]))
        torch.testing.assert_close(u @ u.T, svd_u @ svd_u.T, rtol=0, atol=2 * U32 + 2 * m * U64 * subspace)


def test_subspace_iteration_alg10_matches_hand_computation() -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    a = x @ x.T
    init = torch.linalg.qr(torch.randn(6, 3, generator=gen, dtype=torch.float64))[0]
    got = alice.ritz_basis(a, init)
    h, _ = torch.linalg.qr(a @ init)
    evals, evecs = torch.linalg.eigh(h.T @ a @ h)
    expected = h @ evecs[:, torch.argsort(evals, descending=True)]
    signs = torch.sign((expected * got).sum(0))
    # Ours is H's float64 eigenvectors rounded to float32 (u32 |v| per entry), times the same float64 QR factor:
    # u32 |H| |V| entrywise; the float64 eigh (3 u64 ||H|| / gap, gap = the smallest Ritz value gap) and QR (6 u64
    # cond(A Q0)) add ~1e-14. A missing Rayleigh-Ritz rotation or ascending order moves columns by O(1).
    ritz_gap = float(evals.sort().values.diff().min())
    float64_part = 3 * U64 * float(evals.abs().max()) / ritz_gap + 6 * U64 * float(torch.linalg.cond(a @ init))
    allowed = U32 * (h.abs() @ evecs.abs()).max() + float64_part
    torch.testing.assert_close(got, expected * signs, rtol=0, atol=float(allowed))
    # Rayleigh quotients of the float32-rounded vectors: lambda (1 + 2 v^T dv) to first order, 2 u32 lambda each
    ritz_values = torch.diagonal(got.T @ a @ got)
    assert (ritz_values[:-1] >= ritz_values[1:] - 2 * U32 * (ritz_values[:-1] + ritz_values[1:])).all()


def _switched(seed: int, switching: str = "proposed") -> tuple[Alice, torch.Tensor, list[torch.Tensor]]:
    m, n = 10, 14
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(m, n, generator=gen, dtype=torch.float64) for _ in range(2)]
    weight = nn.Parameter(torch.zeros(m, n, dtype=torch.float64))
    opt = Alice([weight], rank=4, leading=2, update_interval=2, switch_seed=seed, switching=switching)
    weight.grad = grads[0]
    opt.step()
    before = {k: v.clone() for k, v in opt.state[weight].items() if isinstance(v, torch.Tensor)}
    weight.grad = grads[1]
    opt.step()
    return opt, opt.state[weight]["basis"].clone(), [before["basis"], before["tracked"], grads[1]]


def test_switching_is_seeded_and_follows_algorithm_2() -> None:
    _, u_a, (u_prev, tracked, g) = _switched(0)
    _, u_b, _ = _switched(0)
    _, u_c, _ = _switched(1)
    assert torch.equal(u_a, u_b)  # same seed, same process, same operations
    # another seed samples other complement columns: the projectors differ by O(1), rounding moves them by 1e-7
    assert float((u_a @ u_a.T - u_c @ u_c.T).abs().max()) > 0.1
    # U = [Ritz vectors: float64 QR times float32-rounded eigenvectors (2 u32), complete-QR complement (m u64)]
    m = u_a.shape[0]
    torch.testing.assert_close(u_a.T @ u_a, torch.eye(4, dtype=torch.float64), rtol=0, atol=2 * U32 + 2 * m * U64)
    # the leading l = 2 columns are the top Ritz vectors of Q_t = b3 U Q~ U^T + (1 - b3) G G^T from U_{t-1}
    q = 0.999 * u_prev @ tracked @ u_prev.T + 0.001 * g @ g.T
    h, _ = torch.linalg.qr(q @ u_prev)
    evals, evecs = torch.linalg.eigh(h.T @ q @ h)
    ritz = h @ evecs[:, torch.argsort(evals, descending=True)]
    lead = ritz[:, :2]
    # Both from Q formed in float64 in different orders: the span of Q U_{t-1} moves by m u64 cond(Q U_{t-1}),
    # the top-2 Ritz subspace by 4 u64 ||H|| / (l_2 - l_3) (Davis-Kahan); ours rounds the eigenvectors to float32
    # (2 u32 on the projector). Random columns, or the bottom Ritz vectors, are off by O(1).
    ranked = evals.sort(descending=True).values
    spans = m * U64 * float(torch.linalg.cond(q @ u_prev))
    top = 4 * U64 * float(ranked[0] / (ranked[1] - ranked[2]))
    torch.testing.assert_close(u_a[:, :2] @ u_a[:, :2].T, lead @ lead.T, rtol=0, atol=2 * U32 + 2 * (spans + top))
    # the other r - l columns come from the complement of the whole r-dimensional Ritz subspace: ours are orthogonal
    # to span(Q U_{t-1}) to m u64 (complete QR), which is the hand span to `spans`. A complement of only the
    # leading l columns would leave O(1) overlaps.
    torch.testing.assert_close(ritz.T @ u_a[:, 2:], torch.zeros(4, 2, dtype=torch.float64), rtol=0, atol=2 * spans)


@pytest.mark.parametrize("mode", alice.SWITCHING)
def test_switching_variants_give_r_unit_columns(mode: str) -> None:
    _, u, _ = _switched(0, mode)
    assert u.shape == (10, 4)
    # Ritz columns: float32-rounded eigenvectors times a float64 orthonormal factor (2 u32); Gaussian columns
    # normalised in float64 and complete-QR columns (m u64). An unnormalised Gaussian column is off by ~2.
    torch.testing.assert_close(u.norm(dim=0), torch.ones(4, dtype=torch.float64), rtol=0, atol=2 * U32 + 20 * U64)


@pytest.mark.parametrize("mode", alice.COMPENSATION)
def test_compensation_variants_run_and_stay_finite(mode: str) -> None:
    gen = torch.Generator().manual_seed(6)
    grads = [torch.randn(6, 9, generator=gen) for _ in range(4)]
    _, _, deltas = run(grads, rank=3, leading=1, update_interval=2, compensation=mode)
    assert all(torch.isfinite(d).all() for d in deltas)
    rank = torch.linalg.matrix_rank(deltas[-1]).item()
    assert rank == (3 if mode == "none" else 6)


def test_compensation_limiter_bounds_growth() -> None:
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    weight = nn.Parameter(torch.zeros(6, 9, dtype=torch.float64))
    opt = Alice([weight], rank=2, leading=1, update_interval=1000)
    weight.grad = g
    opt.step()
    phi = opt.state[weight]["phi"].item()
    weight.grad = 100.0 * g
    opt.step()
    # phi_2 = (gamma / (||C|| / phi_1)) ||C||: three float64 roundings, and two more in 1.01 * phi here
    assert opt.state[weight]["phi"].item() <= 1.01 * phi * (1 + 6 * U64)


def test_tall_matrix_uses_smaller_side() -> None:
    gen = torch.Generator().manual_seed(8)
    g = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    _, opt, deltas = run([g], rank=2, leading=1)
    _, _, deltas_t = run([g.T.contiguous()], rank=2, leading=1)
    st = next(iter(opt.state.values()))
    assert st["basis"].shape == (4, 2) and st["exp_avg"].shape == (2, 9)
    # The tall run works on the transposed view of the same float64 gradient. Kernels may sum in another order
    # (float64 differences), and the float32 rounding of U's entries can then differ by one unit: U moves by
    # <= 2 u32 |U| entrywise. Through U omega (omega = m / sqrt(v) is sign(sigma) (1 - b1) / sqrt(1 - b2) at
    # step 1, insensitive to sigma) and the compensation C = sqrt(m - r) (G - U U^T G) / sqrt(p) (p the EMA of
    # ||g||^2 - ||U^T g||^2): 2 u32 (|U| |omega| + 2 alpha_c sqrt(m - r) |U| |U|^T |G| / sqrt(p)) + alpha_c |C| dp
    # / (2 p), both runs, times lr alpha. Processing the tall matrix untransposed gives a 9 x 2 basis (asserted).
    basis, omega = st["basis"], st["exp_avg"] / st["exp_avg_sq"].sqrt()
    wide = g.T
    sigma = basis.T @ wide
    p = st["col_energy"]  # (1 - b1) (||g||^2 - ||U^T g||^2) after one step
    dp = (1 - 0.9) * 2 * (sigma.abs() * (2 * U32 * (basis.abs().T @ wide.abs()))).sum(0)
    residual = wide - basis @ sigma
    comp = math.sqrt(4 - 2) * residual / p.sqrt()
    scale = (
        2
        * U32
        * (
            basis.abs() @ omega.abs()
            + 2 * 0.4 * math.sqrt(4 - 2) * (basis.abs() @ basis.abs().T @ wide.abs()) / p.sqrt()
        )
    )
    scale = scale + 0.4 * comp.abs() * dp / (2 * p)
    allowed = 2 * LR * ALPHA * scale.T + 16 * U64 * deltas[0].abs()
    assert bool(((deltas[0] - deltas_t[0].T).abs() <= allowed).all())


def test_state_bytes_follow_table_6() -> None:
    shapes = [(6, 9), (10, 4), (4, 2, 3, 3)]
    for beta3, name in ((0.999, "alice"), (0.0, "alice-0")):
        params = [nn.Parameter(torch.randn(s)) for s in shapes]
        opt = Alice(params, rank=3, leading=1, beta3=beta3)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        measured = sum(
            t.numel() * t.element_size()
            for st in opt.state.values()
            for t in st.values()
            if isinstance(t, torch.Tensor)
        )
        r = 3
        tracking = r * r if beta3 > 0 else 0
        expected = 4 * sum(2 * n * r + m * r + n + tracking + 1 for m, n in ((6, 9), (4, 10), (4, 18)))
        assert measured == expected
        hp = {**alice.ALICE_ENTRY.defaults, "rank": 3, "beta3": beta3}
        assert alice.alice_state_bytes(shapes, [], hp) == expected
        assert 4 * memory.structured_state_elements(name, shapes, {"rank": 3}) == expected
        assert ("tracked" in next(iter(opt.state.values()))) == (beta3 > 0)
    assert memory.matrix_state_elements("alice", (512, 1376)) == 2 * 1376 * 128 + 512 * 128 + 1376 + 128**2 + 1
    assert memory.matrix_state_elements("alice-0", (512, 1376)) == 2 * 1376 * 128 + 512 * 128 + 1376 + 1


def test_resume_reproduces_switching_draws() -> None:
    gen = torch.Generator().manual_seed(9)
    grads = [torch.randn(8, 10, generator=gen) for _ in range(6)]
    w1 = nn.Parameter(torch.zeros(8, 10))
    o1 = Alice([w1], rank=3, leading=1, update_interval=2)
    for g in grads[:3]:
        w1.grad = g
        o1.step()
    saved, w_saved = copy.deepcopy(o1.state_dict()), w1.detach().clone()
    for g in grads[3:]:
        w1.grad = g
        o1.step()
    w2 = nn.Parameter(w_saved)
    o2 = Alice([w2], rank=3, leading=1, update_interval=2)
    o2.load_state_dict(saved)
    for g in grads[3:]:
        w2.grad = g
        o2.step()
    assert torch.equal(w1.detach(), w2.detach())

"""4-bit Shampoo against a float64 reference written from the paper (Wang et al. 2024, arXiv 2405.18144).

The reference follows the algorithm boxes line by line, on non-diagonal gradients (a diagonal gradient keeps every
statistic diagonal, where rectification, the subspace step and the quantization layout cannot show):

- Algorithm 1 (PU): V = D(U_bar) rectified t1 = 1 time by Björck's iteration (Eq. 2, V <- 1.5 V - 0.5 V V^T V);
  A = beta V Diag(lambda) V^T + (1 - beta) G G^T; one subspace step P = QR(A V) (App. B: "one step"); the new
  eigenvalues are diag(P^T A P) and the new U_bar = Q(P), one eigenvector per quantization block (Section 3.3).
- Algorithm 2 (PIRU): V = D(U_bar) rectified t2 = 4 times; A^ = V (Diag(lambda) + max(lambda) eps I)^(-1/4) V^T;
  stored as an fp32 diagonal and a quantized off-diagonal part.
- App. G: beta = 0.95, eps = 1e-6, t1 = 1, t2 = 4, blocks of 64, matrices of order >= 64 quantized.
- The naive baseline (Section 3.1, "slightly improved"): the statistic and its root are quantized without their
  diagonal, which stays fp32.

The stored state is read through the documented state format (`<name>.<field>` = `quant.to_state`) and the public
quantizer; the reference never calls the optimizer's own helpers.

Tolerances. PU's eigenvalues are stored fp32 and compared to within 1e-5 lambda_max: the float32 pipeline (a 96 x 96
QR and two products) differs from float64 by under 1e-6 lambda_max here (the smallest eigenvalues carry that absolute
error too, so a relative tolerance per eigenvalue would not do), while no rectification, or two subspace steps, move
them by more than 1e-2 lambda_max (the test asserts this margin on the reference itself). Quantized matrices are
compared after both sides went through the same quantizer: a code differs only where float32 rounding puts an
element near a decision threshold, so the relative Frobenius gap of the roots stays below 1e-3 while the mutations
checked here give several percent. The eigenvector matrix gets 1e-2 and its block scales an absolute 1e-3 (entries
are O(0.1)): the eigenvectors of the smallest, clustered eigenvalues are ill-conditioned, so float32 rounding moves
them by ~1e-4 and flips a few codes (a gap of 2e-3 is observed), while a block layout across eigenvectors changes
the scales and codes by O(1).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from structbench.optim import quant
from structbench.optim.shampoo4bit import Shampoo4bit, Shampoo4bitNaive
from tests.support.measures import relative_gap

BETA, EPS, T1, T2 = 0.95, 1e-6, 1, 4
ROWS, COLS = 64, 96  # both orders quantized; 96 = 64 + 32, so a block running on into the next row would show
FIELDS = ("codes", "scales", "shape", "bits", "block_size", "codebook_id", "diag")


def gradients(steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Dense, non-diagonal gradients with a spread of singular values (low-rank part plus noise)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        low_rank = torch.randn(ROWS, 6, generator=gen) @ torch.randn(6, COLS, generator=gen)
        out.append(low_rank + 0.3 * torch.randn(ROWS, COLS, generator=gen))
    return out


def stored(state: dict, name: str) -> quant.QuantizedMatrix:
    """The quantized matrix stored under `name`, rebuilt from its documented state fields."""
    return quant.from_state({f: state[f"{name}.{f}"] for f in FIELDS if f"{name}.{f}" in state})


def dequantized(state: dict, name: str) -> torch.Tensor:
    return quant.dequantize(stored(state, name)).double()


def bjorck(v: torch.Tensor, steps: int) -> torch.Tensor:
    """Eq. (2): V_t = 1.5 V_{t-1} - 0.5 V_{t-1} V_{t-1}^T V_{t-1}."""
    for _ in range(steps):
        v = 1.5 * v - 0.5 * v @ v.T @ v
    return v


def qr_positive(x: torch.Tensor) -> torch.Tensor:
    q, r = torch.linalg.qr(x)
    return q * torch.sign(torch.diagonal(r))


def outer(grad: torch.Tensor, side: str) -> torch.Tensor:
    return grad @ grad.T if side == "left" else grad.T @ grad


def reference_pu(
    eigvecs_t: torch.Tensor, eigvals: torch.Tensor, grad: torch.Tensor, side: str, t1: int = T1, iters: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 from the dequantized U_bar^T (one eigenvector per row) and lambda: (new lambda, new P)."""
    v = bjorck(eigvecs_t.T, t1)
    a = BETA * (v * eigvals) @ v.T + (1 - BETA) * outer(grad, side)
    p = v
    for _ in range(iters):
        p = qr_positive(a @ p)
    return torch.diagonal(p.T @ a @ p), p


def reference_piru(eigvecs_t: torch.Tensor, eigvals: torch.Tensor, t2: int = T2) -> torch.Tensor:
    """Algorithm 2: V (Diag(lambda) + max(lambda) eps I)^(-1/4) V^T with V = D(U_bar) rectified t2 times."""
    v = bjorck(eigvecs_t.T, t2)
    lam = eigvals.clamp_min(0)
    return (v * (lam + EPS * lam.max()) ** -0.25) @ v.T


def quantized_offdiag(x: torch.Tensor) -> torch.Tensor:
    return quant.dequantize(quant.quantize_offdiag(x.float())).double()


def run_steps(cls, steps: int, **hparams) -> tuple[nn.Parameter, torch.optim.Optimizer, list[dict], list]:
    """`steps` steps with statistics and roots every step; the state before each step and the gradients."""
    w = nn.Parameter(torch.zeros(ROWS, COLS))
    opt = cls([w], lr=1e-3, stat_interval=1, root_interval=1, **hparams)
    grads = gradients(steps)
    before = []
    for g in grads:
        before.append(copy.deepcopy(opt.state[w]))
        w.grad = g.clone()
        opt.step()
    return w, opt, before, grads


def test_pu_after_a_refresh_matches_algorithm_1_from_the_stored_state():
    """Steps 2 and 3: PU starts from a quantized, non-orthogonal eigenvector matrix, so rectification counts."""
    w, opt, before, grads = run_steps(Shampoo4bit, 3)
    after = [*before[1:], opt.state[w]]
    for t in (1, 2):
        prev, now = before[t], after[t]
        for side in ("left", "right"):
            prev_vt = dequantized(prev, f"{side}_eigvecs_0")
            prev_vals = prev[f"{side}_eigvals_0"].double()
            g = grads[t].double()
            lam, p = reference_pu(prev_vt, prev_vals, g, side)
            scale = float(lam.abs().max())
            # the mutations this comparison must see are far outside its tolerance
            for other in (
                reference_pu(prev_vt, prev_vals, g, side, t1=0),
                reference_pu(prev_vt, prev_vals, g, side, iters=2),
            ):
                assert float((other[0] - lam).abs().max()) > 1e-2 * scale
            torch.testing.assert_close(now[f"{side}_eigvals_0"].double(), lam, rtol=0, atol=1e-5 * scale)
            # U_bar = Q(P^T): one eigenvector per row, each row cut into blocks of 64 (scales = block absmax)
            vt = p.T
            order = vt.shape[0]
            expected_scales = torch.stack(
                [vt[:, start : start + 64].abs().amax(dim=1) for start in range(0, order, 64)], dim=1
            )
            torch.testing.assert_close(
                stored(now, f"{side}_eigvecs_0").scales.double(), expected_scales, rtol=0, atol=1e-3
            )
            assert (
                relative_gap(
                    dequantized(now, f"{side}_eigvecs_0"), quant.dequantize(quant.quantize(vt.float())).double()
                )
                < 1e-2
            )


def test_piru_matches_algorithm_2_with_four_rectification_steps():
    w, opt, _, _ = run_steps(Shampoo4bit, 3)
    state = opt.state[w]
    for side in ("left", "right"):
        vt = dequantized(state, f"{side}_eigvecs_0")
        assert float(torch.linalg.matrix_norm(vt @ vt.T - torch.eye(vt.shape[0], dtype=vt.dtype))) > 0.05
        lam = state[f"{side}_eigvals_0"].double()
        expected = quantized_offdiag(reference_piru(vt, lam))
        actual = dequantized(state, f"{side}_root_0")
        for steps in (0, 1):  # no rectification, or one step, gives a root far outside the tolerance
            assert relative_gap(quantized_offdiag(reference_piru(vt, lam, t2=steps)), expected) > 5e-3
        assert relative_gap(actual, expected) < 1e-3
        torch.testing.assert_close(actual.diagonal(), reference_piru(vt, lam).diagonal(), rtol=1e-4, atol=0)


def offdiag_block_absmax(x: torch.Tensor) -> torch.Tensor:
    """Per row, the absmax of each block of 64 of the matrix without its diagonal: the scales of Q(A - Diag(a))."""
    off = x.clone().fill_diagonal_(0).abs()
    return torch.stack([off[:, start : start + 64].amax(dim=1) for start in range(0, x.shape[1], 64)], dim=1)


def test_naive_keeps_the_diagonals_in_fp32_and_quantizes_the_rest():
    """Naive 4-bit Shampoo after one step (Section 3.1's "slightly improved" naive variant, Alg. 4 lines 4, 8-9):
    the statistic L = beta eps I + (1 - beta) G G^T keeps its diagonal fp32, its off-diagonal part is block-quantized
    with the off-diagonal block absmax as scale (within half the widest code gap of it); the root likewise keeps its
    diagonal out of the quantization, so each scale is its block's largest off-diagonal magnitude, reached exactly by
    a +-1 code. A quantized diagonal, larger than its row's off-diagonal entries, would raise those scales."""
    w, opt, _, grads = run_steps(Shampoo4bitNaive, 1)
    state = opt.state[w]
    g = grads[0].double()
    half_gap = float(quant.codebook("linear-2", 4).double().diff().max()) / 2
    for side in ("left", "right"):
        order = outer(g, side).shape[0]
        stat = BETA * EPS * torch.eye(order, dtype=torch.float64) + (1 - BETA) * outer(g, side)
        held = dequantized(state, f"{side}_stat_0")
        torch.testing.assert_close(held.diagonal(), stat.diagonal(), rtol=1e-6, atol=0)
        scales = stored(state, f"{side}_stat_0").scales.double()
        torch.testing.assert_close(scales, offdiag_block_absmax(stat), rtol=1e-5, atol=0)
        off_error = (held - stat).fill_diagonal_(0).abs()
        assert bool((off_error <= scales.repeat_interleave(64, dim=1)[:, :order] * half_gap * (1 + 1e-5)).all())
        root = dequantized(state, f"{side}_root_0")
        root_scales = stored(state, f"{side}_root_0").scales.double()
        assert bool((root.diagonal().abs() > root_scales.amax(dim=1)).any())  # the diagonal would set the scale
        torch.testing.assert_close(root_scales, offdiag_block_absmax(root), rtol=1e-6, atol=0)


def test_naive_root_is_the_inverse_fourth_root_of_the_stored_statistic():
    """Alg. 4 lines 8-9 on the dequantized statistic: L^ = (D(L_bar) + eps lambda_max I)^(-1/4), then stored with its
    diagonal fp32. The gradient [3 I | 0] + noise keeps the quantized left statistic positive definite (its diagonal,
    9, dwarfs the off-diagonal quantization error), so the float64 eigendecomposition gives the exact root; the right
    one has rank 64, and its zero eigenvalues are clamped at 0 before the ridge (the reference code's rule). The root is
    taken by eigh (`root_method="eigh"`): the default Schur-Newton stops after App. A's 10 iterations, about 1%
    short of the exact root here, which would hide the comparison. Row-wise blocks quantize L_ij and L_ji with
    different scales, so the dequantized statistic is not exactly symmetric: the root is that of its symmetric part
    (Alg. 4 takes the root of a symmetric matrix). float32 eigh agrees to 1e-4 on the diagonal."""
    gen = torch.Generator().manual_seed(1)
    g = torch.cat((3 * torch.eye(ROWS), torch.zeros(ROWS, COLS - ROWS)), dim=1) + 0.2 * torch.randn(
        ROWS, COLS, generator=gen
    )
    w = nn.Parameter(torch.zeros(ROWS, COLS))
    opt = Shampoo4bitNaive([w], lr=1e-3, stat_interval=1, root_interval=1, root_method="eigh")
    w.grad = g
    opt.step()
    state = opt.state[w]
    for side in ("left", "right"):
        held = dequantized(state, f"{side}_stat_0")
        evals, evecs = torch.linalg.eigh((held + held.T) / 2)  # row blocks quantize L_ij and L_ji differently
        evals = evals.clamp_min(0)  # G^T G has rank 64 < 96: zero eigenvalues that quantization can push below 0
        root = (evecs * (evals + EPS * evals.max()) ** -0.25) @ evecs.T
        actual = dequantized(state, f"{side}_root_0")
        torch.testing.assert_close(actual.diagonal(), root.diagonal(), rtol=1e-4, atol=0)
        assert relative_gap(actual, quantized_offdiag(root)) < 1e-3

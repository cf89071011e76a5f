"""Shared linear algebra for the structured optimizers, each routine written once.

Every function takes a single matrix or a batch of matrices over leading dimensions, shape
(..., m, n), and runs on any device. Decompositions (SVD, eigh) run in float32 and are retried in
float64 when they raise or return non-finite values; if both fail they raise
`structbench.errors.SolverError`, so an optimizer can keep its previous state and count the event
(structbench's rule for every solver). Iterative routines never modify their inputs.

References:
    Higham, "Functions of Matrices" (2008): Newton–Schulz iteration for the polar factor.
    Jordan et al. (2024), Muon: quintic Newton–Schulz coefficients.
    Guo & Higham (2006), Eq. 3.2: coupled (Schur–)Newton iteration for A^{-1/p}, as in google-research
        scalable_shampoo and 4-bit Shampoo's 32-bit baseline (Sike-Wang/low-bit-Shampoo optimizers/matrix_functions.py).
    Higham, "Functions of Matrices" (2008), Ch. 6: the coupled Newton–Schulz iteration for A^{1/2} and A^{-1/2}
        (the sign-function Newton–Schulz iteration of Ch. 5 applied to [[0, A], [I, 0]]); public coupled
        inverse-root iterations: facebookresearch/optimizers distributed_shampoo/utils/matrix_functions.py.
    Wang et al. (2024), 4-bit Shampoo: Eq. 2 (Björck rectification), App. B (subspace iteration).
    Halko, Martinsson & Tropp (2011): randomized range finder (Alg. 4.1 / 4.4) and direct SVD (Alg. 5.1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from structbench.errors import SolverError
from structbench.optim.precision import exact_float32

NS_QUINTIC: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
"""Muon's tuned quintic coefficients (Jordan et al. 2024): singular values land near [0.7, 1.2], not at 1."""

NS_CUBIC: tuple[float, float, float] = (1.5, -0.5, 0.0)
"""Classic cubic Newton–Schulz (Higham 2008): X <- 1.5 X - 0.5 X X^T X, converges quadratically to U V^T."""

NS_NORMALIZATIONS = ("frobenius", "spectral")
TRUNCATED_SVD_METHODS = ("exact", "randomized")

_LAMBDA_MAX_FLOOR = 1e-16  # scalable_shampoo's floor on lambda_max before it scales the ridge


def _check_matrix(x: Tensor, name: str) -> None:
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., m, n); got shape {tuple(x.shape)}")


def _check_square(x: Tensor, name: str) -> None:
    _check_matrix(x, name)
    if x.size(-1) != x.size(-2):
        raise ValueError(f"{name} must be square in its last two dims; got shape {tuple(x.shape)}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 when the input already is float64."""
    return torch.promote_types(dtype, torch.float32)


def _is_device_error(err: RuntimeError) -> bool:
    """Whether `err` is the device's failure (torch.AcceleratorError; a RuntimeError "CUDA error: ..." in torch before
    2.8), not the solver's."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    return (accelerator_error is not None and isinstance(err, accelerator_error)) or str(err).startswith("CUDA error")


def _solve_with_retry(
    solve: Callable[[Tensor], tuple[Tensor, ...]],
    x: Tensor,
    what: str,
) -> tuple[Tensor, ...]:
    """Run `solve` on x in float32 (float64 input: in float64); retry in float64 if it raises or returns
    non-finite values.

    Out-of-memory errors propagate unchanged (the runner records them as `oom`), and so do device errors
    (`torch.AcceleratorError` from torch 2.8, "CUDA error: ..." before: a device-side assert, an illegal memory
    access), which poison the device's context and
    are never a solver's failure (the runner records the run `error` and the device unusable).
    """
    cause: RuntimeError | None = None
    for dtype in dict.fromkeys((_compute_dtype(x.dtype), torch.float64)):
        try:
            out = solve(x.to(dtype))
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as err:  # torch.linalg.LinAlgError is a RuntimeError
            if _is_device_error(err):
                raise
            cause = err.with_traceback(None)  # its frames (and their tensors) are not kept alive by the chain
            continue
        if all(bool(torch.isfinite(t).all()) for t in out):
            return out
        cause = None
    reason = f"raised {cause!r}" if cause is not None else "returned non-finite values"
    raise SolverError(f"{what} failed in float32 and float64: the float64 retry {reason}") from cause


def _symmetric_in_compute_dtype(a: Tensor, symmetric: bool) -> Tensor:
    """`a` in float32 (float64 for float64 input), symmetrized unless the caller says it is symmetric already."""
    x = a.to(_compute_dtype(a.dtype))
    return x if symmetric else symmetrize(x)


def _qr_positive(y: Tensor) -> tuple[Tensor, Tensor]:
    """Reduced QR with diag(R) >= 0, which makes the factorization unique for full-rank Y."""
    q, r = torch.linalg.qr(y, mode="reduced")
    diag = torch.diagonal(r, dim1=-2, dim2=-1)
    signs = torch.where(diag < 0, -1.0, 1.0).to(q.dtype)
    return q * signs.unsqueeze(-2), r * signs.unsqueeze(-1)


@dataclass(frozen=True)
class Orthonormalized:
    """What `cholesky_qr2` returned: the Q factors and which matrices took the Householder fallback."""

    q: Tensor
    """(..., m, n) Q of X = Q R with diag(R) > 0, in the input dtype."""
    fallbacks: tuple[int, ...]
    """Indices (into the flattened batch) of the matrices whose Q came from Householder QR."""


QR_ORTHOGONALITY_LEVEL = 8.0
"""c in `cholesky_qr2_tolerance`'s c n sqrt(m) u: 2 lambda with lambda = 4 (see there)."""


def cholesky_qr2_tolerance(m: int, n: int, dtype: torch.dtype) -> float:
    """||Q^T Q - I||_F that `cholesky_qr2` accepts for an (m, n) X computed in `dtype` (unit roundoff u): the level
    of Householder QR's own Q, tau = c n sqrt(m) u, c = `QR_ORTHOGONALITY_LEVEL` = 8 (about 1e-2 at 768 x 768 and
    8e-2 at 3072 x 3072 in float32).

    Derivation. Householder QR's computed Q_hat is within sqrt(n) gamma~_{mn} of an orthonormal Q in the Frobenius
    norm (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed. 2002, Sec. 19.3), so ||Q_hat^T Q_hat -
    I||_F <= 2 sqrt(n) gamma~_{mn} to first order, gamma~_{mn} about m n u: n reflections, each through sums of m
    terms, every rounding error at its bound and of one sign. Under the probabilistic model of Higham & Mary ("A new
    approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019: rounding errors independent
    and of mean zero) k such errors add up to lambda sqrt(k) u instead of k u, with probability at least
    1 - 2 k exp(-lambda^2 (1 - u)^2 / 2); then 2 sqrt(n) m n u becomes 2 lambda sqrt(n) sqrt(m n) u =
    2 lambda n sqrt(m) u. lambda = 4 is a stated margin, not that guarantee (which needs lambda about 6 at
    k = 1e4). The same replacement turns the CholeskyQR2 bound 6 (m n u + n (n + 1) u) of Yamamoto, Nakatsukasa,
    Yanagisawa & Fukaya (2015) into about 12 lambda n sqrt(m) u: its constant 6 is a worst case of its own, and
    in our tests both Householder's and Cholesky-QR2's Q are within 0.5 n sqrt(m) u (float32, 8 <= n <= 768,
    unit-column inputs of condition 1 to 1e3), a factor 16 below tau. This is a model, not a proof: a
    Cholesky-QR2 result beyond tau is further from orthonormal than Householder QR's usually is, and is recomputed
    by it (counted), so no basis worse than that level reaches the caller. One Cholesky-QR pass over unit columns
    of condition kappa leaves about kappa^2 u (6e-2 at kappa = 1e3 in float32), far beyond tau: the second pass is
    what passes the check.
    """
    u = torch.finfo(_compute_dtype(dtype)).eps / 2
    return QR_ORTHOGONALITY_LEVEL * n * math.sqrt(m) * u


def _cholesky_qr(x: Tensor, eye: Tensor) -> tuple[Tensor, Tensor]:
    """One Cholesky-QR pass over a (k, m, n) stack: R = chol(X^T X)^T, Q = X R^{-1} by a triangular solve. Returns
    (Q, ok), ok (k,) bool where the Cholesky factorisation succeeded; a failed one solves with I instead, so that
    its Q stays finite (the caller replaces it)."""
    lower, info = torch.linalg.cholesky_ex(x.mT @ x)
    ok = info == 0
    lower = torch.where(ok[:, None, None], lower, eye)
    return torch.linalg.solve_triangular(lower.mT, x, upper=True, left=False), ok


@exact_float32
def cholesky_qr2(x: Tensor, tol: float | None = None) -> Orthonormalized:
    """Q of X = Q R (diag(R) > 0) for a stack (..., m, n), m >= n, by Cholesky-QR2 with a Householder fallback.

    Each matrix's columns are first scaled to unit norm (Q is unchanged: X D = Q (R D) for a positive diagonal D),
    so the condition number that matters is that of X with unit columns, and the Gram's entries stay in [-1, 1]
    (no overflow or underflow of the squares). Then two Cholesky-QR passes (Yamamoto, Nakatsukasa, Yanagisawa &
    Fukaya, "Roundoff error analysis of the CholeskyQR2 algorithm", ETNA 44, 2015): R1 = chol(X^T X)^T, Q1 = X R1^{-1},
    then the same on Q1; both factorisations and triangular solves are batched (on CUDA, one call for the stack).
    The first pass's Q1 is within about kappa^2 u of orthonormal, the second's to rounding level, while kappa < about
    u^{-1/2} (4096 in float32): the paper proves ||Q^T Q - I||_F <= 6 (m n u + n (n + 1) u) and ||Q R - X||_F <=
    5 n^2 sqrt(n) u ||X||_2 when 8 kappa sqrt(m n u + n (n + 1) u) <= 1. R = R2 R1 has a positive diagonal, so Q is
    QR's Q with diag(R) > 0 (linalg's `_qr_positive`): its columns may differ in sign from `torch.linalg.qr`'s.

    A matrix whose Cholesky factorisation fails (`cholesky_ex`'s info; X numerically rank-deficient, or
    non-finite) or whose ||Q^T Q - I||_F exceeds `tol` (default `cholesky_qr2_tolerance`, the level of Householder
    QR's own Q, far below the paper's bound at large n: a Q the theorem allows but Householder would beat falls back)
    is recomputed by Householder QR with diag(R) >= 0 and listed in `fallbacks`: one host read of the stack's checks
    per call. Float32 (float64 for float64 input); returned in the input dtype.
    """
    _check_matrix(x, "x")
    m, n = x.shape[-2:]
    if m < n:
        raise ValueError(f"x must have at least as many rows as columns; got shape {tuple(x.shape)}")
    dtype = _compute_dtype(x.dtype)
    limit = cholesky_qr2_tolerance(m, n, dtype) if tol is None else tol
    work = x.reshape(-1, m, n).to(dtype)
    norms = torch.linalg.vector_norm(work, dim=-2, keepdim=True)
    eye = torch.eye(n, dtype=dtype, device=x.device)
    first, first_ok = _cholesky_qr(work / norms.clamp_min(torch.finfo(dtype).tiny), eye)
    q, second_ok = _cholesky_qr(first, eye)
    defect = torch.linalg.matrix_norm(q.mT @ q - eye)
    good = first_ok & second_ok & (defect <= limit)  # a NaN defect compares False
    fallbacks = tuple(i for i, fine in enumerate(good.tolist()) if not fine)
    if fallbacks:
        index = torch.tensor(fallbacks, device=x.device)
        q = q.index_copy(0, index, _qr_positive(work[index])[0])
    return Orthonormalized(q.reshape(x.shape).to(x.dtype), fallbacks)


def symmetrize(a: Tensor) -> Tensor:
    """(A + A^T) / 2 over the last two dims."""
    _check_square(a, "a")
    return (a + a.mT) / 2


def polar_svd(g: Tensor) -> Tensor:
    """Polar factor U_r V_r^T of G = U S V^T (reduced SVD), e.g. SUMO's Orthogonalization_SVD.

    For rank-deficient G only the r singular directions with s > max(m, n) * eps * s_max are kept (the
    compact polar factor, ASGO eq. 11): a zero singular value maps to zero, as it does under Newton–Schulz,
    instead of to an arbitrary unit direction. Computed in float32 (float64 for float64 input) with a float64
    retry; returned in the input dtype.
    """
    _check_matrix(g, "g")

    def orth(x: Tensor) -> tuple[Tensor, ...]:
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        tol = max(x.shape[-2:]) * torch.finfo(x.dtype).eps * s[..., :1]
        return ((u * (s > tol).to(x.dtype).unsqueeze(-2)) @ vh,)

    (o,) = _solve_with_retry(orth, g, "SVD")
    return o.to(g.dtype)


def newton_schulz(
    g: Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = NS_QUINTIC,
    eps: float = 1e-7,
    dtype: torch.dtype | None = None,
    *,
    normalize: str = "frobenius",
    cast_back: bool = True,
) -> Tensor:
    """Newton–Schulz approximation of the polar factor U V^T (Muon's NS5, Jordan et al. 2024).

    X0 = G / (||G|| + eps) per matrix, with G cast to the iteration dtype first and ||G||_F computed in it, as
    in torch.optim.Muon (a bfloat16 norm is accumulated in float32 and rounded once); then `steps` times
    A = X X^T, B = b A + c A^2, X = a X + B X with (a, b, c) = `coefficients`; B and X are each one fused
    addmm / baddbmm, rounded once, as in torch.optim.Muon and pytorch_optimizer (bfloat16 results match
    theirs bit for bit; Jordan's reference rounds b A, (c A) A and their sum separately, so it differs in the
    last bits). Tall inputs are transposed so that A is the smaller Gram matrix.
    `NS_QUINTIC` is Muon's iteration (singular values end near [0.7, 1.2]); `NS_CUBIC` is the classic
    iteration (Higham 2008), which converges to U V^T when the normalized singular values lie in (0, sqrt 3).

    `normalize` picks ||G||: "frobenius" (Muon's, cheap) or "spectral" (the X0 of SUMO's Lemma 3.2 proof,
    costs an SVD; for analysis). `dtype` is the iteration dtype: None means bfloat16 on CUDA and float32
    elsewhere. The input is never modified; the result has the input dtype, or with `cast_back=False` the
    iteration dtype (for a caller that applies it with a mixed-dtype op, sparing a float32 copy).
    """
    _check_matrix(g, "g")
    if steps < 0:
        raise ValueError(f"steps must be >= 0; got {steps}")
    if normalize not in NS_NORMALIZATIONS:
        raise ValueError(f"unknown normalize {normalize!r}; valid: {', '.join(NS_NORMALIZATIONS)}")
    if dtype is None:
        dtype = torch.bfloat16 if g.device.type == "cuda" else torch.float32
    a, b, c = coefficients
    transpose = g.size(-2) > g.size(-1)
    x = (g.mT if transpose else g).to(dtype)
    if normalize == "frobenius":
        norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    else:
        norm = torch.linalg.matrix_norm(x.to(_compute_dtype(dtype)), ord=2, keepdim=True)
    x = x / (norm + eps).to(dtype)
    batch_shape = x.shape[:-2]
    if x.dim() > 3:
        x = x.reshape(-1, *x.shape[-2:])
    fused = torch.baddbmm if x.dim() == 3 else torch.addmm
    for _ in range(steps):
        gram = x @ x.mT
        poly = fused(gram, gram, gram, beta=b, alpha=c) if c != 0.0 else b * gram
        x = fused(x, poly, x, beta=a)
    x = x.reshape(*batch_shape, *x.shape[-2:])
    x = x.mT if transpose else x
    return x.to(g.dtype) if cast_back else x


def eigh_with_retry(a: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric eigendecomposition of (A + A^T)/2: float32, retried in float64 (see the module doc).

    Returns (eigenvalues ascending, eigenvectors as columns), both float32. Raises SolverError when the
    float64 retry also raises or returns non-finite values.
    """
    _check_square(a, "a")

    def decompose(x: Tensor) -> tuple[Tensor, ...]:
        evals, evecs = torch.linalg.eigh(symmetrize(x))
        return evals, evecs

    evals, evecs = _solve_with_retry(decompose, a, "eigh")
    return evals.to(torch.float32), evecs.to(torch.float32)


def inverse_root_eigh(a: Tensor, p: float, eps: float = 1e-6, relative_eps: bool = True) -> Tensor:
    """(A + ridge I)^{-1/p} for symmetric PSD A by eigendecomposition, returned in float32.

    Eigenvalues are clamped at 0 before the ridge is added. ridge = eps * lambda_max(A) when
    `relative_eps` (scalable_shampoo / 4-bit Shampoo Alg. 2: Lambda + max(lambda) eps I; lambda_max is
    floored at 1e-16 as there), else ridge = eps.
    """
    if p <= 0:
        raise ValueError(f"p must be > 0; got {p}")
    evals, evecs = eigh_with_retry(a)
    evals = evals.clamp_min(0.0)
    if relative_eps:
        ridge = eps * evals[..., -1:].clamp_min(_LAMBDA_MAX_FLOOR)
        roots = (evals + ridge).pow(-1.0 / p)
    else:
        roots = (evals + eps).pow(-1.0 / p)
    return (evecs * roots.unsqueeze(-2)) @ evecs.mT


def power_iteration(
    a: Tensor,
    iters: int = 10,
    tol: float = 1e-6,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Largest eigenvalue of symmetric PSD A by power iteration (scalable_shampoo's PowerIter).

    Start vector uniform in (-1, 1), drawn from `generator` (default: a fresh generator seeded 0, so the
    result is deterministic and the global RNG is untouched); stops after `iters` steps or once every
    Rayleigh quotient changes by at most `tol`. Returns shape (...) in float32 (float64 for float64 A).
    """
    _check_square(a, "a")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    dtype = _compute_dtype(a.dtype)
    x = a.to(dtype)
    v = torch.rand(*a.shape[:-1], 1, generator=gen, device=gen.device, dtype=dtype) * 2 - 1
    v = v.to(a.device)
    estimate = torch.zeros(a.shape[:-2], dtype=dtype, device=a.device)
    for _ in range(iters):
        v = v / torch.linalg.vector_norm(v, dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        w = x @ v
        new_estimate = (v * w).sum(dim=(-2, -1))
        converged = bool(((new_estimate - estimate).abs() <= tol).all())
        estimate, v = new_estimate, w
        if converged:
            break
    return estimate


def inverse_root_newton(
    a: Tensor,
    p: int,
    eps: float = 1e-6,
    max_iters: int = 100,
    tol: float = 1e-6,
    *,
    relative_eps: bool = True,
    power_iters: int = 10,
    symmetrize_input: bool = True,
) -> Tensor:
    """(A + ridge I)^{-1/p} for symmetric PSD A by the coupled Newton iteration (Guo & Higham 2006, Eq. 3.2).

    As in scalable_shampoo / 4-bit Shampoo's 32-bit baseline (Alg. 4): ridge = eps * lambda_max with
    lambda_max from `power_iters` power-iteration steps (else ridge = eps); z = (1 + p) / (2 ||A||_F),
    M = z A, X = z^{1/p} I; each step T = (1 + 1/p) I - M / p, X <- X T, M <- T^p M. A matrix stops once
    max|M - I| <= tol, and keeps its previous X (stops) when that error grows by more than 1.2x.
    Computed and returned in float32. Raises SolverError if the result is not finite. A is replaced by
    (A + A^T) / 2 first unless `symmetrize_input` is False, which iterates on A as given (scalable_shampoo's
    ComputePower does not symmetrize: a dequantized statistic of naive 4-bit Shampoo is not symmetric).
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be a positive int; got {p!r}")
    _check_square(a, "a")
    x = a.to(torch.float32)
    x = symmetrize(x) if symmetrize_input else x
    eye = torch.eye(x.size(-1), dtype=x.dtype, device=x.device)
    if relative_eps:
        lambda_max = power_iteration(x, iters=power_iters).clamp_min(_LAMBDA_MAX_FLOOR)
        x = x + (eps * lambda_max)[..., None, None] * eye
    else:
        x = x + eps * eye
    z = ((1 + p) / (2 * torch.linalg.matrix_norm(x)))[..., None, None]
    m = z * x
    root = z.pow(1.0 / p) * eye
    error = (m - eye).abs().amax(dim=(-2, -1))
    active = error > tol
    for _ in range(max_iters):
        if not bool(active.any()):
            break
        t = (1 + 1.0 / p) * eye - m / p
        new_root = root @ t
        new_m = torch.linalg.matrix_power(t, p) @ m
        new_error = (new_m - eye).abs().amax(dim=(-2, -1))
        accept = active & (new_error <= 1.2 * error)
        root = torch.where(accept[..., None, None], new_root, root)
        m = torch.where(accept[..., None, None], new_m, m)
        error = torch.where(accept, new_error, error)
        active = accept & (error > tol)
    if not bool(torch.isfinite(root).all()):
        raise SolverError("coupled Newton inverse root returned non-finite values")
    return root


@dataclass(frozen=True)
class InverseSqrt:
    """What `inverse_sqrt_newton_schulz` found: the root, its residual and how many updates it took."""

    root: Tensor
    """(..., d, d) estimate Z of A^{-1/2}, symmetric, float32 (float64 for float64 input)."""
    residual: Tensor
    """(...,) ||Z A Z - I||_F / sqrt(d) of the returned Z, computed in the iteration dtype."""
    converged: Tensor
    """(...,) bool: residual <= tol. A matrix that did not converge returns its best iterate."""
    iterations: int
    """Newton–Schulz updates made (the most any matrix of the batch took)."""


def _rms_residual(product: Tensor, eye: Tensor) -> Tensor:
    """||P - I||_F / sqrt(d) per matrix of a (..., d, d) stack: the RMS entry of P - I."""
    return torch.linalg.matrix_norm(product - eye) / product.size(-1) ** 0.5


PROBE_MARGIN = 2.0
"""A warm start is accepted on probes alone only when their residual estimate is below tol / PROBE_MARGIN."""


@exact_float32
def inverse_sqrt_newton_schulz(
    a: Tensor,
    init: Tensor | None = None,
    *,
    tol: float = 1e-4,
    max_iters: int = 40,
    probes: int = 0,
    symmetric: bool = False,
) -> InverseSqrt:
    """A^{-1/2} of symmetric positive definite A by Newton–Schulz iterations: matrix products only.

    Cold start (`init` None): the coupled iteration (Higham 2008, Ch. 6) Y_0 = A / c, Z_0 = I with
    c = ||A||_F >= lambda_max (so the spectrum of Y_0 lies in (0, 1], inside the (0, 3) where it converges);
    T_k = (3I - Z_k Y_k) / 2, Y_{k+1} = Y_k T_k, Z_{k+1} = T_k Z_k; Z_k -> (A / c)^{-1/2} quadratically once
    ||Z_k Y_k - I|| < 1, and the coupled form is stable in floating point; the root is Z / sqrt(c). From a
    cold start a small eigenvalue lambda needs about log(c / lambda) / log(2.25) updates before the quadratic
    phase.

    Warm start (`init` = Z_0, e.g. the root of the previous step's A): the coupled pair needs a start that
    commutes with A (from any other start it converges to some pair with Z Y = I, not to A's root), so the warm
    start iterates the equivalent single sequence Z_{k+1} = sym(Z_k (3I - Z_k A Z_k) / 2), whose only SPD fixed
    point is A^{-1/2} (Z A Z = I). Linearised at the root, the error's component along eigenvectors i, j of A
    is multiplied by |1/2 - (r + 1/r) / 4| per update, r = sqrt(lambda_i / lambda_j): 0 for commuting errors
    (quadratic convergence), below 1 only while cond(A) < 34 for the rest. So a warm start converges in a few
    updates when A moved little and is well conditioned, and can diverge otherwise: the residual check below
    stops a matrix whose residual grows (it keeps its best iterate and reports not converged), and the caller
    falls back (to a cold start, then an eigendecomposition).

    Residual check: ||Z A Z - I||_F / sqrt(d) <= tol per matrix, on the returned Z (for the warm start the
    products that form the next update measure it; for the cold start it is formed once at the end). Each
    update costs three d x d products. With `probes` = s > 0 a warm start is first checked on s Gaussian
    probe vectors V (fixed seed 0): ||(Z A Z - I) V||_F / ||V||_F estimates the residual at O(d^2 s) cost
    (its square is unbiased for the squared residual), and a matrix whose estimate is at most
    tol / PROBE_MARGIN keeps `init` with no d x d product; in the worst case, a rank-one Z A Z - I whose
    direction is independent of the probes, a root with residual above tol passes only when a chi-square(s)
    variable falls below s / 4 (s = 64: probability below 2e-9 by the Chernoff bound (x e^{1-x})^{s/2},
    x = 1/4). The others take the full iteration with at least one update (having paid for Z A Z, one more
    product brings the residual to rounding level, so that the probes keep the root for the next steps), and
    after each update the same probes accept the new iterate (all of the stack's active matrices below
    tol / PROBE_MARGIN) before the two products of a full check are spent.
    Computed in float32 (float64 for float64 input); `a` and `init`
    are not modified. Both are symmetrized first, unless the caller passes `symmetric=True` for inputs that are
    symmetric already (a d x d transposed sum costs as much memory traffic as several products' worth of small
    operations on large d).
    """
    _check_square(a, "a")
    if max_iters < 0 or not tol > 0:
        raise ValueError(f"max_iters must be >= 0 and tol > 0; got {max_iters}, {tol}")
    x = _symmetric_in_compute_dtype(a, symmetric)
    eye = torch.eye(x.size(-1), dtype=x.dtype, device=x.device)
    if init is None:
        return _coupled_newton_schulz(x, eye, tol, max_iters)
    if init.shape != a.shape:
        raise ValueError(f"init must have a's shape {tuple(a.shape)}; got {tuple(init.shape)}")
    z = _symmetric_in_compute_dtype(init.to(x.dtype), symmetric)
    if probes <= 0 or x.dim() != 3:
        return _warm_newton_schulz(x, z, eye, tol, max_iters, 0)
    estimate = _probe_residual(x, z, probes)
    rest = [i for i, value in enumerate(estimate.tolist()) if value > tol / PROBE_MARGIN]
    if not rest:
        return InverseSqrt(z, estimate, estimate <= tol, 0)
    found = _warm_newton_schulz(x[rest], z[rest], eye, tol, max_iters, probes)
    z, residual = z.clone(), estimate.clone()
    z[rest], residual[rest] = found.root, found.residual
    return InverseSqrt(z, residual, residual <= tol, found.iterations)


@exact_float32
def inverse_sqrt_warm_updates(
    a: Tensor, init: Tensor, *, updates: int = 1, tol: float = 1e-4, symmetric: bool = False
) -> InverseSqrt:
    """A^{-1/2} of symmetric positive definite A from a warm start, with no host read: for a GPU's steady state.

    Exactly `updates` updates of `inverse_sqrt_newton_schulz`'s warm iteration Z <- sym(Z (3I - Z A Z) / 2) on every
    matrix of the stack, each kept only where it lowers the residual ||Z A Z - I||_F / sqrt(d) (a device-side
    choice, `torch.where`): the returned root's residual never exceeds `init`'s, so the worst a matrix can get is
    its warm start back. Its symmetric error E = Z - A^{-1/2} satisfies, to first order in E,
    ||E||_F <= ||Z A Z - I||_F / (2 sqrt(lambda_min(A))) = (residual sqrt(d) / 2) ||A^{-1/2}||_2 (in A's eigenbasis
    each entry of Z A Z - I is E_ij (sqrt(lambda_i) + sqrt(lambda_j))). The iteration contracts error components
    between eigenvalues lambda_i, lambda_j only while their ratio is below about 34 (`inverse_sqrt_newton_schulz`),
    so on an ill-conditioned A that moved it may stall: `converged` (residual <= tol, on the device) says which
    matrices need the caller's fallback, which the caller reads later (`structbench.optim.deferred`). Each update
    costs three d x d products, the first residual two. Float32 (float64 for float64 input).
    """
    _check_square(a, "a")
    if init.shape != a.shape:
        raise ValueError(f"init must have a's shape {tuple(a.shape)}; got {tuple(init.shape)}")
    if updates < 1 or not tol > 0:
        raise ValueError(f"updates must be >= 1 and tol > 0; got {updates}, {tol}")
    x = _symmetric_in_compute_dtype(a, symmetric)
    z = _symmetric_in_compute_dtype(init.to(x.dtype), symmetric)
    eye = torch.eye(x.size(-1), dtype=x.dtype, device=x.device)
    product = z @ (x @ z)
    residual = _rms_residual(product, eye)
    for _ in range(updates):
        half_step = _scaled_minus_product(z, product)
        candidate = (half_step + half_step.mT).mul_(0.25)
        new_product = candidate @ (x @ candidate)
        new_residual = _rms_residual(new_product, eye)
        better = (new_residual < residual)[..., None, None]
        z = torch.where(better, candidate, z)
        product = torch.where(better, new_product, product)
        residual = torch.minimum(new_residual, residual)
    return InverseSqrt(z, residual, residual <= tol, updates)


def coupled_newton_schulz_updates(condition: float, tol: float) -> int:
    """The coupled updates `inverse_sqrt_cold_updates` makes so that, in exact arithmetic, every eigenvalue lambda
    of A with ||A||_F / lambda <= `condition` ends with |1 - x| <= `tol`: x_0 = lambda / ||A||_F, x <- x (3 - x)^2 / 4
    (the eigenvalue of Z_k Y_k; it rises monotonically to 1 from (0, 1], so the smallest x_0 takes the most)."""
    if not condition >= 1.0 or not 0.0 < tol < 1.0:
        raise ValueError(f"condition must be >= 1 and tol in (0, 1); got {condition}, {tol}")
    x, updates = 1.0 / condition, 0
    while 1.0 - x > tol:
        x, updates = x * (3.0 - x) ** 2 / 4.0, updates + 1
    return updates


@exact_float32
def inverse_sqrt_cold_updates(a: Tensor, *, updates: int, tol: float = 1e-2, symmetric: bool = False) -> InverseSqrt:
    """A^{-1/2} of symmetric positive definite A by exactly `updates` coupled Newton–Schulz updates from a cold start,
    with no host read: for a GPU's steady state where no warm start is close enough (`inverse_sqrt_warm_updates`).

    The iteration of `inverse_sqrt_newton_schulz`'s cold start (Higham 2008, Ch. 6): Y_0 = A / c, Z_0 = I,
    c = ||A||_F; T = (3I - Z Y) / 2, Y <- Y T, Z <- T Z; the root is sym(Z) / sqrt(c). Z_k and Y_k are polynomials
    in A, so each eigenvalue lambda follows the scalar x <- x (3 - x)^2 / 4 from x_0 = lambda / c: a fixed count
    converges for every matrix with ||A||_F / lambda_min up to the condition `coupled_newton_schulz_updates` gives
    for it, and the coupled form is stable in floating point (Higham 2008, Ch. 6), so the updates made after
    convergence stay at rounding level (no keep-best choice is needed). The returned residual is that of the root
    itself, ||Z A Z - I||_F / sqrt(d) (two more products), and `converged` (residual <= tol, on the device) says which
    matrices the caller should repair: one with an eigenvalue still far from converged (|1 - x| near 1) has a
    residual of at least about 1 / sqrt(d), above any tol below that. Each update costs three d x d products (the
    first two).
    Float32 (float64 for float64 input); `a` is not modified, and is symmetrized first unless `symmetric`.
    """
    _check_square(a, "a")
    if updates < 1 or not tol > 0:
        raise ValueError(f"updates must be >= 1 and tol > 0; got {updates}, {tol}")
    x = _symmetric_in_compute_dtype(a, symmetric)
    eye = torch.eye(x.size(-1), dtype=x.dtype, device=x.device)
    scale = torch.linalg.matrix_norm(x).clamp_min(torch.finfo(x.dtype).tiny)[..., None, None]
    y = x / scale
    z = eye.expand_as(x)
    product = y
    for update in range(updates):
        if update:
            product = z @ y
        step = torch.add(eye, product, alpha=-1.0 / 3.0).mul_(1.5)
        y, z = y @ step, step @ z
    root = (z + z.mT).mul_(0.5) / scale.sqrt()
    residual = _rms_residual(root @ (x @ root), eye)
    return InverseSqrt(root, residual, residual <= tol, updates)


def _scaled_minus_product(z: Tensor, product: Tensor) -> Tensor:
    """Z (3I - P) = 3 Z - Z P, as one fused product where the stack is 2- or 3-dimensional."""
    if z.dim() == 2:
        return torch.addmm(z, z, product, beta=3.0, alpha=-1.0)
    if z.dim() == 3:
        return torch.baddbmm(z, z, product, beta=3.0, alpha=-1.0)
    return 3.0 * z - z @ product


def _where(mask: Tensor, chosen: Tensor, other: Tensor) -> Tensor:
    """Per matrix of a stack, `chosen` where `mask` holds, else `other` (no copy when the mask is all one way)."""
    if bool(mask.all()):
        return chosen
    if not bool(mask.any()):
        return other
    return torch.where(mask[..., None, None], chosen, other)


def _probe_residual(x: Tensor, z: Tensor, probes: int) -> Tensor:
    """`inverse_sqrt_probe_residual` with `probes` Gaussian probe vectors drawn for the call (`gaussian_probes`)."""
    return inverse_sqrt_probe_residual(x, z, gaussian_probes(x.size(-1), probes, dtype=x.dtype, device=x.device))


def _warm_newton_schulz(x: Tensor, z: Tensor, eye: Tensor, tol: float, max_iters: int, probes: int) -> InverseSqrt:
    """The warm iteration; with probes (> 0) every matrix takes at least one update."""

    def residual_of(root: Tensor) -> tuple[Tensor, Tensor]:
        product = root @ (x @ root)
        return product, _rms_residual(product, eye)

    product, residual = residual_of(z)
    active = residual > (0.0 if probes > 0 else tol)
    iterations = 0
    while iterations < max_iters and bool(active.any()):
        half_step = _scaled_minus_product(z, product)
        candidate = _where(active, (half_step + half_step.mT).mul_(0.25), z)
        iterations += 1
        if probes > 0:
            estimate = _probe_residual(x, candidate, probes)
            if bool((estimate[active] <= tol / PROBE_MARGIN).all()):
                residual = torch.where(active, estimate, residual)
                return InverseSqrt(candidate, residual, active | (residual <= tol), iterations)
        new_product, new_residual = residual_of(candidate)
        better = active & (new_residual < residual)
        z = _where(better, candidate, z)
        product = _where(better, new_product, product)
        residual = torch.where(better, new_residual, residual)
        active = better & (residual > tol)
    return InverseSqrt(z, residual, residual <= tol, iterations)


def _coupled_newton_schulz(x: Tensor, eye: Tensor, tol: float, max_iters: int) -> InverseSqrt:
    scale = torch.linalg.matrix_norm(x).clamp_min(torch.finfo(x.dtype).tiny)[..., None, None]
    y = x / scale
    z = eye.expand_as(x).clone()
    product = y
    residual = _rms_residual(product, eye)
    active = residual > tol
    iterations = 0
    while iterations < max_iters and bool(active.any()):
        step = 0.5 * (3.0 * eye - product)
        new_y, new_z = y @ step, step @ z
        new_product = new_z @ new_y
        new_residual = _rms_residual(new_product, eye)
        iterations += 1
        better = active & (new_residual < residual)
        y = _where(better, new_y, y)
        z = _where(better, new_z, z)
        product = _where(better, new_product, product)
        residual = torch.where(better, new_residual, residual)
        active = better & (residual > tol)
    root = symmetrize(z) / scale.sqrt()
    residual = _rms_residual(symmetrize(root @ x @ root), eye)
    return InverseSqrt(root, residual, residual <= tol, iterations)


def bjorck_orthonormalize(v: Tensor, steps: int = 1) -> Tensor:
    """Björck orthonormalization V <- 1.5 V - 0.5 V V^T V, `steps` times (4-bit Shampoo Eq. 2).

    Converges quadratically to the nearest matrix with orthonormal columns (rows, if wide) when V's
    singular values lie in (0, sqrt 3). Computed in at least float32; returned in the input dtype.
    """
    _check_matrix(v, "v")
    x = v.to(_compute_dtype(v.dtype))
    tall = x.size(-2) >= x.size(-1)
    for _ in range(steps):
        cubic = x @ (x.mT @ x) if tall else (x @ x.mT) @ x
        x = 1.5 * x - 0.5 * cubic
    return x.to(v.dtype)


def subspace_iteration(a: Tensor, q: Tensor, iters: int = 1) -> Tensor:
    """Subspace (orthogonal) iteration Q <- qr(A Q), `iters` times (4-bit Shampoo App. B; SOAP's refresh).

    a: (..., n, n); q: (..., n, k) warm start. Returns the reduced-QR factor with diag(R) >= 0 (unique,
    hence deterministic), computed in at least float32 and returned in q's dtype.
    """
    _check_square(a, "a")
    _check_matrix(q, "q")
    dtype = _compute_dtype(torch.promote_types(a.dtype, q.dtype))
    x, basis = a.to(dtype), q.to(dtype)
    for _ in range(iters):
        basis, _ = _qr_positive(x @ basis)
    return basis.to(q.dtype)


def _sketch_basis(g: Tensor, width: int, power_iters: int, generator: torch.Generator | None) -> Tensor:
    """Orthonormal (..., m, width) basis of range(G Omega), Omega Gaussian (HMT Alg. 4.1 / 4.4)."""
    device = generator.device if generator is not None else g.device
    shape = (*g.shape[:-2], g.size(-1), width)
    omega = torch.randn(shape, generator=generator, device=device, dtype=g.dtype).to(g.device)
    q, _ = _qr_positive(g @ omega)
    for _ in range(power_iters):
        w, _ = _qr_positive(g.mT @ q)
        q, _ = _qr_positive(g @ w)
    return q


def _check_rank(g: Tensor, rank: int, oversample: int, power_iters: int) -> None:
    _check_matrix(g, "g")
    limit = min(g.size(-2), g.size(-1))
    if not 1 <= rank <= limit:
        raise ValueError(f"rank must be in [1, {limit}] for shape {tuple(g.shape)}; got {rank}")
    if oversample < 0 or power_iters < 0:
        raise ValueError(f"oversample and power_iters must be >= 0; got {oversample}, {power_iters}")


def randomized_range_finder(
    g: Tensor,
    rank: int,
    oversample: int = 0,
    power_iters: int = 0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Orthonormal (..., m, rank) basis approximating G's top column space (Halko, Martinsson & Tropp 2011).

    Gaussian sketch of width rank + oversample (capped at min(m, n)) and `power_iters` re-orthonormalized
    power steps (HMT Alg. 4.4). With oversampling the sketch basis Q is cut back to Q U_rank, U_rank the
    top `rank` left singular vectors of Q^T G: the range of HMT's truncated approximation Q [Q^T G]_rank.
    Deterministic given `generator` (None: the global RNG). Computed in at least float32; returned in the
    input dtype.
    """
    _check_rank(g, rank, oversample, power_iters)
    x = g.to(_compute_dtype(g.dtype))
    width = min(rank + oversample, g.size(-2), g.size(-1))
    q = _sketch_basis(x, width, power_iters, generator)
    if width > rank:
        u, _, _ = _svd_with_retry(q.mT @ x)
        q = q @ u[..., :rank].to(q.dtype)
    return q.to(g.dtype)


def _svd_with_retry(x: Tensor) -> tuple[Tensor, ...]:
    def decompose(y: Tensor) -> tuple[Tensor, ...]:
        u, s, vh = torch.linalg.svd(y, full_matrices=False)
        return u, s, vh

    return _solve_with_retry(decompose, x, "SVD")


def truncated_svd(
    g: Tensor,
    rank: int,
    method: str = "exact",
    oversample: int = 5,
    power_iters: int = 2,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rank-r truncated SVD G ~ U diag(S) Vh: U (..., m, r), S (..., r) descending, Vh (..., r, n).

    method "exact": torch.linalg.svd (float32, float64 retry), truncated (GaLore's projector).
    method "randomized": HMT Alg. 5.1 — range finder of width rank + oversample with `power_iters` power
    steps, then the SVD of the small Q^T G (SUMO's Truncated_Randomized_SVD); deterministic given
    `generator`. `oversample`, `power_iters` and `generator` apply only to "randomized".
    Returned in the input dtype.
    """
    if method not in TRUNCATED_SVD_METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(TRUNCATED_SVD_METHODS)}")
    _check_rank(g, rank, oversample, power_iters)
    if method == "exact":
        u, s, vh = _svd_with_retry(g)
    else:
        x = g.to(_compute_dtype(g.dtype))
        width = min(rank + oversample, g.size(-2), g.size(-1))
        q = _sketch_basis(x, width, power_iters, generator)
        u_small, s, vh = _svd_with_retry(q.mT @ x)
        u = q @ u_small.to(q.dtype)
    return (
        u[..., :rank].to(g.dtype),
        s[..., :rank].to(g.dtype),
        vh[..., :rank, :].to(g.dtype),
    )


def from_eigenpairs(values: Tensor, vectors: Tensor) -> Tensor:
    """V diag(values) V^T for eigenvectors V (columns, shape (..., n, n)) and values (..., n).

    With values = f(lambda) for the eigenpairs (lambda, V) of a symmetric A, this is the matrix function f(A)
    (e.g. an inverse root). Computed in the inputs' dtype.
    """
    return (vectors * values.unsqueeze(-2)) @ vectors.mT


NS_POLAR_QUINTIC: tuple[float, float, float] = (15 / 8, -10 / 8, 3 / 8)
"""The inverse-free quintic polar iteration X <- X (15 I - 10 X^T X + 3 (X^T X)^2) / 8: the [2/0] member of the
Padé family of polar iterations (Kenney & Laub 1991; Higham 2008, Ch. 8), whose [1/0] member is the cubic Newton–Schulz
(`NS_CUBIC`). On each singular value it is f(x) = x (15 - 10 x^2 + 3 x^4) / 8: f'(x) = 15 (1 - x^2)^2 / 8 >= 0 and
f(x) >= x on [0, 1], so [0, 1] maps into itself and every singular value rises monotonically to 1, by the factor up to
15/8 per step while it is small and cubically near 1 (f is x times the Taylor series of (1 - z)^{-1/2}, z = 1 - x^2, cut
after z^2, so 1 - f(x) = x (5 z^3 / 16 + O(z^4)): about 2.5 e^3 at x = 1 - e); a zero singular value stays zero."""


@dataclass(frozen=True)
class PolarFactor:
    """What `polar_newton_schulz` found: the iterate and its orthonormality residual, all on the device."""

    polar: Tensor
    """(..., m, n) iterate X ~ U V^T, in the input dtype."""
    residual: Tensor
    """(...,) ||X X^T - I||_F / sqrt(k) over the smaller side k (X^T X for a tall X): the RMS entry of the Gram's
    distance from I, computed in the iteration dtype (non-finite for a non-finite input)."""
    converged: Tensor
    """(...,) bool: residual <= tol (False for a non-finite residual)."""


def polar_steps(smallest: float, tol: float, coefficients: tuple[float, float, float] = NS_POLAR_QUINTIC) -> int:
    """The fewest steps of the scalar polar map x <- a x + b x^3 + c x^5 after which x0 = `smallest` (in (0, 1]) has
    |x^2 - 1| <= tol: the steps that bring every singular value of X0 at or above `smallest` within tol of 1 for a
    map that is increasing on [0, 1] and fixes 1 (`NS_POLAR_QUINTIC`). Plain float arithmetic, no tensor."""
    if not 0 < smallest <= 1 or not 0 < tol < 1:
        raise ValueError(f"smallest must be in (0, 1] and tol in (0, 1); got {smallest}, {tol}")
    a, b, c = coefficients
    x, steps = smallest, 0
    while abs(x * x - 1) > tol:
        grown = a * x + b * x**3 + c * x**5
        if not grown > x:
            raise ValueError(f"the map {coefficients} does not raise {x} toward 1")
        x, steps = min(grown, 1.0), steps + 1
    return steps


def polar_newton_schulz(g: Tensor, steps: int, tol: float) -> PolarFactor:
    """Polar factor U V^T of G = U S V^T by `steps` steps of `NS_POLAR_QUINTIC` from X0 = G / ||G||_F, with no host
    read: a fixed number of products, and a residual check for the caller to read later.

    X0's singular values are s_i / ||G||_F in (0, 1], and step k maps each through f (singular vectors unchanged in
    exact arithmetic), so after K steps X = U f^K(S / ||G||_F) V^T: every singular value with s_i / ||G||_F >= x lies
    within tol of 1 once K >= `polar_steps(x, tol)`, and ||X - U V^T||_F <= ||X X^T - I||_F (|y - 1| <= |y^2 - 1| for
    y >= 0), the residual returned. A zero G gives X = 0 (the norm is floored at the dtype's smallest normal). Each
    step is `newton_schulz`'s three fused products (Gram, polynomial, update) on the smaller Gram, in float32 (float64
    for float64 input); the residual costs one more Gram.
    """
    _check_matrix(g, "g")
    if steps < 0 or not tol > 0:
        raise ValueError(f"steps must be >= 0 and tol > 0; got {steps}, {tol}")
    dtype = _compute_dtype(g.dtype)
    x = newton_schulz(
        g, steps, NS_POLAR_QUINTIC, eps=torch.finfo(dtype).tiny, dtype=dtype, normalize="frobenius", cast_back=False
    )
    wide = x.size(-2) <= x.size(-1)
    gram = x @ x.mT if wide else x.mT @ x
    eye = torch.eye(gram.size(-1), dtype=dtype, device=x.device)
    residual = _rms_residual(gram, eye)
    return PolarFactor(x.to(g.dtype), residual, residual <= tol)


def gaussian_probes(dim: int, count: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A (dim, count) Gaussian probe matrix V drawn on the CPU with seed 0 (the same on every device), moved to
    `device` once by the caller that keeps it (`inverse_sqrt_probe_residual` takes it, so that a step draws nothing
    and copies nothing to the device)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(dim, count, generator=generator, dtype=dtype, device="cpu").to(device)


@exact_float32
def inverse_sqrt_probe_residual(a: Tensor, z: Tensor, probes: Tensor) -> Tensor:
    """||(Z A Z - I) V||_F / ||V||_F per matrix of (..., d, d) stacks A, Z for a (d, s) probe matrix V: an estimate of
    the residual ||Z A Z - I||_F / sqrt(d) of a candidate inverse square root Z at O(d^2 s) cost and no host read
    (its square is unbiased for the squared residual when V is Gaussian; `inverse_sqrt_newton_schulz` bounds the
    chance that a root with residual above tol estimates below tol / PROBE_MARGIN). Non-finite A or Z give a
    non-finite estimate."""
    _check_square(a, "a")
    product = z @ (a @ (z @ probes))
    return torch.linalg.matrix_norm(product - probes) / torch.linalg.matrix_norm(probes)


POLAR_EXPRESS_INVERSE_SQRT: tuple[tuple[float, float, float], ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
"""The (a, b, c) triples of infinity-stars/ASGO `optimizers/utils/matrix_decom.py` (commit d3ef14b) lines 101-108,
`_matrix_inverse_root_PolarExpress`; the last one repeats."""

POLAR_EXPRESS_SAFETY = 1.01
"""matrix_decom.py line 111 (the first seven triples' a, b, c divided by 1.01, 1.01^3, 1.01^5) and line 116 (the
normaliser's factor)."""


def polar_express_schedule(steps: int) -> list[tuple[float, float, float]]:
    """The `steps` triples matrix_decom.py lines 111 and 119 run: all but the last of `POLAR_EXPRESS_INVERSE_SQRT`
    divided by the safety factor (a / 1.01, b / 1.01^3, c / 1.01^5), cut to `steps`, then the last repeated."""
    safe = [
        (a / POLAR_EXPRESS_SAFETY, b / POLAR_EXPRESS_SAFETY**3, c / POLAR_EXPRESS_SAFETY**5)
        for a, b, c in POLAR_EXPRESS_INVERSE_SQRT[:-1]
    ]
    safe.append(POLAR_EXPRESS_INVERSE_SQRT[-1])
    return safe[:steps] + [safe[-1]] * max(0, steps - len(safe))


@exact_float32
def inverse_sqrt_polar_express(a: Tensor, eps: float, steps: int) -> Tensor:
    """The inverse square root that infinity-stars/ASGO's released ASGO takes of its statistic: `steps` coupled
    PolarExpress iterations, `_matrix_inverse_root_PolarExpress` of `optimizers/utils/matrix_decom.py` (commit
    d3ef14beb8b3e5489e1ed9eb0a2a59565ac362ca) lines 112-125, for a stack (..., k, k).

    c = 1.01 ||A + eps I||_F (line 116), Y = A / c, Z = I (lines 117-118); for each (a, b, c') of
    `polar_express_schedule(steps)` (line 119): P = Z Y, B = b P + c' P^2, Y <- a Y + Y B, Z <- a Z + B Z (lines
    120-124); the root is Z / sqrt(c) (line 125). eps enters only the normaliser: the iteration approximates
    A^{-1/2}, not (A + eps I)^{-1/2}. Z and Y are polynomials in A, so each eigenvalue lambda of A follows the scalar
    s <- a s + b s^3 + c' s^5 from s = sqrt(lambda / c), and the root's eigenvalue is s_final / sqrt(lambda): equal
    to (lambda + eps)^{-1/2} only where s has converged to 1, which 10 iterations reach for lambda down to about
    1e-6 c (relative error 5e-5), not at 1e-8 c (4e-3) nor 1e-10 c (0.7, a gain three times too small).

    Float32, as the code's `G.float()` (line 112; float64 input stays float64), the input unmodified and not
    symmetrized (the code does not). Cost: 4 k x k products per iteration (P, P^2, Y B, B Z), no host read, no
    decomposition, so nothing to fail or retry; a zero A with eps 0 gives non-finite values, as in the code.
    """
    _check_square(a, "a")
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    x = a.to(_compute_dtype(a.dtype))
    eye = torch.eye(x.size(-1), dtype=x.dtype, device=x.device)
    normaliser = torch.linalg.matrix_norm(x + eps * eye, keepdim=True) * POLAR_EXPRESS_SAFETY
    y, z = x / normaliser, eye.expand_as(x)
    for a_coef, b_coef, c_coef in polar_express_schedule(steps):
        product = z @ y
        poly = b_coef * product + c_coef * product @ product
        y = a_coef * y + y @ poly
        z = a_coef * z + poly @ z
    return z / normaliser.sqrt()

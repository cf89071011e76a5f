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
    Wang et al. (2024), 4-bit Shampoo: Eq. 2 (Björck rectification), App. B (subspace iteration).
    Halko, Martinsson & Tropp (2011): randomized range finder (Alg. 4.1 / 4.4) and direct SVD (Alg. 5.1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from structbench.errors import SolverError

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


def _solve_with_retry(
    solve: Callable[[Tensor], tuple[Tensor, ...]],
    x: Tensor,
    what: str,
) -> tuple[Tensor, ...]:
    """Run `solve` on x in float32 (float64 input: in float64); retry in float64 if it raises or returns
    non-finite values.

    Out-of-memory errors propagate unchanged (the runner records them as `oom`).
    """
    cause: RuntimeError | None = None
    for dtype in dict.fromkeys((_compute_dtype(x.dtype), torch.float64)):
        try:
            out = solve(x.to(dtype))
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as err:  # torch.linalg.LinAlgError is a RuntimeError
            cause = err.with_traceback(None)  # its frames (and their tensors) are not kept alive by the chain
            continue
        if all(bool(torch.isfinite(t).all()) for t in out):
            return out
        cause = None
    reason = f"raised {cause!r}" if cause is not None else "returned non-finite values"
    raise SolverError(f"{what} failed in float32 and float64: the float64 retry {reason}") from cause


def _qr_positive(y: Tensor) -> tuple[Tensor, Tensor]:
    """Reduced QR with diag(R) >= 0, which makes the factorization unique for full-rank Y."""
    q, r = torch.linalg.qr(y, mode="reduced")
    diag = torch.diagonal(r, dim1=-2, dim2=-1)
    signs = torch.where(diag < 0, -1.0, 1.0).to(q.dtype)
    return q * signs.unsqueeze(-2), r * signs.unsqueeze(-1)


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
) -> Tensor:
    """(A + ridge I)^{-1/p} for symmetric PSD A by the coupled Newton iteration (Guo & Higham 2006, Eq. 3.2).

    As in scalable_shampoo / 4-bit Shampoo's 32-bit baseline (Alg. 4): ridge = eps * lambda_max with
    lambda_max from `power_iters` power-iteration steps (else ridge = eps); z = (1 + p) / (2 ||A||_F),
    M = z A, X = z^{1/p} I; each step T = (1 + 1/p) I - M / p, X <- X T, M <- T^p M. A matrix stops once
    max|M - I| <= tol, and keeps its previous X (stops) when that error grows by more than 1.2x.
    Computed and returned in float32. Raises SolverError if the result is not finite.
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be a positive int; got {p!r}")
    _check_square(a, "a")
    x = symmetrize(a.to(torch.float32))
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

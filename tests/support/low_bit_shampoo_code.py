"""A dtype-generic transcription of the authors' Shampoo code, for side-by-side tests (tests/optim/test_shampoo*).

Read from Sike-Wang/low-bit-Shampoo at commit fc46867b3afbc8e4f72a541475bb883ce94e8d4c (2025-02-13):
`optimizers/matrix_functions.py` (PowerIter l. 22-48, MatPower l. 52-76, ComputePower l. 80-141) and
`optimizers/shampoo1.py` at prec_bits=32 (Preconditioner l. 102-209, ShampooSGD.step l. 250-296,
ShampooAdamW.step l. 337-392), and `optimizers/shampoo2.py` (4-bit Shampoo, Preconditioner l. 102-215) with
`qtensor/utils.py` (QTensorSVDFast l. 90-146) and `qtensor/functional.py` (compute_power l. 270-275) at
prec_bits=32, where every matrix is kept in full precision. Written anew for these tests, in whatever dtype the
inputs carry (float64 for the reference, float32 to measure what the code's own float32 arithmetic changes). Nothing
of theirs is copied.

One deliberate choice: PowerIter draws its start vector from the global RNG (l. 36); any draw is the code's
computation, so `power_iter` takes the draw the project's `linalg.power_iteration` makes (uniform in (-1, 1) from a
generator seeded 0), which makes the truncated estimate's error the same on both sides.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor


def power_iter(mat: Tensor, tol: float = 1e-6, num_iters: int = 10) -> Tensor:
    """matrix_functions.py l. 36-48: Rayleigh quotients of a normalised power iteration, stopped when one changes by
    at most `tol` or after `num_iters` steps; the start vector as the module docstring says."""
    v = (torch.rand(mat.shape[0], 1, generator=torch.Generator().manual_seed(0)) * 2 - 1)[:, 0].to(mat.dtype)
    error, iters, estimate = math.inf, 0, torch.zeros((), dtype=mat.dtype)
    while error > tol and iters < num_iters:
        v = v / torch.linalg.vector_norm(v)
        mat_v = mat @ v
        new_estimate = torch.dot(v, mat_v)
        error = float((new_estimate - estimate).abs())
        v, estimate = mat_v, new_estimate
        iters += 1
    return estimate


def mat_power(mat: Tensor, p: int) -> Tensor:
    """matrix_functions.py l. 62-76: mat^p by repeated squaring (p a power of two) or binary powering."""
    if p in (1, 2, 4, 8, 16, 32):
        result, done = mat, 1
        while done < p:
            result, done = result @ result, done * 2
        return result
    power = None
    while p > 0:
        if p % 2 == 1:
            power = mat if power is None else mat @ power
        p //= 2
        mat = mat @ mat
    return power


def compute_power(mat: Tensor, p: int, iter_count: int = 10, tol: float = 1e-6, ridge: float = 1e-6) -> Tensor:
    """matrix_functions.py l. 103-141: (mat + ridge lambda_max I)^(-1/p) by the coupled Newton iteration, on `mat`
    as given (not symmetrised), keeping the last iterate whose error grew by at most 1.2x."""
    identity = torch.eye(mat.shape[0], dtype=mat.dtype)
    if mat.shape[0] == 1:
        return identity
    alpha = -1.0 / p
    mat = mat + ridge * power_iter(mat) * identity
    z = (1 + p) / (2 * torch.linalg.matrix_norm(mat))
    root = identity * z.pow(1.0 / p)
    m = mat * z
    error = (m - identity).abs().max()
    count = 0
    while error > tol and count < iter_count:
        t = (1 - alpha) * identity + alpha * m
        new_root = root @ t
        m = mat_power(t, p) @ m
        new_error = (m - identity).abs().max()
        if new_error > error * 1.2:
            break
        root, error, count = new_root, new_error, count + 1
    return root


def block_sizes(dim: int, max_order: int) -> list[int]:
    """shampoo1.py l. 50-61 (BlockPartitioner): blocks of `max_order` and a remainder."""
    if dim <= max_order:
        return [dim]
    full = (dim - 1) // max_order
    return [max_order] * full + [dim - full * max_order]


@dataclass
class Shampoo32Code:
    """shampoo1.py at prec_bits=32: ShampooSGD (`base="sgd"`) or ShampooAdamW (`base="adamw"`) on one parameter."""

    param: Tensor
    base: str
    lr: float
    stat_interval: int
    root_interval: int
    max_order: int = 1200
    stat_decay: float = 0.95
    matrix_eps: float = 1e-6
    momentum: float = 0.9
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    step_count: int = 0
    state: dict[str, Tensor] = field(init=False)

    def __post_init__(self) -> None:
        """l. 111-134: size-1 dims squeezed, viewed as (shape[0], -1); L = R = eps I and roots I per block."""
        dims = [d for d in self.param.shape if d != 1]
        self.rows, self.cols = dims[0], math.prod(dims[1:])
        rows, cols = block_sizes(self.rows, self.max_order), block_sizes(self.cols, self.max_order)
        self.blocks = list(itertools.product(_edges(rows), _edges(cols)))
        dtype = self.param.dtype
        self.stats, self.roots = [], []
        for rs, cs in self.blocks:
            for order in (rs.stop - rs.start, cs.stop - cs.start):
                self.stats.append(self.matrix_eps * torch.eye(order, dtype=dtype))
                self.roots.append(torch.eye(order, dtype=dtype))
        self.state = {name: torch.zeros_like(self.param) for name in ("buf", "m", "v")}

    def step(self, grad: Tensor) -> None:
        """One step of ShampooSGD.step (l. 271-296) or ShampooAdamW.step (l. 361-392)."""
        self.step_count += 1
        if self.base == "adamw":
            self.param = self.param * (1 - self.lr * self.weight_decay)
        matrix = grad.reshape(self.rows, self.cols)
        if self.step_count % self.stat_interval == 0:
            self._add_statistics(matrix)
        if self.step_count % self.root_interval == 0:
            self._compute_roots()
        direction = self._preconditioned(matrix)
        direction = direction * (torch.linalg.vector_norm(grad) / (torch.linalg.vector_norm(direction) + 1e-12))
        direction = direction.reshape(self.param.shape)
        if self.base == "sgd":
            self._sgd(direction)
        else:
            self._adamw(direction)

    def _add_statistics(self, matrix: Tensor) -> None:
        """l. 155-168: stat = beta stat + (1 - beta) G G^T (left) / G^T G (right), weight 1 when beta = 1."""
        w1 = self.stat_decay
        w2 = 1.0 if w1 == 1.0 else 1.0 - w1
        for j, (rs, cs) in enumerate(self.blocks):
            g = matrix[rs, cs]
            self.stats[2 * j] = self.stats[2 * j] * w1 + w2 * (g @ g.T)
            self.stats[2 * j + 1] = self.stats[2 * j + 1] * w1 + w2 * (g.T @ g)

    def _compute_roots(self) -> None:
        """l. 170-176: every root by ComputePower of its statistic (exp 4, ridge matrix_eps lambda_max)."""
        self.roots = [compute_power(stat, 4, ridge=self.matrix_eps) for stat in self.stats]

    def _preconditioned(self, matrix: Tensor) -> Tensor:
        """l. 188-209: L^ G R^ per block, merged back."""
        out = torch.empty_like(matrix)
        for j, (rs, cs) in enumerate(self.blocks):
            out[rs, cs] = self.roots[2 * j] @ matrix[rs, cs] @ self.roots[2 * j + 1]
        return out

    def _sgd(self, direction: Tensor) -> None:
        """l. 286-296: L2 decay after grafting, buf = mu buf + G~, W -= lr buf (no Nesterov)."""
        direction = direction + self.weight_decay * self.param
        self.state["buf"] = self.momentum * self.state["buf"] + direction
        self.param = self.param - self.lr * self.state["buf"]

    def _adamw(self, direction: Tensor) -> None:
        """l. 379-392: Adam moments of G~ with bias corrections, eps outside the corrected square root."""
        beta1, beta2 = self.betas
        t = self.step_count
        self.state["m"] = beta1 * self.state["m"] + (1 - beta1) * direction
        self.state["v"] = beta2 * self.state["v"] + (1 - beta2) * direction * direction
        denom = self.state["v"].sqrt() / math.sqrt(1 - beta2**t) + self.adam_eps
        self.param = self.param - (self.lr / (1 - beta1**t)) * self.state["m"] / denom


def _edges(sizes: list[int]) -> list[slice]:
    """Consecutive slices of the given sizes."""
    starts = list(itertools.accumulate(sizes, initial=0))
    return [slice(a, b) for a, b in itertools.pairwise(starts)]


@dataclass
class Shampoo4bitCode(Shampoo32Code):
    """shampoo2.py with inv_root_mode 0 at prec_bits=32: each statistic held as eigenpairs (QTensorSVDFast).

    At 32 bits QTensorSVDFast keeps V^T unquantized and never rectifies it (utils.py l. 99-101, 129, 137-139).
    """

    def __post_init__(self) -> None:
        """utils.py l. 96-97: V^T = I and eigenvalues eps (the diagonal of the initial eps I)."""
        super().__post_init__()
        self.eigvecs_t = [torch.eye(stat.shape[0], dtype=stat.dtype) for stat in self.stats]
        self.eigvals = [stat.diagonal().clone() for stat in self.stats]

    def _add_statistics(self, matrix: Tensor) -> None:
        """shampoo2.py l. 158-171 with utils.py l. 114-121 and 129-131: A = beta V Diag(S) V^T + w2 G G^T,
        V = QR(A V) (torch.linalg.qr's own signs), S = diag(V^T A V)."""
        w1 = self.stat_decay
        w2 = 1.0 if w1 == 1.0 else 1.0 - w1
        for j, (rs, cs) in enumerate(self.blocks):
            g = matrix[rs, cs]
            for index, outer in ((2 * j, g @ g.T), (2 * j + 1, g.T @ g)):
                vt, values = self.eigvecs_t[index], self.eigvals[index]
                a = (vt.T @ values.diag() @ vt) * w1 + w2 * outer
                v, _ = torch.linalg.qr(a @ vt.T)
                self.eigvals[index] = (v.T @ a @ v).diagonal()
                self.eigvecs_t[index] = v.T

    def _compute_roots(self) -> None:
        """shampoo2.py l. 177-179, functional.py l. 270-275 (iter_count 0): V Diag((S + eps max S)^(-1/4)) V^T."""
        self.roots = [
            vt.T @ (1 / (values + self.matrix_eps * values.max()).pow(1 / 4)).diag() @ vt
            for vt, values in zip(self.eigvecs_t, self.eigvals, strict=True)
        ]


def linear2_codebook(bits: int = 4) -> Tensor:
    """qtensor/functional.py l. 96-103 (create_linear_map, signed, power 2): linspace(-1, 1, 2^bits) with entry
    2^(bits-1) - 1 set to 0, then sign(x) x^2. Not symmetric about 0: code 7 is 0 and code 8 is (1/15)^2."""
    data = torch.linspace(-1, 1, 2**bits, dtype=torch.float64)
    data[2 ** (bits - 1) - 1] = 0
    return data.sign() * data.abs().pow(2)


def quantize_diagreal(matrix: Tensor, block: int = 64, bits: int = 4) -> tuple[Tensor, Tensor, Tensor]:
    """kernels.cu l. 310-372 (kQuantizeBlockwise4bitDiagReal) in float64: per row, the diagonal entry is kept apart
    and zeroed, the row is cut into blocks of `block` columns, each block scaled by its absmax and every entry given
    the nearest code (dQuantize, l. 6-55, is a nearest-code search). Returns (codes, per-entry absmax, diagonal)."""
    codebook = linear2_codebook(bits)
    order = matrix.shape[0]
    diagonal = matrix.diagonal().clone()
    off = matrix - torch.diag(diagonal)
    scales = torch.empty_like(off)
    for start in range(0, order, block):
        columns = slice(start, min(start + block, order))
        scales[:, columns] = off[:, columns].abs().amax(dim=1, keepdim=True)
    normalized = off / torch.where(scales > 0, scales, 1.0)
    codes = (normalized.unsqueeze(-1) - codebook).abs().argmin(dim=-1)
    return codes, scales, diagonal


def code_margins(matrix: Tensor, scales: Tensor, bits: int = 4) -> Tensor:
    """How far each normalized entry lies from the nearest decision midpoint between adjacent codes."""
    codebook = linear2_codebook(bits)
    midpoints = (codebook[1:] + codebook[:-1]) / 2
    normalized = matrix / torch.where(scales > 0, scales, 1.0)
    return (normalized.unsqueeze(-1) - midpoints).abs().amin(dim=-1)

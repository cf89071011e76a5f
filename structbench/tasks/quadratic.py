"""Synthetic matrix problems with a known optimum and known conditioning, so suboptimality is exact.

Problems (argument `problem`):

- ``kronecker``: f(W) = 1/2 tr((W - W*)^T A (W - W*) B), A (m x m) and B (n x n) SPD with condition
  numbers `cond_left` and `cond_right`; the Hessian on vec(W) is B (x) A.
- ``block-diagonal``: f(W) = 1/2 sum_j (w_j - w*_j)^T H_j (w_j - w*_j) over the columns w_j, each H_j SPD
  with its own eigenvectors; the column scales span `cond_right`, so the Hessian is block-diagonal but
  not a Kronecker product.
- ``linear-regression``: minibatch least squares Y = X W* + E with rows x ~ N(0, A) and noise
  e ~ N(0, noise_scale^2 B^{-1}), loss 1/(2b) sum_i (x_i^T W - y_i^T) B (W^T x_i - y_i). The Fisher is
  exactly A (x) B and the population suboptimality is the Kronecker form above.

For ``kronecker`` and ``block-diagonal``, `noise_scale > 0` adds a zero-mean noise matrix N_t to every
gradient: full-rank N_t has i.i.d. N(0, noise_scale^2) entries; with `noise_rank = r > 0` it is
noise_scale * sqrt(mn) / r * P Z_t Q^T with fixed orthonormal P (m x r), Q (n x r) and Gaussian Z_t, so
E||N_t||_F^2 = noise_scale^2 * m * n either way.

The evaluation returns the exact suboptimality f(W) - f(W*) (computed in float64) as the loss and the
relative suboptimality (f(W) - f*) / (f(W_0) - f*) as the metric.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from structbench.errors import UsageError
from structbench.tasks.base import EvalResult, TaskContext, TaskDef, check_memory, to_device
from structbench.tasks.spectra import SPECTRA, eigenvalues, random_orthogonal, random_spd

PROBLEMS = ("kronecker", "block-diagonal", "linear-regression")

DEFAULTS: dict[str, Any] = {
    "problem": "kronecker",
    "m": 32,
    "n": 16,
    "cond_left": 100.0,
    "cond_right": 10.0,
    "spectrum": "geometric",
    "noise_scale": 0.0,
    "noise_rank": 0,
    "init_scale": 1.0,
}


def validate_args(args: dict[str, Any]) -> None:
    """Raise UsageError for arguments no run could use, or a problem too large for this machine's memory."""
    problem, m, n, rank = args["problem"], int(args["m"]), int(args["n"]), int(args["noise_rank"])
    if problem not in PROBLEMS:
        raise UsageError(f"unknown quadratic problem {problem!r}; valid: {', '.join(PROBLEMS)}.")
    if args["spectrum"] not in SPECTRA:
        raise UsageError(f"unknown task_args.spectrum {args['spectrum']!r}; valid: {', '.join(SPECTRA)}.")
    if m < 1 or n < 1:
        raise UsageError(f"quadratic shape must be positive, got m={m}, n={n}.")
    if not 0 <= rank <= min(m, n):
        raise UsageError(f"noise_rank must be in [0, min(m, n)={min(m, n)}], got {rank}.")
    for key in ("cond_left", "cond_right"):
        if not args[key] >= 1:
            raise UsageError(f"task_args.{key} is a condition number: it must be >= 1, got {args[key]}.")
    if not args["noise_scale"] >= 0:
        raise UsageError(f"task_args.noise_scale must be >= 0, got {args['noise_scale']}.")
    check_memory(f"quadratic problem {problem!r} with m={m}, n={n}: its matrices", problem_bytes(problem, m, n))


def problem_bytes(problem: str, m: int, n: int) -> int:
    """A lower bound on the bytes a problem holds: A (m x m) and B (n x n) in float64 and float32 (the n blocks of
    block-diagonal likewise), and W*, W_0 in float64."""
    squares = m * m + n * n + (n * m * m if problem == "block-diagonal" else 0)
    return 12 * squares + 16 * m * n


class MatrixParameter(nn.Module):
    """The model of a matrix problem: one (m x n) weight."""

    def __init__(self, initial: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(initial.clone())


class QuadraticTask:
    metric_name = "rel_subopt"
    metric_mode: Literal["min", "max"] = "min"
    data_source = "synthetic (exact objective)"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        validate_args(args)
        problem, m, n, rank = args["problem"], int(args["m"]), int(args["n"]), int(args["noise_rank"])
        self.problem = problem
        self.noise_scale = float(args["noise_scale"])
        self.batch_size = ctx.batch_size
        self.device = ctx.device
        gen = torch.Generator().manual_seed(ctx.seed)
        spectrum = args["spectrum"]
        self.left = random_spd(m, float(args["cond_left"]), spectrum, gen)
        self.right = random_spd(n, float(args["cond_right"]), spectrum, gen)
        if problem == "block-diagonal":
            column_scales = eigenvalues(n, float(args["cond_right"]), "geometric")
            self.blocks = torch.stack(
                [random_spd(m, float(args["cond_left"]), spectrum, gen) * s for s in column_scales.tolist()]
            )
        self.optimum = torch.randn(m, n, generator=gen, dtype=torch.float64)
        initial = self.optimum + float(args["init_scale"]) * torch.randn(m, n, generator=gen, dtype=torch.float64)
        if rank > 0:
            self.noise_left = random_orthogonal(m, gen)[:, :rank]
            self.noise_right = random_orthogonal(n, gen)[:, :rank]
        self.noise_rank = rank
        self.noise_gen = torch.Generator().manual_seed(ctx.seed + 1)
        if problem == "linear-regression":
            self.x_factor = torch.linalg.cholesky(self.left).T
            self.noise_factor = torch.linalg.cholesky(torch.linalg.inv(self.right)).T
        self.model = MatrixParameter(initial.to(torch.float32)).to(ctx.device)
        self.left32, self.right32, self.optimum32 = (
            t.to(ctx.device, torch.float32) for t in (self.left, self.right, self.optimum)
        )
        if problem == "block-diagonal":
            self.blocks32 = self.blocks.to(ctx.device, torch.float32)
        self.initial_subopt = self.suboptimality(self.model.weight)

    def suboptimality(self, weight: torch.Tensor) -> float:
        """f(W) - f(W*) in float64, from the closed form."""
        diff = weight.detach().to("cpu", torch.float64) - self.optimum
        if self.problem == "block-diagonal":
            hd = torch.einsum("jab,bj->aj", self.blocks, diff)
            return 0.5 * float((diff * hd).sum())
        return 0.5 * float((diff * (self.left @ diff @ self.right)).sum())

    def stream_state(self) -> dict[str, Any]:
        return {"noise_gen": self.noise_gen.get_state()}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.noise_gen.set_state(state["noise_gen"])

    def _noise(self, m: int, n: int) -> torch.Tensor:
        if self.noise_rank == 0:
            noise = torch.randn(m, n, generator=self.noise_gen, dtype=torch.float64) * self.noise_scale
        else:
            z = torch.randn(self.noise_rank, self.noise_rank, generator=self.noise_gen, dtype=torch.float64)
            scale = self.noise_scale * (m * n) ** 0.5 / self.noise_rank
            noise = scale * self.noise_left @ z @ self.noise_right.T
        return to_device(noise.to(torch.float32), self.device)

    def train_loss(self, step: int) -> torch.Tensor:
        weight = self.model.weight
        if self.problem == "linear-regression":
            return self._regression_loss(weight)
        diff = weight - self.optimum32
        if self.problem == "block-diagonal":
            loss = 0.5 * (diff * torch.einsum("jab,bj->aj", self.blocks32, diff)).sum()
        else:
            loss = 0.5 * (diff * (self.left32 @ diff @ self.right32)).sum()
        if self.noise_scale > 0:
            loss = loss + (self._noise(*weight.shape) * weight).sum()
        return loss

    def _regression_loss(self, weight: torch.Tensor) -> torch.Tensor:
        m, n = weight.shape
        z = torch.randn(self.batch_size, m, generator=self.noise_gen, dtype=torch.float64)
        e = torch.randn(self.batch_size, n, generator=self.noise_gen, dtype=torch.float64)
        x = to_device((z @ self.x_factor).to(torch.float32), self.device)
        y = x @ self.optimum32 + self.noise_scale * to_device((e @ self.noise_factor).to(torch.float32), self.device)
        residual = x @ weight - y
        return 0.5 * (residual * (residual @ self.right32)).sum() / self.batch_size

    def evaluate(self) -> EvalResult:
        subopt = self.suboptimality(self.model.weight)
        return EvalResult(loss=subopt, metric=subopt / self.initial_subopt)


QUADRATIC = TaskDef(
    name="quadratic",
    summary="matrix quadratics with known optimum: Kronecker, block-diagonal, linear regression",
    defaults=DEFAULTS,
    build=QuadraticTask,
    preflight=lambda args, data_root, batch_size: validate_args(args),
    metric_name=QuadraticTask.metric_name,
)

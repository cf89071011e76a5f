"""SOAP stepped side by side with a float64 transcription of the authors' code (issue 36 item 4).

The code: nikhilvyas/SOAP `soap.py` at commit a1e553530fde97d0e6b307d7c82ac6d38b072340 (the a1e5535 that
structbench.optim.soap cites), read for its computation and written here in the tests' style (nothing of it is
copied). Transcribed: `SOAP.step` (lines 121-210: the first step that only sets L, R and Q, Adam on the rotated
gradient, bias correction, eps added to sqrt(v), weight decay after the update with the raw lr), `merge_dims`
(lines 79-106, channels_first), `project` / `project_back` (lines 240-266, 309-334), `update_preconditioner` (lines
268-307: since f42d296 the first moment is kept rotated, taken back to the original space before a refresh and
forward after it), `get_orthogonal_matrix` (lines 337-370: eigh of L + 1e-30 I, columns flipped to descending
eigenvalues) and `get_orthogonal_matrix_QR` (lines 373-430: estimated eigenvalues diag(Q^T L Q), argsort descending,
exp_avg_sq permuted along the same dimension, one power iteration L Q_sorted and Householder QR with its raw signs).

Our side runs the code's switches: `orthonormalize="householder"` (the code's `torch.linalg.qr`) and
`momentum_in_eigenbasis=True` (the code's rotated first moment since f42d296; the paper's original-space moment,
our default, is equal in exact arithmetic and is run too). A conv filter is compared with the code's
`merge_dims=True` and `max_precond_dim = in*kh*kw` chosen so that its merge gives our (out, in*kh*kw) view (the
code's default, one factor per tensor dimension, is a documented deviation of ours); the merge is checked first.

Why the comparison is well defined:
- Column signs: a column of Q_L (Q_R) enters the update twice, Q (m' / (sqrt(v) + eps)) Q^T, v holds squares and the
  rotated moment is rotated back with the same basis, so the signs QR or eigh give cancel.
- Eigenvalue order: the code's order (eigh ascending, flipped; the refresh's sort of estimates) decides which entry
  of exp_avg_sq belongs to which direction; with distinct eigenvalues (random gradients) both follow the same order.
- The first step's null space: one gradient's statistic G^T G of a wide G (G G^T of a tall one) has a null space
  whose eigenbasis LAPACK picks arbitrarily, and the next Adam step depends on it (v is not rotation invariant). So
  the transcription adopts our first-step basis after checking that it is an eigenbasis of its own float64 statistic
  (Q^T L Q equal to the descending eigenvalues to eigh's float32 accuracy); later bases come from the transcribed
  power iteration, and the shapes give every statistic full rank before its first refresh (gradients from
  precondition_frequency + 1 steps span every side).

Tolerance: ours computes in float32, the transcription in float64. float32 eigh and QR are backward stable (exact
for an input perturbed by about d u ||A||_2, d the size, u = 2^-24) and each product with inner size k errs by at
most k u |A| |B|. So the transcription is run again with every statistic it decomposes perturbed by a random
symmetric matrix of norm d u ||L||_2 and every gradient perturbed entrywise by k u |G| (k the larger side), three
seeds; our W_t - W_0 must lie within 4x the largest of these self-deviations (the factor allows for a worst direction
beyond three random ones and for the float32 rounding of the moments), plus 2 t u max|W| for the rounding of W itself
over t steps. Nothing in it comes from our optimizer's observed gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from structbench.optim.soap import SOAP
from tests.support.rounding_noise import Noise

SOAP_COMMIT = "a1e553530fde97d0e6b307d7c82ac6d38b072340"
F64 = torch.float64
U32 = 2.0**-24
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 0.01, 0.95, 0.95, 1e-8, 0.01
SHAMPOO_BETA = 0.5
"""The code's `shampoo_beta` (soap.py line 145; our `shampoo_beta`): low, so that the statistics, and through them
the bases, move by O(1) between refreshes and a refresh's treatment of the moments shows in W."""
FREQUENCY = 3
STEPS = 13
"""The first step only initialises; the other 12 pass the refreshes at t = 3, 6, 9 and 12."""
SHAPES = {
    "wide": ((4, 10), None),
    "tall": ((10, 4), None),
    "square": ((6, 6), None),
    "conv": ((8, 4, 2, 2), 16),
}
"""Parameter shape and, for the conv filter, the max_precond_dim with which the code's merge_dims=True gives (8, 16)
(matrices run with the code's defaults, merge_dims False and max_precond_dim 10000: both sides rotated)."""


def code_merged_shape(shape: tuple[int, ...], max_precond_dim: int) -> tuple[int, ...]:
    """soap.py lines 86-105: merge dimensions from the left while their product stays <= max_precond_dim."""
    merged: list[int] = []
    current = 1
    for size in shape:
        if current * size > max_precond_dim:
            if current > 1:
                merged.append(current)
                current = size
            else:
                merged.append(size)
                current = 1
        else:
            current *= size
    if current > 1 or not merged:
        merged.append(current)
    return tuple(merged)


def code_project(x: Tensor, bases: list[Tensor]) -> Tensor:
    """soap.py lines 250-256: contract dimension 0 with each basis in turn (Q_L^T X Q_R for a matrix)."""
    for q in bases:
        x = torch.tensordot(x, q, dims=([0], [0]))
    return x


def code_project_back(x: Tensor, bases: list[Tensor]) -> Tensor:
    """soap.py lines 318-324: contract dimension 0 with each basis's second index (Q_L X Q_R^T for a matrix)."""
    for q in bases:
        x = torch.tensordot(x, q, dims=([0], [1]))
    return x


def code_eigenbasis(gg: Tensor) -> Tensor:
    """soap.py lines 361 and 365: eigh(L + 1e-30 I), columns flipped to descending eigenvalues."""
    _, vectors = torch.linalg.eigh(gg + 1e-30 * torch.eye(gg.size(0), dtype=F64))
    return vectors.flip(1)


@dataclass
class CodeState:
    """The code's state for one parameter (soap.py lines 129-137, 220-238), in float64 and the merged shape."""

    gg: list[Tensor]
    exp_avg: Tensor
    exp_avg_sq: Tensor
    bases: list[Tensor] | None = None
    step: int = 0


def code_power_qr(state: CodeState, noise: Noise | None) -> list[Tensor]:
    """soap.py lines 408-417: per dimension, sort the estimates diag(Q^T L Q) descending, permute exp_avg_sq along
    that dimension, Q <- qr(L Q_sorted) (raw Householder signs); sets the permuted exp_avg_sq (line 429)."""
    assert state.bases is not None
    new_bases = []
    exp_avg_sq = state.exp_avg_sq
    for dim, (gg, q) in enumerate(zip(state.gg, state.bases, strict=True)):
        gg = noise.statistic(gg) if noise else gg
        estimates = torch.diag(q.T @ gg @ q)
        order = torch.argsort(estimates, descending=True)
        exp_avg_sq = exp_avg_sq.index_select(dim, order)
        new_bases.append(torch.linalg.qr(gg @ q[:, order])[0])
    state.exp_avg_sq = exp_avg_sq
    return new_bases


def code_update_preconditioner(state: CodeState, grad: Tensor, noise: Noise | None) -> None:
    """soap.py lines 273-307: m back to the original space, L and R lerp towards the gradient's outer products, the
    initial eigh or the refresh when step % f == 0, m forward into the (new) basis."""
    if state.bases is not None:
        state.exp_avg = code_project_back(state.exp_avg, state.bases)
    for dim, gg in enumerate(state.gg):
        others = [i for i in range(grad.dim()) if i != dim]
        gg.lerp_(torch.tensordot(grad, grad, dims=(others, others)), 1 - SHAMPOO_BETA)
    if state.bases is None:
        state.bases = [code_eigenbasis(noise.statistic(gg) if noise else gg) for gg in state.gg]
    if state.step > 0 and state.step % FREQUENCY == 0:
        state.bases = code_power_qr(state, noise)
    if state.step > 0:
        state.exp_avg = code_project(state.exp_avg, state.bases)


def code_step(state: CodeState, param: Tensor, grad: Tensor, noise: Noise | None) -> Tensor:
    """soap.py lines 139-210 for one parameter (shapes already merged): returns the new parameter."""
    grad = noise.gradient(grad) if noise else grad
    if state.bases is None:
        code_update_preconditioner(state, grad, noise)
        return param
    rotated = code_project(grad, state.bases)
    state.step += 1
    state.exp_avg = state.exp_avg * BETA1 + rotated * (1 - BETA1)
    state.exp_avg_sq = state.exp_avg_sq * BETA2 + rotated.square() * (1 - BETA2)
    denom = state.exp_avg_sq.sqrt() + EPS
    step_size = LR * math.sqrt(1 - BETA2**state.step) / (1 - BETA1**state.step)
    param = param - step_size * code_project_back(state.exp_avg / denom, state.bases)
    param = param - LR * WEIGHT_DECAY * param
    code_update_preconditioner(state, grad, noise)
    return param


def _check_eigenbasis(q: Tensor, gg: Tensor) -> None:
    """q (ours, float32) is an eigenbasis of the float64 statistic gg with columns by descending eigenvalue: Q^T L Q
    equals diag(eigenvalues, descending) to float32 eigh's accuracy, 16 d u ||L||_2 entrywise (backward error c d u
    with c = 4, and q's own distance from orthonormal, of the same order, entering on both sides)."""
    expected = torch.diag(torch.linalg.eigvalsh(gg).flip(0))
    bound = 16 * gg.size(0) * U32 * float(torch.linalg.matrix_norm(gg, ord=2))
    torch.testing.assert_close(q.T @ gg @ q, expected, rtol=0, atol=bound)


def _our_bases(optimizer: SOAP, param: nn.Parameter) -> list[Tensor]:
    state = optimizer.state[param]
    return [state[key].double() for key in ("q_left", "q_right")]


def _code_run(w0: Tensor, grads: list[Tensor], first_bases: list[Tensor], noise: Noise | None) -> list[Tensor]:
    """The transcription's W_t - W_0 after each step (merged shape), adopting `first_bases` after the first step."""
    state = CodeState(
        gg=[torch.zeros(n, n, dtype=F64) for n in w0.shape],
        exp_avg=torch.zeros_like(w0),
        exp_avg_sq=torch.zeros_like(w0),
    )
    param, changes = w0, []
    for t, grad in enumerate(grads):
        param = code_step(state, param, grad, noise)
        if t == 0:
            state.bases = [q.clone() for q in first_bases]
        changes.append(param - w0)
    return changes


@pytest.mark.parametrize("momentum_in_eigenbasis", [True, False])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_soap_follows_the_authors_code_through_every_refresh(kind, momentum_in_eigenbasis):
    """W_t - W_0 of SOAP (the code's switches) against the float64 transcription of nikhilvyas/SOAP soap.py (commit
    in the module doc), 13 steps with refreshes every 3, on a wide, a tall, a square and a conv-shaped parameter."""
    shape, merge_limit = SHAPES[kind]
    merged = code_merged_shape(shape, merge_limit) if merge_limit else shape
    assert merged == (shape[0], math.prod(shape[1:]))
    max_precond_dim = merge_limit or 10000
    gen = torch.Generator().manual_seed(36)
    w0 = torch.randn(*shape, generator=gen)
    grads = [torch.randn(*shape, generator=gen) for _ in range(STEPS)]
    param = nn.Parameter(w0.clone())
    optimizer = SOAP(
        [param],
        lr=LR,
        beta1=BETA1,
        beta2=BETA2,
        shampoo_beta=SHAMPOO_BETA,
        eps=EPS,
        weight_decay=WEIGHT_DECAY,
        precondition_frequency=FREQUENCY,
        max_precond_dim=max_precond_dim,
        orthonormalize="householder",
        momentum_in_eigenbasis=momentum_in_eigenbasis,
    )
    ours = []
    for t, grad in enumerate(grads):
        param.grad = grad.clone()
        optimizer.step()
        if t == 0:
            first_bases = _our_bases(optimizer, param)
        ours.append((param.detach().double() - w0.double()).reshape(merged))

    merged_grads = [g.double().reshape(merged) for g in grads]
    w0_code = w0.double().reshape(merged)
    first_gg = [
        torch.tensordot(merged_grads[0], merged_grads[0], dims=([1 - d], [1 - d])) * (1 - SHAMPOO_BETA) for d in (0, 1)
    ]
    for q, gg in zip(first_bases, first_gg, strict=True):
        _check_eigenbasis(q, gg)
    reference = _code_run(w0_code, merged_grads, first_bases, None)
    perturbed = [_code_run(w0_code, merged_grads, first_bases, Noise(seed)) for seed in (1, 2, 3)]

    assert float(reference[-1].abs().max()) > 2 * LR  # the run moved by more than two steps of size lr
    w_max = float(w0.abs().max()) + float(max(change.abs().max() for change in reference))
    for t, (mine, theirs) in enumerate(zip(ours, reference, strict=True)):
        spread = max(float((other[t] - theirs).abs().max()) for other in perturbed)
        tolerance = 4 * spread + 2 * (t + 1) * U32 * w_max
        gap = float((mine - theirs).abs().max())
        assert gap <= tolerance, f"step {t + 1}: |ours - code| = {gap:.3g} > {tolerance:.3g}"

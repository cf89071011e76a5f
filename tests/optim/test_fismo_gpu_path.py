"""FISMO's GPU path (structbench/optim/fismo.py) against independent facts.

- Counts: a steady step after the first reads no tensor value on the host and decomposes nothing (cost_profile, which
  counts a DeferredCheck's read apart: one per same-shape stack), and a "kept" step multiplies no d x d matrices.
- Storage: each parameter's state tensors are views of one stack per shape, and a saved state_dict is no larger than
  the same state saved as independent copies (a stack's storage is written once, not once per view).
- Resume: a checkpoint taken while a failed root is still pending (deferred check) resumes bit-identically.
- matmul_precision: every large non-root product goes through precision.matmul with the group's precision, and one
  step's update stays within the error bound derived from precision.product_error_bound through the whitening,
  the SVD polar factor and the unwhitening, against float64.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import Tensor, nn

import structbench.optim.fismo as fismo_module
from structbench.optim import precision
from structbench.optim.cost_profile import count
from structbench.optim.fismo import Fismo

F64 = torch.float64
U32 = 2.0**-24
SHAPES = [(12, 20), (12, 20), (20, 8), (8, 8)]

pytestmark = pytest.mark.usefixtures("one_thread")


def _params(shapes: list[tuple[int, int]], seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(*s, generator=gen) * 0.02) for s in shapes]


def _grads(params: list[nn.Parameter], scale: float, gen: torch.Generator) -> None:
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * scale


def test_a_steady_step_reads_no_value_on_the_host_and_decomposes_nothing() -> None:
    """Small gradients (1e-3) move the factors by about 1e-8 per step, so after the first (host-checked) refresh
    and one warm one, the roots are kept: the step reads only the three stacks' deferred checks, decomposes nothing,
    and its only matrix products whose inner dimension is the factor's side d are the probes' (d x 64 operands)."""
    params = _params(SHAPES)
    optimizer = Fismo(params)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        _grads(params, 1e-3, gen)
        optimizer.step()
    _grads(params, 1e-3, gen)
    cost = count(optimizer.step, optimizer)
    assert cost.reads == 0 and not cost.decompositions
    assert cost.deferred_reads == 3  # (12, 20) twice in one stack, (20, 8), (8, 8)
    stacks = {id(s): s for s in optimizer._stacks.values()}.values()
    assert all(mode == fismo_module.KEPT for s in stacks for row in s.modes for mode in row)


def test_state_tensors_are_views_of_one_stack_and_a_saved_state_dict_is_written_once() -> None:
    params = _params(SHAPES)
    optimizer = Fismo(params)
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):
        _grads(params, 1.0, gen)
        optimizer.step()
    first, second = (optimizer.state[p] for p in params[:2])
    for key in ("P", "Q", "P_inv_root", "Q_inv_root", "momentum", "step"):
        assert first[key].untyped_storage().data_ptr() == second[key].untyped_storage().data_ptr()
        assert first[key].data_ptr() != second[key].data_ptr()
    state = optimizer.state_dict()
    shared, copies = io.BytesIO(), io.BytesIO()
    torch.save(state, shared)
    cloned = {
        "state": {i: {k: v.clone() for k, v in s.items()} for i, s in state["state"].items()},
        "param_groups": state["param_groups"],
    }
    torch.save(cloned, copies)
    assert len(shared.getvalue()) <= len(copies.getvalue())


def test_a_checkpoint_with_a_failed_root_pending_resumes_bit_identically() -> None:
    """Three steps of small gradients (1e-3) leave the roots "kept"; a step of large ones (scale 30) moves the factors
    far beyond what a kept root fits, so its probe check fails and the repair waits for the next step. state_dict makes
    that repair first (the next step would make the same one, and sets the root's mode to "checked"), so the resumed
    and the continued runs match bit for bit, root_fallbacks included."""
    params = _params(SHAPES)
    optimizer = Fismo(params, gamma=0.9)
    gen = torch.Generator().manual_seed(3)
    for scale in (1e-3, 1e-3, 1e-3, 30.0):
        _grads(params, scale, gen)
        optimizer.step()
    stacks = list({id(s): s for s in optimizer._stacks.values()}.values())
    assert all(s.check.pending for s in stacks)
    buffer = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "optim": optimizer.state_dict()}, buffer)
    assert any(mode == fismo_module.CHECKED for s in stacks for row in s.modes for mode in row)
    later = [torch.randn(p.shape, generator=gen) for _ in range(3) for p in params]

    def resume(run: Fismo, weights: list[nn.Parameter]) -> list[Tensor]:
        for step in range(3):
            for i, p in enumerate(weights):
                p.grad = later[step * len(weights) + i].clone()
            run.step()
        return [p.detach().clone() for p in weights]

    continued = resume(optimizer, params)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    fresh = [nn.Parameter(w.clone()) for w in saved["params"]]
    reloaded = Fismo(fresh, gamma=0.9)
    reloaded.load_state_dict(saved["optim"])
    assert all(torch.equal(a, b) for a, b in zip(continued, resume(reloaded, fresh), strict=True))
    assert optimizer.root_fallbacks == reloaded.root_fallbacks


def _worst_residual(optimizer: Fismo) -> float:
    """max ||Z X Z - I||_F / sqrt(d) over the stored roots and factors (float64), less the float32 residual's
    rounding gamma_2d || |Z| |X| |Z| ||_F / sqrt(d): at most root_tol for roots that passed the solver's check."""
    worst = 0.0
    for state in optimizer.state.values():
        for factor, root in (("P", "P_inv_root"), ("Q", "Q_inv_root")):
            x, z = state[factor].to(F64), state[root].to(F64)
            d = x.size(0)
            residual = float(torch.linalg.matrix_norm(z @ x @ z - torch.eye(d, dtype=F64))) / d**0.5
            magnitude = float(torch.linalg.matrix_norm(z.abs() @ x.abs() @ z.abs())) / d**0.5
            worst = max(worst, residual - 2 * d * U32 / (1 - 2 * d * U32) * magnitude)
    return worst


def test_a_root_that_failed_its_deferred_check_is_used_once_then_repaired() -> None:
    """Kept roots, then a step of large gradients: the step leaves (and used) roots far above root_tol; the repair
    the next step would make first (made here by state_dict) brings every stored root back within root_tol."""
    params = _params(SHAPES)
    optimizer = Fismo(params, gamma=0.9)
    gen = torch.Generator().manual_seed(3)
    for scale in (1e-3, 1e-3, 1e-3, 30.0):
        _grads(params, scale, gen)
        optimizer.step()
    tol = optimizer.param_groups[0]["root_tol"]
    assert _worst_residual(optimizer) > 10 * tol
    optimizer.state_dict()
    assert _worst_residual(optimizer) <= tol


def test_every_large_product_takes_the_group_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    """One refresh step (Gauss–Seidel, whitened momentum, roots kept so that G Q^{-1/2} is reused): G Q^{-1/2} and its
    Gram product, P^{-1/2} G and its Gram product, the whitening's remaining product, and the two products of
    P^{-1/2} O Q^{-1/2}: seven products, all in the group's precision (roots and Newton–Schulz polar steps are not
    among them)."""
    params = _params([(12, 20)])
    optimizer = Fismo(params, matmul_precision="tf32")
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        _grads(params, 1e-3, gen)
        optimizer.step()
    seen: list[str] = []

    def recorded(a: Tensor, b: Tensor, chosen: str) -> Tensor:
        seen.append(chosen)
        return precision.matmul(a, b, chosen)

    monkeypatch.setattr(fismo_module, "matmul", recorded)
    _grads(params, 1e-3, gen)
    optimizer.step()
    assert seen == ["tf32"] * 7


def _exact_root(a: Tensor) -> Tensor:
    values, vectors = torch.linalg.eigh(a.to(F64))
    return (vectors * values.rsqrt()) @ vectors.T


def _spd(d: int, cond: float, seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=F64))
    values = torch.logspace(0.0, -float(torch.log10(torch.tensor(cond))), d, dtype=F64)
    matrix = (basis * values) @ basis.T
    return d * matrix / torch.trace(matrix)


@pytest.mark.parametrize("chosen", precision.MATMUL_PRECISIONS)
@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_one_step_in_each_precision_is_within_its_derived_bound_of_float64(chosen: str, shape: tuple[int, int]) -> None:
    """gamma = 1 freezes the factors (cond 10 and 20, exact float32 roots set as state; the probes keep them), so the
    step is D = P^{-1/2} O Q^{-1/2}, O = Polar(X), X = P^{-1/2} G Q^{-1/2} (momentum zero: M = (1 - beta) X, same
    polar factor). Bound, with c = product_error_bound(precision, max(m, n)) per product:
    - X: two chained products, |X^ - X| <= (2c + c^2) |P^{-1/2}| |G| |Q^{-1/2}| entrywise;
    - O: the float32 SVD is backward stable (k u32 ||X||_2, k = max(m, n)) and the polar factor moves by at most
      2 ||dX||_F / s_min(X); its float32 U, V are orthonormal to k u32 each (2 k u32 sqrt(min(m, n)));
    - D: ||P^{-1/2}||_2 ||Q^{-1/2}||_2 ||dO||_F, plus (2c + c^2) || |P^{-1/2}| |O| |Q^{-1/2}| ||_F;
    - the weights (lr 1) round by u32 (||W_before||_F + ||W_after||_F).
    tf32 and bfloat16 are emulated on a CPU by rounding the operands (precision.matmul)."""
    rows, cols = shape
    p_factor, q_factor = _spd(rows, 10.0, seed=2), _spd(cols, 20.0, seed=3)
    param = nn.Parameter(torch.zeros(shape))
    optimizer = Fismo([param], lr=1.0, gamma=1.0, polar="svd", matmul_precision=chosen)
    param.grad = torch.ones(shape)
    optimizer.step()
    roots = {"P_inv_root": _exact_root(p_factor).float(), "Q_inv_root": _exact_root(q_factor).float()}
    optimizer.state[param].update(P=p_factor.float(), Q=q_factor.float(), momentum=torch.zeros(shape), **roots)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    before = param.detach().clone()
    param.grad = grad
    optimizer.step()
    p_root, q_root = (roots[k].to(F64) for k in ("P_inv_root", "Q_inv_root"))
    x = p_root @ grad.to(F64) @ q_root
    u, sv, vh = torch.linalg.svd(x, full_matrices=False)
    polar = u @ vh
    expected = p_root @ polar @ q_root
    k = max(rows, cols)
    c = precision.product_error_bound(chosen, k)
    chained = 2 * c + c * c
    dx = chained * float(torch.linalg.matrix_norm(p_root.abs() @ grad.to(F64).abs() @ q_root.abs()))
    dx += k * U32 * float(sv[0])
    d_polar = 2 * dx / float(sv[-1]) + 2 * k * U32 * min(rows, cols) ** 0.5
    roots_2 = float(torch.linalg.matrix_norm(p_root, ord=2) * torch.linalg.matrix_norm(q_root, ord=2))
    error = roots_2 * d_polar + chained * float(torch.linalg.matrix_norm(p_root.abs() @ polar.abs() @ q_root.abs()))
    error += U32 * float(torch.linalg.matrix_norm(before.to(F64)) + torch.linalg.matrix_norm(param.detach().to(F64)))
    deviation = float(torch.linalg.matrix_norm((before - param.detach()).to(F64) - expected))
    assert deviation <= error, (deviation, error)

"""FISMO: Fisher-Structured Momentum-Orthogonalized optimizer.

Paper: Xu, Yan, Zhang, "FISMO: Fisher-Structured Momentum-Orthogonalized Optimizer" (ICML 2026 submission,
arXiv 2601.21750), Algorithm 1 (read with §5.1, Theorems 4.1 and 4.2). No public code
exists (the paper links none). For each matrix W (m x n; a conv filter as (out, in*kh*kw)) with
mini-batch-mean gradient G_t, starting from P_0 = I_m, Q_0 = I_n, M_0 = 0:

    4: L_t = (1/n) G_t Q_{t-1}^{-1} G_t^T + mu tr(P_{t-1})/m I_m     P~_t = gamma P_{t-1} + (1 - gamma) L_t
       P_t = sym(m P~_t / tr P~_t)                                   (trace normalised to m)
    5: R_t = (1/m) G_t^T P_t^{-1} G_t + mu tr(Q_{t-1})/n I_n         (the NEW P_t: Gauss–Seidel order)
       Q~_t = gamma Q_{t-1} + (1 - gamma) R_t                        Q_t = sym(n Q~_t / tr Q~_t)
    6: G~_t = P_t^{-1/2} G_t Q_t^{-1/2}                              whitened gradient
    7: M_t = beta M_{t-1} + (1 - beta) G~_t                          momentum in the whitened space
    8: D_t = P_t^{-1/2} Polar(M_t) Q_t^{-1/2}                        Theorem 4.2's step
    9: W_t = W_{t-1} - lr D_t

No bias correction, no Nesterov, no update scaling and no weight decay in the paper (Algorithm 1 lines 7-9). The
paper gives no hyperparameter values: the defaults lr 0.002, beta 0.95, gamma 0.99, mu 1e-3 are structbench's, chosen
by the small sweep that docs/optimizers.md reports (FISMO's defaults: tasks, grid, criterion, results).
Implementation (each choice exact in exact arithmetic, within a stated tolerance, or a switch):
- Only P^{-1/2} and Q^{-1/2} are kept: G Q^{-1} G^T is formed as (G Q^{-1/2})(G Q^{-1/2})^T and G^T P^{-1} G as
  (P^{-1/2} G)^T (P^{-1/2} G), PSD by construction, and P_t^{-1/2} G_t is reused for the whitening. The statistic
  and the EMA are one fused product (gamma X + (1 - gamma)/n B B^T), the damping added on the diagonal.
- Inverse square roots, default `root_method="newton"` (matrix products only): each factor's root by
  linalg.inverse_sqrt_newton_schulz, warm-started from that factor's previous root (kept without any d x d
  product while `NEWTON_PROBES` probe vectors put its residual below root_tol / 2, else at most
  `NEWTON_WARM_ITERS` updates), then, for a matrix whose residual ||Z X Z - I||_F / sqrt(d) is still above
  `root_tol`, a cold coupled Newton–Schulz start (at most `NEWTON_COLD_ITERS` updates), then the
  eigendecomposition below. Each eigendecomposition fallback adds one to the matrix's `root_fallbacks` and to
  the optimizer's `root_fallbacks`, recorded with the run (the runs table's `root_fallbacks` column). No eigenvalue
  floor is applied (in exact arithmetic the damping already bounds the spectrum below). A root with residual r
  is about r / 2 from the exact root, relative, so each step's update stays within about root_tol (default 1e-3)
  of the exact form; tests/optim/test_matrix_roots.py checks 3 root_tol against float64 eigendecompositions over
  several steps. Most steps keep the previous roots (the factors move by about 1 - gamma per step at most), so
  a step costs about the products above plus the polar step.
- `root_method="eigh"` (exact): one symmetric eigendecomposition per factor (linalg.eigh_with_retry: float32,
  float64 retry; `root_dtype="float64"` solves in float64). Eigenvalues are clamped at the floor
  (1 - gamma) d m / tr P~_t that damping d = mu tr(P_{t-1})/m guarantees (proof of Lemma D.2, Eq. 28), which only
  removes rounding below it. An eigendecomposition of a large factor costs far more than the products (about
  8x Muon's step on GPT-2-small shapes on a CPU, benchmarks/matrix_roots.py).
- Polar: `polar="ns"` (default; the paper follows Muon but gives no steps or coefficients: Muon's quintic,
  `ns_steps` 5, X0 = M/(||M||_F + ns_eps)) or `"svd"` (exact U V^T; zero singular values map to zero).
- Switches for ablations (structbench's; the paper runs none): `order="jacobi"` (R_t from P_{t-1});
  `damping="theorem"` (Theorem 4.1's mu tr(Q^{-1})/n I_m and mu tr(P^{-1})/m I_n, which differs from Algorithm 1's);
  `whiten_momentum=False` (M on the raw
  gradient, whitened before the polar step). Not in the paper, off by default: `precond_every` k > 1 (P, Q
  and their roots refreshed every k-th step), `nesterov` (direction (1 - beta) G~_t + beta M_t),
  `weight_decay` (decoupled, W <- (1 - lr wd) W before the step), and `max_factor_dim` d > 0: a matrix with a
  side above d gets no factors (`oversize="muon"`: P = Q = I, i.e. the paper's Muon M = beta M + (1 - beta) G,
  W -= lr Polar(M)) or goes to the AdamW fallback (`oversize="adamw"`).

FISMO is not invariant to the gradient scale (derived here from Algorithm 1 line 4): with tr P_{t-1} = m, step 4 is
P_t = (1 - a) P_{t-1} + a (m / tr L_t) L_t with a = (1 - gamma) tr L_t / (gamma m + (1 - gamma) tr L_t), so
small gradients (tr L_t << m) leave P, Q near I (FISMO ~ Muon) and large ones make them anisotropic.

State per factored matrix, float32 whatever the parameter dtype: `P`, `Q`, `P_inv_root`, `Q_inv_root`,
`momentum` (m x n), plus CPU int64 scalars `step`, `solver_failures` (consecutive) and, with
`root_method="newton"`, `root_fallbacks` (cumulative). Same-shape matrices of
a group are stacked: eigendecompositions, Newton–Schulz and SVD run batched. A failed eigendecomposition
(or non-finite root) keeps that factor's previous value and roots; a failed SVD polar falls back to
Newton–Schulz for the step. Each failure adds one to `solver_failures`; the third consecutive step with a
failure for one parameter raises SolverError. Under torch.compile the step runs eagerly
(`torch.compiler.disable`): the failure handling is data-dependent Python control flow.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from structbench.errors import SolverError
from structbench.optim import linalg
from structbench.optim.base import EagerStructuredOptimizer
from structbench.optim.distributed import DISTRIBUTED
from structbench.optim.hparams import Declaration, decade_around, flag, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import ADAMW_FALLBACK, adamw_state_bytes, hybrid_builder
from structbench.optim.muon import NS_COEFFICIENTS, NS_DTYPES, ORTHOGONALIZATION
from structbench.optim.partition import matrix_shape, matrix_view, split
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

ORDERS = ("gauss_seidel", "jacobi")
DAMPINGS = ("algorithm", "theorem")
ROOT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
ROOT_METHODS = ("eigh", "newton")
NEWTON_WARM_ITERS = 6
"""Warm-started Newton–Schulz updates before a cold start (one step's factor moves by about 1 - gamma)."""
NEWTON_PROBES = 64
"""Probe vectors that check the previous root before any d x d product (linalg.inverse_sqrt_newton_schulz)."""
NEWTON_COLD_ITERS = 40
"""Cold coupled Newton–Schulz updates before the eigendecomposition fallback (cond 1e5 needs about 20)."""
OVERSIZE = ("muon", "adamw")
STATE_DTYPE = torch.float32
_COUNTERS = ("step", "solver_failures")
ROOT_FALLBACKS = "root_fallbacks"
PAPER = "Xu et al. (arXiv 2601.21750)"
SWEPT = "the sweep in docs/optimizers.md; the paper gives no values"


def factored(shape: tuple[int, int], max_factor_dim: int) -> bool:
    """Whether a matrix of `shape` gets Kronecker factors (no limit when max_factor_dim is 0)."""
    return max_factor_dim == 0 or max(shape) <= max_factor_dim


def _trace(a: Tensor) -> Tensor:
    """tr A per matrix of a (k, d, d) stack, shape (k, 1, 1)."""
    return torch.diagonal(a, dim1=-2, dim2=-1).sum(-1)[:, None, None]


class Fismo(EagerStructuredOptimizer):
    """FISMO (Algorithm 1) over matrix parameters (2-D, or conv filters through their (out, in*kh*kw) view)."""

    matrices_only = "FISMO"
    cpu_state_keys = (*_COUNTERS, ROOT_FALLBACKS)

    @property
    def root_fallbacks(self) -> int:
        """Eigendecompositions that `root_method="newton"` fell back to, over all matrices and steps (the sum of the
        state counters, so a resumed run keeps counting)."""
        return sum(int(st[ROOT_FALLBACKS]) for st in self.state.values() if ROOT_FALLBACKS in st)

    hparams = (
        Declaration(
            real("lr", 0.002, ours(SWEPT), "(0, inf)", decade_around()),
            real("beta", 0.95, ours(f"Muon's reference momentum, fixed in {SWEPT}"), "[0, 1)", lin(0.91, 0.99)),
            real("gamma", 0.99, ours(SWEPT), "[0, 1]"),
            real("mu", 1e-3, ours(SWEPT), "(0, inf)"),
        )
        + ORTHOGONALIZATION
        + Declaration(
            option("order", "gauss_seidel", ORDERS, paper(f"{PAPER} Alg. 1 step 5: R_t from the new P_t")),
            option("damping", "algorithm", DAMPINGS, paper(f"{PAPER} Alg. 1 step 4; 'theorem' is Thm 4.1's")),
            flag("whiten_momentum", True, paper(f"{PAPER} Alg. 1 steps 6-7: momentum of the whitened gradient")),
            option("root_dtype", "float32", ROOT_DTYPES, ours("float32 eigendecompositions, retried in float64")),
            option(
                "root_method",
                "newton",
                ROOT_METHODS,
                ours("matrix products only (Newton–Schulz), within root_tol of the exact root; 'eigh' is exact"),
            ),
            real(
                "root_tol",
                1e-3,
                ours("RMS of Z X Z - I accepted from 'newton': per-step updates within 3 root_tol of float64 eigh's"),
                "(0, 1)",
            ),
            integer(
                "precond_every", 1, paper(f"{PAPER} Alg. 1: factors every step; k > 1 is not in the paper"), "[1, inf)"
            ),
            integer("max_factor_dim", 0, paper(f"{PAPER} Alg. 1 factors every matrix (0: no limit)"), "[0, inf)"),
            option("oversize", "muon", OVERSIZE, ours("an unfactored matrix takes the paper's Muon step")),
            flag("nesterov", False, paper(f"{PAPER} Alg. 1 has none")),
            real("weight_decay", 0.0, paper(f"{PAPER} Alg. 1 has none"), "[0, inf)"),
        )
    )
    hparams = hparams + DISTRIBUTED

    def step_group(self, group: dict[str, Any]) -> None:
        live = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse or p.grad.is_complex() for p in live):
            raise RuntimeError("FISMO supports dense real gradients only")
        buckets: dict[tuple[tuple[int, int], torch.device], list[Tensor]] = defaultdict(list)
        for p in live:
            buckets[(matrix_shape(p.shape), p.device)].append(p)
        for (shape, _), params in buckets.items():
            for p in params:
                if not self.state[p]:
                    self._init_state(p, shape, group)
            self._step_bucket(group, params, shape)

    def _init_state(self, param: Tensor, shape: tuple[int, int], group: Mapping[str, Any]) -> None:
        rows, cols = shape
        state = self.state[param]
        options = {"dtype": STATE_DTYPE, "device": param.device}
        if factored(shape, group["max_factor_dim"]):
            state["P"] = torch.eye(rows, **options)
            state["Q"] = torch.eye(cols, **options)
            state["P_inv_root"] = torch.eye(rows, **options)
            state["Q_inv_root"] = torch.eye(cols, **options)
        state["momentum"] = torch.zeros(rows, cols, **options)
        counters = _COUNTERS + ((ROOT_FALLBACKS,) if uses_newton(shape, group) else ())
        for key in counters:
            state[key] = torch.zeros((), dtype=torch.int64)

    def _step_bucket(self, group: dict[str, Any], params: list[Tensor], shape: tuple[int, int]) -> None:
        states = [self.state[p] for p in params]
        grads = torch.stack([matrix_view(p.grad).to(STATE_DTYPE) for p in params])
        failed = [False] * len(params)
        p_roots = q_roots = None
        signal = grads
        if factored(shape, group["max_factor_dim"]):
            due = [i for i, st in enumerate(states) if int(st["step"]) % group["precond_every"] == 0]
            halves: tuple[Tensor | None, Tensor | None] = (None, None)
            if due:
                everyone = len(due) == len(params)
                fresh, found = self._refresh(group, [params[i] for i in due], grads if everyone else grads[due])
                halves = found if everyone else halves
                for i, fail in zip(due, fresh, strict=True):
                    failed[i] = fail
            p_roots = _stacked(states, "P_inv_root")
            q_roots = _stacked(states, "Q_inv_root")
            if group["whiten_momentum"]:
                signal = _whitened(grads, p_roots, q_roots, *halves)
        moments = [st["momentum"] for st in states]
        torch._foreach_mul_(moments, group["beta"])
        torch._foreach_add_(moments, list(signal.unbind(0)), alpha=1.0 - group["beta"])
        direction = torch.stack(moments)
        if group["nesterov"]:
            direction = torch.lerp(signal, direction, group["beta"])
        if p_roots is not None and not group["whiten_momentum"]:
            direction = p_roots @ direction @ q_roots
        ortho = self._polar(direction, params, group, failed)
        update = ortho if p_roots is None else p_roots @ ortho @ q_roots
        decay = 1.0 - group["lr"] * group["weight_decay"]
        for p, st, delta, fail in zip(params, states, update.unbind(0), failed, strict=True):
            _apply(p, delta, group["lr"], decay)
            st["step"] += 1
            if fail:
                self.solver_failed(st, "solver_failures", partial(_solver_failure, p), failures=0)
            else:
                self.solver_ok(st, "solver_failures")

    def _refresh(
        self, group: Mapping[str, Any], params: list[Tensor], grads: Tensor
    ) -> tuple[list[bool], tuple[Tensor | None, Tensor | None]]:
        """Steps 4-5: new P, Q and their inverse roots for a (k, m, n) stack. Returns which matrices had a failure,
        and, for the whitening, P_t^{-1/2} G_t (formed for R_t in Gauss–Seidel order; None in Jacobi order) and
        G_t Q_t^{-1/2} (formed for L_t with Q_{t-1}^{-1/2}: given only where every Q root is unchanged)."""
        states = [self.state[p] for p in params]
        rows, cols = grads.shape[-2:]
        gamma, mu = group["gamma"], group["mu"]
        p_old, q_old = _stacked(states, "P"), _stacked(states, "Q")
        p_root_old, q_root_old = _stacked(states, "P_inv_root"), _stacked(states, "Q_inv_root")
        theorem = group["damping"] == "theorem"

        left = grads @ q_root_old
        damp_left = mu * (_squared_norm(q_root_old) / cols if theorem else _trace(p_old) / rows)
        p_new, p_root, p_ok, p_fallbacks = self._normalised_factor(
            p_old, p_root_old, _blend(p_old, left, left.mT, 1.0 / cols, damp_left, gamma), damp_left, gamma, group
        )

        p_root_right = p_root if group["order"] == "gauss_seidel" else p_root_old
        right = p_root_right @ grads
        damp_right = mu * (_squared_norm(p_root_right) / rows if theorem else _trace(q_old) / cols)
        q_new, q_root, q_ok, q_fallbacks = self._normalised_factor(
            q_old, q_root_old, _blend(q_old, right.mT, right, 1.0 / rows, damp_right, gamma), damp_right, gamma, group
        )
        if group["root_method"] == "newton":
            for st, p_count, q_count in zip(states, p_fallbacks, q_fallbacks, strict=True):
                st[ROOT_FALLBACKS] += p_count + q_count

        outcome = []
        matrices = zip(_own_rows(p_new), _own_rows(p_root), _own_rows(q_new), _own_rows(q_root), strict=True)
        for i, (st, (p, p_inv_root, q, q_inv_root)) in enumerate(zip(states, matrices, strict=True)):
            st["P"], st["P_inv_root"], st["Q"], st["Q_inv_root"] = p, p_inv_root, q, q_inv_root
            failures = (not p_ok[i]) + (not q_ok[i])
            self.solver_failures += failures
            outcome.append(failures > 0)
        kept = torch.equal(q_root, q_root_old)
        return outcome, (right if group["order"] == "gauss_seidel" else None, left if kept else None)

    @staticmethod
    def _normalised_factor(
        old: Tensor, old_root: Tensor, blended: Tensor, damp: Tensor, gamma: float, group: Mapping[str, Any]
    ) -> tuple[Tensor, Tensor, list[bool], list[int]]:
        """Trace normalisation and symmetrisation of one factor's EMA (`_blend`), and its inverse square root.

        Matrices whose root fails keep their previous factor and root. Returns (factor, root, ok per matrix,
        eigendecomposition fallbacks of `root_method="newton"` per matrix).
        """
        dim = old.size(-1)
        scale = dim / _trace(blended)
        factor = (blended + blended.mT).mul_(scale / 2)
        floor = ((1.0 - gamma) * damp * scale).reshape(-1, 1)
        dtype = ROOT_DTYPES[group["root_dtype"]]
        if group["root_method"] == "newton":
            roots, fallbacks = _newton_inverse_roots(factor, old_root, floor, dtype, group["root_tol"])
        else:
            roots, fallbacks = _inverse_roots(factor, floor, dtype), [0] * len(factor)
        ok = [root is not None for root in roots]
        if all(ok):
            return factor, torch.stack(roots) if len(roots) > 1 else roots[0].unsqueeze(0), ok, fallbacks
        factor = torch.stack([f if good else o for f, o, good in zip(factor, old, ok, strict=True)])
        root = torch.stack([r if r is not None else o for r, o in zip(roots, old_root, strict=True)])
        return factor, root, ok, fallbacks

    def _polar(self, direction: Tensor, params: list[Tensor], group: Mapping[str, Any], failed: list[bool]) -> Tensor:
        """Polar(direction) per matrix: exact SVD (falling back to Newton–Schulz on failure) or Newton–Schulz."""
        if group["polar"] == "svd":
            try:
                return linalg.polar_svd(direction)
            except SolverError:
                self.solver_failures += len(params)
                failed[:] = [True] * len(params)
        return linalg.newton_schulz(
            direction,
            steps=group["ns_steps"],
            coefficients=NS_COEFFICIENTS[group["ns_coefficients"]],
            eps=group["ns_eps"],
            dtype=NS_DTYPES[group["ns_dtype"]],
        )


def _solver_failure(param: Tensor, streak: int) -> str:
    return f"FISMO: solvers for a {tuple(param.shape)} parameter failed {streak} steps in a row"


def uses_newton(shape: tuple[int, int], group: Mapping[str, Any]) -> bool:
    """Whether a matrix of `shape` has factors whose roots come from Newton–Schulz (and a fallback counter)."""
    return group["root_method"] == "newton" and factored(shape, group["max_factor_dim"])


def _whitened(grads: Tensor, p_roots: Tensor, q_roots: Tensor, left: Tensor | None, right: Tensor | None) -> Tensor:
    """Step 6, P^{-1/2} G Q^{-1/2} for (k, m, n) stacks, reusing `left` = P^{-1/2} G or `right` = G Q^{-1/2} (formed
    with the current roots by the refresh, else None): the remaining product is (m x m)(m x n) from `right`,
    m^2 n operations, or (m x n)(n x n) from `left`, m n^2; the cheaper where both are given."""
    rows, cols = grads.shape[-2:]
    if right is not None and (left is None or rows <= cols):
        return p_roots @ right
    return (p_roots @ grads if left is None else left) @ q_roots


def _stacked(states: list[dict[str, Any]], key: str) -> Tensor:
    """The matrices `key` of `states` as a (k, d, d) stack: a view of the one matrix when k is 1, else a copy."""
    if len(states) == 1:
        return states[0][key].unsqueeze(0)
    return torch.stack([st[key] for st in states])


def _own_rows(stack: Tensor) -> tuple[Tensor, ...]:
    """The matrices of a (k, d, d) stack as state tensors of their own: the view when k is 1 (the storage holds
    nothing else), else copies (a view would keep the whole stack alive)."""
    return stack.unbind(0) if stack.size(0) == 1 else tuple(matrix.clone() for matrix in stack)


def _blend(old: Tensor, a: Tensor, b: Tensor, alpha: float, damp: Tensor, gamma: float) -> Tensor:
    """Steps 4-5's EMA before normalisation, gamma X + (1 - gamma) (alpha A B + damp I), for (k, d, d) stacks: one
    fused product for the statistic and the EMA, the damping added on the diagonal."""
    blended = torch.baddbmm(old, a, b, beta=gamma, alpha=(1.0 - gamma) * alpha)
    blended.diagonal(dim1=-2, dim2=-1).add_((1.0 - gamma) * damp.reshape(-1, 1))
    return blended


def _squared_norm(a: Tensor) -> Tensor:
    """||A||_F^2 per matrix, shape (k, 1, 1): tr(X^{-1}) when A = X^{-1/2}."""
    return a.square().sum(dim=(-2, -1), keepdim=True)


def _inverse_roots(factors: Tensor, floor: Tensor, dtype: torch.dtype) -> list[Tensor | None]:
    """X^{-1/2} per matrix of a (k, d, d) SPD stack (eigenvalues clamped at `floor`, (k, 1)); None where it fails.

    One batched eigendecomposition; on SolverError (or a non-finite root) the stack is retried matrix by matrix.
    """

    def solve(stack: Tensor, low: Tensor) -> Tensor:
        evals, evecs = linalg.eigh_with_retry(stack.to(dtype))
        return linalg.from_eigenpairs(evals.clamp_min(low).rsqrt(), evecs)

    try:
        roots = solve(factors, floor)
    except SolverError:
        roots = None
    if roots is not None and bool(torch.isfinite(roots).all()):
        return list(roots.unbind(0))
    found: list[Tensor | None] = []
    for factor, low in zip(factors, floor, strict=True):
        try:
            root = solve(factor.unsqueeze(0), low.unsqueeze(0))[0]
        except SolverError:
            found.append(None)
            continue
        found.append(root if bool(torch.isfinite(root).all()) else None)
    return found


def _newton_inverse_roots(
    factors: Tensor, previous: Tensor, floor: Tensor, dtype: torch.dtype, tol: float
) -> tuple[list[Tensor | None], list[int]]:
    """X^{-1/2} per matrix of a (k, d, d) SPD stack by Newton–Schulz: warm from `previous` (the last roots), then
    cold, then by eigendecomposition (`_inverse_roots`) for the matrices still above `tol`. Returns the roots
    (None where every method failed) and, per matrix, 1 where it fell back to the eigendecomposition."""
    stack = factors.to(dtype)
    warm = linalg.inverse_sqrt_newton_schulz(
        stack, init=previous, tol=tol, max_iters=NEWTON_WARM_ITERS, probes=NEWTON_PROBES, symmetric=True
    )
    roots = list(warm.root.unbind(0))
    done = [bool(ok) for ok in warm.converged]
    retry = [i for i, ok in enumerate(done) if not ok]
    if retry:
        cold = linalg.inverse_sqrt_newton_schulz(stack[retry], tol=tol, max_iters=NEWTON_COLD_ITERS, symmetric=True)
        for i, root, ok in zip(retry, cold.root.unbind(0), cold.converged, strict=True):
            roots[i], done[i] = root, bool(ok)
    found: list[Tensor | None] = [root.to(STATE_DTYPE) for root in roots]
    pending = [i for i, ok in enumerate(done) if not ok]
    if pending:
        for i, root in zip(pending, _inverse_roots(factors[pending], floor[pending], dtype), strict=True):
            found[i] = root
    return found, [0 if ok else 1 for ok in done]


def _apply(param: Tensor, delta: Tensor, lr: float, decay: float) -> None:
    """W <- decay W - lr D, rounded once to the parameter dtype."""
    if param.dtype == STATE_DTYPE:
        if decay != 1.0:
            param.mul_(decay)
        param.add_(delta.view_as(param), alpha=-lr)
        return
    weight = param.to(STATE_DTYPE)
    if decay != 1.0:
        weight.mul_(decay)
    weight.add_(delta.view_as(param), alpha=-lr)
    param.copy_(weight)


def _route(model: nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    """Muon's convention (KellerJordan/Muon muon.py; the paper names no routing: structbench's choice): hidden
    matrices and conv filters to FISMO; 1-D params, embeddings and
    the head to AdamW; with `oversize="adamw"`, also matrices with a side above `max_factor_dim`."""
    routing = split(model, named, fallback_name="adamw", head_to_fallback=True)
    if hp["oversize"] != "adamw":
        return routing
    shapes = {name: matrix_shape(param.shape) for name, param in named}
    structured = tuple(n for n in routing.structured if factored(shapes[n], hp["max_factor_dim"]))
    fallback = tuple(n for n, _ in named if n not in structured)
    return Routing(structured=structured, fallback=fallback, fallback_name="adamw" if fallback else None)


COUNTER_BYTES = 8 * len(_COUNTERS)


def fismo_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """Per matrix: P, Q and their inverse roots (2 m^2 + 2 n^2 floats) and M (m n), float32, two int64 counters;
    an oversize matrix under `oversize="muon"` keeps only M and the counters. Plus torch AdamW's state."""
    total = 0
    for shape in structured:
        rows, cols = matrix_shape(shape)
        factors = 2 * rows * rows + 2 * cols * cols if factored((rows, cols), hp["max_factor_dim"]) else 0
        fallback_counter = 8 if uses_newton((rows, cols), hp) else 0
        total += 4 * (factors + rows * cols) + COUNTER_BYTES + fallback_counter
    return total + adamw_state_bytes(fallback)


_NOTES = (
    "The paper gives no hyperparameter values: lr 0.002, beta 0.95, gamma 0.99 and mu 1e-3 come from a small sweep "
    "on a quadratic and an MLP (docs/optimizers.md, FISMO's defaults). Its lr optima differ by task, so suites set "
    "lr (a Muon lr does not carry over either: no shape scale in Algorithm 1). FISMO is not invariant to the gradient "
    "scale (loss reduction, batch size, clipping, loss scaling all change it; tests/optim/test_fismo.py quantifies "
    "it). Polar: Muon's quintic NS from X0 = M/(||M||_F + ns_eps) (the paper says only 'following Muon'); "
    "polar='svd' is the exact U V^T. Switches: damping 'theorem' (mu tr(Q^{-1})/n, Theorem 4.1's form); flagged not "
    "in paper: precond_every > 1, nesterov, weight_decay (decoupled), max_factor_dim > 0 with oversize 'muon' "
    "(identity factors) | 'adamw' (routed to the fallback). Routing: hidden matrices and conv filters "
    "(out, in*kh*kw) to FISMO; 1-D params, embeddings and the head to torch AdamW with Muon's aux-Adam settings. "
    "State float32 for any parameter dtype: P, Q, P^{-1/2}, Q^{-1/2}, M (4 (2 m^2 + 2 n^2 + m n) bytes) and two "
    "int64 counters, plus root_fallbacks with the default roots. Roots: root_method 'newton' (default; matrix "
    "products only: Newton–Schulz warm-started from the previous root, a probe and residual check, a cold coupled "
    "start, then eigh; eigh fallbacks counted in root_fallbacks and the run's root_fallbacks column) or 'eigh' "
    "(exact). Newton roots have residual RMS(Z X Z - I) within root_tol (1e-3); each step's update stays within "
    "3 root_tol of the float64 eigh form where the factors' condition numbers stay below about 250 "
    "(tests/optim/test_matrix_roots.py)."
)

FISMO = register(
    OptimizerEntry(
        name="fismo",
        refresh_interval="precond_every",
        summary="FISMO: Kronecker Fisher factors (Gauss–Seidel EMA, trace-normalised) whiten a Muon-style polar step",
        reference=(
            "Xu, Yan & Zhang 2026, 'FISMO: Fisher-Structured Momentum-Orthogonalized Optimizer' "
            "(arXiv 2601.21750), Algorithm 1"
        ),
        hparams=Fismo.hparams + ADAMW_FALLBACK,
        build=hybrid_builder(Fismo),
        route=_route,
        notes=_NOTES,
        lr_keys=("lr", "adamw_lr"),
        state_bytes=fismo_state_bytes,
    )
)

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
- Inverse square roots, default `root_method="newton"` (matrix products only, float32 whatever `matmul_precision`):
  each root is refreshed in one of three modes (`MODES`), chosen per same-shape stack from the previous refresh's
  outcome: "kept" (the previous root, checked against the new factor by `NEWTON_PROBES` probe vectors,
  linalg.inverse_sqrt_probe_residual: no d x d product), "warm" (`NEWTON_STEADY_UPDATES` warm Newton–Schulz updates,
  linalg.inverse_sqrt_warm_updates, each kept only where it lowers the residual) or "checked" (the host-checked
  path: warm updates with a host check after each, at most `NEWTON_WARM_ITERS`, then a cold coupled start, at most
  `NEWTON_COLD_ITERS`, then the eigendecomposition below; a first refresh is "checked"). A root passes when its
  residual ||Z X Z - I||_F / sqrt(d) is at most `root_tol` (for a kept root: its probe estimate at most
  root_tol / PROBE_MARGIN). With `root_check="deferred"` "kept" and "warm" read nothing on the host: their
  pass/fail flags go to a DeferredCheck and are read at the next step, which first repairs each root that failed by
  the host-checked path (an eigendecomposition there adds one to the matrix's `root_fallbacks` and to the
  optimizer's, recorded in the runs table's `root_fallbacks` column) and refreshes that stack "checked" next. The
  price: a root that failed its check is used for the step it was made in (its factor jumped beyond what the
  previous root or the warm updates reach: tests/optim/test_matrix_roots.py shows one such step at gradient scale 10,
  about 1 % off the exact update for the steps after it), and a matrix's solver failures are counted, and the third
  in a row raised, one step later. `state_dict()` makes the pending repairs first, so a resumed run continues
  exactly. With `root_check="immediate"` every refresh is "checked" at once (host reads every step: the behaviour
  before the deferred check). The default `root_check="auto"` is "deferred" on a device that queues work (CUDA), where a
  host read waits for every queued kernel, and "immediate" on the CPU, where it waits for nothing: there the deferred
  path's "warm" refresh (2 + 3 NEWTON_STEADY_UPDATES d x d products, however close the root already is) costs more than
  a host-checked one, which stops at the first iterate that passes (ResNet-18's 4608 x 4608 factors on a 2-core CPU:
  about 100 s for the "warm" second step against 6 s host-checked). No eigenvalue floor is applied to Newton–Schulz
  roots (in exact arithmetic the damping already bounds the spectrum below). A root with residual r is about r / 2 from
  the exact root, relative, so each step's update stays within about root_tol (default 1e-3) of the exact form;
  tests/optim/test_matrix_roots.py checks 3 root_tol against float64 eigendecompositions over several steps. Where the
  gradients are small (tr L << m) the factors move little per step and the roots stay "kept": a step then costs the
  products above, the polar step and the probes (3 products of d x d by d x 64 per factor), and the warm updates' 2 + 3
  NEWTON_STEADY_UPDATES d x d products only when a probe residual passes root_tol / PROBE_MARGIN^2. (Warm updates every
  step would cost about 5x the rest of the step in d^3 products at GPT-2-small's 3072 x 768 matrices: hence the
  probe-kept mode.)
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

- `matmul_precision` ("float32" default, the paper's exact products; "tf32"; "bfloat16"; structbench.optim.precision):
  the precision of the large non-root products: G Q^{-1/2} and its Gram product (L), P^{-1/2} G and its Gram
  product (R), the whitening's remaining product and the two of P^{-1/2} O Q^{-1/2} (and, with
  `whiten_momentum=False`, those of P^{-1/2} M Q^{-1/2}). Each product's entrywise error is at most
  c |A| |B|, c = precision.product_error_bound (about 2 u + k 2^-24, u = 2^-11 for tf32, 2^-8 for bfloat16);
  tests/optim/test_fismo_gpu_path.py carries it through one step's whitening, polar factor and unwhitening against
  float64. The roots (and their checks) stay float32; the Newton–Schulz polar step keeps its own `ns_dtype`. The
  default stays float32: the issue asks for the default to be chosen by GPU measurement and none was available to
  this change (the counts alone do not decide it: they show the float32 FLOPs, not the accuracy a run needs).

State per factored matrix, float32 whatever the parameter dtype: `P`, `Q`, `P_inv_root`, `Q_inv_root`,
`momentum` (m x n), plus CPU int64 scalars `step`, `solver_failures` (consecutive) and, with
`root_method="newton"`, `root_fallbacks` (cumulative) and the CPU int8 pair `root_modes` (the next refresh's mode,
P side and Q side). Same-shape matrices of a group on one device are kept in one stack per state entry (made once,
and again only when the stack's members or their state tensors change, e.g. after `load_state_dict`); each
parameter's state holds views of its row, so a saved state dict writes each stack once. Eigendecompositions,
Newton–Schulz, SVD and the products run batched over a stack. With `root_method="eigh"` a failed eigendecomposition
(or non-finite root) keeps that factor's previous value and root; with "newton" a non-finite factor does (found on
the device, counted a step later) and a root whose repair fails keeps its checked iterate; a failed SVD polar falls
back to Newton–Schulz for the step. Each failure adds one to `solver_failures`; the third consecutive step with a
failure for one parameter raises SolverError. Under torch.compile the step runs eagerly (`torch.compiler.disable`):
the failure handling is data-dependent Python control flow.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from structbench.errors import SolverError
from structbench.optim import linalg
from structbench.optim.base import EagerStructuredOptimizer
from structbench.optim.deferred import DeferredCheck
from structbench.optim.distributed import DISTRIBUTED
from structbench.optim.hparams import Declaration, decade_around, flag, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import ADAMW_FALLBACK, adamw_state_bytes, hybrid_builder
from structbench.optim.muon import NS_COEFFICIENTS, NS_DTYPES, ORTHOGONALIZATION
from structbench.optim.partition import matrix_shape, matrix_view, split
from structbench.optim.precision import MATMUL_PRECISIONS, matmul
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

ORDERS = ("gauss_seidel", "jacobi")
DAMPINGS = ("algorithm", "theorem")
ROOT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
ROOT_METHODS = ("eigh", "newton")
ROOT_CHECKS = ("auto", "deferred", "immediate")
"""`root_check`: "auto" is "deferred" where the device queues work (CUDA), "immediate" on the CPU
(`_checked_at_once`)."""
NEWTON_WARM_ITERS = 6
"""Warm-started Newton–Schulz updates before a cold start (one step's factor moves by about 1 - gamma)."""
NEWTON_PROBES = 64
"""Probe vectors that check the previous root before any d x d product (linalg.inverse_sqrt_newton_schulz)."""
NEWTON_COLD_ITERS = 40
"""Cold coupled Newton–Schulz updates before the eigendecomposition fallback (cond 1e5 needs about 20)."""
NEWTON_STEADY_UPDATES = 4
"""Warm updates (linalg.inverse_sqrt_warm_updates) a stack of roots in mode "warm" takes, with no host read."""
OVERSIZE = ("muon", "adamw")
STATE_DTYPE = torch.float32
_COUNTERS = ("step", "solver_failures")
ROOT_FALLBACKS = "root_fallbacks"
ROOT_MODES = "root_modes"
"""CPU int8 state (P side, Q side): how the root is refreshed next, an index into `MODES`."""
MODES = ("kept", "warm", "checked")
"""A root's refresh, from the last one's outcome (a stack takes the most thorough of its matrices' modes):
"kept" (its probe residual was at most root_tol / PROBE_MARGIN^2): checked by probes against the new factor, no
product of d x d matrices, and accepted when their estimate is at most root_tol / PROBE_MARGIN (as in
linalg.inverse_sqrt_newton_schulz: a root with residual above root_tol passes with probability below 2e-9);
"warm" (above it): NEWTON_STEADY_UPDATES warm updates, accepted on their exact residual; "checked" (a first
refresh, a root that failed its check, or one whose host-checked refresh needed more than NEWTON_STEADY_UPDATES
updates): the host-checked iterations and fallbacks at once (`_newton_inverse_roots`). Only "checked" reads the
host."""
KEPT, WARM, CHECKED = range(len(MODES))
SIDES = ("P", "Q")
ROOT_OF = {"P": "P_inv_root", "Q": "Q_inv_root"}
FLAG_KINDS = ("repair", "broken", "stale")
"""The root flags a deferred refresh posts per side and matrix: the root failed its check (repair it, "checked"
next), the factor came out non-finite (a solver failure: factor and root kept), the root is "warm" next."""
PAPER = "Xu et al. (arXiv 2601.21750)"
SWEPT = "the sweep in docs/optimizers.md; the paper gives no values"


def factored(shape: tuple[int, int], max_factor_dim: int) -> bool:
    """Whether a matrix of `shape` gets Kronecker factors (no limit when max_factor_dim is 0)."""
    return max_factor_dim == 0 or max(shape) <= max_factor_dim


def _trace(a: Tensor) -> Tensor:
    """tr A per matrix of a (k, d, d) stack, shape (k, 1, 1)."""
    return torch.diagonal(a, dim1=-2, dim2=-1).sum(-1)[:, None, None]


@dataclass
class _Pending:
    """What one step of a stack left to finish at the next (`Fismo._settle`): the rows it stepped, the rows whose
    factors it refreshed (the posted root flags are theirs, (flag, side) in `kinds` order), the rows with a failure
    already known on the host, and what the repair of a root needs (eigenvalue floors per side, root_tol, dtype)."""

    rows: list[int]
    refreshed: list[int] = field(default_factory=list)
    kinds: list[tuple[str, str]] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)
    floors: dict[str, Tensor] = field(default_factory=dict)
    tol: float = 0.0
    dtype: torch.dtype = STATE_DTYPE


@dataclass
class _Stack:
    """The state of a group's same-shape matrices on one device, one (k, ...) tensor per state entry; each
    parameter's state holds views of its row (`views`), so per-parameter access and `state_dict` see the one storage.
    `modes` mirrors the CPU `root_modes` state on the host; `open_streaks` the rows whose solver-failure streak is
    nonzero (both so that a step reads no state tensor to know them)."""

    params: list[Tensor]
    tensors: dict[str, Tensor]
    views: list[dict[str, Tensor]]
    modes: list[list[int]]
    open_streaks: set[int]
    check: DeferredCheck = field(default_factory=DeferredCheck)
    pending: _Pending | None = None

    @classmethod
    def of(cls, params: list[Tensor], states: list[dict[str, Any]]) -> _Stack:
        """Stack the states of `params` (copies, once) and point each state at its row."""
        keys = list(states[0])
        tensors = {key: torch.stack([st[key] for st in states]) for key in keys}
        views = [{key: tensors[key][row] for key in keys} for row in range(len(params))]
        for st, view in zip(states, views, strict=True):
            st.update(view)
        modes = tensors[ROOT_MODES].tolist() if ROOT_MODES in tensors else [[CHECKED] * len(SIDES) for _ in params]
        streaks = {row for row, count in enumerate(tensors["solver_failures"].tolist()) if count}
        return cls(params, tensors, views, modes, streaks)

    def holds(self, params: list[Tensor], states: list[dict[str, Any]]) -> bool:
        """Whether this stack is exactly `params` and their states still hold its views (not values loaded or set
        since: those are stacked anew)."""
        return (
            len(params) == len(self.params)
            and all(a is b for a, b in zip(params, self.params, strict=True))
            and all(
                st.get(key) is view for st, row in zip(states, self.views, strict=True) for key, view in row.items()
            )
        )

    def row_of(self, param: Tensor) -> int:
        return next(row for row, p in enumerate(self.params) if p is param)


class _Rows:
    """Some rows of a stack's tensors: read (`of`) and written back (`put`, `keep`) without a copy when they are
    all of them."""

    def __init__(self, rows: list[int], size: int) -> None:
        self.rows = rows
        self.every = rows == list(range(size))

    def of(self, tensor: Tensor) -> Tensor:
        return tensor if self.every else tensor[self.rows]

    def put(self, tensor: Tensor, value: Tensor) -> None:
        if self.every:
            tensor.copy_(value)
        else:
            tensor[self.rows] = value

    def keep(self, tensor: Tensor, mask: Tensor, value: Tensor) -> None:
        """Rows of `tensor` set to `value` where the per-row `mask` holds, kept elsewhere (one launch)."""
        mask = mask.reshape(-1, *([1] * (tensor.dim() - 1)))
        if self.every:
            torch.where(mask, value, tensor, out=tensor)
        else:
            tensor[self.rows] = torch.where(mask, value, tensor[self.rows])


class Fismo(EagerStructuredOptimizer):
    """FISMO (Algorithm 1) over matrix parameters (2-D, or conv filters through their (out, in*kh*kw) view)."""

    matrices_only = "FISMO"
    cpu_state_keys = (*_COUNTERS, ROOT_FALLBACKS, ROOT_MODES)

    def __init__(self, params: Any, **hparams: Any) -> None:
        super().__init__(params, **hparams)
        self._stacks: dict[Tensor, _Stack] = {}
        self._probes: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._stacks, self._probes = {}, {}

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
            option(
                "root_check",
                "auto",
                ROOT_CHECKS,
                ours(
                    "'auto': 'deferred' on a device that queues work (CUDA), 'immediate' on the CPU; 'deferred': "
                    "'newton' roots checked a step later (no host read); 'immediate': at once, every refresh"
                ),
            ),
            real(
                "root_tol",
                1e-3,
                ours("RMS of Z X Z - I accepted from 'newton': per-step updates within 3 root_tol of float64 eigh's"),
                "(0, 1)",
            ),
            option(
                "matmul_precision",
                "float32",
                MATMUL_PRECISIONS,
                paper(f"{PAPER} Alg. 1: exact products; 'tf32' / 'bfloat16' round the large non-root products"),
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

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict, after the pending root repairs and failure counts of the last step are made (the ones
        the next step would make first: the same state either way, so a run resumed from it continues exactly)."""
        for stack in {id(s): s for s in self._stacks.values()}.values():
            self._settle(stack)
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._stacks.clear()
        super().load_state_dict(state_dict)

    def step_group(self, group: dict[str, Any]) -> None:
        live = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse or p.grad.is_complex() for p in live):
            raise RuntimeError("FISMO supports dense real gradients only")
        buckets: dict[tuple[tuple[int, int], torch.device], list[Tensor]] = defaultdict(list)
        for p in live:
            buckets[(matrix_shape(p.shape), p.device)].append(p)
        for (shape, device), params in buckets.items():
            for p in params:
                if not self.state.get(p):
                    self._init_state(p, shape, group)
            stack = self._stack(group, shape, device)
            self._settle_and_check(stack)
            self._step_stack(group, stack, params, shape)

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
        newton = uses_newton(shape, group)
        for key in _COUNTERS + ((ROOT_FALLBACKS,) if newton else ()):
            state[key] = torch.zeros((), dtype=torch.int64, device="cpu")
        if newton:
            state[ROOT_MODES] = torch.full((len(SIDES),), CHECKED, dtype=torch.int8, device="cpu")

    def _stack(self, group: Mapping[str, Any], shape: tuple[int, int], device: torch.device) -> _Stack:
        """The stack of the group's matrices of `shape` on `device` that have state, stacked anew (after the old
        stacks' pending work is settled) when its members or their state tensors changed."""
        members = [
            p for p in group["params"] if self.state.get(p) and p.device == device and matrix_shape(p.shape) == shape
        ]
        states = [self.state[p] for p in members]
        stack = self._stacks.get(members[0])
        if stack is not None and stack.holds(members, states):
            return stack
        for old in {id(s): s for p in members if (s := self._stacks.get(p)) is not None}.values():
            self._settle(old)
        stack = _Stack.of(members, states)
        for p in members:
            self._stacks[p] = stack
        return stack

    def _step_stack(self, group: dict[str, Any], stack: _Stack, params: list[Tensor], shape: tuple[int, int]) -> None:
        rows = [stack.row_of(p) for p in params]
        select = _Rows(rows, len(stack.params))
        precision = group["matmul_precision"]
        grads = torch.stack([matrix_view(p.grad) for p in params]).to(STATE_DTYPE)
        pending = _Pending(rows, tol=group["root_tol"], dtype=ROOT_DTYPES[group["root_dtype"]])
        p_roots = q_roots = None
        signal = grads
        if factored(shape, group["max_factor_dim"]):
            every = group["precond_every"]
            refresh = rows if every == 1 else [r for r, p in zip(rows, params, strict=True) if self._due(p, every)]
            halves: tuple[Tensor | None, Tensor | None] = (None, None)
            if refresh:
                refreshed = grads if refresh == rows else grads[[rows.index(r) for r in refresh]]
                found = self._refresh(group, stack, refresh, refreshed, pending)
                halves = found if refresh == rows else halves
            p_roots = select.of(stack.tensors["P_inv_root"])
            q_roots = select.of(stack.tensors["Q_inv_root"])
            if group["whiten_momentum"]:
                signal = _whitened(grads, p_roots, q_roots, *halves, precision)
        moments = _moved_momentum(stack.tensors["momentum"], select, signal, group["beta"])
        direction = torch.lerp(signal, moments, group["beta"]) if group["nesterov"] else moments
        if p_roots is not None and not group["whiten_momentum"]:
            direction = matmul(matmul(p_roots, direction, precision), q_roots, precision)
        ortho = self._polar(direction, group, pending)
        update = ortho if p_roots is None else matmul(matmul(p_roots, ortho, precision), q_roots, precision)
        _apply_all(params, update, group["lr"], 1.0 - group["lr"] * group["weight_decay"])
        if select.every:
            stack.tensors["step"].add_(1)
        else:
            stack.tensors["step"][rows] += 1
        stack.pending = pending
        if not stack.check.pending:
            self._settle_and_check(stack)

    def _due(self, param: Tensor, every: int) -> bool:
        return int(self.state[param]["step"]) % every == 0

    def _refresh(
        self, group: Mapping[str, Any], stack: _Stack, rows: list[int], grads: Tensor, pending: _Pending
    ) -> tuple[Tensor | None, Tensor | None]:
        """Steps 4-5 for `rows` of the stack ((k, m, n) gradients): new P, Q and their inverse roots, written into the
        stack. Returns, for the whitening, P_t^{-1/2} G_t (formed for R_t in Gauss–Seidel order; None in Jacobi order)
        and G_t Q_t^{-1/2} (formed for L_t with Q_{t-1}^{-1/2}: given only where the Q roots are unchanged)."""
        select = _Rows(rows, len(stack.params))
        rows_, cols = grads.shape[-2:]
        gamma, mu, precision = group["gamma"], group["mu"], group["matmul_precision"]
        p_old, q_old = select.of(stack.tensors["P"]), select.of(stack.tensors["Q"])
        p_root_old, q_root_old = select.of(stack.tensors["P_inv_root"]), select.of(stack.tensors["Q_inv_root"])
        theorem = group["damping"] == "theorem"
        pending.refreshed = rows

        left = matmul(grads, q_root_old, precision)
        damp_left = mu * (_squared_norm(q_root_old) / cols if theorem else _trace(p_old) / rows_)
        blended = _blend(p_old, left, left.mT, 1.0 / cols, damp_left, gamma, precision)
        p_side = self._factor_and_root(stack, "P", select, blended, damp_left, gamma, group, pending)

        p_root_right = p_side.root if group["order"] == "gauss_seidel" else p_root_old
        right = matmul(p_root_right, grads, precision)
        damp_right = mu * (_squared_norm(p_root_right) / rows_ if theorem else _trace(q_old) / cols)
        blended = _blend(q_old, right.mT, right, 1.0 / rows_, damp_right, gamma, precision)
        q_side = self._factor_and_root(stack, "Q", select, blended, damp_right, gamma, group, pending)

        for side in (p_side, q_side):
            side.store(select)
        deferred = [(name, side) for name, side in zip(SIDES, (p_side, q_side), strict=True) if side.flags]
        pending.kinds = [(what, name) for what in FLAG_KINDS for name, _ in deferred]
        if deferred:
            stack.check.post(torch.cat([side.flags[what] for what in FLAG_KINDS for _, side in deferred]))
        kept = group["root_method"] == "newton" and not q_side.updated
        return (right if group["order"] == "gauss_seidel" else None, left if kept else None)

    def _factor_and_root(
        self,
        stack: _Stack,
        side: str,
        select: _Rows,
        blended: Tensor,
        damp: Tensor,
        gamma: float,
        group: Mapping[str, Any],
        pending: _Pending,
    ) -> _Side:
        """Trace normalisation and symmetrisation of one factor's EMA (`_blend`), and its inverse square root."""
        dim = blended.size(-1)
        scale = dim / _trace(blended)
        factor = (blended + blended.mT).mul_(scale / 2)
        floor = ((1.0 - gamma) * damp * scale).reshape(-1, 1)
        old_root = select.of(stack.tensors[ROOT_OF[side]])
        if group["root_method"] == "eigh":
            return self._eigh_side(stack, side, select, factor, floor, old_root, pending)
        dtype = ROOT_DTYPES[group["root_dtype"]]
        mode = max(stack.modes[row][SIDES.index(side)] for row in select.rows)
        if mode == CHECKED or _checked_at_once(group["root_check"], factor.device):
            return self._checked_side(stack, side, select, factor, floor, old_root, pending)
        pending.floors[side] = floor
        probes = self._probe_matrix(dim, dtype, factor.device)
        start = linalg.inverse_sqrt_probe_residual(factor.to(dtype), old_root.to(dtype), probes)
        tol = group["root_tol"]
        healthy = torch.isfinite(start)
        if mode == WARM:
            found = linalg.inverse_sqrt_warm_updates(
                factor.to(dtype), old_root.to(dtype), updates=NEWTON_STEADY_UPDATES, tol=tol, symmetric=True
            )
            root, fits = found.root.to(STATE_DTYPE), found.converged
        else:
            root, fits = old_root, start <= tol / linalg.PROBE_MARGIN
        return _Side(
            stack.tensors[side],
            stack.tensors[ROOT_OF[side]],
            factor,
            root,
            healthy,
            updated=mode == WARM,
            flags={"repair": healthy & ~fits, "broken": ~healthy, "stale": ~(start <= tol / linalg.PROBE_MARGIN**2)},
        )

    def _checked_side(
        self,
        stack: _Stack,
        side: str,
        select: _Rows,
        factor: Tensor,
        floor: Tensor,
        old_root: Tensor,
        pending: _Pending,
    ) -> _Side:
        """Mode "checked": the roots by the host-checked iterations and the eigendecomposition fallback
        (`_newton_inverse_roots`, counted) at once; "checked" again next when they needed more than the warm updates
        a "warm" refresh gives, else "warm"."""
        found = _newton_inverse_roots(factor, old_root, floor, pending.dtype, pending.tol)
        for row, fallback in zip(select.rows, found.fallbacks, strict=True):
            stack.tensors[ROOT_FALLBACKS][row] += fallback
        self._set_modes(stack, select.rows, SIDES.index(side), [CHECKED if found.hard else WARM] * len(select.rows))
        return self._host_side(stack, side, select, factor, old_root, found.roots, pending)

    def _eigh_side(
        self,
        stack: _Stack,
        side: str,
        select: _Rows,
        factor: Tensor,
        floor: Tensor,
        old_root: Tensor,
        pending: _Pending,
    ) -> _Side:
        """root_method="eigh": the roots by eigendecomposition (which synchronises anyway)."""
        roots = _inverse_roots(factor, floor, pending.dtype)
        return self._host_side(stack, side, select, factor, old_root, roots, pending)

    def _host_side(
        self,
        stack: _Stack,
        side: str,
        select: _Rows,
        factor: Tensor,
        old_root: Tensor,
        roots: list[Tensor | None],
        pending: _Pending,
    ) -> _Side:
        """A refresh whose roots are known on the host: a matrix whose root failed (None) keeps its previous factor
        and root, a solver failure."""
        ok = [root is not None for root in roots]
        root = torch.stack([r if r is not None else o for r, o in zip(roots, old_root, strict=True)])
        for row, good in zip(select.rows, ok, strict=True):
            if not good:
                pending.failed.add(row)
                self.solver_failures += 1
        healthy = torch.tensor(ok, device=factor.device)
        return _Side(stack.tensors[side], stack.tensors[ROOT_OF[side]], factor, root, healthy, updated=True)

    def _probe_matrix(self, dim: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The fixed probe vectors for d x d roots, drawn and moved to the device once."""
        key = (dim, dtype, device)
        if key not in self._probes:
            self._probes[key] = linalg.gaussian_probes(dim, NEWTON_PROBES, dtype=dtype, device=device)
        return self._probes[key]

    def _settle_and_check(self, stack: _Stack) -> None:
        """`_settle`, then SolverError for a matrix whose solvers failed MAX_CONSECUTIVE_SOLVER_FAILURES steps in a
        row."""
        self._settle(stack)
        for row in sorted(stack.open_streaks):
            param = stack.params[row]
            self.end_on_solver_streaks([self.state[param]], "solver_failures", partial(_solver_failure, param))

    def _settle(self, stack: _Stack) -> None:
        """Finish the stack's last step: read its posted root flags (a deferred read), repair the roots that failed
        their check (`_newton_inverse_roots`: warm, cold, then eigendecomposition, counted in root_fallbacks), note
        each deferred root's next mode, and count each stepped matrix's failures."""
        pending, stack.pending = stack.pending, None
        if pending is None:
            return
        failed = set(pending.failed)
        refreshed = pending.refreshed
        flagged: dict[tuple[str, str], list[int]] = defaultdict(list)
        for index in stack.check.take():
            kind, position = divmod(index, len(refreshed))
            flagged[pending.kinds[kind]].append(position)
        for side in {side for _, side in pending.kinds}:
            modes = [KEPT] * len(refreshed)
            for position in flagged[("stale", side)]:
                modes[position] = WARM
            for position in flagged[("repair", side)]:
                modes[position] = CHECKED
            self._set_modes(stack, refreshed, SIDES.index(side), modes)
            for position in flagged[("broken", side)]:
                failed.add(refreshed[position])
                self.solver_failures += 1
            if flagged[("repair", side)]:
                failed |= self._repair(stack, side, pending, flagged[("repair", side)])
        for row in pending.rows:
            state = self.state[stack.params[row]]
            if row in failed:
                self.solver_failed(state, "solver_failures", None, failures=0)
                stack.open_streaks.add(row)
            elif row in stack.open_streaks:
                self.solver_ok(state, "solver_failures")
                stack.open_streaks.discard(row)

    @staticmethod
    def _set_modes(stack: _Stack, rows: list[int], side: int, modes: list[int]) -> None:
        """Record how the roots of one side are refreshed next (host mirror, and CPU state where it changes)."""
        for row, mode in zip(rows, modes, strict=True):
            if stack.modes[row][side] != mode:
                stack.modes[row][side] = mode
                stack.tensors[ROOT_MODES][row, side] = mode

    def _repair(self, stack: _Stack, side: str, pending: _Pending, positions: list[int]) -> set[int]:
        """Roots of the refreshed `positions` that failed their check, made again from their stored factors by the
        host-checked iterations and the eigendecomposition fallback. Returns the rows where every method failed
        (their root stays the checked one)."""
        rows = [pending.refreshed[i] for i in positions]
        root_key = ROOT_OF[side]
        factors, roots = stack.tensors[side][rows], stack.tensors[root_key][rows]
        floors = pending.floors[side][positions]
        found = _newton_inverse_roots(factors, roots, floors, pending.dtype, pending.tol)
        failed = set()
        for row, root, fallback in zip(rows, found.roots, found.fallbacks, strict=True):
            stack.tensors[ROOT_FALLBACKS][row] += fallback
            if root is None:
                failed.add(row)
                self.solver_failures += 1
            else:
                stack.tensors[root_key][row] = root
        return failed

    def _polar(self, direction: Tensor, group: Mapping[str, Any], pending: _Pending) -> Tensor:
        """Polar(direction) per matrix: exact SVD (falling back to Newton–Schulz on failure) or Newton–Schulz."""
        if group["polar"] == "svd":
            try:
                return linalg.polar_svd(direction)
            except SolverError:
                self.solver_failures += len(pending.rows)
                pending.failed.update(pending.rows)
        return linalg.newton_schulz(
            direction,
            steps=group["ns_steps"],
            coefficients=NS_COEFFICIENTS[group["ns_coefficients"]],
            eps=group["ns_eps"],
            dtype=NS_DTYPES[group["ns_dtype"]],
        )


@dataclass
class _Side:
    """One factor's refresh, to be written into the stack once both sides are computed: the factor and root where
    `healthy` (the previous ones elsewhere), whether the roots were iterated, and the device flags (`FLAG_KINDS`)
    posted for the next step where the roots were not checked on the host."""

    factor_stack: Tensor
    root_stack: Tensor
    factor: Tensor
    root: Tensor
    healthy: Tensor
    updated: bool
    flags: dict[str, Tensor] = field(default_factory=dict)

    def store(self, select: _Rows) -> None:
        select.keep(self.factor_stack, self.healthy, self.factor)
        if self.updated:
            select.keep(self.root_stack, self.healthy, self.root)


def _solver_failure(param: Tensor, streak: int) -> str:
    return f"FISMO: solvers for a {tuple(param.shape)} parameter failed {streak} steps in a row"


def uses_newton(shape: tuple[int, int], group: Mapping[str, Any]) -> bool:
    """Whether a matrix of `shape` has factors whose roots come from Newton–Schulz (and a fallback counter)."""
    return group["root_method"] == "newton" and factored(shape, group["max_factor_dim"])


def _whitened(
    grads: Tensor, p_roots: Tensor, q_roots: Tensor, left: Tensor | None, right: Tensor | None, precision: str
) -> Tensor:
    """Step 6, P^{-1/2} G Q^{-1/2} for (k, m, n) stacks, reusing `left` = P^{-1/2} G or `right` = G Q^{-1/2} (formed
    with the current roots by the refresh, else None): the remaining product is (m x m)(m x n) from `right`,
    m^2 n operations, or (m x n)(n x n) from `left`, m n^2; the cheaper where both are given."""
    rows, cols = grads.shape[-2:]
    if right is not None and (left is None or rows <= cols):
        return matmul(p_roots, right, precision)
    return matmul(matmul(p_roots, grads, precision) if left is None else left, q_roots, precision)


def _moved_momentum(momentum: Tensor, select: _Rows, signal: Tensor, beta: float) -> Tensor:
    """Step 7, M <- beta M + (1 - beta) S for the selected rows of the stack `momentum` (in place when they are all
    of them); returns the new momenta."""
    moments = select.of(momentum)
    moments.mul_(beta).add_(signal, alpha=1.0 - beta)
    if not select.every:
        select.put(momentum, moments)
    return moments


def _blend(old: Tensor, a: Tensor, b: Tensor, alpha: float, damp: Tensor, gamma: float, precision: str) -> Tensor:
    """Steps 4-5's EMA before normalisation, gamma X + (1 - gamma) (alpha A B + damp I), for (k, d, d) stacks: in
    float32 one fused product for the statistic and the EMA (else the product in `precision`, then the EMA), the
    damping added on the diagonal."""
    if precision == "float32":
        blended = torch.baddbmm(old, a, b, beta=gamma, alpha=(1.0 - gamma) * alpha)
    else:
        blended = torch.add(old * gamma, matmul(a, b, precision), alpha=(1.0 - gamma) * alpha)
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


@dataclass
class _Roots:
    """What `_newton_inverse_roots` found."""

    roots: list[Tensor | None]
    """Per matrix, its root (None where every method failed)."""
    fallbacks: list[int]
    """Per matrix, 1 where it fell back to the eigendecomposition."""
    hard: bool
    """Whether some matrix needed more than NEWTON_STEADY_UPDATES warm updates, or a cold start."""


def _checked_at_once(root_check: str, device: torch.device) -> bool:
    """Whether every refresh is host-checked at once: root_check "immediate", or "auto" on the CPU, where a host read
    waits for nothing (the CPU runs each operator to its end before the next) and the host-checked refresh stops as
    soon as its root passes, while a "warm" refresh always makes all NEWTON_STEADY_UPDATES updates."""
    return root_check == "immediate" or (root_check == "auto" and device.type == "cpu")


def _newton_inverse_roots(factors: Tensor, previous: Tensor, floor: Tensor, dtype: torch.dtype, tol: float) -> _Roots:
    """X^{-1/2} per matrix of a (k, d, d) SPD stack by Newton–Schulz: warm from `previous` (the last roots, host
    checks after each update), then cold, then by eigendecomposition (`_inverse_roots`) for the matrices still above
    `tol`."""
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
    hard = bool(retry) or warm.iterations > NEWTON_STEADY_UPDATES
    return _Roots(found, [0 if ok else 1 for ok in done], hard)


def _apply_all(params: list[Tensor], update: Tensor, lr: float, decay: float) -> None:
    """W <- decay W - lr D for each parameter and its row of `update`: one foreach call for float32 parameters."""
    deltas = [delta.view_as(p) for p, delta in zip(params, update.unbind(0), strict=True)]
    if any(p.dtype != STATE_DTYPE for p in params):
        for p, delta in zip(params, deltas, strict=True):
            _apply(p, delta, lr, decay)
        return
    if decay != 1.0:
        torch._foreach_mul_(params, decay)
    torch._foreach_add_(params, deltas, alpha=-lr)


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
    """Per matrix: P, Q and their inverse roots (2 m^2 + 2 n^2 floats) and M (m n), float32, two int64 counters; with
    Newton–Schulz roots a third (root_fallbacks) and two int8 (root_modes); an oversize matrix under
    `oversize="muon"` keeps only M and the two counters. Plus torch AdamW's state."""
    total = 0
    for shape in structured:
        rows, cols = matrix_shape(shape)
        factors = 2 * rows * rows + 2 * cols * cols if factored((rows, cols), hp["max_factor_dim"]) else 0
        fallback_counter = 8 + len(SIDES) if uses_newton((rows, cols), hp) else 0
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
    "int64 counters, plus root_fallbacks and two int8 root_modes with the default roots. Roots: root_method "
    "'newton' (default; matrix products only: the previous root kept on a probe check, or fixed warm Newton–Schulz "
    "updates, their checks read a step later (root_check 'deferred': no host sync; a root that failed its check is "
    "used for that step and repaired at the next by the host-checked warm, cold, then eigh path) or at once "
    "(root_check 'immediate'; the default 'auto' is 'deferred' on CUDA, 'immediate' on the CPU); eigh fallbacks "
    "counted in root_fallbacks and the run's root_fallbacks column) or "
    "'eigh' (exact). matmul_precision float32 (default) | tf32 | bfloat16 for the large non-root products. Newton "
    "roots have residual RMS(Z X Z - I) within root_tol (1e-3); each step's update stays within 3 root_tol of the "
    "float64 eigh form where the roots it used passed their check (tests/optim/test_matrix_roots.py)."
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

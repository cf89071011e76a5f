"""32-bit Shampoo with layer-wise grafting onto SGD-M or AdamW.

Paper: Wang, Zhou, Li, Huang, "4-bit Shampoo for Memory-Efficient Network Training", NeurIPS 2024
(arXiv 2405.18144), Appendix A, Algorithm 4 ("Practical 32-bit Shampoo", the paper's 32-bit baseline,
following Anil et al. 2020 and Yong et al. 2023). Per parameter block W (m x n) with gradient G_t:

    L_0 = eps I_m, R_0 = eps I_n, L^_0 = I_m, R^_0 = I_n
    if t % T1 == 0:  L_t = beta L_{t-1} + (1 - beta) G_t G_t^T ;  R_t = beta R_{t-1} + (1 - beta) G_t^T G_t
    if t % T2 == 0:  L^_t = (L_t + lambda_max(L_t) eps I)^{-1/4} ;  R^_t = (R_t + lambda_max(R_t) eps I)^{-1/4}
    G^_t = L^_t G_t R^_t ;  G~_t = G^_t ||G_t||_F / ||G^_t||_F ;  W_t, s_t = F(W_{t-1}, s_{t-1}, G~_t)

Statistics are updated only on multiples of T1 and only with that step's gradient (gradients in between
are not accumulated); until the first multiple of T2 the roots are the identity, so the update is plain F.
Line 9's roots come from 10 power iterations and 10 coupled Schur-Newton iterations (App. A text);
`root_method="eigh"` computes (L + eps lambda_max I)^{-1/4} exactly by eigendecomposition instead.

Details the paper leaves open follow the authors' code (Sike-Wang/low-bit-Shampoo `optimizers/shampoo1.py`
at 32 bits, with `optimizers/matrix_functions.py`):
- shapes: size-1 dims are squeezed and the rest viewed as (shape[0], -1), so a conv filter is
  (out, in*kh*kw); a dim larger than `max_order` is cut into blocks of `max_order` plus a remainder, and
  every block has its own L and R. Parameters with fewer than two non-unit dims get no preconditioner
  (the same base optimizer, unpreconditioned);
- grafting is per whole tensor, after the blocks are merged, with denominator ||G^||_F + 1e-12;
- statistics use the gradient in float32; with `stat_decay == 1` the statistics are the plain sums of
  Eq. (1) (the code's w2 = 1 when beta = 1);
- F = SGD-M (`ShampooSGD`): L2 weight decay is added to G~ after grafting, then buf = mu buf + G~ (no
  dampening, Nesterov optional) and W -= lr buf; F = AdamW (`ShampooAdamW`): W *= 1 - lr wd first, then
  Adam moments of G~ with bias corrections, W -= lr / (1 - beta1^t) m / (sqrt(v / (1 - beta2^t)) + eps)
  (torch.optim.AdamW's eps placement).

State per parameter (all tensors, plus Python ints): `step`, `root_failures` (consecutive failed root steps) and
`root_updates` (successful ones; while 0 the roots are exactly I and the products are skipped), per block k
`left_stat_k`, `right_stat_k`, `left_root_k`, `right_root_k` (float32 whatever the parameter dtype), and
the base's moments in the parameter's dtype (`momentum_buffer`, or `exp_avg` and `exp_avg_sq`). The
preconditioner maintenance sits behind `init_preconditioner`, `update_statistics`,
`compute_inverse_roots` and `precondition_all` (`precondition` of each parameter here), which a low-bit variant
overrides.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from structbench.errors import SolverError
from structbench.optim import linalg
from structbench.optim.base import StructuredOptimizer, eager
from structbench.optim.distributed import DISTRIBUTED
from structbench.optim.hparams import Declaration, code, decade_around, flag, integer, lin, option, paper, real
from structbench.optim.hybrid import build_hybrid
from structbench.optim.partition import parameter_kinds
from structbench.optim.registry import Builder, NamedParams, OptimizerEntry, Routing, register

BASES = ("sgd", "adamw")
ROOT_METHODS = ("newton", "eigh")
GRAFT_EPS = 1e-12
"""Grafting denominator guard, ||G^||_F + 1e-12 (authors' code)."""
NEWTON_ITERS = 10
"""Power iterations and coupled Schur-Newton iterations per root (paper App. A: "run for 10 iterations")."""
NEWTON_TOL = 1e-6
"""Stopping tolerance on max|M - I| of the coupled Newton iteration and on the power-iteration estimate (code)."""
PAPER = "4-bit Shampoo (arXiv 2405.18144)"
REFERENCE = "Sike-Wang/low-bit-Shampoo optimizers/shampoo1.py"
CNN_SETTING = f"{PAPER} App. G, CIFAR-100 CNNs"
TRANSFORMER_SETTING = f"{PAPER} App. G, CIFAR-100 transformers"

BlockSlices = tuple[tuple[slice, slice], ...]


def preconditioner_shape(shape: Sequence[int]) -> tuple[int, int] | None:
    """The (rows, cols) matrix Shampoo sees for a parameter of `shape`, or None if it gets no preconditioner.

    Size-1 dims are dropped and the rest viewed as (shape[0], -1) (authors' code), so a conv filter
    (out, in, kh, kw) becomes (out, in*kh*kw) and a (1, n) matrix is treated as a vector.
    """
    dims = [int(size) for size in shape if size != 1]
    if len(dims) < 2:
        return None
    return dims[0], math.prod(dims[1:])


def block_sizes(dim: int, max_order: int) -> list[int]:
    """Split `dim` into full blocks of `max_order` and one remainder block (authors' BlockPartitioner)."""
    full = (dim - 1) // max_order
    return [max_order] * full + [dim - full * max_order]


def block_slices(rows: int, cols: int, max_order: int) -> BlockSlices:
    """(row slice, col slice) of every block, row-major over the block grid."""
    row_edges = _edges(block_sizes(rows, max_order))
    col_edges = _edges(block_sizes(cols, max_order))
    return tuple((rs, cs) for rs in row_edges for cs in col_edges)


def _edges(sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


def root_failure(name: str, streak: int) -> str:
    """The SolverError of a parameter whose inverse roots failed `streak` root steps in a row."""
    return f"{name} inverse roots failed on {streak} consecutive root steps for a parameter"


def _stat_key(side: str, k: int) -> str:
    return f"{side}_stat_{k}"


def _root_key(side: str, k: int) -> str:
    return f"{side}_root_{k}"


def statistic_weights(group: Mapping[str, Any]) -> tuple[float, float]:
    """(beta, weight) of the statistic update L <- beta L + weight G G^T: beta = `stat_decay` and weight = 1 - beta,
    or weight = 1 when beta = 1 (plain sums, Eq. 1)."""
    beta = group["stat_decay"]
    return beta, 1.0 if beta == 1.0 else 1.0 - beta


class Shampoo(StructuredOptimizer):
    """Shampoo (4-bit Shampoo paper, Algorithm 4) grafted onto SGD-M (`base="sgd"`) or AdamW (`base="adamw"`).

    `lr` is the base optimizer's; the `sgd_*` hyperparameters apply to SGD-M and the `adamw_*` ones to AdamW, each
    base with its own weight decay. `stat_decay` is beta, `matrix_eps` is epsilon (statistics start at eps I; the
    root's ridge is eps * lambda_max), `stat_interval` is T1 and `root_interval` is T2; roots are
    (. + ridge)^{-1/inverse_root_order}. With `precondition=False` (not a hyperparameter: the part a Shampoo plays)
    the parameters (any shape) get the base optimizer alone: the paper's code path for 1-D parameters.
    """

    hparams = Declaration(
        real(
            "lr",
            0.1,
            paper(f"{CNN_SETTING}, SGD-M's lr; the AdamW base's is 1e-3 (transformers): set it with base adamw"),
            "(0, inf)",
            decade_around(),
        ),
        option("base", "sgd", BASES, paper(f"{CNN_SETTING}: SGD-M")),
        real("sgd_momentum", 0.9, paper(CNN_SETTING), "[0, 1)", lin(0.85, 0.95)),
        flag("sgd_nesterov", False, code(f"{REFERENCE}; the paper states none")),
        real("sgd_weight_decay", 5e-4, paper(f"{CNN_SETTING}; L2, added after grafting ({REFERENCE})"), "[0, inf)"),
        real("adamw_beta1", 0.9, paper(TRANSFORMER_SETTING), "[0, 1)"),
        real("adamw_beta2", 0.999, paper(TRANSFORMER_SETTING), "[0, 1)"),
        real("adamw_eps", 1e-8, paper(TRANSFORMER_SETTING), "[0, inf)"),
        real("adamw_weight_decay", 0.05, paper(f"{TRANSFORMER_SETTING}; decoupled, applied first"), "[0, inf)"),
        real("stat_decay", 0.95, paper(f"{PAPER} App. G; 1 sums the statistics (Eq. 1)"), "[0, 1]"),
        real("matrix_eps", 1e-6, paper(f"{PAPER} App. G"), "(0, inf)"),
        integer("stat_interval", 100, paper(f"{PAPER} App. G, T1 for CIFAR (ImageNet 200, LMs 200)"), "[1, inf)"),
        integer("root_interval", 500, paper(f"{PAPER} App. G, T2 for CIFAR (ImageNet 1000, LMs 200)"), "[1, inf)"),
        integer("max_order", 1200, paper(f"{PAPER} App. G, blocks of at most 1200"), "[1, inf)"),
        option(
            "root_method",
            "newton",
            ROOT_METHODS,
            paper(f"{PAPER} App. A: power iteration + Schur-Newton ('eigh': the code's inv_root_mode 0)"),
        ),
        integer("inverse_root_order", 4, paper(f"{PAPER} Alg. 4 line 9: (L + eps I)^(-1/4)"), "[1, inf)"),
    )
    hparams = hparams + DISTRIBUTED

    def __init__(
        self, params: Iterable[nn.Parameter] | Iterable[dict[str, Any]], *, precondition: bool = True, **hparams: Any
    ) -> None:
        self.preconditioning = precondition
        super().__init__(params, **hparams)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group({"precondition": self.preconditioning, **param_group})

    def check_group(self, group: dict[str, Any]) -> None:
        if group["precondition"]:
            vectors = [tuple(p.shape) for p in group["params"] if preconditioner_shape(p.shape) is None]
            if vectors:
                raise ValueError(
                    f"Shampoo preconditions parameters with at least two non-unit dims; got shapes {vectors}. "
                    "Give them to a Shampoo with precondition=False (the base optimizer alone)."
                )

    # ---- preconditioner maintenance (a low-bit variant overrides these four) ----

    def init_preconditioner(
        self, state: dict[str, Any], blocks: BlockSlices, group: Mapping[str, Any], device: torch.device
    ) -> None:
        """L_0 = R_0 = eps I and L^_0 = R^_0 = I for every block, float32 (Algorithm 4, inputs)."""
        for k, (rs, cs) in enumerate(blocks):
            for side, order in (("left", rs.stop - rs.start), ("right", cs.stop - cs.start)):
                eye = torch.eye(order, dtype=torch.float32, device=device)
                state[_stat_key(side, k)] = eye * group["matrix_eps"]
                state[_root_key(side, k)] = eye.clone()

    def update_statistics(
        self, state: dict[str, Any], grad: Tensor, blocks: BlockSlices, group: Mapping[str, Any]
    ) -> None:
        """L <- beta L + (1 - beta) G G^T and R <- beta R + (1 - beta) G^T G per block (Alg. 4 line 4).

        `grad` is the float32 (rows, cols) gradient. beta = 1 accumulates plain sums (Eq. 1).
        """
        beta, weight = statistic_weights(group)
        for k, (rs, cs) in enumerate(blocks):
            g = grad[rs, cs]
            state[_stat_key("left", k)].addmm_(g, g.mT, beta=beta, alpha=weight)
            state[_stat_key("right", k)].addmm_(g.mT, g, beta=beta, alpha=weight)

    def compute_inverse_roots(
        self, items: Sequence[tuple[dict[str, Any], BlockSlices]], group: Mapping[str, Any]
    ) -> None:
        """L^ = (L + eps lambda_max I)^{-1/p}, R^ likewise, for every block of every item (Alg. 4 lines 8-9).

        Statistics of the same order, across parameters and sides, go through one batched solver call. A
        parameter whose roots fail keeps all its previous roots; `solver_failures` counts each failed
        matrix, and the third consecutive failing root step of one parameter raises SolverError.
        """
        jobs: dict[int, list[tuple[int, str, Tensor]]] = defaultdict(list)
        for index, (state, blocks) in enumerate(items):
            for k in range(len(blocks)):
                for side in ("left", "right"):
                    stat = state[_stat_key(side, k)]
                    jobs[stat.size(-1)].append((index, _root_key(side, k), stat))
        new_roots: list[dict[str, Tensor]] = [{} for _ in items]
        failed: set[int] = set()
        for order_jobs in jobs.values():
            roots = self._batched_roots(torch.stack([stat for _, _, stat in order_jobs]), group)
            for (index, key, _), root in zip(order_jobs, roots, strict=True):
                if root is None:
                    failed.add(index)
                    self.solver_failures += 1
                else:
                    new_roots[index][key] = root
        for index, (state, _) in enumerate(items):
            if index in failed:
                self.solver_failed(state, "root_failures", None, failures=0)
                continue
            self.solver_ok(state, "root_failures")
            state["root_updates"] += 1
            for key, root in new_roots[index].items():
                state[key].copy_(root)
        self.end_on_solver_streaks((state for state, _ in items), "root_failures", partial(root_failure, "Shampoo"))

    def precondition(self, state: dict[str, Any], grad: Tensor, blocks: BlockSlices) -> Tensor:
        """G^ = L^ G R^ per block, merged back to the (rows, cols) matrix (Alg. 4 line 12); `precondition_all`'s step
        for one parameter."""
        if len(blocks) == 1:
            return state[_root_key("left", 0)] @ grad @ state[_root_key("right", 0)]
        out = torch.empty_like(grad)
        for k, (rs, cs) in enumerate(blocks):
            out[rs, cs] = state[_root_key("left", k)] @ grad[rs, cs] @ state[_root_key("right", k)]
        return out

    # ---- the step ----

    def step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                self._init_state(p, state, group)
            state["step"] += 1
        grads32 = [p.grad.float() for p in params]
        directions = self._preconditioned(params, states, grads32, group) if group["precondition"] else grads32
        updates = self._graft(params, grads32, directions)
        if group["base"] == "sgd":
            self._sgd_update(params, states, updates, group)
        else:
            self._adamw_update(params, states, updates, group)

    def _preconditioned(
        self, params: list[nn.Parameter], states: list[dict[str, Any]], grads32: list[Tensor], group: Mapping[str, Any]
    ) -> list[Tensor]:
        """Statistics (every T1), roots (every T2, batched), then G^ per parameter, as (rows, cols) matrices."""
        matrices, layouts = [], []
        for p, grad in zip(params, grads32, strict=True):
            rows, cols = preconditioner_shape(p.shape)  # type: ignore[misc]
            matrices.append(grad.reshape(rows, cols))
            layouts.append(block_slices(rows, cols, group["max_order"]))
        for state, grad, blocks in zip(states, matrices, layouts, strict=True):
            if state["step"] % group["stat_interval"] == 0:
                self.update_statistics(state, grad, blocks, group)
        due = [
            (state, blocks)
            for state, blocks in zip(states, layouts, strict=True)
            if state["step"] % group["root_interval"] == 0
        ]
        if due:
            # data-dependent solver loops and retries: run eagerly under torch.compile
            eager(type(self).compute_inverse_roots, self, due, group)
        return self.precondition_all(states, matrices, layouts, group)

    def precondition_all(
        self,
        states: Sequence[dict[str, Any]],
        grads: Sequence[Tensor],
        layouts: Sequence[BlockSlices],
        group: Mapping[str, Any],
    ) -> list[Tensor]:
        """G^ of every parameter by `precondition`, one at a time (a low-bit variant batches them)."""
        # Until a root update succeeds every root is exactly I, and I G I == G bit for bit: skip the products.
        return [
            self.precondition(state, grad, blocks) if state["root_updates"] else grad
            for state, grad, blocks in zip(states, grads, layouts, strict=True)
        ]

    @staticmethod
    def _graft(params: list[nn.Parameter], grads32: list[Tensor], directions: list[Tensor]) -> list[Tensor]:
        """G~ = G^ ||G||_F / (||G^||_F + 1e-12) per whole tensor, in the parameter's shape and dtype."""
        grad_norms = torch._foreach_norm(grads32)
        direction_norms = torch._foreach_add(torch._foreach_norm(directions), GRAFT_EPS)
        scales = torch._foreach_div(grad_norms, direction_norms)
        grafted = torch._foreach_mul(directions, scales)
        return [g.reshape(p.shape).to(p.dtype) for p, g in zip(params, grafted, strict=True)]

    @staticmethod
    def _sgd_update(
        params: list[nn.Parameter], states: list[dict[str, Any]], updates: list[Tensor], group: Mapping[str, Any]
    ) -> None:
        """ShampooSGD: G~ += wd W (after grafting); buf = mu buf + G~; W -= lr (buf, or G~ + mu buf if Nesterov)."""
        momentum = group["sgd_momentum"]
        if group["sgd_weight_decay"] != 0.0:
            torch._foreach_add_(updates, params, alpha=group["sgd_weight_decay"])
        buffers = [state["momentum_buffer"] for state in states]
        torch._foreach_mul_(buffers, momentum)
        torch._foreach_add_(buffers, updates)
        if group["sgd_nesterov"]:
            torch._foreach_add_(updates, buffers, alpha=momentum)
            steps = updates
        else:
            steps = buffers
        torch._foreach_add_(params, steps, alpha=-group["lr"])

    @staticmethod
    def _adamw_update(
        params: list[nn.Parameter], states: list[dict[str, Any]], updates: list[Tensor], group: Mapping[str, Any]
    ) -> None:
        """ShampooAdamW: W *= 1 - lr wd; Adam moments of G~; W -= lr/(1-b1^t) m / (sqrt(v/(1-b2^t)) + eps)."""
        lr, beta1, beta2 = group["lr"], group["adamw_beta1"], group["adamw_beta2"]
        if group["adamw_weight_decay"] != 0.0:
            torch._foreach_mul_(params, 1.0 - lr * group["adamw_weight_decay"])
        exp_avgs = [state["exp_avg"] for state in states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in states]
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, updates, alpha=1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, updates, updates, value=1.0 - beta2)
        steps = [state["step"] for state in states]
        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denominators, [math.sqrt(1.0 - beta2**t) for t in steps])
        torch._foreach_add_(denominators, group["adamw_eps"])
        torch._foreach_addcdiv_(params, exp_avgs, denominators, [-lr / (1.0 - beta1**t) for t in steps])

    def _init_state(self, p: nn.Parameter, state: dict[str, Any], group: Mapping[str, Any]) -> None:
        state["step"] = 0
        if group["base"] == "sgd":
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        else:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["precondition"]:
            state["root_failures"] = 0
            state["root_updates"] = 0
            rows, cols = preconditioner_shape(p.shape)  # type: ignore[misc]
            self.init_preconditioner(state, block_slices(rows, cols, group["max_order"]), group, p.device)

    def _batched_roots(self, stats: Tensor, group: Mapping[str, Any]) -> list[Tensor | None]:
        """Inverse roots of a (batch, k, k) stack; on SolverError, matrix by matrix (None where one fails)."""
        try:
            return list(self._inverse_root(stats, group).unbind(0))
        except SolverError:
            if stats.size(0) == 1:
                return [None]
        out: list[Tensor | None] = []
        for stat in stats.unbind(0):
            try:
                out.append(self._inverse_root(stat, group))
            except SolverError:
                out.append(None)
        return out

    @staticmethod
    def _inverse_root(stats: Tensor, group: Mapping[str, Any], symmetrize: bool = True) -> Tensor:
        """(S + eps lambda_max I)^{-1/p} of each statistic S of `stats`. Newton iterates on (S + S^T) / 2, or on S
        as given when `symmetrize` is False; eigh always decomposes (S + S^T) / 2."""
        p, eps = group["inverse_root_order"], group["matrix_eps"]
        if group["root_method"] == "newton":
            return linalg.inverse_root_newton(
                stats,
                p,
                eps,
                max_iters=NEWTON_ITERS,
                tol=NEWTON_TOL,
                relative_eps=True,
                power_iters=NEWTON_ITERS,
                symmetrize_input=symmetrize,
            )
        root = linalg.inverse_root_eigh(stats, p, eps, relative_eps=True)
        if not bool(torch.isfinite(root).all()):
            raise SolverError("eigh inverse root returned non-finite values")
        return root


# ---- registry entry ----

ROUTING = Declaration(
    flag("precondition_head_embeddings", True, code(f"{REFERENCE}: every parameter is handed to Shampoo")),
)


def _route(model: nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    """Parameters with two or more non-unit dims get Shampoo; the rest get the base optimizer alone.

    The authors' code hands every model parameter to Shampoo, so the classifier head and embeddings are
    preconditioned too; `precondition_head_embeddings=False` sends them to the unpreconditioned base instead.
    """
    kinds = parameter_kinds(model, named)
    excluded = set() if hp["precondition_head_embeddings"] else {"head", "embedding"}
    structured = tuple(
        name for name, p in named if preconditioner_shape(p.shape) is not None and kinds[name] not in excluded
    )
    fallback = tuple(name for name, _ in named if name not in structured)
    return Routing(structured=structured, fallback=fallback, fallback_name=hp["base"] if fallback else None)


def shampoo_builder(cls: type[Shampoo]) -> Builder:
    """The registry builder of a Shampoo variant: `cls` on the preconditioned parameters, the base optimizer alone
    (an unpreconditioned Shampoo with the same hyperparameters) on the rest."""

    def build(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
        return build_hybrid(
            named,
            routing,
            hp,
            make_structured=lambda params, values: cls(params, **cls.hparams.take(values)),
            make_fallback=lambda params, values: Shampoo(params, precondition=False, **Shampoo.hparams.take(values)),
        )

    return build


def state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """Float32 L, R, L^, R^ per block (4 order^2 bytes each) + the base's moments (1 or 2 per element)."""
    moments = 1 if hp["base"] == "sgd" else 2
    total = 4 * moments * sum(math.prod(shape) for shape in [*structured, *fallback])
    for shape in structured:
        rows, cols = preconditioner_shape(shape)  # type: ignore[misc]
        row_blocks, col_blocks = block_sizes(rows, hp["max_order"]), block_sizes(cols, hp["max_order"])
        squares = len(col_blocks) * sum(r * r for r in row_blocks) + len(row_blocks) * sum(c * c for c in col_blocks)
        total += 2 * 4 * squares
    return total


SHAMPOO = register(
    OptimizerEntry(
        name="shampoo",
        refresh_interval="root_interval",
        summary="32-bit Shampoo (EMA statistics every T1, inverse 4th roots every T2) grafted onto SGD-M or AdamW",
        reference="Wang et al. 2024, 4-bit Shampoo for Memory-Efficient Network Training, NeurIPS, App. A, Alg. 4",
        hparams=Shampoo.hparams + ROUTING,
        build=shampoo_builder(Shampoo),
        route=_route,
        notes=(
            "lr is the grafted base's step size whatever the base (one number, not a base-dependent default, so that "
            "equal hparams mean equal runs). root_method newton runs 10 power iterations and 10 coupled Schur-Newton "
            "iterations. Only the active base's sgd_*/adamw_* keys are used. Reference code (paper silent): "
            "per-tensor grafting with +1e-12, tolerance 1e-6 for Newton and power iteration, squeeze size-1 dims and "
            "view as (shape[0], -1); parameters with < 2 non-unit dims get the same base optimizer unpreconditioned "
            "(recorded as the fallback). Statistics and roots are float32; moments follow the parameter dtype."
        ),
        lr_keys=("lr",),
        state_bytes=state_bytes,
        check_hparams={"stat_interval": 1, "root_interval": 2},
    )
)

"""4-bit Shampoo (ours and naive) grafted onto SGD-M or AdamW.

Paper: Wang, Zhou, Li, Huang, "4-bit Shampoo for Memory-Efficient Network Training", NeurIPS 2024
(arXiv 2405.18144).

`shampoo-4bit` is Algorithm 3 ("practical 4-bit Shampoo") with PU (Algorithm 1) and PIRU (Algorithm 2).
Per block of a parameter, each statistic L (and R) is held only as its eigendecomposition, fp32
eigenvalues lambda and a block-quantized eigenvector matrix; the full-precision L is never stored:

    PU   (every T1, Alg. 1):  V = D(U_bar); V <- 1.5 V - 0.5 V V^T V (t1 = 1 times)
                              A = beta V Diag(lambda) V^T + (1 - beta) G G^T
                              P = QR(A V) (one warm-started subspace step, App. B); Sigma = diag(P^T A P)
                              store lambda = Sigma (fp32), U_bar = Q(P)
    PIRU (every T2, Alg. 2):  V = D(U_bar) rectified t2 = 4 times (a fresh dequantization)
                              A^ = V (Diag(lambda) + max(lambda) eps I)^{-1/4} V^T
                              store a = diag(A^) (fp32) and Q(A^ - Diag(a))
    step (Alg. 3 l. 13-15):   L^ = Diag(l) + D(L_bar), likewise R^; G^ = L^ G R^; graft; F.

`shampoo-4bit-naive` is the paper's baseline "4-bit Shampoo (naive)" (Section 5, Table 12): Algorithm 4
with L, R, L^ and R^ themselves block-quantized. As the paper's "slightly improved" naive variant and the
authors' `shampoo1.py`, the diagonal of each matrix stays fp32 and only the off-diagonal part is quantized
(`keep_diagonal=False` quantizes the whole matrix). Every T1 the statistic is dequantized, the EMA applied
and the result re-quantized; every T2 the root is computed by Schur-Newton from the dequantized statistic as it
is, not symmetric (its (i, j) and (j, i) entries lie in different quantization blocks), as the paper's naive baseline
is specified (Sec. 3.1: the inverse root of the dequantized statistic) and as the authors' `shampoo1.py` (lines
175-176) computes it. `symmetrize_statistic=True` (ours, off by default) roots (S + S^T) / 2 instead: a slightly
kinder baseline: in `tests/optim/test_shampoo4bit_authors_code.py`'s problems (orders 64-96, 4 bits) its roots
differ from the authors' by 4 % to 19 % of their largest entry, against a float32 noise floor of about 1e-6.

Details the paper leaves open follow the authors' code (Sike-Wang/low-bit-Shampoo `optimizers/shampoo2.py`
and `shampoo1.py`, with `qtensor/utils.py`):
- eigenvector matrices are quantized transposed, one eigenvector per row, so every block of 64 lies inside
  one eigenvector (Section 3.3); the quantizer is `structbench.optim.quant` (absmax per row block,
  round-to-nearest, two 4-bit codes per byte);
- a matrix with fewer than `min_lowbit_numel` = 4096 elements (order < 64) stays fp32 (App. G); for
  `shampoo-4bit` it is still kept as fp32 (eigenvalues, eigenvectors) and updated by the same PU/PIRU
  without rectification (the code's iter_count = 0 for unquantized matrices); `bits=32` keeps every matrix so;
- eigenvalues are the Rayleigh quotients diag(P^T A P), not sorted; in PIRU they are clamped at 0 before the
  relative ridge max(lambda) eps is added (lambda_max floored at 1e-16, as `linalg.inverse_root_eigh`);
- `root_method="newton"` is the code's inv_root_mode 1 (used by the paper for 4-bit GPT-2): the root of the
  dequantized, rectified V Diag(lambda) V^T by power iteration + coupled Schur-Newton (10 iterations each);
- shapes, blocking (max order 1200), grafting per tensor, the base optimizers and weight decay are
  inherited unchanged from `structbench.optim.shampoo.Shampoo`.

One detail departs from the code: PU's QR (`linalg.subspace_iteration`) makes diag(R) >= 0, so every eigenvector's
sign is fixed; the authors take torch.linalg.qr's raw signs (`qtensor/utils.py` l. 115, commit fc46867). The
subspace, the eigenvalues and every root are the same, but the linear-2 codebook is not symmetric about 0 (16 codes,
code 7 is 0), so a flipped eigenvector is stored with other quantization errors. Measured by
`tests/optim/test_shampoo4bit_authors_code.py::test_qr_sign_convention_stays_inside_the_one_ulp_noise_floor`
(64 x 96 and 64 x 8 x 3 x 3 parameters, T1 = 1, T2 = 3, twelve steps): W_T - W_0 of the two conventions differ by
15 % and 16 % of max |W_T - W_0|, while one-ulp perturbations of the gradients move either convention by 13 % to
18 %: the sign convention is inside the code's own noise floor (4-bit codes amplify any rounding).

Every step (Alg. 3 lines 13-14) dequantizes both roots of every block and forms L^ G R^. With `batch_matrices`
stacking (by default on CUDA, as `muon` and `soap`), the blocks whose roots share a storage format (orders, bits,
block size, codebook, kept diagonal) and device form one bucket: its 4-bit codes are decoded in one pass
(`quant.dequantize_many`, bit for bit the per-matrix `quant.dequantize`) and its products are two batched matmuls,
so a step costs a fixed number of kernel launches per bucket, not per matrix. The algorithm is unchanged: each
product is (L^ G) R^ of the same dequantized roots; only a batched matmul may sum in another order than a single
one, and either way each entry is within (gamma_m + gamma_n + gamma_m gamma_n) (|L^| |G| |R^|) of the exact product
of those float32 factors (m x n the block, gamma_k = k u / (1 - k u), u = 2^-24). The stored state, its bytes and
its checkpoints are the same in both modes. (No GPU was at hand to time the default: it follows the project's
`batch_matrices` rule, stacked on CUDA, where the cost profile counts 68 launches per steady step at GPT-2-small's
48 matrices stacked against 541 one at a time.)

State per parameter, besides `Shampoo`'s `step`, `root_failures`, `root_updates` and the base's moments,
per block k and side in (left, right), every tensor of a quantized matrix flattened into the state as the
plain values of `quant.to_state` under `<name>.<field>`:
- shampoo-4bit: `{side}_eigvals_{k}` (fp32), `{side}_eigvecs_{k}.*` (quantized V^T) or `{side}_eigvecs_{k}`
  (fp32 V^T), and `{side}_root_{k}.*` (fp32 diagonal + quantized off-diagonal) or `{side}_root_{k}` (fp32);
- shampoo-4bit-naive: `{side}_stat_{k}.*` / `{side}_stat_{k}` and `{side}_root_{k}.*` / `{side}_root_{k}`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from structbench.errors import SolverError
from structbench.optim import linalg, quant
from structbench.optim import shampoo as shampoo32
from structbench.optim.base import BATCH_MATRICES, gather, stacks_matrices
from structbench.optim.hparams import Declaration, code, flag, integer, option, ours, paper
from structbench.optim.registry import OptimizerEntry, register
from structbench.optim.shampoo import PAPER, REFERENCE, BlockSlices, Shampoo, shampoo_builder

BITS = (3, 4, 8, 32)
"""Storage widths: the quantizer's 3/4/8 bits, or 32 for fp32 storage of every matrix."""

LOWBIT = Declaration(
    option("bits", 4, BITS, paper(f"{PAPER} App. G: 4-bit; 3 and 8 are Table 12's, 32 stores fp32")),
    option("codebook", "linear-2", quant.CODEBOOK_NAMES, paper(f"{PAPER} Eq. 3, Sec. 3.3 ('dt': App. C)")),
    integer("block_size", quant.DEFAULT_BLOCK_SIZE, paper(f"{PAPER} App. G"), "[1, inf)"),
    integer(
        "min_lowbit_numel", quant.MIN_LOWBIT_NUMEL, paper(f"{PAPER} App. G: smaller matrices stay fp32"), "[1, inf)"
    ),
)
"""How both low-bit variants store their matrices."""
_LAMBDA_MAX_FLOOR = 1e-16
_QUANT_FIELDS = ("codes", "scales", "shape", "bits", "block_size", "codebook_id")


# ---- quantized matrices flattened into an optimizer state ----


def _is_quantized(state: Mapping[str, Any], name: str) -> bool:
    return f"{name}.codes" in state


def _store(state: dict[str, Any], name: str, q: quant.QuantizedMatrix) -> None:
    """Put `q` into `state` as the plain values of `quant.to_state`, under `<name>.<field>`."""
    for key, value in quant.to_state(q).items():
        state[f"{name}.{key}"] = value


def _stored(state: Mapping[str, Any], name: str) -> quant.QuantizedMatrix:
    """The quantized matrix stored under `name` (`_is_quantized(state, name)`)."""
    fields = {key: state[f"{name}.{key}"] for key in _QUANT_FIELDS}
    if f"{name}.diag" in state:
        fields["diag"] = state[f"{name}.diag"]
    return quant.from_state(fields)


def _load(state: Mapping[str, Any], name: str) -> Tensor:
    """The float32 matrix stored under `name`: dequantized if quantized, else the fp32 tensor itself."""
    if not _is_quantized(state, name):
        return state[name]
    return quant.dequantize(_stored(state, name))


def _load_many(states: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Tensor:
    """The float32 matrices stored under `names[i]` in `states[i]`, all of one `_storage_format`, as one
    (len(states), k, k) stack: dequantized in one pass (`quant.dequantize_many`), bit for bit as `_load` of each."""
    if _is_quantized(states[0], names[0]):
        return quant.dequantize_many([_stored(state, name) for state, name in zip(states, names, strict=True)])
    return gather([state[name] for state, name in zip(states, names, strict=True)])


def _storage_format(state: Mapping[str, Any], name: str) -> tuple[Any, ...]:
    """What `_load_many` needs alike to stack matrices: the shape, and the quantizer's format if quantized."""
    if not _is_quantized(state, name):
        return (tuple(state[name].shape),)
    fields = tuple(state[f"{name}.{key}"] for key in ("shape", "bits", "block_size", "codebook_id"))
    return (*fields, f"{name}.diag" in state)


def _lowbit(order: int, group: Mapping[str, Any]) -> bool:
    """Whether an order x order matrix is stored low-bit (App. G: numel >= 4096, and bits < 32)."""
    return group["bits"] != 32 and quant.should_quantize(order * order, group["min_lowbit_numel"])


def _quantize(x: Tensor, group: Mapping[str, Any], keep_diagonal: bool) -> quant.QuantizedMatrix:
    fn = quant.quantize_offdiag if keep_diagonal else quant.quantize
    return fn(x, bits=group["bits"], codebook=group["codebook"], block_size=group["block_size"])


def _orders(blocks: BlockSlices) -> list[tuple[int, str, int]]:
    """(block index, side, order) of every preconditioner of a parameter."""
    return [
        (k, side, order)
        for k, (rs, cs) in enumerate(blocks)
        for side, order in (("left", rs.stop - rs.start), ("right", cs.stop - cs.start))
    ]


def _outer_factors(grad: Tensor, side: str) -> tuple[Tensor, Tensor]:
    """(G, G^T), whose product is the left statistic's G G^T, or (G^T, G) for the right one's G^T G."""
    return (grad, grad.mT) if side == "left" else (grad.mT, grad)


def _root_buckets(
    states: Sequence[Mapping[str, Any]], grads: Sequence[Tensor], layouts: Sequence[BlockSlices], batch_mode: str
) -> list[list[tuple[int, int]]]:
    """The (parameter index, block index) of every block whose roots are no longer I, grouped by the storage formats
    of its two roots and its device where `batch_mode` stacks (`base.stacks_matrices`), else one block per group."""
    buckets: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)
    for index, (state, blocks, grad) in enumerate(zip(states, layouts, grads, strict=True)):
        if not state["root_updates"]:
            continue
        stacked = stacks_matrices(batch_mode, grad.device)
        for k in range(len(blocks)):
            formats = tuple(_storage_format(state, f"{side}_root_{k}") for side in ("left", "right"))
            buckets[(*formats, grad.device, None if stacked else (index, k))].append((index, k))
    return list(buckets.values())


def _bucket_products(states: Sequence[Mapping[str, Any]], grads: Sequence[Tensor], ks: Sequence[int]) -> Tensor:
    """(L^ G) R^ for block ks[i] of states[i] and its gradient grads[i], as one (len(states), m, n) stack."""
    left = _load_many(states, [f"left_root_{k}" for k in ks])
    right = _load_many(states, [f"right_root_{k}" for k in ks])
    return torch.bmm(torch.bmm(left, gather(list(grads))), right)


class _LowBitShampoo(Shampoo):
    """Shared plumbing: dequantized preconditioning, and a root refresh that keeps `Shampoo`'s counters
    (`root_updates`, `root_failures`, `solver_failures`). Both variants declare `LOWBIT` and `BATCH_MATRICES` besides
    their own."""

    def precondition_all(
        self,
        states: Sequence[dict[str, Any]],
        grads: Sequence[Tensor],
        layouts: Sequence[BlockSlices],
        group: Mapping[str, Any],
    ) -> list[Tensor]:
        """G^ = L^ G R^ of every block, L^ = Diag(l) + D(L_bar) (Alg. 3 lines 13-14); a parameter whose roots are
        still I (no root update yet) keeps its gradient, as `Shampoo.precondition_all`.

        Where `batch_matrices` stacks, the blocks whose roots share a storage format (orders, bits, block size,
        codebook, diagonal) and device are one bucket: its roots are dequantized in one pass and its products are
        two batched matmuls; otherwise every block is a bucket of one.
        """
        directions = list(grads)
        for jobs in _root_buckets(states, grads, layouts, group["batch_matrices"]):
            products = _bucket_products(
                [states[index] for index, _ in jobs],
                [grads[index][layouts[index][k]] for index, k in jobs],
                [k for _, k in jobs],
            )
            for (index, k), product in zip(jobs, products.unbind(0), strict=True):
                if len(layouts[index]) == 1:
                    directions[index] = product
                    continue
                if directions[index] is grads[index]:
                    directions[index] = torch.empty_like(grads[index])
                directions[index][layouts[index][k]] = product
        return directions

    def _refresh_roots(
        self,
        items: Sequence[tuple[dict[str, Any], BlockSlices]],
        group: Mapping[str, Any],
        root_of: Callable[[dict[str, Any], int, str, int], Tensor],
        keep_diagonal: bool,
    ) -> None:
        """New roots for every block of every item; a parameter any of whose roots fails (SolverError or
        non-finite) keeps all its previous roots, as `Shampoo.compute_inverse_roots`."""
        for state, blocks in items:
            new: dict[str, Tensor] = {}
            failed = 0
            for k, side, order in _orders(blocks):
                try:
                    root = root_of(state, k, side, order)
                except SolverError:
                    root = None
                if root is None or not bool(torch.isfinite(root).all()):
                    failed += 1
                    continue
                new[f"{side}_root_{k}"] = root
            if failed:
                self.solver_failed(state, "root_failures", None, failures=failed)
                continue
            self.solver_ok(state, "root_failures")
            state["root_updates"] += 1
            for name, root in new.items():
                if _is_quantized(state, name):
                    _store(state, name, _quantize(root, group, keep_diagonal))
                else:
                    state[name].copy_(root)
        describe = partial(shampoo32.root_failure, "4-bit Shampoo")
        self.end_on_solver_streaks((state for state, _ in items), "root_failures", describe)


class Shampoo4bit(_LowBitShampoo):
    """4-bit Shampoo, Algorithm 3 (PU = Alg. 1, PIRU = Alg. 2), grafted onto SGD-M or AdamW.

    Besides `Shampoo`'s arguments: `bits` (3, 4, 8, or 32 = fp32 storage), `codebook` ("linear-2" or "dt"),
    `block_size` (64), `min_lowbit_numel` (4096), `rectify_t1` / `rectify_t2` (Björck steps before PU / PIRU;
    0 turns rectification off), `svd_iters` (warm-started subspace steps in PU), `batch_matrices` (the steady-state
    products stacked per bucket of same-format roots: "auto" on CUDA only). `root_method` "eigh" is
    Algorithm 2 (the root from the stored eigenpairs); "newton" is Schur-Newton on V Diag(lambda) V^T.
    """

    hparams = (
        Shampoo.hparams.with_defaults(root_method=("eigh", paper(f"{PAPER} Alg. 2: the root from the eigenpairs")))
        + LOWBIT
        + BATCH_MATRICES
        + Declaration(
            integer("rectify_t1", 1, paper(f"{PAPER} Alg. 1: Björck steps before PU (0: none)"), "[0, inf)"),
            integer("rectify_t2", 4, paper(f"{PAPER} Alg. 2: Björck steps before PIRU (0: none)"), "[0, inf)"),
            integer("svd_iters", 1, paper(f"{PAPER} App. B: one warm-started subspace step"), "[1, inf)"),
        )
    )

    # ---- Algorithm 3, line 1-2: lambda_0 = diag(eps I), U_bar_0 = Q(I); l_0 = diag(I), L_bar_0 = Q(0) ----

    def init_preconditioner(
        self, state: dict[str, Any], blocks: BlockSlices, group: Mapping[str, Any], device: torch.device
    ) -> None:
        for k, side, order in _orders(blocks):
            eye = torch.eye(order, dtype=torch.float32, device=device)
            state[f"{side}_eigvals_{k}"] = torch.full((order,), float(group["matrix_eps"]), device=device)
            if _lowbit(order, group):
                _store(state, f"{side}_eigvecs_{k}", _quantize(eye, group, keep_diagonal=False))
                _store(state, f"{side}_root_{k}", _quantize(eye, group, keep_diagonal=True))
            else:
                state[f"{side}_eigvecs_{k}"] = eye.clone()
                state[f"{side}_root_{k}"] = eye

    def _eigvecs(self, state: Mapping[str, Any], name: str, steps: int) -> Tensor:
        """V (eigenvectors as columns): D(U_bar) rectified `steps` times, or the fp32 V unrectified."""
        if not _is_quantized(state, name):
            return state[name].mT
        vt = _load(state, name)
        if steps:
            vt = linalg.bjorck_orthonormalize(vt, steps)
        return vt.mT

    # ---- Algorithm 1 (PU), every T1 ----

    def update_statistics(
        self, state: dict[str, Any], grad: Tensor, blocks: BlockSlices, group: Mapping[str, Any]
    ) -> None:
        beta, weight = shampoo32.statistic_weights(group)
        for k, side, _ in _orders(blocks):
            rs, cs = blocks[k]
            name, evals_key = f"{side}_eigvecs_{k}", f"{side}_eigvals_{k}"
            v = self._eigvecs(state, name, group["rectify_t1"])
            first, second = _outer_factors(grad[rs, cs], side)
            a = torch.addmm(first @ second, v * state[evals_key], v.mT, beta=weight, alpha=beta)
            p = linalg.subspace_iteration(a, v, group["svd_iters"])
            state[evals_key].copy_(((a @ p) * p).sum(dim=0))
            if _is_quantized(state, name):
                _store(state, name, _quantize(p.mT, group, keep_diagonal=False))
            else:
                state[name].copy_(p.mT)

    # ---- Algorithm 2 (PIRU), every T2 ----

    def compute_inverse_roots(
        self, items: Sequence[tuple[dict[str, Any], BlockSlices]], group: Mapping[str, Any]
    ) -> None:
        self._refresh_roots(items, group, lambda state, k, side, _: self._piru(state, k, side, group), True)

    def _piru(self, state: Mapping[str, Any], k: int, side: str, group: Mapping[str, Any]) -> Tensor:
        v = self._eigvecs(state, f"{side}_eigvecs_{k}", group["rectify_t2"])
        evals = state[f"{side}_eigvals_{k}"].clamp_min(0.0)
        p, eps = group["inverse_root_order"], group["matrix_eps"]
        if group["root_method"] == "newton":
            return self._inverse_root(linalg.from_eigenpairs(evals, v), group)
        ridge = eps * evals.max().clamp_min(_LAMBDA_MAX_FLOOR)
        return linalg.from_eigenpairs((evals + ridge).pow(-1.0 / p), v)


class Shampoo4bitNaive(_LowBitShampoo):
    """Naive 4-bit Shampoo: Algorithm 4 with L, R, L^, R^ block-quantized (diagonals fp32 by default)."""

    hparams = (
        Shampoo.hparams
        + LOWBIT
        + BATCH_MATRICES
        + Declaration(
            flag("keep_diagonal", True, code(f"{REFERENCE}: the paper's 'slightly improved' naive variant")),
            flag(
                "symmetrize_statistic",
                False,
                ours(f"(S + S^T)/2 before the Newton root; {REFERENCE} l. 175-176 roots the dequantized S as is"),
            ),
        )
    )

    def init_preconditioner(
        self, state: dict[str, Any], blocks: BlockSlices, group: Mapping[str, Any], device: torch.device
    ) -> None:
        """L_0 = eps I, L^_0 = I, quantized where the order is >= 64 (both are represented exactly)."""
        for k, side, order in _orders(blocks):
            eye = torch.eye(order, dtype=torch.float32, device=device)
            for name, matrix in ((f"{side}_stat_{k}", eye * group["matrix_eps"]), (f"{side}_root_{k}", eye)):
                if _lowbit(order, group):
                    _store(state, name, _quantize(matrix, group, group["keep_diagonal"]))
                else:
                    state[name] = matrix

    def update_statistics(
        self, state: dict[str, Any], grad: Tensor, blocks: BlockSlices, group: Mapping[str, Any]
    ) -> None:
        """L <- Q(beta D(L_bar) + (1 - beta) G G^T), likewise R (Alg. 4 line 4 on quantized storage)."""
        beta, weight = shampoo32.statistic_weights(group)
        for k, side, _ in _orders(blocks):
            rs, cs = blocks[k]
            name = f"{side}_stat_{k}"
            g = grad[rs, cs]
            if _is_quantized(state, name):
                stat = torch.addmm(_load(state, name), *_outer_factors(g, side), beta=beta, alpha=weight)
                _store(state, name, _quantize(stat, group, group["keep_diagonal"]))
            else:
                state[name].addmm_(*_outer_factors(g, side), beta=beta, alpha=weight)

    def compute_inverse_roots(
        self, items: Sequence[tuple[dict[str, Any], BlockSlices]], group: Mapping[str, Any]
    ) -> None:
        """L^ = Q((D(L_bar) + eps lambda_max I)^{-1/4}) (Alg. 4 lines 8-9 on quantized storage).

        D(L_bar) is not symmetric (entries (i, j) and (j, i) lie in different quantization blocks, with different
        scales); the Newton root iterates on it as given, as the authors' code; `symmetrize_statistic` roots
        (D(L_bar) + D(L_bar)^T) / 2 instead (root_method eigh always does).
        """

        def root_of(state: dict[str, Any], k: int, side: str, _: int) -> Tensor:
            return self._inverse_root(_load(state, f"{side}_stat_{k}"), group, group["symmetrize_statistic"])

        self._refresh_roots(items, group, root_of, group["keep_diagonal"])


# ---- registry entries ----


def matrix_bytes(order: int, hp: Mapping[str, Any], keep_diagonal: bool) -> int:
    """Stored bytes of one order x order matrix: packed codes + fp32 scales (+ fp32 diagonal), or fp32."""
    if hp["bits"] != 32 and quant.should_quantize(order * order, hp["min_lowbit_numel"]):
        return quant.quantized_nbytes((order, order), hp["bits"], hp["block_size"], with_diag=keep_diagonal)
    return 4 * order * order


def preconditioner_bytes(shape: Sequence[int], hp: Mapping[str, Any], naive: bool) -> int:
    """Statistic + inverse-root bytes of every block of one parameter (0 for a parameter Shampoo skips).

    shampoo-4bit: (fp32 eigenvalues + eigenvector matrix) + root with fp32 diagonal; shampoo-4bit-naive:
    statistic and root, each with an fp32 diagonal when `keep_diagonal`.
    """
    dims = shampoo32.preconditioner_shape(shape)
    if dims is None:
        return 0
    rows, cols = dims
    total = 0
    for rs, cs in shampoo32.block_slices(rows, cols, hp["max_order"]):
        for order in (rs.stop - rs.start, cs.stop - cs.start):
            if naive:
                total += 2 * matrix_bytes(order, hp, hp["keep_diagonal"])
            else:
                total += 4 * order + matrix_bytes(order, hp, False) + matrix_bytes(order, hp, True)
    return total


def _state_bytes(naive: bool) -> Callable[[list[tuple[int, ...]], list[tuple[int, ...]], Mapping[str, Any]], int]:
    def state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
        """The base's moments (4 bytes x 1 or 2 per element) + `preconditioner_bytes` of each structured shape."""
        moments = 1 if hp["base"] == "sgd" else 2
        total = 4 * moments * sum(math.prod(shape) for shape in [*structured, *fallback])
        return total + sum(preconditioner_bytes(shape, hp, naive) for shape in structured)

    return state_bytes


state_bytes = _state_bytes(naive=False)
naive_state_bytes = _state_bytes(naive=True)

_COMMON_NOTES = (
    "The Shampoo hyperparameters are `shampoo`'s, with the same sources. bits 3/4/8 select the quantizer; bits 32 "
    "stores every matrix fp32. batch_matrices auto stacks the steady-state products per bucket of same-format roots "
    "on CUDA only (same algorithm, same state). "
)

SHAMPOO_4BIT = register(
    OptimizerEntry(
        name="shampoo-4bit",
        refresh_interval="root_interval",
        summary="4-bit Shampoo: fp32 eigenvalues + 4-bit eigenvectors, Björck rectification, 4-bit inverse roots",
        reference="Wang et al. 2024, 4-bit Shampoo for Memory-Efficient Network Training, NeurIPS, Alg. 1-3",
        hparams=Shampoo4bit.hparams + shampoo32.ROUTING,
        build=shampoo_builder(Shampoo4bit),
        route=shampoo32._route,
        notes=_COMMON_NOTES
        + (
            "root_method eigh = Alg. 2 (root from the eigenpairs with ridge max(lambda) eps). Switch root_method "
            "newton = the code's inv_root_mode 1 (Schur-Newton on the "
            "dequantized V Diag(lambda) V^T; the paper's choice for 4-bit GPT-2). Reference code (paper silent): "
            "eigenvectors quantized transposed (one per row), unquantized matrices kept as fp32 eigenpairs "
            "without rectification, eigenvalues = Rayleigh quotients diag(P^T A P)."
        ),
        lr_keys=("lr",),
        state_bytes=state_bytes,
        check_hparams={"stat_interval": 1, "root_interval": 2},
    )
)

SHAMPOO_4BIT_NAIVE = register(
    OptimizerEntry(
        name="shampoo-4bit-naive",
        refresh_interval="root_interval",
        summary="Naive 4-bit Shampoo: Algorithm 4 with L, R and their inverse roots block-quantized",
        reference="Wang et al. 2024, 4-bit Shampoo for Memory-Efficient Network Training, NeurIPS, Sec. 5 "
        "(the '4-bit Shampoo (naive)' baseline), Alg. 4",
        hparams=Shampoo4bitNaive.hparams + shampoo32.ROUTING,
        build=shampoo_builder(Shampoo4bitNaive),
        route=shampoo32._route,
        notes=_COMMON_NOTES
        + (
            "root_method newton (Alg. 4: power iteration + coupled Schur-Newton on the dequantized statistic). "
            "keep_diagonal True keeps each matrix's diagonal fp32 and quantizes the off-diagonal part; False "
            "quantizes the whole matrix. The Newton root iterates on the dequantized statistic as it is (not "
            "symmetric), as the authors' code; symmetrize_statistic True (ours) roots (S + S^T) / 2, a kinder baseline."
        ),
        lr_keys=("lr",),
        state_bytes=naive_state_bytes,
        check_hparams={"stat_interval": 1, "root_interval": 2},
    )
)

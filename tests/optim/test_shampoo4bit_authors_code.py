"""4-bit Shampoo and its naive baseline against a float64 transcription of the authors' code.

Four parts: the naive variant's roots at every root step (below); shampoo-4bit's QR sign convention against the
authors' raw QR, measured against the one-ulp noise floor; shampoo-4bit at bits = 32 (PU's QR step and Rayleigh
eigenvalues, PIRU's root from eigenpairs, grafting and both bases) stepped beside `shampoo2.py` at prec_bits = 32;
the naive statistic's EMA, step by step, through a transcription of the authors' 4-bit CUDA kernel
(`cudaC_python/csrc/kernels.cu`, with the codebook of `qtensor/functional.py`). Quantized eigenvectors (shampoo-4bit
at 4 bits) are not compared with the kernel here; tests/optim/test_shampoo4bit_reference.py bounds them.

Reference: Sike-Wang/low-bit-Shampoo at commit fc46867b3afbc8e4f72a541475bb883ce94e8d4c. The naive variant is
`optimizers/shampoo1.py` with prec_bits=4: every T2 `compute_preconditioners` (l. 170-176) dequantizes the statistic
and hands it, as it is, to `ComputePower` (`optimizers/matrix_functions.py` l. 80-141), which neither symmetrises it
nor needs it symmetric. A dequantized statistic is not symmetric: entries (i, j) and (j, i) lie in different blocks
of 64, with different scales. The transcription is `tests.support.low_bit_shampoo_code.compute_power`.

What is compared: at every root step (T1 = 1, T2 = 3, six steps: two refreshes, the first at step 3), the root our
optimizer computes before quantizing it, against `compute_power` in float64 of the very statistic it was given (a
subclass records both). Parameters: wide (64 x 96), tall (96 x 64), square (64 x 64) and conv (64 x 8 x 3 x 3, viewed
as 64 x 72), every statistic of order >= 64 and so quantized (4 bits, linear-2, blocks of 64, fp32 diagonal).

Tolerance: our root is a float32 computation; the same transcription run in float32 on the same statistic differs
from its float64 run by what float32 arithmetic alone changes in the authors' computation, and ours is allowed four
times that. Symmetrising the statistic first moves the root by far more (measured below and stated in
`structbench.optim.shampoo4bit`), so the test fails on code that symmetrises.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from structbench.optim import linalg, quant
from structbench.optim.shampoo4bit import Shampoo4bit, Shampoo4bitNaive
from tests.support.low_bit_shampoo_code import (
    Shampoo4bitCode,
    code_margins,
    compute_power,
    linear2_codebook,
    quantize_diagreal,
)

SHAPES = {"wide": (64, 96), "tall": (96, 64), "square": (64, 64), "conv": (64, 8, 3, 3)}
STEPS, T1, T2 = 6, 1, 3
FLOAT32_SLACK = 4.0


class RecordingNaive(Shampoo4bitNaive):
    """Shampoo4bitNaive that records each (statistic, root) pair its root step computes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.roots_seen: list[tuple[Tensor, Tensor]] = []
        super().__init__(*args, **kwargs)

    def _inverse_root(self, stats: Tensor, group: Any, *args: Any) -> Tensor:  # type: ignore[override]
        root = Shampoo4bitNaive._inverse_root(stats, group, *args)
        self.roots_seen.append((stats.detach().clone(), root.detach().clone()))
        return root


def roots_of_a_run(shape: tuple[int, ...], **hparams: Any) -> list[tuple[Tensor, Tensor]]:
    """The (statistic, root) pairs of STEPS steps of RecordingNaive on fixed gradients with a low-rank part."""
    gen = torch.Generator().manual_seed(0)
    param = nn.Parameter(torch.randn(shape, generator=gen))
    optimizer = RecordingNaive([param], lr=0.1, stat_interval=T1, root_interval=T2, **hparams)
    rows = shape[0]
    for _ in range(STEPS):
        low_rank = torch.randn(rows, 4, generator=gen) @ torch.randn(4, param[0].numel(), generator=gen)
        param.grad = (low_rank + 0.3 * torch.randn(rows, param[0].numel(), generator=gen)).reshape(shape)
        optimizer.step()
    return optimizer.roots_seen


def relative(x: Tensor, reference: Tensor) -> float:
    return float((x.double() - reference).abs().max() / reference.abs().max())


def float32_bound(stat: Tensor) -> tuple[Tensor, float]:
    """The float64 reference root of `stat` as given, and FLOAT32_SLACK x its float32 run's relative gap."""
    reference = compute_power(stat.double(), 4)
    return reference, FLOAT32_SLACK * relative(compute_power(stat.float(), 4), reference)


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_naive_roots_are_the_authors_roots_of_the_unsymmetrised_statistic(shape_name: str) -> None:
    seen = roots_of_a_run(SHAPES[shape_name])
    assert len(seen) == 2 * (STEPS // T2), "two sides (one block each) per root step"
    for index, (stat, root) in enumerate(seen):
        assert bool((stat != stat.mT).any()), "the dequantized statistic is expected to be asymmetric"
        reference, bound = float32_bound(stat)
        gap = relative(root, reference)
        assert gap <= bound, f"root {index} (root step {index // 2 + 1}): gap {gap:.3g} > float32 bound {bound:.3g}"


def test_the_symmetrising_switch_roots_the_symmetric_part() -> None:
    """symmetrize_statistic=True roots (S + S^T) / 2, measurably apart from the authors' root of S."""
    for stat, root in roots_of_a_run(SHAPES["wide"], symmetrize_statistic=True):
        reference, bound = float32_bound((stat + stat.mT) / 2)
        assert relative(root, reference) <= bound
        assert relative(root, compute_power(stat.double(), 4)) > 10 * bound


# ---- shampoo-4bit's QR sign convention against the authors' raw QR (information: measured, documented) ----

QR_SHAPES = {"wide": (64, 96), "conv": (64, 8, 3, 3)}
QR_STEPS, NOISE_SEEDS = 12, (0, 1)


def raw_subspace_step(a: Tensor, q: Tensor, iters: int = 1) -> Tensor:
    """The authors' PU subspace step, qtensor/utils.py l. 115: torch.linalg.qr(A V) with its own signs."""
    basis = q.to(torch.float32)
    for _ in range(iters):
        basis, _ = torch.linalg.qr(a.to(torch.float32) @ basis)
    return basis.to(q.dtype)


def low_rank_gradients(shape: tuple[int, ...], seed: int = 0) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape[0], torch.Size(shape[1:]).numel()
    out = []
    for _ in range(QR_STEPS):
        low_rank = torch.randn(rows, 4, generator=gen) @ torch.randn(4, cols, generator=gen)
        out.append((low_rank + 0.3 * torch.randn(rows, cols, generator=gen)).reshape(shape))
    return out


def one_ulp_apart(grads: list[Tensor], seed: int) -> list[Tensor]:
    """Each entry moved one float32 ulp up or down, the direction drawn with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for grad in grads:
        up = torch.rand(grad.shape, generator=gen) < 0.5
        out.append(torch.nextafter(grad, torch.where(up, torch.inf, -torch.inf)))
    return out


def final_delta(shape: tuple[int, ...], grads: list[Tensor]) -> Tensor:
    """W_T - W_0 of Shampoo4bit (T1 = 1, T2 = 3) on `grads`."""
    w0 = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    param = nn.Parameter(w0.clone())
    optimizer = Shampoo4bit([param], lr=0.1, stat_interval=1, root_interval=3)
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()
    return param.detach() - w0


def noise_floor(shape: tuple[int, ...], grads: list[Tensor]) -> float:
    """The largest relative move of W_T - W_0 under one-ulp perturbations of the gradients."""
    base = final_delta(shape, grads)
    return max(relative(final_delta(shape, one_ulp_apart(grads, seed)), base.double()) for seed in NOISE_SEEDS)


@pytest.mark.parametrize("shape_name", sorted(QR_SHAPES))
def test_qr_sign_convention_stays_inside_the_one_ulp_noise_floor(
    shape_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positive diag(R) (ours) against raw QR (the authors'): W_T - W_0 after four root refreshes differ by no more
    than twice what one-ulp gradient perturbations move either convention (the numbers in shampoo4bit's docstring
    come from this problem)."""
    shape = QR_SHAPES[shape_name]
    grads = low_rank_gradients(shape)
    positive, positive_floor = final_delta(shape, grads), noise_floor(shape, grads)
    monkeypatch.setattr(linalg, "subspace_iteration", raw_subspace_step)
    raw, raw_floor = final_delta(shape, grads), noise_floor(shape, grads)
    assert relative(raw, positive.double()) > 0, "the conventions are expected to differ"
    assert relative(raw, positive.double()) <= 2 * max(positive_floor, raw_floor)


# ---- shampoo-4bit's PU / PIRU at bits = 32 against shampoo2.py at prec_bits = 32, step by step ----

FULL_PRECISION_SHAPES = {"wide": (8, 20), "tall": (20, 8), "square": (12, 12), "conv": (6, 3, 3, 3)}
FULL_PRECISION_BASES = {"sgd": (0.1, 5e-4), "adamw": (1e-3, 0.05)}


@pytest.mark.parametrize("base", sorted(FULL_PRECISION_BASES))
@pytest.mark.parametrize("shape_name", sorted(FULL_PRECISION_SHAPES))
def test_full_precision_eigenpair_shampoo_follows_the_authors_code(base: str, shape_name: str) -> None:
    """bits = 32: every statistic held as fp32 eigenpairs, updated by one warm QR step and Rayleigh quotients, roots
    from the eigenpairs (shampoo2.py inv_root_mode 0), nine steps with T1 = 1, T2 = 3 and blocks of at most 16.
    Without quantization the QR's signs cancel (V Diag(S) V^T and the roots do not depend on them), so W_t - W_0 is
    compared at every step within FLOAT32_SLACK x the transcription's own float32-vs-float64 gap (up to 1e-2 of the
    largest weight change on the wide and tall cases, whose near-null eigenvalues float32 cannot resolve)."""
    shape = FULL_PRECISION_SHAPES[shape_name]
    lr, weight_decay = FULL_PRECISION_BASES[base]
    w0 = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    param = nn.Parameter(w0.clone())
    settings = dict(base=base, lr=lr, stat_interval=1, root_interval=3, max_order=16)
    ours = Shampoo4bit([param], bits=32, **settings, **{f"{base}_weight_decay": weight_decay})
    code64 = Shampoo4bitCode(w0.double(), weight_decay=weight_decay, **settings)
    code32 = Shampoo4bitCode(w0.clone(), weight_decay=weight_decay, **settings)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 10):
        grad = torch.randn(shape, generator=gen)
        param.grad = grad.clone()
        ours.step()
        code64.step(grad.double())
        code32.step(grad.clone())
        reference = code64.param - w0.double()
        bound = FLOAT32_SLACK * relative(code32.param - w0, reference)
        gap = relative(param.detach() - w0, reference)
        assert gap <= bound, f"step {step}: W_t - W_0 differs by {gap:.3g} (float32 bound {bound:.3g})"


# ---- the naive statistic's update through the authors' 4-bit kernel, step by step ----

UNIT_ROUNDOFF = 2.0**-24
STAT_FIELDS = ("codes", "scales", "shape", "bits", "block_size", "codebook_id", "diag")


def stored_statistic(state: dict[str, Any], name: str) -> Tensor:
    """D(statistic) as stored under `name`, read through the documented state fields, in float64."""
    fields = {key: state[f"{name}.{key}"] for key in STAT_FIELDS if f"{name}.{key}" in state}
    return quant.dequantize(quant.from_state(fields)).double()


def gamma(n: int) -> float:
    return n * UNIT_ROUNDOFF / (1 - n * UNIT_ROUNDOFF)


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_naive_statistic_is_the_authors_kernel_quantization_of_the_ema(shape_name: str) -> None:
    """Teacher-forced, each of five steps: from the statistic we stored at the previous step and the gradient, the
    authors' update (shampoo1.py l. 155-168) in float64, quantized by a transcription of their CUDA kernel
    (`quantize_diagreal`: per row, fp32 diagonal, blocks of 64 columns, nearest linear-2 code). The stored diagonal
    and block scales must lie within the float32 error bound of the update, gamma_{k+2} (beta |S| + w |G| |G|^T)
    entrywise (k the inner dimension); a stored code may differ from the kernel's only where the float64 entry lies
    within that bound (relative to its scale, plus 4 u for the scaling) of a decision midpoint."""
    shape = SHAPES[shape_name]
    gen = torch.Generator().manual_seed(0)
    param = nn.Parameter(torch.randn(shape, generator=gen))
    optimizer = Shampoo4bitNaive([param], lr=0.1, stat_interval=1, root_interval=100)
    rows, cols = shape[0], param[0].numel()
    codebook = linear2_codebook()
    previous: dict[str, Tensor] = {}
    for step in range(5):
        grad = torch.randn(rows, 4, generator=gen) @ torch.randn(4, cols, generator=gen)
        param.grad = (grad + 0.3 * torch.randn(rows, cols, generator=gen)).reshape(shape)
        optimizer.step()
        g = param.grad.reshape(rows, cols).double()
        for side, outer, inner in (("left", g @ g.T, cols), ("right", g.T @ g, rows)):
            stat = stored_statistic(optimizer.state[param], f"{side}_stat_0")
            if step:
                abs_outer = g.abs() @ g.abs().T if side == "left" else g.abs().T @ g.abs()
                expected = 0.95 * previous[side] + 0.05 * outer
                bound = gamma(inner + 2) * (0.95 * previous[side].abs() + 0.05 * abs_outer)
                check_against_kernel(stat, expected, bound, codebook, f"step {step + 1} {side}")
            previous[side] = stat


def check_against_kernel(stat: Tensor, expected: Tensor, bound: Tensor, codebook: Tensor, where: str) -> None:
    codes, scales, diagonal = quantize_diagreal(expected)
    assert bool(((stat.diagonal() - diagonal).abs() <= bound.diagonal() + UNIT_ROUNDOFF * diagonal.abs()).all()), where
    off = stat - torch.diag(stat.diagonal())
    stored_scales = torch.empty_like(off)
    block_bound = torch.empty_like(off)
    for start in range(0, stat.shape[0], 64):
        columns = slice(start, min(start + 64, stat.shape[0]))
        stored_scales[:, columns] = off[:, columns].abs().amax(dim=1, keepdim=True)
        block_bound[:, columns] = bound[:, columns].amax(dim=1, keepdim=True)
    assert bool(((stored_scales - scales).abs() <= block_bound + UNIT_ROUNDOFF * scales).all()), f"{where}: scales"
    normalized = off / torch.where(stored_scales > 0, stored_scales, 1.0)
    stored_codes = (normalized.unsqueeze(-1) - codebook).abs().argmin(dim=-1)
    stored_codes.diagonal().copy_(codes.diagonal())
    slack = 2 * (bound + block_bound) / torch.where(scales > 0, scales, 1.0) + 4 * UNIT_ROUNDOFF
    differ = stored_codes != codes
    assert bool((code_margins(expected - torch.diag(diagonal), scales)[differ] <= slack[differ]).all()), (
        f"{where}: {int(differ.sum())} codes differ from the kernel's, some far from a decision midpoint"
    )

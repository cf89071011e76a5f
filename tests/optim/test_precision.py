"""The matmul precision switch (structbench/optim/precision.py): TF32 rounding against the format's definition, and
each precision's product within its stated error bound of the float64 product, the bound itself not loose by more
than a known factor (so that a product computed in a coarser format than declared would fail)."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from structbench.optim import linalg, precision


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest() -> None:
    """1 + k 2^-10 is representable; 1 + 2^-11 + 2^-13 rounds up to 1 + 2^-10, 1 + 2^-12 down to 1; signs are kept;
    infinities and NaN pass."""
    x = torch.tensor([1 + 3 * 2.0**-10, 1 + 2.0**-11 + 2.0**-13, 1 + 2.0**-12, -(1 + 2.0**-11 + 2.0**-13)])
    assert precision.round_to_tf32(x).tolist() == [1 + 3 * 2.0**-10, 1 + 2.0**-10, 1.0, -(1 + 2.0**-10)]
    special = torch.tensor([float("inf"), float("-inf"), float("nan")])
    rounded = precision.round_to_tf32(special)
    assert rounded[:2].tolist() == [float("inf"), float("-inf")] and bool(rounded[2].isnan())


@pytest.mark.parametrize("name", precision.MATMUL_PRECISIONS)
def test_each_precision_is_within_its_bound_and_uses_its_rounding(name: str) -> None:
    """Batched (8, 64, 24) x (8, 24, 64) products of Gaussian operands: the error against float64 is within
    product_error_bound |A| |B| entrywise. And an outer product of 64 Gaussians by 64 (inner dimension 1, where
    the error is the operands' rounding alone) shows the declared format's rounding: a value's relative rounding
    error is at least u/4 with probability at least 1/2 (its absolute error is uniform on [0, ulp/2] and
    ulp/2 >= u |x|), so all 64 of a column fall below u/4 with probability at most 2^-64; a finer format than
    declared (float32 for "tf32") fails."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(8, 64, 24, generator=generator)
    b = torch.randn(8, 24, 64, generator=generator)
    found = precision.matmul(a, b, name)
    assert found.dtype == torch.float32
    exact = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    assert float(((found.double() - exact).abs() / scale).max()) <= precision.product_error_bound(name, 24)
    column, row = torch.randn(64, 1, generator=generator), torch.ones(1, 1)
    relative = (precision.matmul(column, row, name).double() - column.double()).abs() / column.double().abs()
    if name != "float32":
        assert float(relative.max()) >= precision.unit_roundoff(name) / 4


def test_an_unknown_precision_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="float32, tf32, bfloat16"):
        precision.matmul(torch.ones(2, 2), torch.ones(2, 2), "float16")


class _Tf32Flags(TorchFunctionMode):
    """Records CUDA's TF32 matmul flag at every matrix product."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("matmul", "__matmul__", "mm", "bmm", "baddbmm", "addmm"):
            self.seen.append(torch.backends.cuda.matmul.allow_tf32)
        return func(*args, **(kwargs or {}))


def test_the_float32_iterations_run_with_tf32_off_whatever_the_global_setting(monkeypatch) -> None:
    """With TF32 switched on globally, every product of linalg's inverse-root iterations and Cholesky-QR2 sees it off,
    and the global setting is back after each call."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    a = torch.eye(8).expand(2, 8, 8) * 2.0
    calls = (
        lambda: linalg.inverse_sqrt_cold_updates(a, updates=3),
        lambda: linalg.inverse_sqrt_warm_updates(a, torch.eye(8).expand(2, 8, 8), updates=2),
        lambda: linalg.inverse_sqrt_newton_schulz(a),
        lambda: linalg.cholesky_qr2(torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(0))),
    )
    for call in calls:
        flags = _Tf32Flags()
        with flags:
            call()
        assert flags.seen and not any(flags.seen)
        assert torch.backends.cuda.matmul.allow_tf32

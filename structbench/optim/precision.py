"""The precision of an optimizer's large float32 matrix products: a declared switch, the same for every optimizer.

- "float32": the products in float32 (on CUDA with TF32 off, torch's default: CUDA cores, unit roundoff 2^-24);
- "tf32": the operands rounded to TF32's 10-bit mantissa, products accumulated in float32 (on CUDA the tensor cores'
  TF32 mode, switched on for the product alone; elsewhere emulated by rounding the operands to nearest, so that a CPU
  run shows the same rounding as a GPU's, to within its accumulation order); unit roundoff 2^-11 per operand;
- "bfloat16": the operands cast to bfloat16 (8-bit mantissa) and multiplied there (float32 accumulation on tensor
  cores and in torch's CPU kernels, the result rounded to bfloat16), returned in float32; unit roundoff 2^-8.

Error bound of one product C = A B of inner dimension k whose operands are rounded with unit roundoff u and
accumulated in float32 (u32 = 2^-24): |C_hat - C| <= ((1 + u)^2 - 1 + gamma_k(u32)) |A| |B| entrywise, about
(2u + k u32) |A| |B|, and for bfloat16, whose result is rounded once more, (1 + u)^3 - 1 + gamma_k(u32):
`product_error_bound` gives the factor.

`exact_float32` guards the other way: the iterations whose residual checks assume float32 products (linalg's inverse
roots and Cholesky-QR2) run with CUDA's TF32 off even where a user switched it on globally.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor

P = ParamSpec("P")
R = TypeVar("R")
MATMUL_PRECISIONS = ("float32", "tf32", "bfloat16")
_UNIT_ROUNDOFF = {"float32": 2.0**-24, "tf32": 2.0**-11, "bfloat16": 2.0**-8}
_TF32_DROPPED_BITS = 13
"""float32 has 23 explicit mantissa bits, TF32 10: the 13 low bits are rounded away."""


def check_precision(precision: str) -> None:
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision must be one of {', '.join(MATMUL_PRECISIONS)}; got {precision!r}")


def unit_roundoff(precision: str) -> float:
    """The unit roundoff of a product's operands in `precision`."""
    check_precision(precision)
    return _UNIT_ROUNDOFF[precision]


def product_error_bound(precision: str, inner: int) -> float:
    """The factor c with |fl(A B) - A B| <= c |A| |B| entrywise, for float32 A, B rounded to `precision` and a float32
    accumulation of `inner` terms: (1 + u)^r - 1 + gamma_inner(2^-24), r = 2 roundings (the operands), 3 for
    bfloat16 (its result too)."""
    u, u32 = unit_roundoff(precision), _UNIT_ROUNDOFF["float32"]
    roundings = 3 if precision == "bfloat16" else 2
    return (1 + u) ** roundings - 1 + inner * u32 / (1 - inner * u32)


def round_to_tf32(x: Tensor) -> Tensor:
    """Float32 `x` rounded to nearest (ties away from zero) at TF32's 10-bit mantissa, returned as float32; infinities
    and NaN pass through."""
    bits = x.contiguous().view(torch.int32)
    half = 1 << (_TF32_DROPPED_BITS - 1)
    rounded = ((bits + half) >> _TF32_DROPPED_BITS) << _TF32_DROPPED_BITS
    finite = torch.isfinite(x)
    return torch.where(finite, rounded.view(torch.float32), x)


@contextmanager
def _cuda_tf32(allowed: bool) -> Iterator[None]:
    """torch's CUDA TF32 matmul flag set to `allowed` for the block, restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def exact_float32(function: Callable[P, R]) -> Callable[P, R]:
    """Run `function` with CUDA's TF32 matmul mode off, whatever the user set globally
    (`torch.backends.cuda.matmul.allow_tf32`, `torch.set_float32_matmul_precision("high")`): for the iterations whose
    residual checks and error bounds assume float32 products (inverse roots, Cholesky-QR2), which TF32's 2^-11
    rounding would fail or loosen. The flag is restored on return; it has no effect off CUDA."""

    @functools.wraps(function)
    def exact(*args: P.args, **kwargs: P.kwargs) -> R:
        with _cuda_tf32(False):
            return function(*args, **kwargs)

    return exact


def matmul(a: Tensor, b: Tensor, precision: str) -> Tensor:
    """a @ b of float32 tensors (batched as `torch.matmul`) in `precision`, returned in float32."""
    check_precision(precision)
    if precision == "float32":
        return a @ b
    if precision == "bfloat16":
        return (a.to(torch.bfloat16) @ b.to(torch.bfloat16)).to(a.dtype)
    if a.device.type == "cuda":
        with _cuda_tf32(True):
            return a @ b
    return round_to_tf32(a) @ round_to_tf32(b)

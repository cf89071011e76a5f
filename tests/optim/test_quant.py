"""Tests for structbench.optim.quant against facts derived here from the paper, not from the code.

Paper: Wang et al., "4-bit Shampoo for Memory-Efficient Network Training", NeurIPS 2024. Codebooks come
from Eq. (3) (Linear-2) and Appendix C (DT), recomputed here with exact fractions and checked against
the paper's printed tables; codes are checked against a brute-force argmin over the codebook; byte
counts are computed from the storage format (module docstring); the row-block scales are recomputed
with explicit loops over the blocks.
"""

from __future__ import annotations

import io
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structbench.optim.quant import (
    CODEBOOK_NAMES,
    DEFAULT_BLOCK_SIZE,
    MIN_LOWBIT_NUMEL,
    SUPPORTED_BITS,
    QuantizedMatrix,
    codebook,
    dequantize,
    dequantize_many,
    dynamic_tree_codebook,
    from_state,
    linear_square_codebook,
    quantize,
    quantize_offdiag,
    quantized_nbytes,
    same_format,
    should_quantize,
    to_state,
)

ALL_CODEBOOKS = [(name, bits) for name in CODEBOOK_NAMES for bits in SUPPORTED_BITS]

# Hand-derived 4- and 3-bit tables.
# Linear-2, Eq. (3): R(j) = ∓(-1 + 2j/(2^b - 1))^2 with R(2^(b-1) - 1) = 0. At b = 4 the base values
# are (2j - 15)/15, so the squares are n^2/225 for odd n; at b = 3 they are n^2/49.
LINEAR2_4BIT = [Fraction(n, 225) for n in (-225, -169, -121, -81, -49, -25, -9, 0, 1, 9, 25, 49, 81, 121, 169, 225)]
LINEAR2_3BIT = [Fraction(n, 49) for n in (-49, -25, -9, 0, 1, 9, 25, 49)]
# DT, Appendix C, b = 4: (E, F) = (0, 2): p = 0.1, 0.325, 0.55, 0.775, 1 -> q = 17/80, 35/80, 53/80, 71/80;
# (1, 1): p = 0.1, 0.55, 1 -> q = 0.325, 0.775, times 1/10 = 13/400, 31/400; (2, 0): q = 0.55 / 100 = 11/2000.
_DT4_POSITIVE = [Fraction(11, 2000), Fraction(13, 400), Fraction(31, 400)] + [Fraction(n, 80) for n in (17, 35, 53, 71)]
DT_4BIT = sorted([-v for v in _DT4_POSITIVE] + [Fraction(0)] + _DT4_POSITIVE + [Fraction(1)])
# DT, b = 3: (0, 1): q = 0.325, 0.775 = 13/40, 31/40; (1, 0): q = 0.55 / 10 = 11/200.
_DT3_POSITIVE = [Fraction(11, 200), Fraction(13, 40), Fraction(31, 40)]
DT_3BIT = sorted([-v for v in _DT3_POSITIVE] + [Fraction(0)] + _DT3_POSITIVE + [Fraction(1)])

# The tables exactly as printed in Appendix C (4 decimals).
PAPER_PRINTED = {
    ("linear-2", 4): [-1.0, -0.7511, -0.5378, -0.36, -0.2178, -0.1111, -0.04, 0.0,
                      0.0044, 0.04, 0.1111, 0.2178, 0.36, 0.5378, 0.7511, 1.0],
    ("linear-2", 3): [-1.0, -0.5102, -0.1837, 0.0, 0.0204, 0.1837, 0.5102, 1.0],
    ("dt", 4): [-0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0.0,
                0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875, 1.0],
    ("dt", 3): [-0.775, -0.325, -0.055, 0.0, 0.055, 0.325, 0.775, 1.0],
}  # fmt: skip


def paper_linear2(bits: int) -> list[Fraction]:
    """Eq. (3) of the paper, term by term."""
    n = 2**bits - 1
    zero_index = 2 ** (bits - 1) - 1
    out = []
    for j in range(2**bits):
        base = -1 + Fraction(2 * j, n)
        out.append(-(base**2) if j < zero_index else Fraction(0) if j == zero_index else base**2)
    return out


def paper_dt(bits: int) -> list[Fraction]:
    """Appendix C: {0, 1} ∪ {±q_k 10^-E}, b = 2 + E + F, q_k = (p_k + p_(k+1))/2, p_j = 0.9j/2^F + 0.1."""
    g = []
    for f in range(bits - 1):
        e = bits - 2 - f
        p = [Fraction(9, 10) * j / 2**f + Fraction(1, 10) for j in range(2**f + 1)]
        g += [s * (p[k] + p[k + 1]) / 2 / 10**e for k in range(2**f) for s in (1, -1)]
    return sorted([*g, Fraction(0), Fraction(1)])


def paper_codebook(name: str, bits: int) -> torch.Tensor:
    """The float32 rounding of the exact paper values."""
    values = paper_linear2(bits) if name == "linear-2" else paper_dt(bits)
    return to_float32(values)


def to_float32(values: list[Fraction]) -> torch.Tensor:
    return torch.tensor([float(v) for v in values], dtype=torch.float64).float()


def rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """Row layout of the format: rows = shape[0], a 1-D tensor is one row, a scalar one element."""
    if len(shape) == 0:
        return 1, 1
    return (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))


def unpack_by_hand(codes: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Byte i holds element 2i in its low nibble and 2i+1 in its high nibble (one code per byte at 8 bits)."""
    out: list[int] = []
    for byte in codes.tolist():
        out.extend([byte] if bits == 8 else [byte & 0x0F, byte >> 4])
    return torch.tensor(out[:numel], dtype=torch.long)


def block_scales_by_hand(mat: torch.Tensor, block_size: int) -> torch.Tensor:
    """Absmax of every run of block_size contiguous elements of a row; the last run may be shorter."""
    rows, cols = mat.shape
    blocks = -(-cols // block_size)
    scales = torch.zeros(rows, blocks, dtype=torch.float32)
    for r in range(rows):
        for b in range(blocks):
            scales[r, b] = mat[r, b * block_size : (b + 1) * block_size].abs().max()
    return scales


def normalised_by_hand(mat: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N(x) of Section 2.2 in float32 (x / block absmax, 0 for a zero block) and the per-element scale."""
    scales = block_scales_by_hand(mat, block_size)
    per_element = torch.repeat_interleave(scales, block_size, dim=1)[:, : mat.shape[1]]
    safe = torch.where(per_element > 0, per_element, torch.ones_like(per_element))
    return mat / safe, per_element


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def assert_nearest_codes(q: QuantizedMatrix, x: torch.Tensor) -> None:
    """Every stored code is a minimiser of |N(x) - R(j)| over the paper's codebook (brute force)."""
    rows, cols = rows_cols(tuple(x.shape))
    mat = x.detach().float().reshape(rows, cols)
    normalised, _ = normalised_by_hand(mat, q.block_size)
    table = paper_codebook(q.codebook, q.bits).double()
    indices = unpack_by_hand(q.codes, q.bits, rows * cols).view(rows, cols)
    distance = (normalised.double().unsqueeze(-1) - table).abs()
    chosen = distance.gather(-1, indices.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(chosen, distance.min(dim=-1).values)


def roundtrip_error_bound(x: torch.Tensor, block_size: int, name: str, bits: int) -> torch.Tensor:
    """Per-element bound on |x - D(Q(x))|.

    With s the block absmax and t = fl(x/s) in [-1, 1]: if c_lo <= t <= c_hi are adjacent codes, the
    nearest code c has |t - c| <= (c_hi - c_lo)/2 (0 when t is a code); below the smallest code c_0
    (DT has no -1) |t - c_0| <= c_0 + 1; above the largest code, |t - c_max| <= 1 - c_max. The quantizer's
    float32 decision thresholds are within 2^-24 of the exact midpoints, so the chosen code is within
    (c_hi - c_lo)/2 + 2^-24 of t. Then |x - fl(c s)| <= |x - t s| + s |t - c| + |c s - fl(c s)| <=
    s (|t - c| + 3 2^-24) <= s (|t - c| + 2^-22), both float32 roundings being relative errors of at most 2^-24
    on values of magnitude at most s.
    """
    rows, cols = rows_cols(tuple(x.shape))
    normalised, scale = normalised_by_hand(x.detach().float().reshape(rows, cols), block_size)
    t = normalised.double()
    table = paper_codebook(name, bits).double()
    last = table.numel() - 1
    lo = torch.searchsorted(table, t, right=True) - 1
    hi = torch.searchsorted(table, t, right=False)
    half_gap = (table[hi.clamp(max=last)] - table[lo.clamp(min=0)]) / 2
    half_gap = torch.where(lo < 0, table[0] + 1, half_gap)
    half_gap = torch.where(hi > last, 1 - table[last], half_gap)
    return (scale.double() * (half_gap + 2.0**-22)).view(x.shape)


def assert_within_bound(q: QuantizedMatrix, x: torch.Tensor) -> None:
    error = (dequantize(q).double() - x.detach().double()).abs()
    assert bool((error <= roundtrip_error_bound(x, q.block_size, q.codebook, q.bits)).all())


def save_and_load(obj: object) -> object:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def dequantize_by_hand(q: QuantizedMatrix) -> torch.Tensor:
    """R(code) times the code's block scale, element by element in float32 (one rounding: the product), with the
    kept diagonal written over: D(Q(x)) of Section 2.2 from the format alone."""
    rows, cols = rows_cols(q.shape)
    table = paper_codebook(q.codebook, q.bits)
    indices = unpack_by_hand(q.codes, q.bits, rows * cols).view(rows, cols)
    out = torch.empty(rows, cols)
    for r in range(rows):
        for c in range(cols):
            out[r, c] = table[indices[r, c]] * q.scales[r, c // q.block_size]
    if q.diag is not None:
        out.diagonal().copy_(q.diag)
    return out.view(q.shape)


# ---------------------------------------------------------------------------------------------- codebooks


@pytest.mark.parametrize(
    ("name", "bits", "hand_derived"),
    [("linear-2", 4, LINEAR2_4BIT), ("linear-2", 3, LINEAR2_3BIT), ("dt", 4, DT_4BIT), ("dt", 3, DT_3BIT)],
)
def test_codebook_equals_hand_derived_values(name: str, bits: int, hand_derived: list[Fraction]) -> None:
    assert paper_codebook(name, bits).tolist() == to_float32(hand_derived).tolist()
    table = codebook(name, bits)
    assert table.dtype == torch.float32
    assert torch.equal(table, to_float32(hand_derived))
    # Not rounding: the paper prints 4 decimals, so each printed value is within 5e-5 of the exact one, and the
    # float32 entry within 2^-24 (relative, |R| <= 1) of it. A wrong formula moves an entry by >= 1e-3.
    torch.testing.assert_close(table, torch.tensor(PAPER_PRINTED[(name, bits)]), rtol=0, atol=5e-5 + 2.0**-24)


@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
def test_codebook_is_sorted_paper_mapping(name: str, bits: int) -> None:
    table = codebook(name, bits)
    assert table.shape == (2**bits,)
    assert bool((table[1:] > table[:-1]).all())
    assert torch.equal(table, paper_codebook(name, bits))
    assert table[2 ** (bits - 1) - 1] == 0 and table[-1] == 1
    # Linear-2 contains -1 and the asymmetric +1/(2^b-1)^2; DT contains +1 but not -1 (Section 7, item 3).
    if name == "linear-2":
        assert table[0] == -1 and table[2 ** (bits - 1)] == float(Fraction(1, (2**bits - 1) ** 2))
    else:
        assert table[0] > -1


@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
def test_codebook_entries_are_nearest_float32_to_exact_values(name: str, bits: int) -> None:
    exact = paper_linear2(bits) if name == "linear-2" else paper_dt(bits)
    table = codebook(name, bits)
    below = torch.nextafter(table, torch.tensor(-2.0))
    above = torch.nextafter(table, torch.tensor(2.0))
    for value, entry, lower, upper in zip(exact, table.tolist(), below.tolist(), above.tolist(), strict=True):
        error = abs(Fraction(entry) - value)
        assert error <= abs(Fraction(lower) - value) and error <= abs(Fraction(upper) - value)


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_codebook_matches_float_formula(bits: int) -> None:
    """Eq. (3) and Appendix C evaluated in ordinary float64 arithmetic agree to within float32 rounding."""
    n, zero = 2**bits - 1, 2 ** (bits - 1) - 1
    linear2 = [-((-1 + 2 * j / n) ** 2) if j < zero else 0.0 if j == zero else (-1 + 2 * j / n) ** 2
               for j in range(2**bits)]  # fmt: skip
    dt = [0.0, 1.0]
    for e in range(bits - 1):
        f = bits - 2 - e
        p = [0.9 * j / 2**f + 0.1 for j in range(2**f + 1)]
        dt += [s * (p[k] + p[k + 1]) / 2 * 10.0**-e for k in range(2**f) for s in (1, -1)]
    # Each table entry is the float32 nearest the exact value (2^-24 relative, test above); the float64 formula is
    # rounded to float32 (2^-24) from a value within 4 n 2^-53 <= 2^-43 of exact (Linear-2's -1 + 2j/n cancels down
    # to 1/n, n = 2^b - 1 <= 255, then is squared; DT's sums of positive terms lose 8 2^-53): |table - formula| <=
    # (2^-23 + 2^-42) |R|. An off-by-one in j or E moves entries by >= 1e-2.
    rel = 2.0**-23 + 2.0**-42
    torch.testing.assert_close(linear_square_codebook(bits), torch.tensor(linear2).float(), rtol=rel, atol=0)
    torch.testing.assert_close(dynamic_tree_codebook(bits), torch.tensor(sorted(dt)).float(), rtol=rel, atol=0)


def test_codebook_rejects_unknown_name_and_bits() -> None:
    with pytest.raises(ValueError, match=r"'linear-2'.*'dt'"):
        codebook("linear2", 4)
    with pytest.raises(ValueError, match="bits"):
        codebook("dt", 5)
    with pytest.raises(ValueError, match="'dt'"):
        quantize(torch.ones(4), codebook="nf4")


def test_codebook_returns_fresh_tensor() -> None:
    table = codebook("linear-2", 4)
    table.zero_()
    assert codebook("linear-2", 4)[-1] == 1


# ----------------------------------------------------------------------------------- rounding and packing


@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
def test_codes_are_nearest_and_error_within_half_gap(name: str, bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    # rows of very different magnitude, 200 columns = blocks of 64, 64, 64, 8
    x = torch.randn(48, 200, generator=g) * torch.logspace(-6, 6, 48).unsqueeze(1)
    q = quantize(x, bits=bits, codebook=name)
    assert torch.equal(q.scales, block_scales_by_hand(x, DEFAULT_BLOCK_SIZE))
    assert_nearest_codes(q, x)
    assert_within_bound(q, x)


def test_error_bound_for_4bit_linear2_by_hand() -> None:
    """Largest half-gap of 4-bit Linear-2 is (1 - 169/225)/2 = 28/225: the worst error is 0.1244 s."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    error = (dequantize(quantize(x)) - x).abs().view(64, 4, 64).amax(dim=2)
    assert bool((error <= block_scales_by_hand(x, 64) * (28 / 225 + 1e-6)).all())


@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
def test_values_at_and_beside_every_midpoint(name: str, bits: int) -> None:
    """Float32 values at, just below and just above each midpoint go to the nearest code; exact ties
    go to the lower code (the first minimiser over the sorted codebook)."""
    table = paper_codebook(name, bits).double()
    mid = ((table[:-1] + table[1:]) / 2).float()
    probes = torch.cat(
        [mid, torch.nextafter(mid, torch.tensor(-2.0)), torch.nextafter(mid, torch.tensor(2.0)), table.float()]
    )
    x = torch.cat([torch.ones(1), probes])  # block absmax exactly 1, so N(x) = x
    q = quantize(x, bits=bits, codebook=name, block_size=x.numel())
    indices = unpack_by_hand(q.codes, bits, x.numel())
    assert torch.equal(indices, (x.double().unsqueeze(1) - table).abs().argmin(dim=1))


@pytest.mark.parametrize("name", CODEBOOK_NAMES)
def test_exact_tie_resolves_to_lower_code(name: str) -> None:
    table = paper_codebook(name, 4)
    tie_up = table[8] / 2  # exactly halfway between code 7 (= 0) and code 8
    tie_down = table[6] / 2  # exactly halfway between code 6 and code 7 (= 0)
    x = torch.stack([torch.tensor(1.0), tie_up, tie_down, torch.nextafter(tie_up, torch.tensor(1.0))])
    assert unpack_by_hand(quantize(x, codebook=name).codes, 4, 4).tolist() == [15, 7, 6, 8]


@pytest.mark.parametrize("name", CODEBOOK_NAMES)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_packing_layout_built_by_hand(name: str, bits: int) -> None:
    """Shape (3, 7), block 4: blocks of 4 and 3 per row, 21 elements, so the last byte has one code."""
    table = paper_codebook(name, bits)
    top = 2**bits - 1
    indices = [(3 * i + 2) % (top + 1) for i in range(21)]
    for start in (0, 4, 7, 11, 14, 18):  # the first element of every block is +1, so every absmax is 1
        indices[start] = top
    x = table[torch.tensor(indices)].view(3, 7)
    q = quantize(x, bits=bits, codebook=name, block_size=4)
    if bits == 8:
        expected = indices
    else:
        padded = [*indices, 0]
        expected = [padded[2 * k] | (padded[2 * k + 1] << 4) for k in range(11)]
    assert q.codes.dtype == torch.uint8
    assert q.codes.tolist() == expected
    assert torch.equal(q.scales, torch.ones(3, 2))
    assert torch.equal(dequantize(q), x)


def test_three_bit_codes_fill_only_three_bits_of_each_nibble() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    codes = quantize(x, bits=3).codes
    assert bool(((codes & 0x0F) < 8).all()) and bool(((codes >> 4) < 8).all())


# ------------------------------------------------------------------------------------- storage and bytes


@pytest.mark.parametrize(
    ("shape", "bits", "block_size", "code_bytes", "scale_count"),
    [
        ((128, 128), 4, 64, 128 * 128 // 2, 128 * 2),
        ((100, 100), 4, 64, 100 * 100 // 2, 100 * 2),  # ceil(100/64) = 2 blocks per row
        ((100, 100), 8, 64, 100 * 100, 100 * 2),
        ((64, 64), 3, 64, 64 * 64 // 2, 64),  # 3-bit codes take 4-bit nibbles
        ((3, 7), 4, 4, 11, 3 * 2),  # 21 codes -> 11 bytes
        ((5,), 4, 64, 3, 1),
        ((2, 3, 5), 8, 4, 30, 2 * 4),  # rows of 15 elements -> 4 blocks each
        ((), 4, 64, 1, 1),
    ],
)
def test_exact_packed_byte_counts(
    shape: tuple[int, ...], bits: int, block_size: int, code_bytes: int, scale_count: int
) -> None:
    q = quantize(torch.randn(shape), bits=bits, block_size=block_size)
    assert q.codes.dtype == torch.uint8 and q.codes.numel() == code_bytes
    assert q.scales.dtype == torch.float32 and q.scales.numel() == scale_count
    assert q.nbytes == code_bytes + 4 * scale_count
    assert quantized_nbytes(shape, bits, block_size) == q.nbytes
    assert dequantize(q).shape == shape


def test_byte_count_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="square"):
        quantized_nbytes((64, 65), with_diag=True)
    with pytest.raises(ValueError, match="block_size"):
        quantized_nbytes((64, 64), block_size=0)


def test_four_bit_storage_is_about_seven_times_smaller() -> None:
    """Appendix G: 32 / (4 + 0.5) bits ≈ 7.1 for block 64; the kept diagonal adds 4k bytes."""
    k = 128
    q = quantize(torch.randn(k, k))
    assert q.nbytes == k * k // 2 + 4 * k * 2
    assert (4 * k * k) / q.nbytes == 32 / 4.5  # 65536 / 9216 and 32 / 4.5 are both 64 / 9, correctly rounded
    q_diag = quantize_offdiag(torch.randn(k, k))
    assert q_diag.nbytes == k * k // 2 + 4 * k * 2 + 4 * k
    assert quantized_nbytes((k, k), with_diag=True) == q_diag.nbytes


# ------------------------------------------------------------------------------------- special blocks


@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
def test_zero_blocks_have_zero_scale_and_zero_code(name: str, bits: int) -> None:
    x = torch.randn(4, 130, generator=torch.Generator().manual_seed(1))
    x[0, 64:128] = 0  # one zero block in a row
    x[2] = 0  # a whole zero row
    q = quantize(x, bits=bits, codebook=name)
    zero_code = paper_codebook(name, bits).tolist().index(0.0)
    indices = unpack_by_hand(q.codes, bits, x.numel()).view(4, 130)
    assert q.scales[0, 1] == 0 and bool((q.scales[2] == 0).all())
    assert bool((indices[0, 64:128] == zero_code).all()) and bool((indices[2] == zero_code).all())
    out = dequantize(q)
    assert bool((out[0, 64:128] == 0).all()) and bool((out[2] == 0).all())
    assert_within_bound(q, x)
    all_zero = quantize(torch.zeros(64, 64), bits=bits, codebook=name)
    assert torch.equal(dequantize(all_zero), torch.zeros(64, 64))


@pytest.mark.parametrize("value", [0.37, -0.37, 1e-30, -2.5e20])
def test_all_equal_blocks(value: float) -> None:
    x = torch.full((4, 128), value)
    v = torch.tensor(value)
    assert torch.equal(dequantize(quantize(x)), x)  # Linear-2 holds both +1 and -1
    dt = dequantize(quantize(x, codebook="dt"))
    # DT has +1 but not -1: a negative constant block decodes to its smallest code, -71/80.
    expected = x if value > 0 else (to_float32([Fraction(-71, 80)]) * v.abs()).expand(4, 128)
    assert torch.equal(dt, expected)


# ----------------------------------------------------------------------------------------- the diagonal


def test_offdiag_keeps_diagonal_exactly_and_excludes_it_from_absmax() -> None:
    g = torch.Generator().manual_seed(2)
    k = 100
    a = torch.randn(k, k, generator=g) * 1e-2
    a = (a + a.T) / 2
    a.diagonal().copy_(1e3 + torch.rand(k, generator=g))  # like an inverse root: a dominant diagonal
    q = quantize_offdiag(a)
    out = dequantize(q)
    assert q.diag is not None and torch.equal(bits_of(out.diagonal()), bits_of(a.diagonal()))
    off = a.clone()
    off.fill_diagonal_(0)
    assert torch.equal(q.scales, block_scales_by_hand(off, DEFAULT_BLOCK_SIZE))
    assert_nearest_codes(q, off)
    bound = roundtrip_error_bound(off, DEFAULT_BLOCK_SIZE, "linear-2", 4)
    assert bool(((out - off).abs().fill_diagonal_(0) <= bound).all())
    plain_error = (dequantize(quantize(a)) - a).abs().fill_diagonal_(0).sum()
    assert (out - a).abs().sum() < plain_error / 2


def test_offdiag_needs_a_square_matrix() -> None:
    with pytest.raises(ValueError, match="square"):
        quantize_offdiag(torch.randn(64, 65))
    with pytest.raises(ValueError, match="square"):
        quantize_offdiag(torch.randn(64))


# -------------------------------------------------------------------------------------------- threshold


def test_size_threshold() -> None:
    """Appendix G: "Matrices with a size smaller than 4096 will not be quantized" (order < 64)."""
    assert MIN_LOWBIT_NUMEL == 4096 and DEFAULT_BLOCK_SIZE == 64
    assert not should_quantize(63 * 63) and not should_quantize(4095)
    assert should_quantize(64 * 64) and should_quantize(1200 * 1200)
    assert should_quantize(100, threshold=100) and not should_quantize(99, threshold=100)


# -------------------------------------------------------------------------------------- state round trip


@pytest.mark.parametrize("diagonal", [False, True])
def test_state_round_trip_through_torch_save_is_bit_exact(diagonal: bool) -> None:
    x = torch.randn(96, 96, generator=torch.Generator().manual_seed(4))
    q = quantize_offdiag(x, bits=3, codebook="dt") if diagonal else quantize(x, bits=8, block_size=32)
    state = to_state(q)
    assert all(isinstance(v, torch.Tensor | int | tuple) for v in state.values())
    assert sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor)) == q.nbytes
    r = from_state(save_and_load(state))
    assert (r.shape, r.bits, r.block_size, r.codebook) == (q.shape, q.bits, q.block_size, q.codebook)
    assert torch.equal(r.codes, q.codes) and r.codes.dtype == torch.uint8
    assert torch.equal(bits_of(r.scales), bits_of(q.scales))
    assert (r.diag is None) == (q.diag is None)
    if q.diag is not None and r.diag is not None:
        assert torch.equal(bits_of(r.diag), bits_of(q.diag))
    assert torch.equal(bits_of(dequantize(r)), bits_of(dequantize(q)))


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_state_survives_optimizer_state_dict_round_trip(param_dtype: torch.dtype) -> None:
    """Optimizer.load_state_dict casts state tensors to the parameter dtype; the state still decodes exactly."""
    x = torch.randn(80, 80, generator=torch.Generator().manual_seed(5)) * 1e-3
    q = quantize_offdiag(x)
    param = torch.nn.Parameter(torch.zeros(3, dtype=param_dtype))
    optimizer = torch.optim.SGD([param], lr=0.1)
    optimizer.state[param]["inverse_root"] = to_state(q)
    restored = torch.optim.SGD([param], lr=0.1)
    restored.load_state_dict(save_and_load(optimizer.state_dict()))
    r = from_state(restored.state[param]["inverse_root"])
    assert torch.equal(r.codes, q.codes)
    assert torch.equal(bits_of(r.scales), bits_of(q.scales))
    assert r.diag is not None and q.diag is not None and torch.equal(bits_of(r.diag), bits_of(q.diag))
    assert torch.equal(bits_of(dequantize(r)), bits_of(dequantize(q)))


def test_from_state_rejects_inconsistent_state() -> None:
    state = to_state(quantize(torch.randn(64, 64)))
    with pytest.raises(ValueError, match="codes"):
        from_state({**state, "codes": state["codes"][:-1]})
    with pytest.raises(ValueError, match="scales"):
        from_state({**state, "block_size": 32})
    with pytest.raises(ValueError, match="codebook_id"):
        from_state({**state, "codebook_id": len(CODEBOOK_NAMES)})
    with pytest.raises(ValueError, match=r"0\.\.255"):
        from_state({**state, "scales": state["scales"].float() + 0.5})


# ---------------------------------------------------------------------------------------- inputs, devices


def test_input_dtypes_and_validation() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(6))
    q32 = quantize(x)
    q64 = quantize(x.double())
    assert torch.equal(q64.codes, q32.codes) and torch.equal(q64.scales, q32.scales)
    qbf = quantize(x.bfloat16())
    assert torch.equal(qbf.scales, block_scales_by_hand(x.bfloat16().float(), 64))
    assert dequantize(qbf).dtype == torch.float32
    assert not quantize(x.requires_grad_()).codes.requires_grad
    with pytest.raises(TypeError):
        quantize(torch.ones(8, dtype=torch.int64))
    with pytest.raises(ValueError, match="block_size"):
        quantize(x, block_size=0)
    with pytest.raises(ValueError, match="bits"):
        quantize(x, bits=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
def test_cuda_matches_cpu_bit_for_bit(name: str, bits: int) -> None:
    x = torch.randn(300, 200, generator=torch.Generator().manual_seed(7)) * 3
    cpu = quantize_offdiag(x[:200], bits=bits, codebook=name)
    gpu = quantize_offdiag(x[:200].cuda(), bits=bits, codebook=name)
    assert gpu.device.type == "cuda"
    assert torch.equal(gpu.codes.cpu(), cpu.codes) and torch.equal(bits_of(gpu.scales.cpu()), bits_of(cpu.scales))
    assert torch.equal(bits_of(dequantize(gpu).cpu()), bits_of(dequantize(cpu)))
    plain = quantize(x.cuda(), bits=bits, codebook=name, block_size=48)
    assert torch.equal(plain.codes.cpu(), quantize(x, bits=bits, codebook=name, block_size=48).codes)
    assert from_state(to_state(plain)).device.type == "cuda"


# -------------------------------------------------------------------------------------- property tests


@settings(max_examples=60, deadline=None, database=None)
@given(
    shape=st.lists(st.integers(1, 24), min_size=0, max_size=3).map(tuple),
    bits=st.sampled_from(SUPPORTED_BITS),
    name=st.sampled_from(CODEBOOK_NAMES),
    block_size=st.sampled_from([3, 16, 64, 100]),
    seed=st.integers(0, 2**31 - 1),
    log_scale=st.integers(-20, 20),
    kind=st.sampled_from(["normal", "sparse", "small-integers"]),
    offdiag=st.booleans(),
)
def test_random_tensors(
    shape: tuple[int, ...],
    bits: int,
    name: str,
    block_size: int,
    seed: int,
    log_scale: int,
    kind: str,
    offdiag: bool,
) -> None:
    g = torch.Generator().manual_seed(seed)
    if offdiag:
        shape = (shape[0], shape[0]) if shape else (1, 1)
    if kind == "small-integers":
        x = torch.randint(-3, 4, shape, generator=g).float()
    else:
        x = torch.randn(shape, generator=g)
        if kind == "sparse":
            x = x * (torch.rand(shape, generator=g) < 0.3)
    x = x * 10.0**log_scale
    q = (quantize_offdiag if offdiag else quantize)(x, bits=bits, codebook=name, block_size=block_size)
    out = dequantize(q)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert q.nbytes == quantized_nbytes(shape, bits, block_size, with_diag=offdiag)
    rows, cols = rows_cols(shape)
    assert q.nbytes == (rows * cols if bits == 8 else -(-rows * cols // 2)) + 4 * (
        rows * -(-cols // block_size) + (shape[0] if offdiag else 0)
    )
    target = x
    if offdiag:
        target = x.clone()
        target.fill_diagonal_(0)
        assert torch.equal(bits_of(out.diagonal()), bits_of(x.diagonal()))
        out = out.clone()
        out.fill_diagonal_(0)
    assert_nearest_codes(q, target)
    error = (out.double() - target.double()).abs()
    assert bool((error <= roundtrip_error_bound(target, block_size, name, bits)).all())
    assert torch.equal(bits_of(dequantize(from_state(save_and_load(to_state(q))))), bits_of(dequantize(q)))


# ---------------------------------------------------------------------------------------- stacked decoding


@pytest.mark.parametrize(("name", "bits"), ALL_CODEBOOKS)
@pytest.mark.parametrize(
    ("shape", "block_size", "offdiag"),
    [
        ((9, 9), 4, True),
        ((9, 9), 4, False),
        ((3, 7), 4, False),
        ((5,), 2, False),
        ((), 64, False),
        ((2, 3, 5), 4, False),
    ],
)
def test_a_stack_decodes_bit_for_bit_as_each_matrix_by_hand(
    name: str, bits: int, shape: tuple[int, ...], block_size: int, offdiag: bool
) -> None:
    """Odd element counts (a half-used last byte), short last blocks, a kept diagonal, 0-, 1- and 3-D shapes:
    every element of the stack is the one float32 product R(code) x scale, bit for bit."""
    g = torch.Generator().manual_seed(11)
    quantizer = quantize_offdiag if offdiag else quantize
    qs = [quantizer(torch.randn(shape, generator=g) * 10.0**k, bits=bits, codebook=name, block_size=block_size)
          for k in (-3, 0, 2)]  # fmt: skip
    stacked = dequantize_many(qs)
    assert stacked.shape == (3, *shape) and stacked.dtype == torch.float32
    for q, decoded in zip(qs, stacked.unbind(0), strict=True):
        by_hand = dequantize_by_hand(q)
        assert torch.equal(bits_of(decoded), bits_of(by_hand))
        assert torch.equal(bits_of(dequantize(q)), bits_of(by_hand))
    assert torch.equal(bits_of(dequantize_many(qs[:1])[0]), bits_of(dequantize(qs[0])))


def test_a_stack_needs_one_format() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(12))
    plain = quantize(x)
    assert same_format(plain, quantize(2 * x))
    others = [
        quantize(x[:32]),
        quantize(x, bits=8),
        quantize(x, block_size=32),
        quantize(x, codebook="dt"),
        quantize_offdiag(x),
    ]
    for other in others:
        assert not same_format(plain, other)
        with pytest.raises(ValueError, match="one format"):
            dequantize_many([plain, other])
    with pytest.raises(ValueError, match="at least one"):
        dequantize_many([])


def test_a_three_bit_nibble_outside_the_codebook_decodes_to_nan() -> None:
    """3-bit codes fill 3 bits of a nibble; a nibble of 8..15 names no code and decodes to NaN, not to a value.
    Three elements: byte 0 holds elements 0 and 1, byte 1 element 2 (low nibble) and padding (high nibble)."""
    q = quantize(torch.tensor([1.0, -1.0, -1.0]), bits=3)

    def with_codes(codes: torch.Tensor) -> QuantizedMatrix:
        return QuantizedMatrix(codes, q.scales, q.shape, q.bits, q.block_size, q.codebook)

    padding_set = q.codes.clone()
    padding_set[1] |= 0x80
    assert torch.equal(dequantize(with_codes(padding_set)), torch.tensor([1.0, -1.0, -1.0]))
    element_set = q.codes.clone()
    element_set[1] |= 0x08
    decoded = dequantize(with_codes(element_set))
    assert torch.equal(decoded[:2], torch.tensor([1.0, -1.0])) and bool(decoded[2].isnan())

"""Block-wise low-bit quantization with packed storage, as used by 4-bit Shampoo.

Paper: Wang, Zhou, Li, Huang, "4-bit Shampoo for Memory-Efficient Network Training", NeurIPS 2024
(arXiv 2405.18144).

- Section 2.2: a b-bit quantizer is Q = (I∘N, M). N divides every element by its block's maximum,
  I(x) = argmin_j |x - R(j)| picks the nearest entry of the quantization mapping (codebook) R, and the
  dequantizer is D(Q(x)) = R(I(N(x))) ⊙ M(x).
- Section 3.3, Eq. (3): the Linear-2 ("linear square") mapping. Appendix C: the dynamic tree (DT) mapping.
- Algorithm 2 (PIRU): the inverse root is stored as an fp32 diagonal plus a quantized off-diagonal part.
- Appendix G: block size 64, Linear-2 by default, matrices smaller than 4096 elements stay fp32.

Storage format (one `QuantizedMatrix`):

- Row layout. A tensor is viewed as `rows x cols` with `rows = shape[0]` and `cols = numel / shape[0]`
  (a 1-D tensor is one row, a 0-D tensor one element). Each row is cut into contiguous blocks of
  `block_size` elements; blocks never cross rows, so the last block of a row is shorter when
  `cols % block_size != 0` and a row has `ceil(cols / block_size)` blocks. An eigenvector matrix stored
  transposed (one eigenvector per row) therefore has every block inside one eigenvector (Section 3.3).
- Scales. One float32 absmax per block, shape `(rows, ceil(cols / block_size))`. The paper writes
  `max_j x_j`; for signed data only the absolute maximum maps the block into [-1, 1] as N must, and the
  reference code uses it too. An all-zero block has scale 0 and encodes every element as the 0 code.
- Codes. Indices into the sorted codebook, packed over the row-major flattened tensor. 8 bits: one code
  per byte. 4 bits: two codes per byte, element 2i in the low nibble and element 2i+1 in the high
  nibble of byte i (a trailing odd element leaves a zero high nibble). 3 bits: stored in 4-bit nibbles
  exactly like 4 bits, so 3-bit storage costs as much as 4-bit storage.
- Rounding. Deterministic round-to-nearest against the codebook, computed on the float32 normalised
  value `x / absmax` (a true division, as N is defined). A value exactly halfway between two codes goes
  to the lower code (the more negative one), which is the first minimiser of |x - R(j)| over the sorted
  codebook. The decision thresholds are the float32 numbers just at or below each exact midpoint, so
  the choice is exactly the nearest code for every float32 input, on every device.
- Decoding. Every code byte is read through a table of its decoded codes (one code at 8 bits, the low
  then the high nibble's at 3 and 4), then multiplied by its block's scale: one float32 product per
  element, so `dequantize_many` decodes a stack of one format in one pass, bit for bit as `dequantize`
  of each. A 3-bit nibble of 8 to 15 (never written by `quantize`) decodes to NaN.
- Non-finite inputs are not checked: a NaN or inf makes its block's scale non-finite, and the
  dequantized block is then non-finite too.

Differences from the reference code (Sike-Wang/low-bit-Shampoo). Its Linear-2 construction
(`linspace(-1, 1, 2^b)`, entry 2^(b-1)-1 set to 0, then sign·x^2) and its DT construction are exactly
Eq. (3) and Appendix C, and its diagonal handling and 4096 threshold are the paper's, so there is no
switch. What differs is arithmetic the paper leaves open, and none of it is a switch here: the reference
builds the codebooks in float32 (`linspace`, then squaring), so entries differ from the float32 rounding
of the exact values used here by up to 1.2e-7 (many ulps for the smallest 8-bit Linear-2 entries, whose
linspace base suffers cancellation); its CUDA binary search compares against float32-rounded midpoints,
multiplies by the reciprocal of the absmax instead of dividing, and breaks exact ties towards whichever
code the search visited last. These move a code only for inputs within about 1e-7 of a decision
threshold. The reference also supports only 4 and 8 bits, and its 4-bit kernel packs each row from byte
`row_start / 2`, which misplaces the codes of odd rows when the order is odd; packing here runs over the
whole flattened tensor, which is the same layout whenever the row length is even.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import torch
from torch import Tensor

from structbench.optim.base import gather

DEFAULT_BLOCK_SIZE = 64
"""Elements per quantization block (Appendix G)."""

MIN_LOWBIT_NUMEL = 4096
"""Tensors with fewer elements than this stay fp32 (Appendix G; the reference's `min_lowbit_size`)."""

SUPPORTED_BITS = (3, 4, 8)
"""Bit widths with a codebook and a packed format (Table 3 uses 3, 4 and 8 bits)."""

CODEBOOK_NAMES = ("linear-2", "dt")
"""Codebook names accepted by `codebook` and `quantize`; the position is the id kept by `to_state`."""

StateValue = Tensor | int | tuple[int, ...]
"""A value of the state dict made by `to_state`."""


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")


def _check_codebook_name(name: str) -> None:
    if name not in CODEBOOK_NAMES:
        valid = ", ".join(repr(n) for n in CODEBOOK_NAMES)
        raise ValueError(f"unknown codebook {name!r}; valid codebooks are {valid}")


def _linear_square_values(bits: int) -> list[Fraction]:
    """Eq. (3), exactly: R(j) = -(-1 + 2j/(2^b-1))^2 below index 2^(b-1)-1, 0 at it, +(...)^2 above."""
    top = 2**bits - 1
    zero_index = 2 ** (bits - 1) - 1
    values = []
    for j in range(2**bits):
        d = Fraction(2 * j, top) - 1
        if j < zero_index:
            values.append(-d * d)
        elif j == zero_index:
            values.append(Fraction(0))
        else:
            values.append(d * d)
    return values


def _dynamic_tree_values(bits: int) -> list[Fraction]:
    """Appendix C, exactly: {0, 1} ∪ {±q_k · 10^-E : b = 2 + E + F, q_k = (p_k + p_(k+1))/2,
    p_j = 0.9 j / 2^F + 0.1}, over every split E, F >= 0, sorted ascending."""
    values = [Fraction(0), Fraction(1)]
    for exponent in range(bits - 1):
        fraction_bits = bits - 2 - exponent
        steps = 2**fraction_bits
        p = [Fraction(9 * j, 10 * steps) + Fraction(1, 10) for j in range(steps + 1)]
        for k in range(steps):
            q = (p[k] + p[k + 1]) / 2 / 10**exponent
            values.extend((q, -q))
    return sorted(values)


@cache
def _codebook_floats(name: str, bits: int) -> tuple[float, ...]:
    _check_codebook_name(name)
    _check_bits(bits)
    exact = _linear_square_values(bits) if name == "linear-2" else _dynamic_tree_values(bits)
    return tuple(float(v) for v in exact)


def codebook(name: str, bits: int, device: torch.device | str | None = None) -> Tensor:
    """The quantization mapping R named `name` ("linear-2" or "dt") at `bits` bits.

    Returns a new sorted float32 tensor of the 2**bits codebook values in [-1, 1]: the float32 rounding
    of the exact values of Eq. (3) (Linear-2) or Appendix C (DT). Raises ValueError for an unknown name
    or an unsupported bit width.
    """
    exact = torch.tensor(_codebook_floats(name, bits), dtype=torch.float64, device="cpu")
    return exact.to(device=device or "cpu", dtype=torch.float32)


def linear_square_codebook(bits: int) -> Tensor:
    """Linear-2 mapping, Section 3.3 Eq. (3); asymmetric, e.g. 4-bit has +1/225 but no -1/225."""
    return codebook("linear-2", bits)


def dynamic_tree_codebook(bits: int) -> Tensor:
    """Dynamic tree (DT) mapping, Appendix C; contains +1 but not -1."""
    return codebook("dt", bits)


@cache
def _thresholds(name: str, bits: int, device: torch.device) -> Tensor:
    """The codebook's decision thresholds on `device`.

    Threshold i is the largest float32 that is <= the exact midpoint of codes i and i+1, so for a
    float32 x, `x <= threshold_i` holds exactly when x is no farther from code i than from code i+1.
    """
    values = codebook(name, bits)
    exact_mid = (values[:-1].double() + values[1:].double()) / 2
    mid = exact_mid.float()
    rounded_up = mid.double() > exact_mid
    mid = torch.where(rounded_up, torch.nextafter(mid, torch.full_like(mid, -math.inf)), mid)
    return mid.to(device)


def _row_layout(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], math.prod(shape[1:])


def _code_nbytes(numel: int, bits: int) -> int:
    return numel if bits == 8 else (numel + 1) // 2


def quantized_nbytes(
    shape: tuple[int, ...], bits: int = 4, block_size: int = DEFAULT_BLOCK_SIZE, with_diag: bool = False
) -> int:
    """Exact stored bytes of a quantized tensor of `shape`: packed codes + fp32 scales (+ fp32 diagonal).

    For a k x k matrix at 4 bits this is ceil(k^2/2) + 4·k·ceil(k/block_size) (+ 4k), the "4 + 0.5 bits
    per element" of Appendix G.
    """
    _check_bits(bits)
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if with_diag and (len(shape) != 2 or shape[0] != shape[1]):
        raise ValueError(f"a kept diagonal needs a square matrix, got shape {tuple(shape)}")
    rows, cols = _row_layout(tuple(shape))
    scale_count = rows * math.ceil(cols / block_size)
    diag_count = shape[0] if with_diag else 0
    return _code_nbytes(rows * cols, bits) + 4 * (scale_count + diag_count)


def should_quantize(numel: int, threshold: int = MIN_LOWBIT_NUMEL) -> bool:
    """Whether a tensor of `numel` elements is stored low-bit: Appendix G keeps sizes < 4096 in fp32."""
    return numel >= threshold


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A block-wise quantized tensor; see the module docstring for the exact format.

    `codes` is the packed uint8 code storage, `scales` the float32 per-block absmax of shape
    (rows, blocks per row), `shape` the original shape. `diag`, when present, is the fp32 diagonal of a
    square matrix kept outside the quantization (Algorithm 2); dequantization writes it back.
    The codebook itself is not stored: it is a function of `codebook` and `bits`.
    """

    codes: Tensor
    scales: Tensor
    shape: tuple[int, ...]
    bits: int
    block_size: int
    codebook: str
    diag: Tensor | None = None

    def __post_init__(self) -> None:
        _check_bits(self.bits)
        _check_codebook_name(self.codebook)
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        rows, cols = _row_layout(self.shape)
        if self.codes.dtype != torch.uint8 or self.codes.shape != (_code_nbytes(rows * cols, self.bits),):
            raise ValueError(
                f"codes must be a 1-D uint8 tensor of {_code_nbytes(rows * cols, self.bits)} bytes for shape "
                f"{self.shape} at {self.bits} bits, got {self.codes.dtype} {tuple(self.codes.shape)}"
            )
        scale_shape = (rows, math.ceil(cols / self.block_size))
        if self.scales.dtype != torch.float32 or self.scales.shape != scale_shape:
            raise ValueError(
                f"scales must be float32 of shape {scale_shape}, got {self.scales.dtype} {tuple(self.scales.shape)}"
            )
        if self.diag is not None and (
            len(self.shape) != 2
            or self.shape[0] != self.shape[1]
            or self.diag.dtype != torch.float32
            or self.diag.shape != (self.shape[0],)
        ):
            raise ValueError(f"a kept diagonal needs a square matrix and float32 shape ({self.shape[0]},)")

    @property
    def numel(self) -> int:
        """Number of elements of the original tensor."""
        return math.prod(self.shape)

    @property
    def device(self) -> torch.device:
        """Device holding the stored tensors."""
        return self.codes.device

    @property
    def nbytes(self) -> int:
        """Exact bytes of the stored tensors (codes, scales and the kept diagonal, if any)."""
        tensors = [self.codes, self.scales] if self.diag is None else [self.codes, self.scales, self.diag]
        return sum(t.numel() * t.element_size() for t in tensors)


def _check_input(x: Tensor, block_size: int) -> None:
    if not x.is_floating_point():
        raise TypeError(f"quantize expects a floating-point tensor, got {x.dtype}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")


def _pack(indices: Tensor, bits: int) -> Tensor:
    """Pack flat code indices: one per byte at 8 bits, else two per byte with the even element low."""
    indices = indices.to(torch.uint8)
    if bits == 8:
        return indices
    if indices.numel() % 2:
        indices = torch.cat((indices, indices.new_zeros(1)))
    pairs = indices.view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def _quantize_float32(
    x: Tensor, bits: int, codebook_name: str, block_size: int, diag: Tensor | None
) -> QuantizedMatrix:
    _check_bits(bits)
    _check_codebook_name(codebook_name)
    shape = tuple(x.shape)
    rows, cols = _row_layout(shape)
    blocks_per_row = math.ceil(cols / block_size)
    padded = torch.nn.functional.pad(x.reshape(rows, cols), (0, blocks_per_row * block_size - cols))
    blocks = padded.view(rows, blocks_per_row, block_size)
    scales = blocks.abs().amax(dim=2)
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales)).unsqueeze(2)
    normalised = (blocks / divisor).view(rows, blocks_per_row * block_size)[:, :cols].contiguous()
    thresholds = _thresholds(codebook_name, bits, x.device)
    indices = torch.bucketize(normalised, thresholds, out_int32=True)
    return QuantizedMatrix(
        codes=_pack(indices.reshape(-1), bits),
        scales=scales,
        shape=shape,
        bits=bits,
        block_size=block_size,
        codebook=codebook_name,
        diag=diag,
    )


def quantize(
    x: Tensor, bits: int = 4, codebook: str = "linear-2", block_size: int = DEFAULT_BLOCK_SIZE
) -> QuantizedMatrix:
    """Q(x) of Section 2.2: per-row-block absmax normalisation, nearest-code rounding, packed codes.

    `x` may have any floating dtype; it is quantized from its float32 values.
    """
    _check_input(x, block_size)
    return _quantize_float32(x.detach().to(torch.float32), bits, codebook, block_size, diag=None)


def quantize_offdiag(
    x: Tensor, bits: int = 4, codebook: str = "linear-2", block_size: int = DEFAULT_BLOCK_SIZE
) -> QuantizedMatrix:
    """Algorithm 2's storage of an inverse root Â: a = diag(Â) in fp32 and Q(Â - Diag(a)).

    The diagonal is zeroed before the block absmax is taken, so it does not enlarge any scale (as in
    the reference's QTensorDiagReal); `dequantize` restores it exactly. `x` must be a square matrix.
    """
    _check_input(x, block_size)
    if x.dim() != 2 or x.shape[0] != x.shape[1]:
        raise ValueError(f"quantize_offdiag expects a square matrix, got shape {tuple(x.shape)}")
    off_diagonal = x.detach().to(torch.float32, copy=True)
    diag = off_diagonal.diagonal().clone(memory_format=torch.contiguous_format)
    off_diagonal.diagonal().zero_()
    return _quantize_float32(off_diagonal, bits, codebook, block_size, diag=diag)


@cache
def _byte_values(name: str, bits: int, device: torch.device) -> Tensor:
    """The decoded values of every code byte, shape (256, codes per byte): row i holds R(i) at 8 bits, and at 3
    and 4 bits (R(i & 0x0F), R(i >> 4)), the low nibble first as `_pack` writes it. A nibble outside a 3-bit
    codebook (8 to 15), which `quantize` never writes, decodes to NaN."""
    values = codebook(name, bits)
    if bits == 8:
        return values.unsqueeze(1).to(device)
    nibble_values = torch.full((16,), math.nan, device="cpu")
    nibble_values[: values.numel()] = values
    byte = torch.arange(256, device="cpu")
    return torch.stack((nibble_values[byte & 0x0F], nibble_values[byte >> 4]), dim=1).to(device)


def _decode(codes: Tensor, scales: Tensor, diag: Tensor | None, fmt: QuantizedMatrix) -> Tensor:
    """D(Q(x)) of a (B, code bytes) stack of `fmt`'s format: R of every code times its block's scale, the kept
    diagonals written back; a (B, *shape) float32 tensor. Each element is one table read and one float32
    product, whatever B, so a stack decodes bit for bit as its matrices one by one."""
    batch = codes.shape[0]
    rows, cols = _row_layout(fmt.shape)
    table = _byte_values(fmt.codebook, fmt.bits, codes.device)
    decoded = torch.index_select(table, 0, codes.reshape(-1).to(torch.int32)).view(batch, -1)
    decoded = decoded[:, : rows * cols].reshape(batch, rows, cols)
    blocks = scales.shape[-1]
    per_element = scales.unsqueeze(-1).expand(batch, rows, blocks, fmt.block_size).reshape(batch, rows, -1)
    out = decoded * per_element[..., :cols]
    if diag is not None:
        out.diagonal(dim1=-2, dim2=-1).copy_(diag)
    return out.view(batch, *fmt.shape)


def dequantize(q: QuantizedMatrix) -> Tensor:
    """D(Q(x)) = R(I(N(x))) ⊙ M(x) of Section 2.2 as a float32 tensor of the original shape.

    With a kept diagonal this is Diag(a) + D(Ā), the decompression of Algorithm 3, line 13.
    """
    diag = None if q.diag is None else q.diag.unsqueeze(0)
    return _decode(q.codes.unsqueeze(0), q.scales.unsqueeze(0), diag, q)[0]


def _format(q: QuantizedMatrix) -> tuple[object, ...]:
    return q.shape, q.bits, q.block_size, q.codebook, q.device, q.diag is None


def same_format(a: QuantizedMatrix, b: QuantizedMatrix) -> bool:
    """Whether `a` and `b` decode alike: same shape, bits, block size, codebook, device and diagonal kept or not."""
    return _format(a) == _format(b)


def dequantize_many(qs: Sequence[QuantizedMatrix]) -> Tensor:
    """`dequantize` of every matrix of `qs` (all of one `same_format`) as one (len(qs), *shape) float32 stack,
    decoded in one pass: bit for bit the stack of `dequantize(q)` for q in `qs`. Raises ValueError for an empty
    sequence or mixed formats."""
    if not qs:
        raise ValueError("dequantize_many needs at least one quantized matrix")
    first = qs[0]
    if not all(same_format(first, q) for q in qs):
        raise ValueError("dequantize_many needs matrices of one format (shape, bits, block size, codebook, diag)")
    diag = None if first.diag is None else gather([q.diag for q in qs])  # type: ignore[misc]
    return _decode(gather([q.codes for q in qs]), gather([q.scales for q in qs]), diag, first)


def _float_bytes(t: Tensor) -> Tensor:
    return t.reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8)


def _as_bytes(state: dict[str, StateValue], key: str) -> Tensor:
    """state[key] as uint8, undoing a cast to a floating dtype; raises unless it holds whole numbers 0..255."""
    value = state[key]
    if not isinstance(value, Tensor):
        raise ValueError(f"state[{key!r}] must be a tensor, got {type(value).__name__}")
    if value.dtype == torch.uint8:
        return value
    as_uint8 = value.to(torch.uint8)
    if not torch.equal(as_uint8.to(value.dtype), value):
        raise ValueError(f"state[{key!r}] ({value.dtype}) does not hold bytes 0..255 exactly")
    return as_uint8


def _as_int(state: dict[str, StateValue], key: str) -> int:
    value = state[key]
    if not isinstance(value, int):
        raise ValueError(f"state[{key!r}] must be an int, got {type(value).__name__}")
    return value


def to_state(q: QuantizedMatrix) -> dict[str, StateValue]:
    """The container as plain optimizer-state values: uint8 tensors, ints and a tuple of ints.

    `Optimizer.load_state_dict` casts every state tensor to a floating parameter's dtype and turns
    strings into garbage, so the float32 scales and diagonal are kept as their raw bytes (uint8 views
    of a copy) and the codebook as its index in `CODEBOOK_NAMES`. Integers 0..255 survive a cast to
    float32, float16 or bfloat16 exactly, so `from_state` recovers every bit after such a round trip.
    The tensors' total bytes equal `q.nbytes`.
    """
    state: dict[str, StateValue] = {
        "codes": q.codes,
        "scales": _float_bytes(q.scales),
        "shape": tuple(q.shape),
        "bits": q.bits,
        "block_size": q.block_size,
        "codebook_id": CODEBOOK_NAMES.index(q.codebook),
    }
    if q.diag is not None:
        state["diag"] = _float_bytes(q.diag)
    return state


def from_state(state: dict[str, StateValue]) -> QuantizedMatrix:
    """Rebuild a `QuantizedMatrix` from `to_state` output, also after `Optimizer.load_state_dict` cast
    its tensors to a floating dtype (the result is then uint8/float32 again, on the same device)."""
    shape_value = state["shape"]
    if not isinstance(shape_value, tuple):
        raise ValueError(f"state['shape'] must be a tuple, got {type(shape_value).__name__}")
    shape = tuple(int(s) for s in shape_value)
    block_size = _as_int(state, "block_size")
    codebook_id = _as_int(state, "codebook_id")
    if not 0 <= codebook_id < len(CODEBOOK_NAMES):
        raise ValueError(f"codebook_id must index {CODEBOOK_NAMES}, got {codebook_id}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    rows, cols = _row_layout(shape)
    scale_shape = (rows, math.ceil(cols / block_size))
    scales = _as_bytes(state, "scales")
    if scales.numel() != 4 * math.prod(scale_shape):
        raise ValueError(f"scales hold {scales.numel()} bytes, inconsistent with shape {shape}")
    diag = None
    if "diag" in state:
        diag_bytes = _as_bytes(state, "diag")
        if len(shape) != 2 or diag_bytes.numel() != 4 * shape[0]:
            raise ValueError(f"diag holds {diag_bytes.numel()} bytes, inconsistent with shape {shape}")
        diag = diag_bytes.contiguous().view(torch.float32)
    return QuantizedMatrix(
        codes=_as_bytes(state, "codes"),
        scales=scales.contiguous().view(torch.float32).view(scale_shape),
        shape=shape,
        bits=_as_int(state, "bits"),
        block_size=block_size,
        codebook=CODEBOOK_NAMES[codebook_id],
        diag=diag,
    )

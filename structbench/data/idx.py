"""The IDX file format of MNIST and Fashion-MNIST, gzipped or not.

IDX (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"): two zero bytes, one byte
naming the element type, one byte giving the number of dimensions d, then d big-endian
uint32 sizes, then the elements in C order, big-endian.
"""

from __future__ import annotations

import gzip
import zlib
from math import prod
from pathlib import Path

import numpy as np

from structbench.data.errors import DataFormatError

GZIP_MAGIC = b"\x1f\x8b"

IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
"""IDX type code -> element dtype as stored (big-endian)."""


def decompress_if_gzip(raw: bytes, source: Path) -> bytes:
    """Return ``raw`` gunzipped if it starts with the gzip magic, else ``raw`` unchanged.

    The magic decides, not the file name, so a ``.gz`` name on a plain file is harmless.
    """
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataFormatError(source, f"not a readable gzip file ({exc})") from exc


def parse_idx(payload: bytes, source: Path) -> np.ndarray:
    """Decode the (decompressed) IDX bytes ``payload`` into a native-endian array.

    Raises :class:`DataFormatError` naming ``source`` for a bad magic, an unknown type code, or
    a data section shorter (truncated file) or longer than the header's dimensions promise.
    """
    if len(payload) < 4 or payload[0] != 0 or payload[1] != 0:
        raise DataFormatError(source, "not an IDX file (the first two bytes must be zero)")
    type_code, ndim = payload[2], payload[3]
    if type_code not in IDX_DTYPES:
        raise DataFormatError(source, f"unknown IDX element type code 0x{type_code:02X}")
    if ndim == 0:
        raise DataFormatError(source, "IDX header declares zero dimensions")
    header_len = 4 + 4 * ndim
    if len(payload) < header_len:
        raise DataFormatError(source, f"truncated IDX header ({len(payload)} bytes, need {header_len})")
    dims = tuple(int.from_bytes(payload[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_DTYPES[type_code]
    expected = prod(dims) * dtype.itemsize
    actual = len(payload) - header_len
    if actual < expected:
        raise DataFormatError(
            source,
            f"truncated IDX file: header promises shape {dims} ({expected} data bytes), but only {actual} follow",
        )
    if actual > expected:
        raise DataFormatError(
            source, f"IDX file has {actual - expected} bytes beyond the shape {dims} its header declares"
        )
    array = np.frombuffer(payload, dtype=dtype, count=prod(dims), offset=header_len).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: Path) -> np.ndarray:
    """Read the IDX file at ``path`` (gzipped or not) into a native-endian array."""
    return parse_idx(decompress_if_gzip(path.read_bytes(), path), path)

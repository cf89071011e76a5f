"""Unpickling of the CIFAR python batches without running arbitrary code.

The CIFAR "python version" files are pickled dicts of numpy arrays, lists, ints and strings. A
plain ``pickle.load`` would call any global a crafted file names; this unpickler resolves only
the few globals those files (and numpy's own pickles, protocols 2-5) need.
"""

from __future__ import annotations

import codecs
import importlib
import io
import pickle
from pathlib import Path
from types import ModuleType

import numpy as np

from structbench.data.errors import DataFormatError


def _numpy_core(submodule: str) -> ModuleType:
    """numpy's ``_core.<submodule>`` (numpy >= 2), else ``core.<submodule>`` (numpy 1.x)."""
    try:
        return importlib.import_module(f"numpy._core.{submodule}")
    except ImportError:
        return importlib.import_module(f"numpy.core.{submodule}")


def _allowed_globals() -> dict[tuple[str, str], object]:
    multiarray, numeric = _numpy_core("multiarray"), _numpy_core("numeric")
    allowed: dict[tuple[str, str], object] = {
        ("_codecs", "encode"): codecs.encode,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for prefix in ("numpy.core", "numpy._core"):
        allowed[(f"{prefix}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{prefix}.numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global outside :func:`_allowed_globals`."""

    allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> object:
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None


def load_pickle(data: bytes, source: Path | str) -> object:
    """Unpickle ``data`` (read from ``source``) with ``encoding="bytes"``, as the CIFAR page says.

    Python-2 strings (the dict keys among them) come back as ``bytes``. Any failure, including
    a refused global, raises :class:`DataFormatError` naming ``source``.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as exc:
        raise DataFormatError(source, f"not a readable CIFAR pickle ({type(exc).__name__}: {exc})") from exc

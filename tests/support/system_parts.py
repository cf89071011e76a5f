"""The parts of the system (not of PyPI) that some tests need, and what a test does when one is missing.

`.ci/run` installs every part and runs with `CI=true`: there a missing part is a broken setup and fails the test.
Elsewhere (`python3 -m pip install -e ".[dev]" && python3 -m pytest -q`) the test skips, with the reason and how to
get the part in the skip summary. A test asks for a part with `@pytest.mark.system_part("name")` (handled in
conftest.py) or, where finding the part takes more than a probe (a running Slurm cluster), calls `missing()` itself.
Everything the tests need from PyPI is in the `dev` extra: no test skips for want of it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from structbench.data.mnist import DEBIAN_FASHION_MNIST_DIR, IDX_FILES


@dataclass(frozen=True)
class SystemPart:
    what: str
    present: Callable[[], bool]
    how_to_get: str


SYSTEM_PARTS = {
    "fashion-mnist": SystemPart(
        f"Debian's Fashion-MNIST ({DEBIAN_FASHION_MNIST_DIR}/*.gz)",
        lambda: all((DEBIAN_FASHION_MNIST_DIR / f"{base}.gz").is_file() for base in IDX_FILES.values()),
        "apt-get install dataset-fashion-mnist",
    ),
    "chromium": SystemPart(
        "a chromium browser on PATH", lambda: shutil.which("chromium") is not None, "apt-get install chromium"
    ),
}


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def missing(what: str, how_to_get: str) -> None:
    """A needed system part is missing: fail under CI=true (CI installs it), else skip saying how to get it."""
    reason = f"{what} is missing (get it: {how_to_get})"
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(f"system part: {reason}; CI installs it and fails without it")


def require(name: str) -> None:
    part = SYSTEM_PARTS[name]
    if not part.present():
        missing(part.what, part.how_to_get)

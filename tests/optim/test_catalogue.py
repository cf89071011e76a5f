"""`structbench list` reads structbench's own optimizers from a catalogue file, without importing torch; the file is
what the registry would write now."""

from __future__ import annotations

import subprocess
import sys

import pytest

from structbench.optim import catalogue_writer


def test_the_catalogue_file_is_what_the_registry_writes_now() -> None:
    written = catalogue_writer.PATH.read_text(encoding="utf-8")
    assert written == catalogue_writer.registry_text(), (
        "structbench/optimizers.json is stale: run `python -m structbench.optim.catalogue_writer` and commit it"
    )


LIST_WITHOUT_TORCH = """
import sys
import structbench.cli
from structbench.cli.app import app
try:
    app(sys.argv[1:], prog_name="structbench", standalone_mode=False)
finally:
    print("torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("what", [["all"], ["optims", "--optim", "fismo"]])
def test_list_does_not_import_torch(what: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LIST_WITHOUT_TORCH, "list", *what], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch imported: False" in done.stderr
    assert "fismo: hyperparameters" in done.stdout and "Xu, Yan & Zhang 2026" in done.stdout

"""An output the user names that cannot be created (a path under a regular file, or an existing file where a
directory is written) is a usage error in every command that writes one: one `error:` line naming it, exit 2, before
any work, nothing written. (report and export used to build the whole report or start the export first, then exit 1
or 2 depending on the target.) Root ignores permission bits, so the unwritable place is a path under a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.store import adamw_and_muon_store

FILE_CONTENT = b"a regular file, not a directory\n"


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a directory): what a command wrote shows as a difference."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """A store with runs (to report and export) and a regular file."""
    store = adamw_and_muon_store(tmp_path / "store")
    a_file = tmp_path / "F"
    a_file.write_bytes(FILE_CONTENT)
    return store, a_file


COMMANDS = {
    "run": lambda store, dest: ["run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "2",
                                "--out", dest],
    "claims": lambda store, dest: ["claims", "--paper", "sumo", "--scale", "ci", "--out", dest],
    "data fetch": lambda store, dest: ["data", "fetch", "digits", "--data-dir", dest],
    "report md": lambda store, dest: ["report", "--out", store, "--format", "md", "--to", dest],
    "report html": lambda store, dest: ["report", "--out", store, "--format", "html", "--to", dest],
    "report all": lambda store, dest: ["report", "--out", store, "--format", "all", "--to", dest],
    "export csv": lambda store, dest: ["export", dest, "--to", "csv", "--out", store],
    "export mlflow": lambda store, dest: ["export", Path(dest) / "mlflow.db", "--to", "mlflow", "--out", store],
}  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_under_a_file_is_a_usage_error_before_any_work(cli, tmp_path, places, command):
    store, a_file = places
    if command == "export mlflow":
        pytest.importorskip("mlflow")
    before = tree(tmp_path)
    result = cli(*COMMANDS[command](store, a_file / "sub"))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(a_file) in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert tree(tmp_path) == before


@pytest.mark.parametrize("command", ["report md", "report html", "report all", "export csv", "export mlflow"])
def test_report_and_export_say_which_part_of_the_path_is_a_file(cli, places, command):
    store, a_file = places
    if command == "export mlflow":
        pytest.importorskip("mlflow")
    dest = a_file / "sub"
    result = cli(*COMMANDS[command](store, dest))
    what = command.split()[0]
    assert result.stderr.strip() == f"error: cannot write the {what} to {dest}: {a_file} is a file, not a directory."


@pytest.mark.parametrize("command", ["report md", "report html", "export csv"])
def test_an_existing_file_as_the_output_directory_is_a_usage_error(cli, tmp_path, places, command):
    store, a_file = places
    before = tree(tmp_path)
    result = cli(*COMMANDS[command](store, a_file))
    assert result.exit_code == 2, result.output
    what = command.split()[0]
    assert result.stderr.strip() == f"error: cannot write the {what} to {a_file}: it is a file, not a directory."
    assert a_file.read_bytes() == FILE_CONTENT and tree(tmp_path) == before

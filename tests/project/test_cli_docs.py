"""docs/cli.md stays complete: its synopsis has a line for every command of the app and names each of that command's
options, read from the app itself (so a new option without its line in the docs fails here)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer

import structbench.cli  # noqa: F401  (registers the commands on the app)
from structbench.cli.app import app
from tests.support.paths import ROOT


def command_options(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(command path, option) for every long option of `command` and its subcommands, --help aside."""
    for name, sub in getattr(command, "commands", {}).items():
        yield from command_options(sub, (*path, name))
    for param in command.params:
        for option in (*param.opts, *param.secondary_opts):
            if option.startswith("--") and option != "--help":
                yield " ".join(path), option


def synopsis(markdown: str) -> dict[str, str]:
    """Each command's synopsis in docs/cli.md (its `    structbench COMMAND ...` line and the indented lines that
    continue it), keyed by the command path ('' for the bare `structbench --version`)."""
    start = markdown.index("\n    structbench ") + 1
    block = markdown[start : markdown.index("\n\n", start)]
    found: dict[str, str] = {}
    for entry in re.split(r"\n(?=    structbench )", block):
        words = entry.split()[1:3]
        path = words if words[:1] == ["data"] else words[:1]
        found[" ".join(word for word in path if not word.startswith("-"))] = entry
    return found


def mentions(text: str, option: str) -> bool:
    return re.search(re.escape(option) + r"(?![\w-])", text) is not None


def test_every_option_of_every_command_is_in_the_synopsis_of_docs_cli() -> None:
    lines = synopsis((ROOT / "docs" / "cli.md").read_text())
    options = list(command_options(typer.main.get_command(app)))
    missing = [(command, option) for command, option in options if not mentions(lines.get(command, ""), option)]
    assert missing == []
    # the walk reached subcommands and the root's own option, and the synopsis has a line per command
    assert {("run", "--slurm-extra"), ("data fetch", "--data-dir"), ("", "--version")} <= set(options)
    assert set(lines) >= {command for command, _ in options} | {"list", "env", "data status"}

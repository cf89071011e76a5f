"""The `structbench` command line: thin — each command parses its options, calls one library function, and prints
with rich. This module holds the app, one-line errors, exit codes, the consoles and the option types the commands
share; the commands live in run.py (run, status), report.py (report, export) and tools.py (list, check, doctor, data
status, env, claims), registered on the app by the package (structbench/cli/__init__.py).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from structbench import heap
from structbench.errors import UsageError
from structbench.inert import inert

# Modules that load torch (runner, optim, tasks, spec, measure, data) are imported inside the commands that use
# them, so `structbench report`, `--help` and the like start without torch.

EXIT_RUN_ERROR = 1
EXIT_USAGE = 2


def one_line(message: str) -> str:
    """A message with its line breaks (those of str.splitlines) turned into spaces and its other control characters
    shown escaped (structbench.inert): an error is one line on stderr, whatever text of the user's or a store's (a
    key, a path, a name) it quotes, and no terminal escape sequence in that text reaches the terminal."""
    return inert(" ".join(message.splitlines()))


class OneLineErrors(TyperGroup):
    """The root command: a command-line error (unknown option, bad or missing value) is reported like any other
    usage error, as one `error: ...` line on stderr with click's exit code (2), instead of a framed help box."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:
            if type(exc).__name__ != "NoArgsIsHelpError":  # its message, the help, is already printed
                print(f"error: {one_line(exc.format_message())}", file=sys.stderr)
            code = exc.exit_code
        except typer.Abort:  # click's name for a KeyboardInterrupt that reached it
            print("interrupted.", file=sys.stderr)
            code = 128 + signal.SIGINT
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    help="Benchmark structured optimizers: run suites, record measurements to Parquet, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def run_command() -> None:
    """The `structbench` command (its console script and `python -m structbench`). Once the command is done, what is
    alive is frozen out of the garbage collector (`structbench.heap`): the interpreter's last collections then skip
    torch's heap, about 1 s less at exit on 2 cores. A dataset checksum warning prints as one `warning: ...` line."""
    from structbench.data.checksums import show_checksum_warnings_as_lines

    show_checksum_warnings_as_lines()
    try:
        app(prog_name="structbench")
    finally:
        heap.freeze()


WIDTH = None if sys.stdout.isatty() else 160
console = Console(width=WIDTH)
err_console = Console(stderr=True, width=WIDTH)


def show_version(value: bool) -> None:
    if value:
        import structbench

        print(f"structbench {structbench.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


F = TypeVar("F", bound=Callable[..., Any])


def path_value(text: str | Path) -> Path:
    """A path option's value; an empty one is a usage error (it would silently mean the current directory). Typer
    passes an option's default (a Path) through the parser too."""
    if not str(text).strip():
        raise typer.BadParameter("an empty path is not a directory; give one, or leave the option out.")
    return Path(text)


T = TypeVar("T")


def without_repeats(option: str, values: list[T] | None) -> list[T] | None:
    """The values of a repeatable option, each once (in the order first given); a note names those given twice."""
    if not values:
        return values
    unique = list(dict.fromkeys(values))
    if len(unique) < len(values):
        repeated = ", ".join(str(v) for v in unique if values.count(v) > 1)
        print(f"note: {option} {inert(repeated)} given more than once; each runs once.", file=sys.stderr)
    return unique


def existing_data_dir(data_dir: Path | None, create: bool) -> Path | None:
    """--data-dir as given, which must be a directory: created when `create` (--create-data-dir), else a missing
    one is a usage error (a typo would otherwise read as "dataset not on disk")."""
    if data_dir is None or data_dir.expanduser().is_dir():
        return data_dir
    if data_dir.expanduser().exists():
        raise UsageError(f"--data-dir {data_dir} is not a directory.")
    if not create:
        raise UsageError(
            f"--data-dir {data_dir} does not exist; check the path, or add --create-data-dir to create it."
        )
    data_dir.expanduser().mkdir(parents=True)
    return data_dir


def directory_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a directory (it is a file, lies under a file, or is in a directory this user
    may not write), or None when it is one or can be created; looks only, writes nothing."""
    try:
        if path.exists():
            if not path.is_dir():
                return "it is a file, not a directory"
            return None if os.access(path, os.W_OK | os.X_OK) else "permission denied"
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"{ancestor} is a file, not a directory"
        return None if os.access(ancestor, os.W_OK | os.X_OK) else f"permission denied in {ancestor}"
    except OSError as exc:
        return exc.strerror or str(exc)


def writable_destination(path: Path, what: str) -> None:
    """A UsageError (exit 2, before any work) unless `what` can be written to the directory `path`: an output the
    user named that cannot be created is theirs to fix. A write that fails later (a full disk) is a run error, 1."""
    problem = directory_problem(path.expanduser())
    if problem is not None:
        raise UsageError(f"cannot write {what} to {path}: {problem}.")


def usage_errors_exit_2(command: F) -> F:
    """Report a UsageError as one line on stderr and exit 2, with no traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UsageError as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            raise typer.Exit(EXIT_USAGE) from None

    return wrapper  # type: ignore[return-value]


OutDir = Annotated[Path, typer.Option(parser=path_value, help="Results directory.")]
DataDir = Annotated[
    Path | None,
    typer.Option(parser=path_value, help="Data root (else $STRUCTBENCH_DATA, else ~/.cache/structbench/data)."),
]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
OptimAliases = Annotated[
    list[str] | None,
    typer.Option("--optim-alias", help="NAME=package.module:ClassName: a short name for a plugin optimizer."),
]

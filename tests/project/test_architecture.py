"""The package's layering holds (docs/architecture.md): no import cycle between structbench's modules, a thin
command line (each command function short, and the CLI reaching the pipeline only through its front doors).

The import graph is read from the source with `ast` (imports inside functions count: a lazy import is still a
dependency; imports under `if TYPE_CHECKING:` do not run and are left out), so the test needs no import of torch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "structbench"
CLI_FUNCTION_MAX_LINES = 60


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under `if TYPE_CHECKING:`."""
    guarded: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            guarded.update(sub for sub in ast.walk(node) if isinstance(sub, ast.ImportFrom | ast.Import))
    return guarded


def imported_modules(name: str) -> Iterator[str]:
    """The structbench modules that module `name` imports, wherever the import statement stands."""
    tree = ast.parse(MODULES[name].read_text())
    guarded = type_checking_only(tree)
    for node in ast.walk(tree):
        if node in guarded:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("structbench"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                yield child if child in MODULES else node.module


def import_graph() -> dict[str, set[str]]:
    return {name: {target for target in imported_modules(name) if target != name} for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_cycle_finder_finds_a_planted_cycle_and_nothing_in_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    assert cycles(import_graph()) == []


def test_the_import_graph_sees_lazy_imports_and_skips_type_checking_ones():
    """The graph reads imports inside functions (the CLI imports its library lazily) and leaves out those that only
    type checkers run."""
    graph = import_graph()
    assert "structbench.plan.grid" in graph["structbench.cli.run"]
    source = MODULES["structbench.execution.job"].read_text()
    assert "if TYPE_CHECKING:" in source
    assert "structbench.plan.grid" not in graph["structbench.execution.job"]


def command_functions() -> Iterator[tuple[str, int]]:
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                yield f"{path.name}:{node.name}", node.end_lineno - start + 1  # type: ignore[operator]


def test_every_command_line_function_is_short():
    long = {name: lines for name, lines in command_functions() if lines > CLI_FUNCTION_MAX_LINES}
    assert long == {}
    assert dict(command_functions())["run.py:run"] > 20  # the walk found the commands themselves


CLI_MAY_IMPORT = (
    "structbench.cli",
    "structbench.errors",
    "structbench.inert",
    "structbench.plan.",
    "structbench.execution.session",
    "structbench.report.publish",
    "structbench.report.options",
    "structbench.report.suite_files",
    "structbench.report.views.",
    "structbench.store.",
    "structbench.optim",
    "structbench.claims",
    "structbench.data",
    "structbench.export",
    "structbench.measure",
    "structbench.catalogue",
    "structbench.heap",
)
"""What the command line may reach: planning, the grid session, report publishing and the views it prints with, the
store (status, doctor), the registries of optimizers, claims, datasets and exporters, the optimizer catalogue `list`
prints, the garbage-collector freeze it leaves at exit, and structbench.inert, which makes stored text safe for the
terminal. Not the training code
(runner, loop, executors), nor the report's analysis and figures: those are reached through the session and
publish."""


def test_the_command_line_reaches_the_pipeline_only_through_its_front_doors():
    graph = import_graph()
    reached = {target for name in MODULES if name.startswith("structbench.cli") for target in graph[name]}
    assert {"structbench.execution.session", "structbench.report.publish"} <= reached
    outside = sorted(t for t in reached if t != "structbench" and not t.startswith(CLI_MAY_IMPORT))
    assert outside == []

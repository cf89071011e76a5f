"""Optimizers from outside structbench: `--optim package.module:ClassName`, `--optim-alias NAME=package.module:Class`,
and the entry-point group `structbench.optimizers` of installed packages.

- `package.module:ClassName` names any `torch.optim.Optimizer` whose constructor takes the parameters first and its
  hyperparameters as keywords. Its registry entry is made here: the class owns every parameter, and its keywords
  with a number, boolean or string default are its hyperparameters (a `StructuredOptimizer` brings its own declared
  `hparams`, ranges and sources). It has no analytic state size, so `structbench check` reports that check failed.
- An installed package registers full `OptimizerEntry`s (name, defaults with their sources, routing, analytic
  `state_bytes`) under the group `structbench.optimizers` of its metadata: each entry point names an
  `OptimizerEntry` or a list of them.

Each plugin entry carries its identity (`OptimizerEntry.origin`): how it was found, its `module:attribute`, the
installed distribution and version that holds it (if any) and the sha256 of the module file defining it. The identity
goes into every run's spec, so into its run key: a new version, or an edited file, is a new run, never a cache hit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from structbench.catalogue import ENTRY_POINT_GROUP
from structbench.errors import UsageError
from structbench.optim import registry
from structbench.optim.base import StructuredOptimizer
from structbench.optim.hparams import Declaration, Hyperparameter, Interval, code, decade_around
from structbench.store.paths import check_name

SCALAR_KINDS = (bool, int, float, str)


def is_class_path(name: str) -> bool:
    return ":" in name


def _split(target: str) -> tuple[str, str]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise UsageError(f"--optim {target!r}: a plugin optimizer is written package.module:ClassName.")
    return module_name, attribute


def _import(target: str, what: str) -> tuple[ModuleType, Any]:
    module_name, attribute = _split(target)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(
            f"{what} {target!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); "
            "is its package installed, or its directory on PYTHONPATH?"
        ) from None
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise UsageError(f"{what} {target!r}: module {module_name!r} has no attribute {attribute!r}.")
        value = getattr(value, part)
    return module, value


def _distribution_of(module: ModuleType) -> tuple[str | None, str | None]:
    """The installed distribution (name, version) that holds `module`'s top-level package, or (None, None)."""
    top = module.__name__.partition(".")[0]
    names = metadata.packages_distributions().get(top, [])
    if not names:
        return None, None
    return names[0], metadata.version(names[0])


def _file_sha256(module: ModuleType) -> str | None:
    path = getattr(module, "__file__", None)
    if path is None or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def identity(kind: str, target: str, module: ModuleType, distribution: str | None = None) -> dict[str, Any]:
    """A plugin's identity as stored with its runs (module docstring); `module` is the one that defines it."""
    found, version = _distribution_of(module)
    if distribution is not None:
        found, version = distribution, metadata.version(distribution)
    return {"kind": kind, "target": target, "distribution": found, "version": version, "sha256": _file_sha256(module)}


def declaration_of(cls: type[torch.optim.Optimizer], target: str) -> tuple[Declaration, str]:
    """The hyperparameters of a plugin class, and a note on the keywords left at the class's default.

    A StructuredOptimizer declares its own. Otherwise each keyword after the parameters with a bool, int, float or
    str default is one (its default from the signature; `lr`, the step size, must be a positive number); keywords
    with other defaults (tuples, None) keep them and are named in the note; a keyword without a default is an error.
    """
    declared = getattr(cls, "hparams", None)
    if issubclass(cls, StructuredOptimizer) and isinstance(declared, Declaration):
        return declared, ""
    source = code(f"{target}, its constructor's default")
    fields: list[Hyperparameter] = []
    kept: list[str] = []
    keywords = list(inspect.signature(cls.__init__).parameters.values())[2:]
    for param in keywords:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is param.empty:
            raise UsageError(
                f"--optim {target}: keyword {param.name!r} has no default, so structbench cannot choose one; "
                "register an OptimizerEntry with its defaults through the structbench.optimizers entry point."
            )
        default = param.default
        number = isinstance(default, (int, float)) and not isinstance(default, bool)
        if param.name == "lr" and number:
            fields.append(
                Hyperparameter("lr", float, float(default), source, Interval.parse("(0, inf)"), decade_around())
            )
        elif param.name != "lr" and isinstance(default, SCALAR_KINDS):
            kind = next(k for k in SCALAR_KINDS if isinstance(default, k))
            fields.append(Hyperparameter(param.name, kind, default, source))
        else:
            kept.append(f"{param.name}={default!r}")
    if not any(f.name == "lr" for f in fields):
        raise UsageError(f"--optim {target}: the class must take a keyword `lr` (its step size) with a number default.")
    note = f"Left at the class's default (not settable here): {', '.join(kept)}." if kept else ""
    return Declaration(*fields), note


def class_entry(target: str, name: str | None = None) -> registry.OptimizerEntry:
    """The registry entry of the class `target` (package.module:ClassName), registered under `name` (default:
    `target` itself)."""
    module, cls = _import(target, "--optim")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise UsageError(f"--optim {target!r} is not a torch.optim.Optimizer subclass.")
    declaration, note = declaration_of(cls, target)
    origin = identity("class", target, inspect.getmodule(cls) or module)
    version = f" {origin['distribution']} {origin['version']}" if origin["distribution"] else ""
    summary = (inspect.getdoc(cls) or f"{cls.__name__} (plugin)").splitlines()[0]

    def build(named: registry.NamedParams, routing: registry.Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
        return cls([p for _, p in named], **hp)

    return registry.OptimizerEntry(
        name=name or target,
        summary=summary,
        reference=f"plugin {target}{version}",
        hparams=declaration,
        build=build,
        notes=f"Plugin class {target}: owns every parameter. {note}".strip(),
        origin=origin,
    )


def register_alias(alias: str, target: str) -> None:
    """`--optim-alias alias=target`: the class `target` registered under the short name `alias`."""
    if not alias or is_class_path(alias):
        raise UsageError(f"--optim-alias takes NAME=package.module:ClassName with a NAME without ':', got {alias!r}.")
    check_name("--optim-alias name", alias)
    load_entry_points()
    existing = registry.registered(alias)
    if existing is not None:
        if existing.origin is not None and existing.origin.get("target") == target:
            return
        raise UsageError(f"--optim-alias {alias}={target}: {alias!r} is already an optimizer's name; choose another.")
    registry.add(class_entry(target, alias))


def parse_aliases(items: list[str]) -> dict[str, str]:
    """`--optim-alias NAME=package.module:ClassName` values as {NAME: target}, each registered."""
    aliases = {}
    for item in items:
        alias, sep, target = (part.strip() for part in item.partition("="))
        if not sep or not alias or not is_class_path(target):
            raise UsageError(f"--optim-alias takes NAME=package.module:ClassName, got {item!r}.")
        register_alias(alias, target)
        aliases[alias] = target
    return aliases


def load_entry_points() -> None:
    """Register every OptimizerEntry that installed packages declare in the `structbench.optimizers` group (each
    entry point once per process)."""
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        distribution = point.dist.name if point.dist is not None else None
        key = (distribution, point.name, point.value)
        if key in _LOADED:
            continue
        what = f"entry point {point.name!r} ({ENTRY_POINT_GROUP}) of {distribution or 'an unnamed distribution'}"
        module, value = _import(point.value, what)
        entries = list(value) if isinstance(value, (list, tuple)) else [value]
        if not entries or not all(isinstance(e, registry.OptimizerEntry) for e in entries):
            raise UsageError(f"{what}: {point.value} must be an OptimizerEntry or a list of them.")
        origin = identity("entry point", point.value, module, distribution)
        for entry in entries:
            existing = registry.registered(entry.name)
            if existing is not None and existing.origin != origin:
                raise UsageError(f"{what} registers {entry.name!r}, which is already an optimizer's name.")
            if existing is None:
                registry.add(dataclasses.replace(entry, origin=origin))
        _LOADED.add(key)


_LOADED: set[tuple[str | None, str, str]] = set()


def resolve(name: str) -> registry.OptimizerEntry | None:
    """The entry for a name the registry does not hold yet: a class path is imported and registered; any other name
    is looked for among the installed packages' entry points. None when neither has it."""
    if is_class_path(name):
        registry.add(class_entry(name))
    else:
        load_entry_points()
    return registry.registered(name)


def ensure(name: str, origin: Mapping[str, Any] | None) -> None:
    """Make `name` known in this process (a worker) from the identity stored with its run: an alias is registered
    again from its class path."""
    if registry.registered(name) is not None or origin is None:
        return
    if origin["kind"] == "class" and name != origin["target"]:
        register_alias(name, str(origin["target"]))
    else:
        resolve(name)


def record(name: str) -> dict[str, Any] | None:
    """The identity stored with a run of optimizer `name`: None for structbench's own optimizers."""
    if registry.registered(name) is None:
        resolve(name)
    entry = registry.get(name)
    return dict(entry.origin) if entry.origin is not None else None

"""Declared hyperparameters: each optimizer's hyperparameters stated once, with where each default comes from.

A `Hyperparameter` is one field: its type, its default and the source of that default (a paper's table or equation,
a reference code's file, or a choice of structbench's and why), the values it may take and, where tuning it makes
sense, the range a sweep explores. An optimizer class lists its own as `hparams`, a `Declaration`; its registry entry
adds the fallback's and the routing switches. Everything else follows from that one declaration: the constructor's
keywords and their checks, the registry's defaults and the usage errors of `--set`, `structbench list optims`, and
the search spaces of `--sweep` and `--search`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

INT64_LIMIT = 2**63
"""Integers are stored in 64 bits (run tables, state dicts): |value| < 2^63."""

_INTERVAL = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])$")


@dataclass(frozen=True)
class Source:
    """Where a default comes from: `kind` is "paper", "code" (a reference implementation) or "structbench" (a choice
    made here); `where` names the table, section or equation, the repository and file, or the reason."""

    kind: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}"


def paper(where: str) -> Source:
    return Source("paper", where)


def code(where: str) -> Source:
    return Source("code", where)


def ours(why: str) -> Source:
    return Source("structbench", why)


@dataclass(frozen=True)
class Interval:
    """The numbers a hyperparameter may take, written as in mathematics: "[0, 1)", "(0, inf)", "[1, inf)"."""

    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        match = _INTERVAL.match(text.strip())
        if match is None:
            raise ValueError(f"an interval is written like '[0, 1)', got {text!r}")
        left, low, high, right = match.groups()
        return cls(float(low), float(high), left == "[", right == "]")

    def __contains__(self, value: float) -> bool:
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return math.isfinite(value) and above and below

    def __str__(self) -> str:
        left, right = "[" if self.low_closed else "(", "]" if self.high_closed else ")"
        return f"{left}{_number(self.low)}, {_number(self.high)}{right}"

    def bound(self) -> str:
        """The interval as a bound on a finite number: ">= 0", "> 0", "< 1", "in [0, 1)", or "" when unbounded."""
        if math.isinf(self.low) and math.isinf(self.high):
            return ""
        if math.isinf(self.high):
            return f"{'>=' if self.low_closed else '>'} {_number(self.low)}"
        if math.isinf(self.low):
            return f"{'<=' if self.high_closed else '<'} {_number(self.high)}"
        return f"in {self}"


ALL_NUMBERS = Interval(-math.inf, math.inf, False, False)


def _number(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Tune:
    """The range a sweep explores: `scale` "log" or "lin" between `low` and `high`, `points` values on a `--sweep`
    grid (a `--search` samples the range continuously). With `relative`, `low` and `high` multiply the default."""

    scale: str
    low: float
    high: float
    points: int
    relative: bool = False

    def bounds(self, default: float) -> tuple[float, float]:
        if self.relative:
            return self.low * default, self.high * default
        return self.low, self.high

    def describe(self, default: float) -> str:
        low, high = self.bounds(default)
        return f"{self.scale}({_number(low)}, {_number(high)}, {self.points})"


def lin(low: float, high: float, points: int = 3) -> Tune:
    return Tune("lin", low, high, points)


def decade_around(points: int = 5) -> Tune:
    """A log range from a tenth of the default to ten times it: a step size's usual search span."""
    return Tune("log", 0.1, 10.0, points, relative=True)


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter: `kind` is float, int, bool or str; `valid` is an Interval of numbers, a tuple of the
    choices (of a string or an integer), or None (any value of its kind); `tune` is its sweep range, None where
    tuning it makes no sense."""

    name: str
    kind: type
    default: Any
    source: Source
    valid: Interval | tuple[Any, ...] | None = None
    tune: Tune | None = None

    def problem(self, value: Any) -> str | None:
        """Why `value` is not a valid value of this hyperparameter, or None if it is."""
        if self.kind is bool:
            return None if isinstance(value, bool) else f"{self.name} must be true or false, got {value!r}"
        if isinstance(self.valid, tuple):
            if isinstance(value, self.kind) and not isinstance(value, bool) and value in self.valid:
                return None
            return f"{self.name} must be one of {', '.join(map(str, self.valid))}, got {value!r}"
        interval = self.valid or ALL_NUMBERS
        if self.kind is int:
            if not isinstance(value, int) or isinstance(value, bool) or not -INT64_LIMIT <= value < INT64_LIMIT:
                return f"{self.name} must be a 64-bit integer, got {value!r}"
            return None if value in interval else f"{self.name} must be an integer {interval.bound()}, got {value!r}"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value in interval:
            return None
        bound = interval.bound()
        wanted = "a positive finite number" if bound == "> 0" else f"a finite number {bound}".rstrip()
        return f"{self.name} must be {wanted}, got {value!r}"

    def valid_text(self) -> str:
        """The valid values as `structbench list optims` shows them."""
        if self.kind is bool:
            return "true | false"
        if isinstance(self.valid, tuple):
            return " | ".join(map(str, self.valid))
        noun = "integer" if self.kind is int else "real"
        return f"{noun} in {self.valid}" if self.valid is not None else f"any {noun}"


def real(name: str, default: float, source: Source, valid: str, tune: Tune | None = None) -> Hyperparameter:
    return Hyperparameter(name, float, default, source, Interval.parse(valid), tune)


def integer(
    name: str, default: int, source: Source, valid: str | None = None, tune: Tune | None = None
) -> Hyperparameter:
    return Hyperparameter(name, int, default, source, Interval.parse(valid) if valid else None, tune)


def flag(name: str, default: bool, source: Source) -> Hyperparameter:
    return Hyperparameter(name, bool, default, source)


def option(name: str, default: str | int, choices: Iterable[str | int], source: Source) -> Hyperparameter:
    """One of a few strings (or integers, of the default's type)."""
    return Hyperparameter(name, type(default), default, source, tuple(choices))


class Declaration:
    """An ordered set of hyperparameters: one optimizer's, or an entry's (its optimizer's, fallback's and routing's)."""

    def __init__(self, *fields: Hyperparameter) -> None:
        names = [field.name for field in fields]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"hyperparameters declared twice: {', '.join(repeated)}")
        self.fields = fields
        self._by_name = dict(zip(names, fields, strict=True))

    def __iter__(self) -> Iterator[Hyperparameter]:
        return iter(self.fields)

    def __getitem__(self, name: str) -> Hyperparameter:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __add__(self, other: Declaration) -> Declaration:
        return Declaration(*self.fields, *other.fields)

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def defaults(self) -> dict[str, Any]:
        return {field.name: field.default for field in self.fields}

    def with_defaults(self, **changes: tuple[Any, Source]) -> Declaration:
        """The same hyperparameters with other defaults (each given with its source): a variant's declaration."""
        unknown = sorted(set(changes) - set(self._by_name))
        if unknown:
            raise ValueError(f"no hyperparameter {', '.join(unknown)} to change")
        return Declaration(
            *(
                replace(field, default=changes[field.name][0], source=changes[field.name][1])
                if field.name in changes
                else field
                for field in self.fields
            )
        )

    def first(self, name: str) -> Declaration:
        """The same hyperparameters with `name` moved to the front."""
        return Declaration(self[name], *(field for field in self.fields if field.name != name))

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The defaults updated by `given`; a key that is not declared is a TypeError, as for any unknown keyword."""
        unknown = sorted(set(given) - set(self._by_name))
        if unknown:
            raise TypeError(f"unexpected hyperparameter(s) {', '.join(unknown)}; valid: {', '.join(self._by_name)}")
        return {**self.defaults(), **given}

    def take(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values of this declaration's hyperparameters out of a larger mapping (an entry's resolved ones)."""
        return {name: values[name] for name in self._by_name}

    def problems(self, values: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
        """(name, why) for each declared hyperparameter whose value in `values` is not valid."""
        for field in self.fields:
            problem = field.problem(values[field.name])
            if problem is not None:
                yield field.name, problem

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise ValueError, naming the first hyperparameter whose value in `values` is not valid."""
        first = next(self.problems(values), None)
        if first is not None:
            raise ValueError(first[1])

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(name, default, valid values, tuning range, source) per hyperparameter: `structbench list optims`."""
        return [
            (
                field.name,
                _shown(field.default),
                field.valid_text(),
                field.tune.describe(field.default) if field.tune is not None else "-",
                str(field.source),
            )
            for field in self.fields
        ]


def _shown(value: Any) -> str:
    """A default as it is written in a suite file or `--set`: true/false, numbers and bare strings."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)

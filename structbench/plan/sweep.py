"""Sweep values: the lists, ranges and quasi-random searches that turn one spec field into several runs.

A `--set` value (or a value in a suite's `[sweep.<optim>]` table) sweeps its field when it is

- a TOML array on a field that is not itself a list: `hparams.muon.lr=[0.01,0.02,0.04]`;
- `log(a,b,n)`: n values spaced evenly in log space from a to b (a, b > 0), rounded to 6 significant digits
  so the same command gives the same run keys on every machine;
- `lin(a,b,n)`: n evenly spaced values from a to b (integers when a, b and the spacing are integers).

Several swept fields of one optimizer form their Cartesian product. `--search halton:N[:SEED]` instead draws N
settings from the declared ranges: a log or lin range is sampled continuously between its ends, a list is a
categorical choice. The points are the Halton sequence (bases 2, 3, 5, ...: one prime per swept field, as
AlgoPerf's quasi-random tuning search does) with a seeded Cranley–Patterson shift, so a search is reproducible
from its seed. A range, a product of swept fields and a search each give at most MAX_VALUES (10,000) values.

With `--sweep` or `--search`, an optimizer whose suite has no `[sweep.<optim>]` table sweeps the tuning ranges
its hyperparameters declare (`declared_sweep`); a suite's table replaces them for that optimizer.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from structbench.errors import UsageError

if TYPE_CHECKING:
    from structbench.optim.hparams import Declaration

_RANGE = re.compile(r"^\s*(log|lin)\s*\((.*)\)\s*$")
_SEARCH = re.compile(r"^halton:(\d+)(?::(\d+))?$")
MAX_VALUES = 10_000
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71)


@dataclass(frozen=True)
class Range:
    """A `log(a,b,n)` or `lin(a,b,n)` range: its grid has n values; a search samples [a, b] continuously."""

    scale: str
    low: float
    high: float
    count: int
    integer: bool

    def grid(self) -> list[Any]:
        if self.count == 1:
            return [self._value(self.low)]
        return [self.at(i / (self.count - 1)) for i in range(self.count)]

    def at(self, u: float) -> Any:
        """The value a fraction u in [0, 1] of the way from low to high (in log space for a log range)."""
        if self.scale == "log":
            value = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
            return self._value(float(f"{value:.6g}"))
        return self._value(self.low + u * (self.high - self.low))

    def _value(self, value: float) -> Any:
        if self.integer:
            return round(value)
        return float(f"{value:.12g}")


@dataclass(frozen=True)
class Swept:
    """One swept field: its dotted key and either an explicit list of values or a range."""

    key: str
    values: tuple[Any, ...] | None = None
    range: Range | None = None

    def grid(self) -> list[Any]:
        return list(self.values) if self.values is not None else self.range.grid()  # type: ignore[union-attr]

    def sample(self, u: float) -> Any:
        if self.range is not None:
            return self.range.at(u)
        values = self.values or ()
        return values[min(int(u * len(values)), len(values) - 1)]


def parse_range(key: str, text: str) -> Range | None:
    """`log(a,b,n)` / `lin(a,b,n)` as a Range; None when `text` is not of that form; a usage error when malformed."""
    match = _RANGE.match(text)
    if match is None:
        return None
    scale, inner = match.groups()
    parts = [p.strip() for p in inner.split(",")]
    form = f"{key}={scale}(a,b,n)"
    if len(parts) != 3:
        raise UsageError(f"{form} takes three numbers (start, stop, count), got {text!r}.")
    try:
        low, high = float(parts[0]), float(parts[1])
        count = int(parts[2])
    except ValueError:
        raise UsageError(f"{form}: start and stop must be numbers and count an integer, got {text!r}.") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise UsageError(f"{form}: start and stop must be finite, got {text!r}.")
    if not 1 <= count <= MAX_VALUES:
        raise UsageError(f"{form}: count must be between 1 and {MAX_VALUES}, got {count}.")
    if scale == "log" and (low <= 0 or high <= 0):
        raise UsageError(f"{form}: a log range needs start and stop > 0, got {text!r}.")
    integer = (
        scale == "lin"
        and all(re.fullmatch(r"[+-]?\d+", p) for p in parts[:2])
        and (count == 1 or (high - low) % (count - 1) == 0)
    )
    return Range(scale, low, high, count, integer)


def parse_swept(key: str, value: Any) -> Swept | None:
    """A swept field from a parsed value (a list, or a range string); None when the value is a plain assignment."""
    if isinstance(value, list):
        if not value:
            raise UsageError(f"{key}: an empty list sweeps nothing; give at least one value.")
        if any(isinstance(v, (list, dict)) for v in value):
            raise UsageError(f"{key}: sweep values must be numbers, booleans or strings, got {value!r}.")
        return Swept(key, values=tuple(value))
    if isinstance(value, str):
        parsed = parse_range(key, value)
        if parsed is not None:
            return Swept(key, range=parsed)
    return None


def grid_points(swept: Sequence[Swept]) -> list[dict[str, Any]]:
    """The Cartesian product of the swept fields' grids, as {key: value} assignments (one empty one if none)."""
    grids = [[(one.key, v) for v in one.grid()] for one in swept]
    size = math.prod(len(grid) for grid in grids)
    if size > MAX_VALUES:
        raise UsageError(
            f"the swept fields {', '.join(one.key for one in swept)} form {size} settings, more than {MAX_VALUES}."
        )
    return [dict(point) for point in itertools.product(*grids)]


@dataclass(frozen=True)
class Search:
    """`--search halton:N[:SEED]`: N quasi-random settings per optimizer from its declared ranges."""

    count: int
    seed: int

    def points(self, swept: Sequence[Swept]) -> list[dict[str, Any]]:
        if not swept:
            return [{}]
        if len(swept) > len(_PRIMES):
            raise UsageError(f"--search supports at most {len(_PRIMES)} swept fields per optimizer, got {len(swept)}.")
        rng = random.Random(self.seed)
        shifts = [rng.random() for _ in swept]
        points = []
        for index in range(1, self.count + 1):
            point = {}
            for dim, field in enumerate(swept):
                u = (radical_inverse(index, _PRIMES[dim]) + shifts[dim]) % 1.0
                point[field.key] = field.sample(u)
            points.append(point)
        return points


def parse_search(text: str | None) -> Search | None:
    if text is None:
        return None
    match = _SEARCH.match(text.strip())
    if match is None or not 1 <= int(match.group(1)) <= MAX_VALUES:
        raise UsageError(f"--search takes halton:N or halton:N:SEED with 1 <= N <= {MAX_VALUES}, got {text!r}.")
    return Search(int(match.group(1)), int(match.group(2) or 0))


def radical_inverse(index: int, base: int) -> float:
    """The van der Corput radical inverse of `index` in `base`: its digits mirrored about the radix point."""
    result, scale = 0.0, 1.0 / base
    while index > 0:
        index, digit = divmod(index, base)
        result += digit * scale
        scale /= base
    return result


def suite_sweep_table(optim_name: str, table: Mapping[str, Any], suite: str) -> list[Swept]:
    """The swept fields a suite declares for one optimizer in `[sweep.<optim>]` (keys are hyperparameter names)."""
    swept = []
    for name, value in table.items():
        key = f"hparams.{optim_name}.{name}"
        parsed = parse_swept(key, value)
        if parsed is None:
            raise UsageError(
                f"suite {suite}: [sweep.{optim_name}] {name} must be a list or a log(a,b,n) / lin(a,b,n) string, "
                f"got {value!r}."
            )
        swept.append(parsed)
    return swept


def declared_sweep(optim_name: str, declaration: Declaration) -> list[Swept]:
    """The swept fields of an optimizer's declared tuning ranges: each a log or lin range of its declared points."""
    swept = []
    for field in declaration:
        if field.tune is not None:
            low, high = field.tune.bounds(field.default)
            points = Range(field.tune.scale, low, high, field.tune.points, integer=field.kind is int)
            swept.append(Swept(f"hparams.{optim_name}.{field.name}", range=points))
    return swept

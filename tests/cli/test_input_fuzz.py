"""Property: whatever `--set` values or suite file a user gives, `run --dry-run` ends with exit 0 or with exactly one
`error: ...` line and exit 2 — never a traceback — and writes nothing.

STRUCTBENCH_FUZZ_EXAMPLES sets the number of examples per property (default 100, a few seconds each on two cores);
the examples are derandomized, so a run is reproducible.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from structbench import optim
from structbench.cli.app import app
from structbench.plan import schedule, spec
from structbench.tasks.quadratic import DEFAULTS as QUADRATIC_ARGS

EXAMPLES = int(os.environ.get("STRUCTBENCH_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
QUADRATIC_OPTIMS = ("sgd", "adamw")
"""The optimizers of the quadratic suite."""

SECTIONS: dict[str, dict[str, Any]] = {
    "task_args": dict(QUADRATIC_ARGS),
    "budget": dict(spec.BUDGET_DEFAULTS),
    "schedule": dict(schedule.SCHEDULE_DEFAULTS),
    "target": dict(spec.TARGET_DEFAULTS),
    **{f"hparams.{name}": dict(optim.get(name).defaults) for name in QUADRATIC_OPTIMS},
}
REAL_KEYS = [f"{section}.{key}" for section, fields in SECTIONS.items() for key in fields] + ["seeds"]
WILDCARD_KEYS = sorted({f"hparams.*.{key}" for name in QUADRATIC_OPTIMS for key in optim.get(name).defaults})

weird_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
bracketed_text = st.sampled_from(["[/]", "[bold]", '"', "'", "\n", "a=b", "log(", "\\", "[", "]", "{", "}", "\x00"])
text = st.lists(st.one_of(weird_text, bracketed_text), max_size=4).map("".join)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1.0, -0.0, 1e-300, 1e300]),
)
range_arguments = st.lists(
    st.one_of(numbers.map(str), st.sampled_from(["", "x", "1e-3", "nan", "inf", str(10**6), str(10**20)])),
    min_size=0,
    max_size=4,
)
ranges = st.builds(lambda kind, args: f"{kind}({','.join(args)})", st.sampled_from(["log", "lin"]), range_arguments)


def toml_number(value: int | float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, save that TOML escapes DEL and takes other characters raw."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_inline(value: Any) -> str:
    """`value` as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return toml_number(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_inline(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_inline(v)}" for k, v in value.items()) + "}"


scalars = st.one_of(numbers, st.booleans(), text, ranges)
toml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)
set_values = st.one_of(
    toml_values.map(toml_inline),
    text,
    ranges,
    st.sampled_from(["", "[]", "[[1]]", "{}", "{a=1}", '"', "[1,", "nan", "-inf", "true", str(2**63), "1e999"]),
)


def like(default: Any) -> st.SearchStrategy[Any]:
    """Values of the type of a field's default, in range or not (non-finite and oversized numbers among them)."""
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return st.one_of(st.integers(min_value=-3, max_value=70), st.integers(min_value=-(2**70), max_value=2**70))
    if isinstance(default, float):
        return st.one_of(st.floats(min_value=0.0, max_value=1.0), numbers.map(float))
    if isinstance(default, str):
        return st.one_of(st.sampled_from([default, "", "block-diagonal", "cosine", "step", "loss", "adamw"]), text)
    if isinstance(default, list):
        return st.lists(numbers, max_size=3)
    return toml_values


FIELD_DEFAULTS = {
    f"{section}.{key}": default for section, fields in SECTIONS.items() for key, default in fields.items()
}
typed_assignments = st.sampled_from(sorted(FIELD_DEFAULTS)).flatmap(
    lambda key: st.one_of(
        like(FIELD_DEFAULTS[key]).map(toml_inline),
        st.lists(like(FIELD_DEFAULTS[key]), min_size=1, max_size=3).map(toml_inline),
        ranges,
    ).map(lambda value: f"{key}={value}")
)
set_keys = st.one_of(
    st.sampled_from(REAL_KEYS),
    st.sampled_from(WILDCARD_KEYS),
    text,
    st.lists(st.sampled_from(["hparams", "*", "sgd", "budget", "steps", "", "x"]), min_size=1, max_size=4).map(
        ".".join
    ),
)
assignments = st.lists(
    st.one_of(typed_assignments, st.builds(lambda key, value: f"{key}={value}", set_keys, set_values)),
    min_size=1,
    max_size=3,
)


def assert_clean_ending(result: Any, out: Path) -> None:
    """Exit 0, or exit 2 with one `error:` line; no exception escaped; the results directory was never created."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not out.exists()


@FUZZ
@given(assignments=assignments)
def test_random_set_values_end_in_a_dry_run_or_one_error_line(tmp_path_factory, assignments):
    out = tmp_path_factory.getbasetemp() / "fuzz-set" / "results"
    args = ["run", "--suite", "quadratic", "--dry-run", "--out", str(out)]
    for assignment in assignments:
        args += ["--set", assignment]
    assert_clean_ending(CliRunner().invoke(app, args), out)


def section_tables(defaults: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Tables of a section's real keys (and some unknown ones) with random values."""
    typed = st.sampled_from(sorted(defaults)).flatmap(lambda key: st.tuples(st.just(key), like(defaults[key])))
    return st.one_of(
        st.lists(typed, max_size=4).map(dict),
        st.dictionaries(st.one_of(st.sampled_from(sorted(defaults)), text), toml_values, max_size=4),
    )


SUITE_FIELDS = {
    "task": st.one_of(st.sampled_from(["quadratic", "synthetic-classification", "language-model"]), toml_values),
    "experiment": st.one_of(st.sampled_from(["orth-error", "quant-error"]), toml_values),
    "description": st.one_of(text, toml_values),
    "task_args": st.one_of(section_tables(QUADRATIC_ARGS), toml_values),
    "budget": st.one_of(section_tables(spec.BUDGET_DEFAULTS), toml_values),
    "schedule": st.one_of(section_tables(schedule.SCHEDULE_DEFAULTS), toml_values),
    "target": st.one_of(section_tables(spec.TARGET_DEFAULTS), toml_values),
    "optims": st.one_of(
        st.lists(st.sampled_from([*QUADRATIC_OPTIMS, "muon", "fismo", "*", "nope"]), max_size=3), toml_values
    ),
    "seeds": st.one_of(st.lists(numbers, max_size=3), toml_values),
    "hparams": st.one_of(
        st.dictionaries(st.sampled_from(QUADRATIC_OPTIMS), section_tables(optim.get("sgd").defaults)), toml_values
    ),
    "checks": st.one_of(section_tables(spec.CHECK_DEFAULTS), toml_values),
    "include": st.one_of(
        st.lists(st.sampled_from(["quadratic", "smoke-quadratic", "nope", "SELF"]), max_size=2), toml_values
    ),
    "sweep": st.one_of(
        st.dictionaries(
            st.sampled_from(QUADRATIC_OPTIMS), st.dictionaries(st.sampled_from(["lr", "momentum"]), toml_values)
        ),
        toml_values,
    ),
    "resources": toml_values,
}
suite_documents = st.fixed_dictionaries({}, optional=SUITE_FIELDS).map(
    lambda fields: "\n".join(f"{key} = {toml_inline(value)}" for key, value in fields.items()).encode("utf-8")
)
PLAUSIBLE_FIELDS = {
    "task_args": section_tables(QUADRATIC_ARGS),
    "budget": section_tables(spec.BUDGET_DEFAULTS),
    "schedule": section_tables(schedule.SCHEDULE_DEFAULTS),
    "target": section_tables(spec.TARGET_DEFAULTS),
    "optims": st.lists(st.sampled_from([*QUADRATIC_OPTIMS, "muon", "fismo"]), min_size=1, max_size=3),
    "seeds": st.lists(st.integers(min_value=-(2**64), max_value=2**64), min_size=1, max_size=3),
    "hparams": st.dictionaries(st.sampled_from(QUADRATIC_OPTIMS), section_tables(optim.get("sgd").defaults)),
}
plausible_documents = st.fixed_dictionaries({"task": st.just("quadratic")}, optional=PLAUSIBLE_FIELDS).map(
    lambda fields: "\n".join(f"{key} = {toml_inline(value)}" for key, value in fields.items()).encode("utf-8")
)
suite_files = st.one_of(
    plausible_documents,
    suite_documents,
    suite_documents.map(lambda doc: doc + b"\n[budget\n"),
    st.binary(max_size=64),
)


@FUZZ
@given(document=suite_files)
def test_random_suite_files_end_in_a_dry_run_or_one_error_line(tmp_path_factory, document):
    folder = tmp_path_factory.getbasetemp() / "fuzz-suite"
    folder.mkdir(exist_ok=True)
    suite = folder / "random.toml"
    suite.write_bytes(document.replace(b'"SELF"', json.dumps(str(suite)).encode()))
    out = folder / "results"
    result = CliRunner().invoke(app, ["run", "--suite", str(suite), "--dry-run", "--out", str(out)])
    assert_clean_ending(result, out)

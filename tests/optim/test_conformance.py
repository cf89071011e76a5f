"""The conformance kit, run for every registered optimizer (later optimizers are checked automatically)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from structbench import optim
from structbench.optim import compile_check, conformance
from structbench.optim.base import EagerStructuredOptimizer

EAGER_KIT = [check for check in conformance.CHECKS if check.name != "compile"]


@pytest.mark.parametrize("check", EAGER_KIT, ids=lambda c: c.name)
@pytest.mark.parametrize("name", optim.names())
def test_conformance(name: str, check: conformance.Check) -> None:
    try:
        check.run(name)
    except conformance.CheckSkipped as skipped:
        pytest.skip(str(skipped))


@pytest.fixture
def default_device_meta():
    """torch's default device set to `meta`, as a user's `torch.set_default_device("cuda")` sets it to a device the
    parameters are not on: a tensor made without `device=` lands there, and every use of it with the parameters
    fails, on a CPU, as it would on a GPU machine."""
    torch.set_default_device("meta")
    yield
    torch.set_default_device(None)


@pytest.mark.parametrize("name", optim.names())
def test_the_kit_and_the_optimizers_follow_the_parameters_device_not_the_default(name, default_device_meta) -> None:
    """Training (both dtypes) and a state_dict round trip on the CPU while the default device is elsewhere: every
    batch, generator, state tensor and constant must be made on the parameters' device."""
    results = conformance.run_checks(name, ["shapes-dtypes", "roundtrip-fp32"], torch.device("cpu"))
    assert [(r.check, r.outcome) for r in results if r.outcome == "fail"] == [], [r.message for r in results]


@dataclass
class Row:
    optim: str
    check: str
    result: str
    detail: str


def table_rows(stdout: str) -> dict[str, Row]:
    """The rows of `structbench check`'s table, a wrapped cell's lines joined."""
    rows: list[Row] = []
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 4:
            continue
        if cells[0]:
            rows.append(Row(*cells))
        else:
            rows[-1].detail += " " + cells[3]
    return {row.optim: row for row in rows}


@pytest.fixture(scope="module")
def compile_check_of_all():
    """`structbench check --check compile` over every optimizer in ONE process, as a user runs it: dynamo's
    recompile limit is per process, so optimizers checked one per process could not show it giving up."""
    done = subprocess.run(
        [sys.executable, "-m", "structbench", "check", "--check", "compile", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done, table_rows(done.stdout)


def compiled_frames(detail: str) -> dict[str, int]:
    listed = re.search(r"compiled frames: ([^;]*);", detail)
    assert listed, detail
    return {part: int(count) for part, count in re.findall(r"([\w-]+) (\d+)", listed.group(1))}


@pytest.mark.parametrize("name", optim.names())
def test_compile_in_one_process_for_every_optimizer(name: str, compile_check_of_all) -> None:
    """Every optimizer part compiles at least one graph, or the row is a SKIP that says why."""
    _, rows = compile_check_of_all
    row = rows[name]
    assert row.check == "compile"
    if row.result == "SKIP":
        entry = optim.get(name)
        parts = compile_check.optimizer_parts(conformance.build(name, conformance.toy_model()), name).values()
        eager = [type(part).__name__ for part in parts if isinstance(part, EagerStructuredOptimizer)]
        if entry.compile_supported:
            declared = "step runs eagerly under torch.compile (EagerStructuredOptimizer)"
            assert eager and all(f"{cls}.{declared}" in row.detail for cls in eager), row.detail
        else:
            assert entry.compile_unsupported_reason[:40] in row.detail, row.detail
        pytest.skip(row.detail)
    assert row.result == "pass", row.detail
    frames = compiled_frames(row.detail)
    assert frames and all(count > 0 for count in frames.values()), row.detail
    assert re.search(r"graph breaks: \d+; dynamo: ", row.detail), row.detail


def test_check_prints_no_raw_dynamo_warnings(compile_check_of_all) -> None:
    """Dynamo's warnings go into one summary per row: none printed on their own (torch's log format starts with a
    level letter and a timestamp, e.g. 'W1125 16:39:21.974000')."""
    done, rows = compile_check_of_all
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(rows) == set(optim.names())
    raw = [line for line in (done.stdout + done.stderr).splitlines() if re.match(r"[WEI]\d{4} \d\d:\d\d", line)]
    assert not raw, raw[:3]
    assert "recompile_limit" not in done.stderr


def test_alice0_declares_why_it_is_not_compiled() -> None:
    with pytest.raises(conformance.CheckSkipped, match="declared unsupported: Without tracking"):
        conformance.check_compile("alice-0")


def test_a_step_dynamo_runs_eagerly_fails_the_compile_check(monkeypatch) -> None:
    """The failure the kit once let through: no graph compiled (here SGD's step hidden from dynamo without saying
    so) must fail, not pass."""
    original = torch.optim.SGD.step
    hidden = torch.compiler.disable(original)

    def step(self, closure=None):
        return hidden(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    with pytest.raises(conformance.CheckFailed, match="no graph compiled for sgd"):
        conformance.check_compile("sgd")


def test_a_step_declared_eager_is_a_skip_that_names_the_declaration(monkeypatch) -> None:
    """SGD's step wrapped in torch.compiler.disable (as SOAP's, SUMO's and FISMO's are): no graph, and a SKIP that
    says so rather than a FAIL or a pass."""
    monkeypatch.setattr(torch.optim.SGD, "step", torch.compiler.disable(torch.optim.SGD.step))
    with pytest.raises(conformance.CheckSkipped, match=r"eager by declaration: sgd \(SGD.step is wrapped in torch"):
        conformance.check_compile("sgd")


def test_a_compiled_step_that_departs_from_eager_fails(monkeypatch) -> None:
    """The comparison is live: compiled steps that each step twice must fail it."""
    original = compile_check.compiled_steps

    def doubled(parts, record):
        steps = original(parts, record)
        return [step for step in steps for _ in range(2)]

    monkeypatch.setattr(compile_check, "compiled_steps", doubled)
    with pytest.raises(conformance.CheckFailed, match=r"depart from eager beyond 0\.0001"):
        conformance.check_compile("adamw")


def test_dynamo_session_collects_torch_log_records_and_warnings(capfd) -> None:
    import logging
    import warnings

    record = compile_check.DynamoRecord()
    with compile_check.dynamo_session(record):
        logging.getLogger("torch._dynamo.convert_frame").warning(
            "torch._dynamo hit config.recompile_limit (8)\n   function: 'step' (/x/y/shampoo.py:12)\n   more"
        )
        warnings.warn("Graph break from `Tensor.item()`\nsecond line", UserWarning, stacklevel=1)
    assert record.messages == [
        "torch._dynamo hit config.recompile_limit (8) in 'step' (shampoo.py:12)",
        "Graph break from `Tensor.item()`",
    ]
    captured = capfd.readouterr()
    assert "recompile_limit" not in captured.err + captured.out


def test_summary_counts_messages_by_kind() -> None:
    record = compile_check.DynamoRecord(messages=["a", "b", "a", "c", "a"])
    assert record.summary() == "dynamo: 5 warnings (3x a; 1x b; 1 other kinds)"
    assert compile_check.DynamoRecord().summary() == "dynamo: no warnings"


def test_the_kit_catches_a_resume_that_is_not_bit_identical(monkeypatch):
    """A kit that cannot fail proves nothing: break SGD's resume and the round-trip check must fail."""
    original = torch.optim.SGD.load_state_dict

    def lossy(self, state_dict):
        original(self, state_dict)
        for state in self.state.values():
            state["momentum_buffer"].mul_(0.5)

    monkeypatch.setattr(torch.optim.SGD, "load_state_dict", lossy)
    with pytest.raises(conformance.CheckFailed, match="not bit-identical"):
        conformance.check_roundtrip_float32("sgd")


def test_the_kit_catches_a_wrong_state_formula(monkeypatch):
    import dataclasses

    from structbench.optim import registry

    wrong = dataclasses.replace(optim.get("adamw"), state_bytes=lambda s, f, hp: 0)
    monkeypatch.setitem(registry._REGISTRY, "adamw", wrong)
    results = {r.check: r for r in conformance.run_checks("adamw", ["state-bytes"])}
    assert results["state-bytes"].outcome == "fail" and "analytic 0 B" in results["state-bytes"].message


def test_check_runs_on_the_device_it_is_given_and_refuses_one_it_cannot_use(cli, monkeypatch) -> None:
    result = cli("check", "--optim", "sgd", "--check", "routing", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "conformance on cpu" in result.stdout and table_rows(result.stdout)["sgd"].result == "pass"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device, message in (("cuda", "torch sees no CUDA device"), ("tpu", "--device must be auto, cpu or cuda")):
        refused = cli("check", "--optim", "sgd", "--device", device)
        assert refused.exit_code == 2 and message in refused.stderr and refused.stdout == ""


def test_check_rejects_an_unknown_check(cli) -> None:
    result = cli("check", "--check", "compil")
    assert result.exit_code == 2
    assert "unknown check 'compil'. Did you mean 'compile'?" in result.stderr


class _NotPlainData:
    """A value no weights-only load builds."""


def test_a_state_that_is_not_plain_data_fails_the_round_trip_check():
    import io

    buffer = io.BytesIO()
    torch.save({"optim": {"state": {0: {"helper": _NotPlainData()}}}}, buffer)
    buffer.seek(0)
    with pytest.raises(conformance.CheckFailed, match=r"weights_only=True"):
        conformance.load_weights_only(buffer)
    buffer = io.BytesIO()
    torch.save({"optim": {"state": {0: {"step": torch.tensor(3.0)}}}}, buffer)
    buffer.seek(0)
    assert conformance.load_weights_only(buffer)["optim"]["state"][0]["step"] == 3.0

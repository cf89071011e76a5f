"""The conformance kit: behaviour every registered optimizer must show, checked on a small model.

Run by pytest for every registered optimizer (`tests/optim/test_conformance.py`) and by
`structbench check --optim NAME [--device cpu|cuda|auto]`. The toy model has a 4-D convolution filter, a wide and a
tall matrix, 1-D biases and a classifier head, so routing, reshaping and the fallback are all exercised.

Every check runs on the device it is given: the model is built there and the batches are drawn there, from a
generator of that device (on CUDA a batch therefore differs from the CPU's, and runs are compared only with runs on
the same device). Nothing depends on torch's default device: the kit passes on a CPU with the default device set to
`meta` (tests/optim/test_conformance.py), which is how a tensor made on the default device instead of the
parameters' shows itself without a GPU.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from structbench import measure, optim
from structbench.optim import compile_check

STEPS = 3


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.wide = nn.Linear(64, 12)
        self.tall = nn.Linear(12, 20)
        self.head = nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).flatten(1)
        return self.head(F.relu(self.tall(F.relu(self.wide(h)))))


CPU = torch.device("cpu")


def toy_batch(step: int, dtype: torch.dtype = torch.float32, device: torch.device = CPU) -> tuple[torch.Tensor, ...]:
    """Inputs and labels of step `step`, drawn on `device` from that device's generator."""
    gen = torch.Generator(device=device).manual_seed(1000 + step)
    inputs = torch.randn(8, 2, 6, 6, generator=gen, device=device).to(dtype)
    return inputs, torch.randint(3, (8,), generator=gen, device=device)


def toy_model(dtype: torch.dtype = torch.float32, seed: int = 0, device: torch.device = CPU) -> ToyNet:
    """The toy model, initialised from `seed` on the CPU and moved to `device`."""
    torch.manual_seed(seed)
    with torch.device(CPU):
        model = ToyNet()
    return model.to(device=device, dtype=dtype)


def build(name: str, model: nn.Module) -> torch.optim.Optimizer:
    entry = optim.get(name)
    return optim.make_optimizer(name, model, **entry.check_hparams)


def loss_of(model: nn.Module, step: int) -> torch.Tensor:
    """The loss of step `step`'s batch, drawn on the model's device."""
    first = next(model.parameters())
    x, y = toy_batch(step, first.dtype, first.device)
    return F.cross_entropy(model(x).float(), y)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, step).backward()
        optimizer.step()


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [n for n in a if not torch.equal(a[n], b[n])]


class CheckFailed(AssertionError):
    pass


class CheckSkipped(Exception):
    """The check does not apply to this optimizer; the message says why (SKIP in `structbench check`, a pytest
    skip in the test suite)."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def check_roundtrip(name: str, dtype: torch.dtype, device: torch.device = CPU) -> None:
    model = toy_model(dtype, device=device)
    optimizer = build(name, model)
    train(model, optimizer, range(STEPS))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, buffer)
    train(model, optimizer, range(STEPS, 2 * STEPS))
    continued = params_of(model)

    buffer.seek(0)
    saved = load_weights_only(buffer)
    resumed = toy_model(dtype, seed=1, device=device)
    resumed.load_state_dict(saved["model"])
    optimizer2 = build(name, resumed)
    optimizer2.load_state_dict(saved["optim"])
    train(resumed, optimizer2, range(STEPS, 2 * STEPS))
    differing = identical(continued, params_of(resumed))
    expect(
        not differing,
        f"resume from state_dict is not bit-identical ({dtype}) for {differing}; structbench optimizers should "
        "subclass structbench.optim.base.StructuredOptimizer, whose load_state_dict keeps saved state dtypes",
    )


def load_weights_only(buffer: io.BytesIO) -> dict[str, Any]:
    """The saved state dicts, read as structbench reads a checkpoint (`torch.load(weights_only=True)`: tensors and
    plain data only); an optimizer whose state holds anything else could never resume from a checkpoint."""
    try:
        return torch.load(buffer, weights_only=True)
    except Exception as exc:
        raise CheckFailed(
            "state_dict does not load with torch.load(weights_only=True), as structbench's checkpoints are read: "
            f"keep only tensors and plain Python data (dicts, lists, tuples, numbers, strings, None) in the state "
            f"({type(exc).__name__})"
        ) from None


def check_roundtrip_float32(name: str, device: torch.device = CPU) -> None:
    check_roundtrip(name, torch.float32, device)


def check_roundtrip_bfloat16(name: str, device: torch.device = CPU) -> None:
    check_roundtrip(name, torch.bfloat16, device)


def check_closure(name: str, device: torch.device = CPU) -> None:
    model = toy_model(device=device)
    optimizer = build(name, model)
    before = params_of(model)
    calls = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, len(calls))
        loss.backward()
        calls.append(float(loss.detach()))
        return loss

    returned = [optimizer.step(closure) for _ in range(STEPS)]
    expect(len(calls) == STEPS, f"closure called {len(calls)} times in {STEPS} steps")
    expect(
        all(r is not None and float(r.detach()) == c for r, c in zip(returned, calls, strict=True)),
        "step(closure) must return the closure's loss",
    )
    expect(bool(identical(before, params_of(model))), "step(closure) changed no parameter")


def check_none_grads(name: str, device: torch.device = CPU) -> None:
    model = toy_model(device=device)
    optimizer = build(name, model)
    frozen = {"tall.weight", "conv.bias"}
    before = params_of(model)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, step).backward()
        for n, p in model.named_parameters():
            if n in frozen:
                p.grad = None
        optimizer.step()
    after = params_of(model)
    changed = set(identical(before, after))
    expect(not (changed & frozen), f"parameters without gradients changed: {sorted(changed & frozen)}")
    expect(
        changed == set(before) - frozen,
        f"parameters with gradients left unchanged: {sorted(set(before) - frozen - changed)}",
    )


def check_shapes_and_dtypes(name: str, device: torch.device = CPU) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        model = toy_model(dtype, device=device)
        optimizer = build(name, model)
        before = params_of(model)
        train(model, optimizer, range(STEPS))
        after = params_of(model)
        expect(all(torch.isfinite(p.float()).all() for p in after.values()), f"non-finite parameter ({dtype})")
        expect(all(after[n].dtype == dtype for n in after), f"parameter dtype changed ({dtype})")
        unchanged = sorted(set(before) - set(identical(before, after)))
        expect(not unchanged, f"1-D/2-D/4-D parameters left unchanged ({dtype}): {unchanged}")


def check_determinism(name: str, device: torch.device = CPU) -> None:
    runs = []
    for _ in range(2):
        model = toy_model(device=device)
        train(model, build(name, model), range(2 * STEPS))
        runs.append(params_of(model))
    differing = identical(*runs)
    expect(not differing, f"two identical runs on {device} differ in {differing}")


def check_routing(name: str, device: torch.device = CPU) -> None:
    model = toy_model(device=device)
    named = list(model.named_parameters())
    entry = optim.get(name)
    hparams = optim.resolve_hparams(name, entry.check_hparams)
    routing = entry.route(model, named, hparams)
    owned = list(routing.structured) + list(routing.fallback)
    expect(sorted(owned) == sorted(n for n, _ in named), f"routing does not cover every parameter once: {owned}")


def check_state_bytes(name: str, device: torch.device = CPU) -> None:
    entry = optim.get(name)
    if entry.state_bytes is None:
        raise CheckSkipped("no analytic state_bytes formula declared (a plugin may declare one: docs/plugins.md)")
    model = toy_model(device=device)
    optimizer, routing = optim.build_with_routing(name, model, entry.check_hparams)
    train(model, optimizer, range(STEPS))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    hparams = optim.resolve_hparams(name, entry.check_hparams)
    analytic = entry.state_bytes(
        [shapes[n] for n in routing.structured], [shapes[n] for n in routing.fallback], hparams
    )
    measured = measure.state_bytes(optimizer)
    expect(measured == analytic, f"measured state {measured} B != analytic {analytic} B")


def check_compile(name: str, device: torch.device = CPU) -> str:
    """Train the toy model with each optimizer part's step compiled (`compile_check`), and eagerly; every part must
    compile at least one graph (or declare its step eager) and the compiled run must match the eager one within
    `COMPILE_RTOL`. Returns what dynamo did, in one line; raises CheckSkipped where a part runs eagerly by declaration
    or the optimizer declares compilation unsupported."""
    entry = optim.get(name)
    if not entry.compile_supported:
        raise CheckSkipped(f"torch.compile declared unsupported: {entry.compile_unsupported_reason}")
    dtype = torch.float32
    record = compile_check.DynamoRecord()
    with compile_check.dynamo_session(record):
        model = toy_model(dtype, device=device)
        optimizer = build(name, model)
        parts = compile_check.optimizer_parts(optimizer, name)
        steps = compile_check.compiled_steps(parts, record)
        for step in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            loss_of(model, step).backward()
            for compiled_step in steps:
                compiled_step()
    eager = toy_model(dtype, device=device)
    train(eager, build(name, eager), range(STEPS))
    described = record.describe(list(parts))
    missing = record.uncompiled(list(parts))
    expect(not missing, f"no graph compiled for {', '.join(missing)}: dynamo ran it eagerly; {described}")
    rtol = compile_check.COMPILE_RTOL[dtype]
    compiled, expected = params_of(model), params_of(eager)
    far = {n: relative_gap(compiled[n], expected[n]) for n in expected}
    far = {n: gap for n, gap in far.items() if gap > rtol}
    expect(not far, f"compiled steps depart from eager beyond {rtol:g} ({dtype}): {far}; {described}")
    if record.eager:
        raise CheckSkipped(f"not all compiled: {described}")
    return described


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (absolute where b is zero)."""
    scale = float(b.abs().max()) or 1.0
    return float((a - b).abs().max()) / scale


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[str, torch.device], Any]
    description: str


CHECKS = (
    Check("routing", check_routing, "every parameter routed exactly once"),
    Check("shapes-dtypes", check_shapes_and_dtypes, "1-D, 2-D and 4-D parameters train in float32 and bfloat16"),
    Check("none-grads", check_none_grads, "parameters without gradients are skipped"),
    Check("closure", check_closure, "step(closure) calls it once and returns its loss"),
    Check("determinism", check_determinism, "identical runs on the device are bit-identical"),
    Check("roundtrip-fp32", check_roundtrip_float32, "state_dict resume continues bit-identically (float32)"),
    Check("roundtrip-bf16", check_roundtrip_bfloat16, "state_dict resume continues bit-identically (bfloat16)"),
    Check("state-bytes", check_state_bytes, "measured state bytes equal the analytic formula"),
    Check("compile", check_compile, "each optimizer part's step compiles to graphs and matches eager (float32)"),
)


Outcome = Literal["pass", "skip", "fail"]


@dataclass(frozen=True)
class CheckResult:
    optim: str
    check: str
    outcome: Outcome
    message: str

    @property
    def passed(self) -> bool:
        return self.outcome != "fail"


def check_names() -> list[str]:
    return [check.name for check in CHECKS]


def run_checks(name: str, only: Sequence[str] = (), device: torch.device = CPU) -> list[CheckResult]:
    """Every check (or those named in `only`) for optimizer `name` on `device`; a failure's message says what went
    wrong, a skip's why it does not apply, a pass's what it found where it has something to say."""
    optim.get(name)
    results = []
    for check in CHECKS:
        if only and check.name not in only:
            continue
        try:
            found = check.run(name, device)
        except CheckSkipped as exc:
            results.append(CheckResult(name, check.name, "skip", str(exc)))
        except Exception as exc:  # a check reports any failure, including crashes of the optimizer
            message = str(exc) if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: {exc}"
            results.append(CheckResult(name, check.name, "fail", message.splitlines()[0] if message else ""))
        else:
            results.append(CheckResult(name, check.name, "pass", found if isinstance(found, str) else ""))
    return results

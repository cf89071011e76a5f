"""Compile an optimizer's step with torch.compile for real, and say what dynamo did with it.

Each part of an optimizer (the structured method, its fallback) has its `step` compiled on its own, through a
backend that counts the graphs dynamo hands it; dynamo is reset first, so that earlier optimizers' compiled code and
recompilation counts cannot make it give up on this one (its recompile limit, 8 per code object, once made every
optimizer after the eighth run eagerly while the check still passed). A part that yields no graph ran eagerly: that
fails the check unless the part declares it, by wrapping its step in `torch.compiler.disable`.

Dynamo's log records and Python warnings during compilation are collected, not printed, and summarised in one line.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from structbench.optim.hybrid import HybridOptimizer

COMPILE_RTOL: dict[torch.dtype, float] = {torch.float32: 1e-4}
"""How far, relative to each tensor's largest entry, a parameter trained by compiled steps may lie from the same
training run eagerly, per parameter dtype.

float32: the "eager" backend runs the captured graph with the very ATen kernels eager mode calls, so the two runs
differ only where dynamo computes a value another way: a Python float becomes a float32 0-d tensor, or a constant is
folded. Each such difference is one float32 rounding (2^-24 ~ 6e-8 relative); a few steps through eigendecompositions,
Newton-Schulz iterations and Adam's division by sqrt(v) amplify it by the toy problem's condition numbers (below
1e3). 1e-4 (about 1700 float32 ulps) covers that, and is far below any change of the algorithm: a skipped,
doubled or sign-flipped update moves parameters by a whole step (lr ~ 1e-3 to 1e-2, relative 1e-2 and more).

bfloat16 is not compared: there the same rounding differences are 2^-8 ~ 4e-3 relative each (torch's AdamW, for
one, computes its step size as a Python float eagerly and as a bfloat16 tensor under dynamo), and orthogonalising
methods amplify them to whole steps (measured: 11% of a parameter's scale for sumo-ns5 after 3 steps, with its own
step eager and only the AdamW fallback compiled), so no tolerance separates a correct compiled step from a wrong one.
"""


@dataclass
class DynamoRecord:
    """What dynamo did with one optimizer's compiled steps."""

    graphs: Counter[str] = field(default_factory=Counter)
    """Graphs compiled, per optimizer part."""
    eager: dict[str, str] = field(default_factory=dict)
    """Parts whose step declares itself eager under torch.compile, with the declaration."""
    graph_breaks: int = 0
    messages: list[str] = field(default_factory=list)
    """Dynamo's log records and warnings, first line of each."""

    def uncompiled(self, parts: list[str]) -> list[str]:
        """Parts that compiled no graph although they did not declare themselves eager."""
        return [part for part in parts if self.graphs[part] == 0 and part not in self.eager]

    def describe(self, parts: list[str]) -> str:
        compiled = ", ".join(f"{part} {self.graphs[part]}" for part in parts if part not in self.eager)
        eager = "".join(f"; eager by declaration: {part} ({why})" for part, why in self.eager.items())
        return f"compiled frames: {compiled or 'none'}{eager}; graph breaks: {self.graph_breaks}; {self.summary()}"

    def summary(self) -> str:
        """Dynamo's messages in one line: how many, and the commonest few, each with its count."""
        if not self.messages:
            return "dynamo: no warnings"
        common = Counter(self.messages).most_common(2)
        shown = "; ".join(f"{count}x {shorten(message, 70)}" for message, count in common)
        more = len(set(self.messages)) - len(common)
        return f"dynamo: {len(self.messages)} warnings ({shown}{f'; {more} other kinds' if more > 0 else ''})"


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def optimizer_parts(optimizer: torch.optim.Optimizer, name: str) -> dict[str, torch.optim.Optimizer]:
    """The optimizers that step separately: a hybrid's structured method and fallback, else the optimizer itself."""
    return dict(optimizer.parts) if isinstance(optimizer, HybridOptimizer) else {name: optimizer}


def eager_declaration(part: torch.optim.Optimizer) -> str | None:
    """How `part` declares its step eager under torch.compile (an `EagerStructuredOptimizer`, or a step wrapped in
    `torch.compiler.disable`), or None."""
    if getattr(type(part), "eager_step", False):
        return f"{type(part).__name__}.step runs eagerly under torch.compile (EagerStructuredOptimizer)"
    if getattr(type(part).step, "_torchdynamo_disable", False):
        return f"{type(part).__name__}.step is wrapped in torch.compiler.disable"
    return None


def compiled_steps(parts: dict[str, torch.optim.Optimizer], record: DynamoRecord) -> list[Callable[[], None]]:
    """One compiled `step` per part, each through a backend that counts its graphs in `record`."""

    def compiled(part_name: str, part: torch.optim.Optimizer) -> Callable[[], None]:
        def counting_backend(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
            record.graphs[part_name] += 1
            return graph.forward

        def step() -> None:
            part.step()

        return torch.compile(step, backend=counting_backend)

    for part_name, part in parts.items():
        declared = eager_declaration(part)
        if declared:
            record.eager[part_name] = declared
    return [compiled(part_name, part) for part_name, part in parts.items()]


class _Collector(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(first_line(record.getMessage()))


def first_line(text: str) -> str:
    """A message's first line; for dynamo's recompile-limit warning also the function it names (its second line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[1].startswith("function:"):
        function = re.sub(r"\(\S*/", "(", lines[1].removeprefix("function:").strip())
        return f"{lines[0]} in {function}"
    return lines[0] if lines else ""


@contextmanager
def dynamo_session(record: DynamoRecord) -> Iterator[None]:
    """Reset dynamo, collect torch's log records (WARNING and above) and Python warnings into `record.messages`
    instead of printing them, and count graph breaks into `record.graph_breaks`."""
    torch._dynamo.reset()
    counters.clear()
    collector = _Collector(record.messages)
    torch_loggers = [
        logging.getLogger(name)
        for name in list(logging.Logger.manager.loggerDict)
        if name == "torch" or name.startswith("torch.")
    ]
    saved = {log: log.handlers[:] for log in torch_loggers if log.handlers}
    for log in saved:
        log.handlers = [collector]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", DeprecationWarning)  # modules dynamo imports on first use; not about us
            yield
        record.messages.extend(first_line(str(w.message)) for w in caught)
        record.graph_breaks = sum(counters["graph_break"].values())
    finally:
        for log, handlers in saved.items():
            log.handlers = handlers
        torch._dynamo.reset()

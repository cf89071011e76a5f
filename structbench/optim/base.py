"""The base class of structbench's own optimizers.

`torch.optim.Optimizer.load_state_dict` casts every floating-point parameter's state tensors to the
parameter's dtype (uint8 codes and float32 preconditioners included). Structured optimizers keep
statistics in float32 — and packed codes in uint8 — whatever the parameter dtype, so that cast would
silently change them on resume. `StructuredOptimizer.load_state_dict` restores each state tensor with
the dtype it was saved with, so a resumed run continues bit-identically.

A failed solve (SVD, eigendecomposition, inverse root) is survivable: the matrix keeps its previous basis or root,
or its step falls back to a cheaper method. `StructuredOptimizer.solver_failed` and `solver_ok` keep the one policy
every optimizer follows: each failure adds to the run's `solver_failures`, and the
`MAX_CONSECUTIVE_SOLVER_FAILURES`-th failure in a row of one matrix ends the run with `SolverError`. A streak kept
in optimizer state (a Python int or a CPU int64 tensor under the optimizer's own key) is resumed with it.
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable, Hashable, Iterable, MutableMapping
from typing import Any, ClassVar

import torch

from structbench.errors import SolverError
from structbench.optim import distributed
from structbench.optim.hparams import Declaration, option, ours

BATCH_MODES = ("auto", "on", "off")
"""How an optimizer runs its same-shape matrices: stacked into batched solves and matmuls ("on"), one at a time
("off"), or "auto": stacked on CUDA, one at a time elsewhere. On CPU, stacking measured slower than the loop at GPT-2
and ResNet-18 sizes (benchmarks/optim_step.py: Muon up to 1.5x, SOAP up to 1.5x): the matmuls are compute-bound
either way, and the stacks are large fresh allocations copied in and out on every step."""

BATCH_MATRICES = Declaration(
    option("batch_matrices", "auto", BATCH_MODES, ours("stack same-shape matrices on CUDA only: same algorithm"))
)


MAX_CONSECUTIVE_SOLVER_FAILURES = 3
"""Failures in a row of one matrix's solver after which the run ends with `SolverError` (`solver_error`)."""

Streaks = MutableMapping[Any, Any]
"""Where consecutive failures are counted: a parameter's state (keyed by a state name) or an optimizer's own dict
(keyed by parameter); each count is a Python int or an int64 tensor updated in place."""


def stacks_matrices(mode: str, device: torch.device) -> bool:
    """Whether same-shape matrices on `device` are stacked under batch mode `mode` (one of BATCH_MODES)."""
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def gather(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Same-shape tensors as one (B, ...) batch: a view of a lone tensor, else a stacked copy."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


def _declared_signature(init: Callable[..., None], declared: Declaration) -> inspect.Signature:
    """The signature of a constructor `init` whose `**hparams` are the hyperparameters `declared`: its arguments after
    `self` but the `**` one, then each hyperparameter as a keyword-only argument with its type and default."""
    own = [
        param
        for name, param in inspect.signature(init).parameters.items()
        if name != "self" and param.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    keywords = [
        inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=field.kind)
        for field in declared
    ]
    return inspect.Signature([*own, *keywords])


class StructuredOptimizer(torch.optim.Optimizer):
    """An optimizer whose constructor takes exactly the hyperparameters its class declares in `hparams`.

    The keywords given are the defaults of its param groups (the declaration's defaults fill the rest); every
    param group's values are checked against the declaration when the group is added.
    """

    hparams: ClassVar[Declaration]
    solver_failures: int = 0
    matrices_only: ClassVar[str | None] = None
    """The optimizer's name, when it owns only matrices: a 1-D parameter is then a ValueError naming it."""
    cpu_state_keys: ClassVar[tuple[str, ...]] = ()
    """State entries (host-side counters) that stay on the CPU when state is loaded, whatever the param's device."""

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], **hparams: Any) -> None:
        super().__init__(params, self.hparams.resolve(hparams))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give a class that declares `hparams` the signature of its constructor as called: its own arguments, then
        each declared hyperparameter as a keyword with its type and default (`inspect.signature`, `help`)."""
        super().__init_subclass__(**kwargs)
        declared = getattr(cls, "hparams", None)
        if isinstance(declared, Declaration):
            cls.__signature__ = _declared_signature(cls.__init__, declared)

    def solver_failed(
        self,
        streaks: Streaks,
        key: Hashable,
        describe: Callable[[int], str] | None,
        *,
        failures: int = 1,
    ) -> None:
        """Count a failed solve: `failures` more in the run's `solver_failures` (0 where the optimizer counts them
        elsewhere) and one more in the streak `streaks[key]` (an absent one starts at 0).

        A streak reaching MAX_CONSECUTIVE_SOLVER_FAILURES raises SolverError(describe(streak)); with `describe`
        None the caller checks the step's streaks together afterwards (`end_on_solver_streaks`).
        """
        self.solver_failures += failures
        streak = streaks.get(key, 0)
        if isinstance(streak, torch.Tensor):
            streak.add_(1)
        else:
            streaks[key] = streak + 1
        if describe is not None:
            self.end_on_solver_streaks([streaks], key, describe)

    @staticmethod
    def solver_ok(streaks: Streaks, key: Hashable, *, forget: bool = False) -> None:
        """A successful solve ends the streak `streaks[key]`: zeroed (a tensor in place), or removed with `forget`
        (a streak stored only while it runs)."""
        if forget:
            streaks.pop(key, None)
        elif isinstance(streaks.get(key), torch.Tensor):
            streaks[key].zero_()
        else:
            streaks[key] = 0

    @staticmethod
    def end_on_solver_streaks(every: Iterable[Streaks], key: Hashable, describe: Callable[[int], str]) -> None:
        """Raise SolverError(describe(streak)) for the first of `every` whose streak `key` has reached
        MAX_CONSECUTIVE_SOLVER_FAILURES."""
        for streaks in every:
            streak = int(streaks.get(key, 0))
            if streak >= MAX_CONSECUTIVE_SOLVER_FAILURES:
                raise SolverError(describe(streak))

    def check_group(self, group: dict[str, Any]) -> None:
        """Check what the declaration cannot (a relation between hyperparameters, the parameters' shapes); raise
        ValueError to reject the group."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            self.hparams.check(group)
            self.check_group(group)
            for param in group["params"] if self.matrices_only else ():
                if param.ndim < 2:
                    raise ValueError(
                        f"{self.matrices_only} takes matrices (2-D, or conv filters); got a {param.ndim}-D parameter "
                        f"of shape {tuple(param.shape)}: route it to the fallback optimizer (make_optimizer does this)"
                    )
        except ValueError:
            self.param_groups.pop()
            raise

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Evaluate the closure (with gradients enabled), then update each param group."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            distributed.step_group(self.step_group, group)
        return loss

    def step_group(self, group: dict[str, Any]) -> None:
        """Update one param group; optimizers that use the shared `step` define it."""
        raise TypeError(f"{type(self).__name__} defines neither step nor step_group")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = copy.deepcopy(state_dict)
        super().load_state_dict(state_dict)
        params = {
            saved_id: param
            for saved_group, group in zip(saved["param_groups"], self.param_groups, strict=True)
            for saved_id, param in zip(saved_group["params"], group["params"], strict=True)
        }
        for saved_id, values in saved["state"].items():
            param = params[saved_id]
            self.state[param] = {
                key: value.to(device="cpu" if key in self.cpu_state_keys else param.device)
                if isinstance(value, torch.Tensor)
                else value
                for key, value in values.items()
            }


_DISABLED: dict[Callable[..., Any], Callable[..., Any]] = {}
"""`torch.compiler.disable(function)` per function, made once torch's compiler machinery is loaded."""


def eager(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)`, run eagerly (through `torch.compiler.disable`) when torch.compile is tracing the caller.

    Outside tracing the call is direct: importing an optimizer module does not import torch's compiler machinery
    (`torch._dynamo`, about 2 s on 2 cores), as a `torch.compiler.disable` decorator would, so commands that only
    read the registry (`structbench list optims`) do not pay for it. (torch.optim itself imports it when the first
    optimizer is built.) Once it is loaded the disabled form is made outside tracing, so dynamo meets a ready
    `disable`d function."""
    if torch.compiler.is_compiling():
        disabled = _DISABLED.get(function)
        return (disabled or torch.compiler.disable(function))(*args)
    if function not in _DISABLED and "torch._dynamo" in sys.modules:
        _DISABLED[function] = torch.compiler.disable(function)
    return function(*args)


class EagerStructuredOptimizer(StructuredOptimizer):
    """A `StructuredOptimizer` whose step runs eagerly inside a compiled training step (`eager`): for steps whose
    solver fallbacks, refresh schedules and Python-int counters are data-dependent control flow."""

    eager_step: ClassVar[bool] = True

    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        return eager(StructuredOptimizer.step, self, closure)

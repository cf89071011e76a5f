"""The grid of a `run` command: every (suite spec, optimizer, seed) cell with its run key.

A run key is a content hash of what determines a run's result: the effective spec after overrides (suite name,
task, task arguments, budget, schedule, target), the optimizer's name with its fully resolved hyperparameters, the
seed and the device kind. The suite file's path is left out (the same suite run by name or by path is one run), and
so are the executor, the store, how often the run is checkpointed and where its hyperparameters came from (the same
values are the same run). A store holds at most one run with a final
status per key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from structbench.execution.job import Job
    from structbench.execution.slurm import SlurmOptions
    from structbench.plan.spec import SuiteSpec

KEY_LENGTH = 20


NOT_KEYED_SPEC = ("source", "hparams_source")
"""Spec fields left out of the run key: where the suite file is, and where the hyperparameters came from."""
NOT_KEYED_BUDGET = ("checkpoint_every", "warmup_steps", "empty_cache")
"""Budget fields that do not change a run's result (a run resumed from a checkpoint ends bit-identical; the warm-up's
steps are undone before the run starts; the allocator's cache holds no values)."""


def run_key(suite: SuiteSpec, optim_name: str, seed: int, device_kind: str, world_size: int = 1) -> str:
    """The run's key; a run of several processes (torch.distributed) adds its world size, and a single-process run
    leaves out the `distributed` switch, which only acts across processes."""
    spec = {k: v for k, v in suite.run_spec(optim_name, seed).items() if k not in NOT_KEYED_SPEC}
    spec["budget"] = {k: v for k, v in spec["budget"].items() if k not in NOT_KEYED_BUDGET}
    placement: dict[str, Any] = {"device_kind": device_kind}
    if world_size > 1:
        placement["world_size"] = world_size
    else:
        spec["hparams"] = {k: v for k, v in spec["hparams"].items() if k != "distributed"}
    payload = json.dumps({**spec, **placement}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:KEY_LENGTH]


@dataclass(frozen=True)
class Cell:
    """One run of a grid."""

    suite: SuiteSpec
    optim: str
    seed: int
    key: str
    setting: str
    """The swept hyperparameters that tell this cell's setting apart ("" when the optimizer has one setting)."""

    @property
    def label(self) -> str:
        setting = f" {self.setting}" if self.setting else ""
        return f"{self.suite.name} {self.optim}{setting} seed={self.seed}"


def build_grid(suites: list[SuiteSpec], device_kind: str, world_size: int = 1) -> list[Cell]:
    """The cells of these specs in order (optimizer, setting, seed), each key once."""
    settings = _distinguishing_settings(suites)
    cells: dict[str, Cell] = {}
    for suite in suites:
        for optim_name in suite.optims:
            for seed in suite.seeds:
                key = run_key(suite, optim_name, seed, device_kind, world_size)
                label = settings.get((suite.name, optim_name, json.dumps(_config(suite, optim_name), sort_keys=True)))
                cells.setdefault(key, Cell(suite, optim_name, seed, key, label or ""))
    return list(cells.values())


def _config(suite: SuiteSpec, optim_name: str) -> dict[str, Any]:
    spec = suite.run_spec(optim_name, 0)
    return {
        **{f"hparams.{optim_name}.{k}": v for k, v in spec["hparams"].items()},
        **{f"{section}.{k}": v for section in ("task_args", "budget", "schedule") for k, v in spec[section].items()},
    }


def _distinguishing_settings(suites: list[SuiteSpec]) -> dict[tuple[str, str, str], str]:
    """For each (suite, optimizer, configuration): the fields whose values differ between that pair's settings."""
    configs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for suite in suites:
        for optim_name in suite.optims:
            config = _config(suite, optim_name)
            configs.setdefault((suite.name, optim_name), {})[json.dumps(config, sort_keys=True)] = config
    labels = {}
    for (suite_name, optim_name), by_json in configs.items():
        variants = list(by_json.values())
        differing = [k for k in variants[0] if any(v.get(k) != variants[0].get(k) for v in variants)]
        for text, config in by_json.items():
            short = {k.split(".")[-1] if k.startswith("hparams.") else k: config[k] for k in differing}
            labels[(suite_name, optim_name, text)] = " ".join(f"{k}={v}" for k, v in short.items())
    return labels


@dataclass(frozen=True)
class Request:
    """What a `run` command asks for, as its options give it."""

    suite: str
    optims: Sequence[str] = ()
    seeds: Sequence[int] = ()
    steps: int | None = None
    overrides: Sequence[str] = ()
    sweep: bool = False
    search: str | None = None
    rerun: bool = False
    dry_run: bool = False
    executor: str = "inline"
    jobs: int | None = None
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """The `--slurm-*` values given (None, or [] for `extra`, where not), by SlurmOptions field."""
    wait: bool = False
    nproc_per_node: int | None = None
    nnodes: int | None = None
    device: str = "auto"
    out: Path = Path("results")
    data_dir: Path | None = None
    optim_aliases: Sequence[str] = ()


@dataclass(frozen=True)
class Plan:
    """A grid resolved for its executor: every cell, those the store holds already, and a job for each to run."""

    request: Request
    suites: list[SuiteSpec]
    checks: dict[str, Any]
    cells: list[Cell]
    cached: dict[str, str]
    """Run key -> run id of the final runs the store holds."""
    todo: list[Cell]
    jobs: list[Job]
    workers: int
    world_size: int
    device_kind: str
    slurm: SlurmOptions | None

    @property
    def planned(self) -> int:
        """The runs this grid stores when it runs to the end: its jobs and the numerical experiments' seeds."""
        return len(self.jobs) + sum(len(s.seeds) for s in self.suites if s.experiment is not None)


class Notes(Protocol):
    """Where planning says what it did and what looks wrong."""

    def note(self, text: str) -> None: ...

    def warning(self, text: str) -> None: ...


def plan(request: Request, notes: Notes) -> Plan:
    """Check the request, resolve its suites (`--steps` shortening included), run the tasks' preflight checks, and
    build the grid, its cache lookup in the store and the job of each run to do."""
    from structbench.execution import session

    world_size = session.check_request(request)  # first: local workers' server imports torch while this does
    from structbench.data.root import resolve_data_root
    from structbench.optim import plugins
    from structbench.plan import spec, suite_lookup
    from structbench.plan import sweep as sweeps
    from structbench.store import write as store

    plugins.parse_aliases(list(request.optim_aliases))
    suites, checks = spec.load_suites(
        request.suite,
        list(request.overrides),
        list(request.optims),
        list(request.seeds),
        request.sweep,
        sweeps.parse_search(request.search),
        request.steps,
    )
    for note in [*suite_lookup.notes(request.suite), *dict.fromkeys(s.budget_note for s in suites if s.budget_note)]:
        notes.note(note)
    slurm = session.slurm_placement(request, notes)
    device_kind = session.resolve_device_kind(request.device, slurm)
    if request.nproc_per_node is not None:
        session.check_distributed_suites(suites, world_size, request.nproc_per_node, device_kind, request.executor)
    data_root = resolve_data_root(request.data_dir)
    _preflight(suites, data_root)
    cells = build_grid([s for s in suites if s.experiment is None], device_kind, world_size)
    cached = store.final_run_keys(request.out) if request.out.is_dir() else {}
    todo = cells if request.rerun else [c for c in cells if c.key not in cached]
    workers, jobs = session.jobs_for(request, todo, cached, device_kind, data_root, slurm)
    return Plan(request, suites, checks, cells, cached, todo, jobs, workers, world_size, device_kind, slurm)


def _preflight(suites: list[SuiteSpec], data_root: Path) -> None:
    """Each task's check that its data are on disk, before anything runs."""
    from structbench.tasks import get_task

    for suite in suites:
        if suite.experiment is None:
            task_def = get_task(suite.task)
            if task_def.preflight is not None:
                budget = suite.budget
                task_def.preflight(suite.task_args, data_root, budget["batch_size"] // budget["grad_accum"])

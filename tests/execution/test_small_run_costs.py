"""What a grid of small runs pays once, not per run: the garbage collector's walk of torch's heap (what exists before a
run is frozen out of it while the run's memory probe collects, and given back after) and the git and package-metadata
lookups of the provenance columns (once per process)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from structbench import environment, measure
from structbench.execution.job import Job, run_job
from structbench.plan import grid, spec
from structbench.store import write as store


def quadratic_job(out: Path, seed: int = 0) -> Job:
    suites, _ = spec.load_suites("quadratic", ["budget.steps=3"], ["sgd"], [seed])
    store.prepare(out)
    cell = grid.build_grid(suites, "cpu")[0]
    return Job(cell=cell, device="cpu", data_root=str(out), out=str(out), executor="inline", parallel_runs=1, threads=1)


def test_a_runs_memory_probe_collects_with_what_existed_before_frozen_and_gives_it_back(tmp_path, monkeypatch):
    frozen_at_collection: list[int] = []
    original = measure.MemoryProbe.reset

    def spying_reset(self: measure.MemoryProbe, empty_cache: bool = False) -> None:
        frozen_at_collection.append(gc.get_freeze_count())
        original(self, empty_cache)

    monkeypatch.setattr(measure.MemoryProbe, "reset", spying_reset)
    before = gc.get_freeze_count()
    row = run_job(quadratic_job(tmp_path))
    assert row["status"] == "ok"
    assert len(frozen_at_collection) == 1 and frozen_at_collection[0] > before, "torch's heap frozen during the run"
    assert gc.get_freeze_count() == before, "what the run froze is given back"


def test_git_and_package_versions_are_read_once_per_process(monkeypatch):
    calls: list[tuple[str, ...]] = []
    original = environment._git

    def counting_git(root: Path, *args: str) -> str | None:
        calls.append(args)
        return original(root, *args)

    monkeypatch.setattr(environment, "_git", counting_git)
    environment.code_facts.cache_clear()
    first, second = environment.facts(), environment.facts()
    assert first == second
    assert len(calls) == (2 if environment.checkout_root() is not None else 0)  # rev-parse and status, once


def test_importing_the_optimizers_does_not_import_torchs_compiler():
    """`list`, `check` and planning import every optimizer module; an eager step (`structbench.optim.base.eager`)
    must not bring torch._dynamo with it (about 2 s), as a `torch.compiler.disable` decorator would."""
    code = "import sys, structbench.optim; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"

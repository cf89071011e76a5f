"""The checks of structbench's CUDA paths that only a GPU can run, in one invocation, as a pass/fail table.

    python benchmarks/gpu_check.py [--steps 20]

In order:
1. the CUDA-only tests (`pytest -k cuda`);
2. a sync audit of the steady-state training step (task and optimizer): `torch.cuda.set_sync_debug_mode("warn")`
   over runs of `--steps` and 2 x `--steps` steps of `shakespeare-llama` (AdamW) and of `digits` with each of
   `AUDITED_OPTIMIZERS` (refresh intervals set past the run, log points only at the ends, no evaluation inside);
   every synchronising call is attributed to the Python line that made it, and what the longer run's extra steps
   add must come only from the runner's own log-point code (structbench/execution/runner.py,
   structbench/execution/loop.py, structbench/measure.py): a sync in a task or an optimizer step is a host sync per
   step;
3. the run-order check: the same run twice in a fresh process (this one has run other checks); the first run's first
   step within 2x the second's plus 5 ms, and the one-off setup (`setup_s`) only in the first;
4. the conformance kit on CUDA (`conformance.run_checks(..., device=cuda)`: the model and every batch on the GPU,
   drawn from its generator; torch's default device left as it is) for the seed optimizers;
5. recompilation: `shakespeare-llama` with `task_args.compile="on"` under `TORCH_LOGS=recompiles`: no recompilation
   after the first compiled step;
6. an injected device-side error (a label out of range in the digits task's first batch of seed 0, by a
   `sitecustomize` put first on `PYTHONPATH`, the checkout and the caller's path after it): the injection proves it
   fired (a marker file), the run is stored `error` with CUDA's message, structbench's own error output is one line
   (`error: ...`; CUDA's assertion lines are not structbench's and are not counted), and the next command in a new
   process runs the rest cleanly.
Without CUDA it prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
ALLOWED_SYNC_FILES = ("structbench/execution/runner.py", "structbench/execution/loop.py", "structbench/measure.py")
CONFORMANCE_OPTIMIZERS = (
    "adamw", "muon", "shampoo-4bit", "soap", "asgo", "alice", "fismo", "sumo", "apollo-mini", "fira", "racs",
)  # fmt: skip


def structbench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "structbench", *args], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )


def cuda_tests() -> tuple[bool, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-k", "cuda", "tests"], capture_output=True, text=True, cwd=ROOT
    )
    return done.returncode == 0, (done.stdout.strip().splitlines() or ["no output"])[-1]


AUDITED_OPTIMIZERS = ("adamw", "muon", "soap", "asgo", "sumo", "fismo", "apollo-mini", "shampoo-4bit")
"""The optimizers whose steady-state training step the sync audit runs on CUDA (on `digits`)."""


def audit_overrides(optim_name: str, steps: int) -> list[str]:
    """A sync-audit run's settings: `steps` steps, one log point at the end, no evaluation, and the optimizer's refresh
    interval (if it has one) past the run."""
    from structbench import optim

    overrides = [f"budget.steps={steps}", "budget.epochs=0", "budget.eval_every=0", f"budget.log_every={steps}"]
    interval = optim.get(optim_name).refresh_interval
    if interval is not None:
        overrides.append(f"hparams.{optim_name}.{interval}={10 * steps}")
    return overrides


def _sync_sites(suite: str, optim_name: str, steps: int) -> Counter[str] | str:
    """Synchronising calls of one `steps`-step CUDA run, by the structbench line that made them (CUDA's sync debug
    mode); a run that did not end ok gives its error instead. An optimizer with a refresh interval runs with it past
    the run (so that only its steady state follows its first step)."""
    from structbench.data.root import resolve_data_root
    from structbench.execution.job import Job, run_job
    from structbench.plan import grid, spec
    from structbench.store import write as store

    suites, _ = spec.load_suites(suite, audit_overrides(optim_name, steps), [optim_name], [0])
    cell = grid.build_grid(suites, "cuda")[0]
    out = Path(tempfile.mkdtemp())
    store.prepare(out)
    job = Job(cell=cell, device="cuda", data_root=str(resolve_data_root(None)), out=str(out), executor="inline",
              parallel_runs=1, threads=None)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            row = run_job(job)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    if row["status"] != "ok":
        return f"{suite} {optim_name}: the run ended {row['status']}: {(row['error'] or '').splitlines()[-1:]}"
    return Counter(
        f"{Path(w.filename).as_posix().split('structbench/', 1)[-1]}:{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message).lower()
    )


def steady_state_syncs(short: Counter[str], long: Counter[str]) -> dict[str, int]:
    """The syncs the longer run's extra steps made, per site, outside the runner's own files (its log points and
    evaluations may synchronise): long - short, sites with no extra left out. What happens once (setup, the first
    step, the first refresh) is in both runs and cancels."""
    extra = long - short
    return {site: n for site, n in extra.items() if not any(f in f"structbench/{site}" for f in ALLOWED_SYNC_FILES)}


def sync_audit(steps: int) -> tuple[bool, str]:
    """Each audited (suite, optimizer) run for `steps` and for 2 x `steps` steps: the extra steps must make no
    synchronising call outside the runner (a task's or an optimizer's steady-state step has none)."""
    found: dict[str, dict[str, int]] = {}
    audited = [("shakespeare-llama", "adamw"), *(("digits", name) for name in AUDITED_OPTIMIZERS)]
    for suite, optim_name in audited:
        short, long = _sync_sites(suite, optim_name, steps), _sync_sites(suite, optim_name, 2 * steps)
        if isinstance(short, str) or isinstance(long, str):
            return False, short if isinstance(short, str) else str(long)
        extra = steady_state_syncs(short, long)
        if extra:
            found[f"{suite} {optim_name}"] = extra
    detail = "; ".join(
        f"{run}: " + ", ".join(f"{site} x{n} per {steps} steps" for site, n in sorted(sites.items()))
        for run, sites in found.items()
    )
    return not found, detail or f"{len(audited)} runs: no synchronisation in a steady-state step outside the runner"


def run_order_rows(device: str) -> list[dict[str, float]]:
    """The same 50-step quadratic AdamW run twice in this process: each run's first step, wall and one-off setup."""
    from structbench.execution.job import Job, run_job
    from structbench.plan import grid, spec
    from structbench.store import write as store

    suites, _ = spec.load_suites("quadratic", ["budget.steps=50"], ["adamw"], [0])
    cell = grid.build_grid(suites, device)[0]
    rows = []
    for _ in range(2):
        out = Path(tempfile.mkdtemp())
        store.prepare(out)
        row = run_job(Job(cell=cell, device=device, data_root=str(out), out=str(out), executor="inline",
                          parallel_runs=1, threads=None))  # fmt: skip
        rows.append({key: float(row[key]) for key in ("compile_s", "wall_s", "setup_s")})
    return rows


def run_order(device: str = "cuda") -> tuple[bool, str]:
    """`run_order_rows` in a fresh process (this one has run other checks: its first run would not be a first)."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--run-order-child", device],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return False, f"the fresh process failed (exit {done.returncode}): {last}"
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    ok = first["compile_s"] <= 2 * second["compile_s"] + 5e-3 and second["setup_s"] == 0
    return ok, (
        f"in a fresh process: first step {first['compile_s'] * 1e3:.2f} ms vs {second['compile_s'] * 1e3:.2f} ms, wall "
        f"{first['wall_s'] * 1e3:.1f} vs {second['wall_s'] * 1e3:.1f} ms, setup {first['setup_s'] * 1e3:.1f} ms once"
    )


def conformance_on_cuda() -> tuple[bool, str]:
    from structbench.optim import conformance

    failed = []
    device = torch.device("cuda")
    for name in CONFORMANCE_OPTIMIZERS:
        results = conformance.run_checks(name, device=device)
        failed += [f"{name}/{r.check}: {r.message}" for r in results if not r.passed]
    return not failed, "; ".join(failed) or f"{len(CONFORMANCE_OPTIMIZERS)} optimizers, every check passed"


def recompilation() -> tuple[bool, str]:
    out = tempfile.mkdtemp()
    done = structbench(
        "run", "--suite", "shakespeare-llama", "--optim", "adamw", "--steps", "30", "--set", 'task_args.compile="on"',
        "--out", out, "--quiet", env={**os.environ, "TORCH_LOGS": "recompiles"},
    )  # fmt: skip
    recompiles = [line for line in done.stderr.splitlines() if "Recompiling" in line]
    if done.returncode != 0:
        return False, f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}"
    return not recompiles, f"{len(recompiles)} recompilation(s)" + (f": {recompiles[0]}" if recompiles else "")


INJECT_BAD_LABEL = textwrap.dedent(
    """
    from structbench.tasks.vision import task

    import os
    from pathlib import Path

    draw = task.ImageClassificationTask.next_batch
    fired = []

    def bad_batch(self):
        inputs, labels = draw(self)
        if not fired:
            fired.append(1)
            Path(os.environ["STRUCTBENCH_GPU_CHECK_MARKER"]).write_text("fired")
            labels = labels.clone()
            labels[0] = 10_000  # out of range: cross entropy's device-side assert
        return inputs, labels

    task.ImageClassificationTask.next_batch = bad_batch
    """
)


def device_side_error() -> tuple[bool, str]:
    site = Path(tempfile.mkdtemp())
    (site / "sitecustomize.py").write_text(INJECT_BAD_LABEL)
    out = tempfile.mkdtemp()
    args = ("run", "--suite", "digits", "--optim", "adamw", "--seed", "0", "--seed", "1", "--steps", "20", "--out", out,
            "--quiet")  # fmt: skip
    marker = site / "fired"
    path = os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    faulty = structbench(*args, env={**os.environ, "PYTHONPATH": path, "STRUCTBENCH_GPU_CHECK_MARKER": str(marker)})
    if not marker.exists():
        return False, f"the injected fault never fired (exit {faulty.returncode}): the check did not test anything"
    ours = [line for line in faulty.stderr.strip().splitlines() if line.startswith("error: ")]
    runs = pd.read_parquet(Path(out) / "runs") if (Path(out) / "runs").is_dir() else pd.DataFrame()
    stored = len(runs) == 1 and runs.status.iloc[0] == "error" and "CUDA" in runs.error.iloc[0]
    one_line = faulty.returncode == 1 and len(ours) == 1 and "unusable in this process" in ours[0]
    clean = structbench(*args)
    final = pd.read_parquet(Path(out) / "runs")
    rest_ok = clean.returncode == 0 and sorted(final.query("status == 'ok'").seed) == [0, 1]
    return stored and one_line and rest_ok, (
        f"fault fired; stored as error with CUDA's message: {stored}; structbench's error lines {len(ours)} "
        f"(exit {faulty.returncode}): {one_line}; next command ok: {rest_ok}"
    )


CHECKS: list[tuple[str, Callable[..., tuple[bool, str]]]] = [
    ("CUDA-only tests", cuda_tests),
    ("sync audit (shakespeare-llama, digits)", sync_audit),
    ("run order (same run twice)", run_order),
    ("conformance on CUDA", conformance_on_cuda),
    ("recompilation with compile on", recompilation),
    ("injected device-side error", device_side_error),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the sync audit's runs (default 20)")
    parser.add_argument("--run-order-child", metavar="DEVICE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_order_child:
        print(json.dumps(run_order_rows(args.run_order_child)))
        return 0
    if args.steps < 2:
        print(f"error: --steps must be at least 2, got {args.steps}.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: benchmarks/gpu_check.py needs a CUDA device; torch sees none on this machine.", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name()} · torch {torch.__version__} · CUDA {torch.version.cuda}")
    failures = 0
    for name, check in CHECKS:
        start = time.perf_counter()
        try:
            passed, detail = check(args.steps) if check is sync_audit else check()
        except Exception as exc:  # a check that crashes is a failed check; the others still run
            passed, detail = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
        failures += not passed
        print(f"{'PASS' if passed else 'FAIL'}  {name:<40} {time.perf_counter() - start:6.1f} s  {detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

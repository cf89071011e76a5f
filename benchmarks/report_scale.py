"""How long `structbench report` takes on a large results store.

Writes a synthetic store through `store.write_run` (real Parquet files, one run row and one curve file per
run): suites x optimizers x learning rates x seeds runs (5,000 by default) whose curves decay at rates set
by the optimizer and learning rate, with diverged and out-of-memory runs among them, half the suites with
a loss target and half with an accuracy target. It then brings the store index up to date with the same call
`structbench run` makes at the end of a grid (`store.read.refresh_index`), timing it, and times the real command
line for each format three ways: cold (the report cache `<out>/.report-cache` removed, the index as `run` leaves
it), cold without the index either (`<out>/index` removed too: the worst case, e.g. runs copied in from another
store), and warm (right after the cold report). It prints wall-clock and CPU time (CPU time, the command's and its
worker processes', is the better guide on a shared machine; with --repeat N each figure is the median of N rounds):

    python benchmarks/report_scale.py                       # 5,000 runs in a temporary directory
    python benchmarks/report_scale.py --keep big-store       # keep (and reuse) the store there
    python benchmarks/report_scale.py --keep big-store --repeat 3 --format term --format md
    python benchmarks/report_scale.py --keep big-store --repeat 8 --format html --tree ../old-checkout

With --tree DIR (a checkout of another commit: `git worktree add ../old-checkout COMMIT`; repeatable) each round times
the same commands run from DIR beside this checkout's (in reversed order every other round, so that neither always
goes first), and this checkout's time over DIR's is printed per round
and as the median over the rounds (below 1: this checkout is faster): on a shared machine, whose speed drifts over
minutes, the side-by-side ratio is the figure to trust. The trees must read the same store index format.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from structbench.store import write as store
from structbench.store.read import refresh_index

ROOT = Path(__file__).resolve().parent.parent
STEPS, LOG_EVERY, EVAL_EVERY = 400, 10, 40
FORMATS = ("term", "md", "html", "all")
ENVIRONMENT = {
    "device": "cpu",
    "device_name": "synthetic",
    "torch_version": "2.13.0+cpu",
    "structbench_version": "0.1.0",
    "git_commit": "0" * 40,
    "hostname": "bench",
    "python_version": "3.11",
}


def _run(suite: int, optim: int, lr: float, seed: int, index: int) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(index)
    accuracy = suite % 2 == 1
    speed = 0.01 * (1 + 0.15 * optim) * lr / 0.01 * math.exp(-abs(math.log10(lr / 0.01)))
    diverges = lr >= 0.1 and (optim + seed) % 3 == 0
    oom = optim == 9 and seed == 4
    stop = STEPS if not (diverges or oom) else int(rng.integers(20, STEPS // 2))
    step_time = 0.002 * (1 + 0.1 * optim) * rng.uniform(0.95, 1.05)
    curves: list[dict] = []
    for step in range(0, stop + 1):
        loss = 2.3 * math.exp(-speed * step * rng.uniform(0.9, 1.1)) + 0.05
        wall = step * step_time
        if step and step % LOG_EVERY == 0:
            curves.append(
                {
                    "step": step,
                    "wall_s": wall,
                    "split": "train",
                    "loss": loss,
                    "metric": None,
                    "lr": lr,
                    "step_time_s": step_time,
                    "optim_time_s": step_time * 0.3,
                }
            )
        if step % EVAL_EVERY == 0 or (step == STEPS and stop == STEPS):
            metric = 1 - loss / 2.5 if accuracy else loss
            curves.append(
                {
                    "step": step,
                    "wall_s": wall,
                    "split": "eval",
                    "loss": loss,
                    "metric": metric,
                    "lr": None,
                    "step_time_s": None,
                    "optim_time_s": None,
                }
            )
    status = "diverged" if diverges else ("oom" if oom else "ok")
    final = curves[-1] if status == "ok" else None
    name = f"opt{optim}"
    hparams = {"lr": lr, "weight_decay": 0.0}
    target = {"metric": "accuracy", "value": 0.85} if accuracy else {"metric": "loss", "value": 0.3}
    spec = {
        "suite": f"suite{suite:02d}",
        "task": "synthetic",
        "task_args": {"width": 64},
        "budget": {"steps": STEPS, "log_every": LOG_EVERY, "eval_every": EVAL_EVERY, "batch_size": 64},
        "schedule": {"kind": "constant"},
        "target": target,
        "optim": name,
        "hparams": hparams,
        "seed": seed,
        "source": "benchmark",
    }
    started = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=index)
    state = 4096 * (1 + optim % 4)
    row = {
        "run_id": f"bench-{index:05d}",
        "schema_version": store.SCHEMA_VERSION,
        "suite": spec["suite"],
        "task": "synthetic",
        "optim": name,
        "seed": seed,
        "hparams": json.dumps(hparams),
        "spec": json.dumps(spec, sort_keys=True),
        "status": status,
        "error": None if status == "ok" else f"{status} at step {stop}",
        "started_at": started,
        "finished_at": started + timedelta(seconds=stop * step_time),
        "steps": stop,
        "wall_s": stop * step_time,
        "train_s": stop * step_time,
        "eval_s": 0.1,
        "compile_s": 0.05,
        "step_time_median_s": step_time,
        "optim_time_median_s": step_time * 0.3,
        "peak_mem_bytes": int(2e8 + 1e6 * optim),
        "peak_mem_source": "rss",
        "state_bytes": state,
        "param_count": 1024,
        "final_train_loss": final["loss"] if final else None,
        "final_eval_loss": final["loss"] if final else None,
        "final_eval_metric": final["metric"] if final else None,
        "eval_metric_name": "accuracy" if accuracy else "loss",
        "target_step": None,
        "target_s": None,
        **ENVIRONMENT,
        "eval_metric_mode": "max" if accuracy else "min",
        "initial_eval_loss": 2.35,
        "initial_eval_metric": None,
        "nvml_mem_bytes": None,
        "solver_failures": 0,
        "routing": json.dumps({"structured": ["w1", "w2"], "fallback": ["b1"], "fallback_optimizer": "adamw"}),
        "data_source": "synthetic",
        "analytic_state_bytes": state,
    }
    return row, curves


def generate(out: Path, suites: int, optims: int, lrs: int, seeds: int) -> int:
    store.prepare(out)
    rates = np.geomspace(1e-3, 0.3, lrs)
    index = 0
    for suite in range(suites):
        for optim in range(optims):
            for lr in rates:
                for seed in range(seeds):
                    row, curves = _run(suite, optim, float(lr), seed, index)
                    store.write_run(out, {k: row.get(k) for k in store.RUN_SCHEMA.names}, curves)
                    index += 1
        print(f"  suite {suite + 1}/{suites} written ({index} runs)", file=sys.stderr)
    return index


def timed(command: list[str], cwd: Path | None = None) -> tuple[float, float]:
    """(wall-clock, CPU seconds of the command and every process it started) of one run of `command` in `cwd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def timed_here(work: Callable[[], None]) -> tuple[float, float]:
    """(wall-clock, CPU seconds of this process, all its threads) of one call of `work`."""
    started, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - started, time.process_time() - cpu


def report_command(out: Path, fmt: str, to: Path) -> list[str]:
    return [sys.executable, "-m", "structbench", "report", "--out", str(out), "--format", fmt, "--to", str(to)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", type=int, default=10)
    parser.add_argument("--optims", type=int, default=10)
    parser.add_argument("--lrs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="Write (or reuse) the store here instead of a temporary directory.")
    parser.add_argument("--repeat", type=int, default=1, help="Cold-then-warm pairs per format (medians printed).")
    parser.add_argument(
        "--format", dest="formats", action="append", choices=FORMATS, help="Format to time (repeatable; default: all)."
    )
    parser.add_argument(
        "--tree", type=Path, action="append", default=[], help="Also time the checkout in DIR, round by round."
    )
    args = parser.parse_args()
    for tree in args.tree:
        package = tree / "structbench"
        if not ((package / "cli" / "app.py").is_file() or (package / "cli.py").is_file()):
            parser.error(f"{tree} holds no structbench checkout (no structbench/cli/app.py, nor an older cli.py)")
    trees = [ROOT, *(tree.resolve() for tree in args.tree)]
    root = args.keep or Path(tempfile.mkdtemp(prefix="structbench-report-scale-"))
    out = root / "results"
    expected = args.suites * args.optims * args.lrs * args.seeds
    if not (out / "runs").is_dir() or len(list((out / "runs").glob("*.parquet"))) != expected:
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        print(f"writing {expected} runs to {out} ...", file=sys.stderr)
        generate(out, args.suites, args.optims, args.lrs, args.seeds)
        print(f"  written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    shutil.rmtree(store.index_dir(out), ignore_errors=True)
    build = timed_here(lambda: refresh_index(out))
    current = timed_here(lambda: refresh_index(out))
    wall, cpu = timed([sys.executable, "-m", "structbench", "--help"], ROOT)
    print(f"\n{expected} runs, {args.suites} suites, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"CLI start-up alone (structbench --help): {wall:.2f} s wall, {cpu:.2f} s CPU")
    print(
        f"index refresh at the end of a grid: {build[0]:.2f} s wall, {build[1]:.2f} s CPU building it; "
        f"{current[0]:.2f} s wall, {current[1]:.2f} s CPU when up to date\n"
    )
    header = ("cold", "no index", "warm")
    rounds: dict[tuple[str, Path], list[tuple[float, ...]]] = {}
    for fmt in args.formats or FORMATS:
        command = report_command(out, fmt, root / "report")
        for round_ in range(args.repeat):
            for tree in trees if round_ % 2 == 0 else trees[::-1]:  # each tree first in every other round
                shutil.rmtree(out / ".report-cache", ignore_errors=True)
                refresh_index(out)
                cold, warm = timed(command, tree), timed(command, tree)
                shutil.rmtree(out / ".report-cache", ignore_errors=True)
                shutil.rmtree(store.index_dir(out), ignore_errors=True)
                bare = timed(command, tree)
                rounds.setdefault((fmt, tree), []).append((*cold, *bare, *warm))
    for tree in trees:
        print(f"{'this checkout' if tree == ROOT else str(tree)}:")
        print(f"{'format':8}" + "".join(f"{f'{h} wall':>15}{f'{h} CPU':>14}" for h in header) + "   (seconds)")
        for fmt in args.formats or FORMATS:
            cells = [statistics.median(column) for column in zip(*rounds[fmt, tree], strict=True)]
            print(f"{fmt:8}" + "".join(f"{w:15.2f}{c:14.2f}" for w, c in zip(cells[::2], cells[1::2], strict=True)))
    for tree in trees[1:]:
        print(f"\nthis checkout / {tree}, wall-clock, round by round and (median); below 1: this checkout is faster")
        for fmt in args.formats or FORMATS:
            pairs = zip(rounds[fmt, ROOT], rounds[fmt, tree], strict=True)
            ratios = [[ours[i] / theirs[i] for i in (0, 2, 4)] for ours, theirs in pairs]
            cells = []
            for name, column in zip(header, zip(*ratios, strict=True), strict=True):
                cells.append(f"{name} " + " ".join(f"{r:.2f}" for r in column) + f" ({statistics.median(column):.2f})")
            print(f"{fmt:8}" + "; ".join(cells))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.keep is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()

"""Sweep throughput: the same grid of short quadratic runs inline and on local worker processes, side by side.

    python benchmarks/sweep_throughput.py [--runs 24] [--steps 4000] [--jobs 2] [--slurm]

Each executor runs the grid into a fresh store through the real command line (`structbench run`), timed from
launch to exit, so both pay the same start-up. The grid is `--runs` cells of the `quadratic` suite (sgd and adamw
over a learning-rate list, one seed). Prints both wall-clocks and their ratio (target: local with 2 jobs at least
1.6x faster than inline on 2 idle cores). With `--slurm` (needs a Slurm cluster: `bash .ci/slurm.sh up DIR`), also
the Slurm path's overhead per run: a one-run grid through `--executor slurm --wait` (submission, queueing, the job's
start and imports, storing the row) against the same run inline, each timed from launch to exit, medians of 3.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd


def grid_args(runs: int, steps: int) -> list[str]:
    per_optim = runs // 2
    lrs = ",".join(f"{0.01 * (1 + i):.2f}" for i in range(per_optim))
    return [
        "--suite", "quadratic", "--optim", "sgd", "--optim", "adamw", "--seed", "0",
        "--set", f"hparams.*.lr=[{lrs}]", "--steps", str(steps), "--quiet",
    ]  # fmt: skip


def timed_run(args: list[str], out: Path) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "structbench", "run", *args, "--out", str(out)], capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"structbench run failed ({result.returncode}): {result.stderr.strip().splitlines()[-1:]}")
    return elapsed, pd.read_parquet(out / "runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=24, help="grid size (even: half sgd, half adamw)")
    parser.add_argument("--steps", type=int, default=10000, help="steps per run (about 1 s each on this CPU)")
    parser.add_argument("--jobs", type=int, default=2, help="workers of the local executor")
    parser.add_argument("--slurm", action="store_true", help="also measure the Slurm path's overhead per run")
    args = parser.parse_args()
    if args.runs < 2 or args.runs % 2 or args.steps < 1 or args.jobs < 1:
        parser.error("--runs must be an even number >= 2, --steps and --jobs >= 1")
    if args.slurm and shutil.which("sbatch") is None:
        parser.error("--slurm needs sbatch on the PATH (bash .ci/slurm.sh up DIR; export SLURM_CONF=DIR/slurm.conf)")
    cells = grid_args(args.runs, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inline_s, inline_runs = timed_run(cells, root / "inline")
        local_s, local_runs = timed_run([*cells, "--executor", "local", "--jobs", str(args.jobs)], root / "local")
        same = (
            inline_runs.set_index("run_key").final_eval_loss.sort_index().tolist()
            == local_runs.set_index("run_key").final_eval_loss.sort_index().tolist()
        )
        own = inline_runs.wall_s.sum() + inline_runs.eval_s.sum()
        print(f"grid: {args.runs} quadratic runs x {args.steps} steps (their own time inline: {own:.1f} s)")
        print(f"inline             {inline_s:7.1f} s")
        print(f"local --jobs {args.jobs:<5} {local_s:7.1f} s   speed-up over inline {inline_s / local_s:.2f}x")
        print(f"same final losses per run key: {same}")
        if args.slurm:
            one = ["--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", str(args.steps), "--quiet"]
            inline_one = statistics.median(timed_run(one, root / f"one-inline-{i}")[0] for i in range(3))
            slurm_one = statistics.median(
                timed_run([*one, "--executor", "slurm", "--wait"], root / f"one-slurm-{i}")[0] for i in range(3)
            )
            print(
                f"one run: inline {inline_one:.2f} s, slurm --wait {slurm_one:.2f} s -> Slurm overhead per run "
                f"{slurm_one - inline_one:.2f} s (submission to stored row, beyond the run itself)"
            )


if __name__ == "__main__":
    main()

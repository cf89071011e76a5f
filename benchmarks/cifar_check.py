"""The newcomer's CPU check of the CIFAR suite: `structbench run --suite cifar --optim fismo --steps 3` with a
256-example evaluation subset, on tiny CIFAR-10-layout files, timed end to end (process start to exit) against a
one-minute target.

    python -m benchmarks.cifar_check [--optim fismo] [--steps 3] [--train-per-batch 64] [--target-s 60]

The files hold random images in the real layout (cifar-10-batches-py/: five training batches and a test batch of
`--train-per-batch` images each, and batches.meta), so the command runs the suite's own model (full-width ResNet-18),
batch (128) and optimizer; only the data is small. Their md5 differs from the published files' (the reader's warning
is counted, not shown). Printed: the wall time of the whole command and its ratio to the target, and from the stored
run its wall_s, warmup_s, median step time and the load average at its start and end (a loaded machine's time is
not the check's).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.arguments import Parser, at_least

IMAGE_BYTES = 3 * 32 * 32
BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_tiny_cifar10(root: Path, per_batch: int, seed: int = 0) -> None:
    """cifar-10-batches-py/ under `root`: random uint8 images and labels in the published pickle layout."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in BATCHES:
        batch = {
            b"data": rng.integers(0, 256, (per_batch, IMAGE_BYTES), dtype=np.uint8),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    meta = {b"num_cases_per_batch": per_batch, b"label_names": [f"class{i}".encode() for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--optim", default="fismo")
    parser.add_argument("--steps", type=at_least(1), default=3)
    parser.add_argument("--train-per-batch", type=at_least(2), default=64)
    parser.add_argument("--eval-examples", type=at_least(1), default=256)
    parser.add_argument("--target-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        data, out = Path(scratch) / "data", Path(scratch) / "out"
        write_tiny_cifar10(data, args.train_per_batch)
        command = [
            sys.executable, "-m", "structbench", "run", "--suite", "cifar", "--optim", args.optim,
            "--steps", str(args.steps), "--data-dir", str(data), "--out", str(out), "--quiet",
            "--set", f"task_args.eval_examples={args.eval_examples}",
        ]  # fmt: skip
        print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            print(f"error: the command exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
            return 1
        [run_file] = (out / "runs").glob("*.parquet")
        row = pq.read_table(run_file).to_pylist()[0]
    warnings = sum("md5" in line for line in done.stderr.splitlines())
    budget = json.loads(row["spec"])["budget"]
    print(f"command: {' '.join(command[2:6])} ... --steps {args.steps} (eval_examples {args.eval_examples})")
    ratio = wall / args.target_s
    print(f"  whole command (process start to exit): {wall:.1f} s; target {args.target_s:.0f} s; ratio {ratio:.2f}")
    print(
        f"  stored run: status {row['status']}, wall_s {row['wall_s']:.1f} s, warmup_s {row['warmup_s']:.1f} s "
        f"(warmup_steps {budget['warmup_steps']}), median step {row['step_time_median_s']:.2f} s, "
        f"load {row['load_avg_start']:.2f} -> {row['load_avg_end']:.2f} on {row['cpu_usable']} usable cores"
    )
    print(f"  md5 warnings about the random files: {warnings}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

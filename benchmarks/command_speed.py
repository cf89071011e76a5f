"""How long the quick commands take from a cold start: `structbench run --suite smoke` (every optimizer, 42 runs, into
a fresh store each time), `structbench list optims` and `structbench list suites`, against their targets (10 s and
3 s on a 2-core machine). Each command runs as a new process, as a user types it; each figure is the median of
--repeat rounds (3 by default), with the slowest beside it, and the time `python -c "import torch"` takes in the same
rounds as the floor no command that trains can go under.

    python -m benchmarks.command_speed
    python -m benchmarks.command_speed --repeat 5 --tree ../old-checkout

With --tree DIR (another checkout: `git worktree add ../old-checkout COMMIT`) each round also times the same commands
run from DIR, in alternating order, and prints this checkout's median over DIR's: on a shared machine, whose speed
drifts over minutes, that side-by-side ratio is the figure to trust. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.arguments import Parser, at_least

HERE = Path(__file__).resolve().parents[1]
COMMANDS = {
    "run --suite smoke": (["run", "--suite", "smoke"], 10.0),
    "list optims": (["list", "optims"], 3.0),
    "list suites": (["list", "suites"], 3.0),
}
"""Each timed command: its arguments and its target in seconds."""


def timed(tree: Path, arguments: list[str], store: Path) -> float:
    """Wall-clock seconds of `python -m structbench ARGUMENTS` run from `tree`; a failed command ends the benchmark."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    extra = ["--out", str(store)] if arguments[0] == "run" else []
    start = time.perf_counter()
    command = [sys.executable, "-m", "structbench", *arguments, *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=store.parent)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"error: `structbench {' '.join(arguments)}` from {tree} exited {done.returncode}: "
                         f"{(done.stderr.strip().splitlines() or [''])[-1]}")  # fmt: skip
    return seconds


def import_torch_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=at_least(1), default=3, help="rounds (each figure is their median)")
    parser.add_argument("--tree", type=Path, help="another checkout to time side by side")
    args = parser.parse_args()
    if args.tree is not None and not (args.tree / "structbench" / "__main__.py").is_file():
        parser.error(f"--tree {args.tree} is not a structbench checkout")
    trees = [HERE] + ([args.tree.resolve()] if args.tree is not None else [])
    times: dict[tuple[Path, str], list[float]] = {(tree, name): [] for tree in trees for name in COMMANDS}
    floor: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.repeat):
            floor.append(import_torch_s())
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                for name, (arguments, _) in COMMANDS.items():
                    store = Path(scratch) / f"store-{round_}-{trees.index(tree)}"
                    times[(tree, name)].append(timed(tree, arguments, store))
            print(f"round {round_ + 1}/{args.repeat} done", file=sys.stderr)
    print(f"{os.cpu_count()} cores; `python -c 'import torch'` median {statistics.median(floor):.2f} s")
    for name, (_, target) in COMMANDS.items():
        ours = times[(HERE, name)]
        median = statistics.median(ours)
        verdict = "within" if median <= target else "OVER"
        line = f"structbench {name:18s} median {median:6.2f} s  slowest {max(ours):6.2f} s  "
        line += f"{verdict} the {target:g} s target"
        if len(trees) > 1:
            theirs = statistics.median(times[(trees[1], name)])
            line += f"  | {trees[1].name}: {theirs:6.2f} s, ratio {median / theirs:.2f}"
        print(line)


if __name__ == "__main__":
    main()

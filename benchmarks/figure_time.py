"""CPU seconds the report spends drawing each kind of figure, per suite, on an existing results store.

Builds the report of the store once, draws one suite untimed (fonts and caches warm up), then draws every suite's
figures in this one process and prints, per suite and in total, the CPU seconds of each figure kind: building the
figure ("draw") and turning it into PNG bytes ("save"), and the PNG bytes. It also draws every suite a second time
with the figures saved the way matplotlib's own `savefig(bbox_inches="tight")` does at zlib's default level,
interleaved suite by suite with the first pass so both see the same load, and prints the ratio of the two:

    python -m benchmarks.figure_time --out big-store/results
    python -m benchmarks.figure_time --out big-store/results --tree ../old-checkout   # also another source tree

A store to measure: `python -m benchmarks.report_scale --keep big-store` writes (and keeps) 5,000 runs.
With `--tree DIR` the same measurement also runs on the structbench sources under DIR (a checkout of another
commit: `git worktree add ../old-checkout <commit>`), in a child process, and the totals are printed side by side.
CPU time counts this process only: the report's forked figure workers are not used here. The objects that exist
before drawing are frozen out of the garbage collector, as the report does while it draws.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.arguments import Parser, at_least

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from structbench.report.build import SuiteReport
    from structbench.report.figures.figure_file import Look

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("loss-vs-step", "loss-vs-time", "metric-vs-step", "memory", "quality-vs-memory", "step-time", "sweeps")


def kind_of(figure_name: str, suite_slug: str) -> str:
    """The kind of a suite's figure from its name: "suite00-sweep-opt3" -> "sweeps"."""
    kind = figure_name.removeprefix(suite_slug + "-")
    return "sweeps" if kind.startswith("sweep") else kind


def matplotlib_tight_png(fig: Figure, title: str, run_ids: Sequence[str]) -> bytes:
    """The figure saved by matplotlib's bbox_inches="tight" at zlib's default level: the reference way."""
    from structbench.report.figures import plots

    buffer = io.BytesIO()
    fig.savefig(
        buffer,
        format="png",
        dpi=plots.DPI,
        bbox_inches="tight",
        pad_inches=plots.PAD_INCHES,
        metadata={"Title": title, "Software": "structbench report", "Description": "runs: " + " ".join(run_ids)},
    )
    return buffer.getvalue()


def time_suite(suite: SuiteReport, looks: dict[str, Look], save: Callable[..., bytes]) -> dict[str, dict[str, float]]:
    """{kind: {"draw": s, "save": s, "bytes": n}} of one suite's figures drawn with `save` as plots._png."""
    from structbench.report.figures import plots

    marks: list[tuple[float, float]] = []

    def timed(fig: Figure, title: str, run_ids: Sequence[str]) -> bytes:
        start = time.process_time()
        png = save(fig, title, run_ids)
        marks.append((start, time.process_time()))
        return png

    kept = plots._png
    plots._png = timed
    try:
        begin = time.process_time()
        figures = plots.suite_figures(suite, looks)
    finally:
        plots._png = kept
    slug = plots._slug(suite.name)
    result: dict[str, dict[str, float]] = defaultdict(lambda: {"draw": 0.0, "save": 0.0, "bytes": 0.0})
    previous = begin
    for figure, (start, end) in zip(figures, marks, strict=True):
        entry = result[kind_of(figure.name, slug)]
        entry["draw"] += start - previous
        entry["save"] += end - start
        entry["bytes"] += len(figure.png)
        previous = end
    return dict(result)


def measure(out: Path, suites: int | None) -> dict:
    """Both passes over the store's suites: {"suites": [...], "current": [...], "reference": [...]}."""
    from structbench.report import build
    from structbench.report.figures import plots
    from structbench.report.figures.figure_file import optimizer_looks

    report = build.build_report(out, plotted=True)
    looks = optimizer_looks(report.optims)
    chosen = report.suites[: suites or len(report.suites)]
    plots.suite_figures(chosen[0], looks)
    gc.collect()
    gc.freeze()  # as the report does while it draws (render.py), in every tree measured
    current, reference = [], []
    for i, suite in enumerate(chosen):
        print(f"  suite {i + 1}/{len(chosen)}: {suite.name}", file=sys.stderr, flush=True)
        current.append(time_suite(suite, looks, plots._png))
        reference.append(time_suite(suite, looks, matplotlib_tight_png))
    return {"suites": [s.name for s in chosen], "current": current, "reference": reference}


def total(per_suite: list[dict[str, dict[str, float]]], field: str, kinds: Sequence[str] | None = None) -> float:
    return sum(v[field] for suite in per_suite for k, v in suite.items() if kinds is None or k in kinds)


def print_table(result: dict, label: str) -> None:
    current = result["current"]
    kinds = [k for k in KINDS if any(k in s for s in current)] + sorted({k for s in current for k in s} - set(KINDS))
    print(f"\n{label}: CPU seconds per figure kind (draw + save), one process")
    print(f"{'suite':<12}" + "".join(f"{k[:17]:>18}" for k in kinds) + f"{'total':>9}")
    for name, suite in zip(result["suites"], current, strict=True):
        cells = [suite[k]["draw"] + suite[k]["save"] if k in suite else float("nan") for k in kinds]
        print(f"{name[:12]:<12}" + "".join(f"{c:>18.3f}" for c in cells) + f"{sum(cells):>9.3f}")
    sums = [total(current, "draw", [k]) + total(current, "save", [k]) for k in kinds]
    print(f"{'all':<12}" + "".join(f"{c:>18.3f}" for c in sums) + f"{sum(sums):>9.3f}")
    draw, save = total(current, "draw"), total(current, "save")
    megabytes = total(current, "bytes") / 1e6
    print(f"all suites: draw {draw:.2f} s + save {save:.2f} s = {draw + save:.2f} s CPU; PNGs {megabytes:.2f} MB")
    reference = result["reference"]
    ref_save, ref_all = total(reference, "save"), total(reference, "draw") + total(reference, "save")
    ref_megabytes = total(reference, "bytes") / 1e6
    print(
        f"same figures saved by matplotlib's bbox_inches='tight' at zlib level 6, interleaved: save {ref_save:.2f} s, "
        f"draw + save {ref_all:.2f} s, PNGs {ref_megabytes:.2f} MB; save ratio (this / matplotlib's) "
        f"{save / ref_save:.2f}, draw + save ratio {(draw + save) / ref_all:.2f}"
    )


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results store (a directory with runs/ and curves/)")
    parser.add_argument("--suites", type=at_least(1), default=None, help="time only the first N suites")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="also time the sources under DIR")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.out / "runs").is_dir():
        parser.error(f"{args.out} holds no runs/ directory (write a store with benchmarks/report_scale.py --keep)")
    for tree in args.tree:
        if not (tree / "structbench" / "report" / "plots.py").is_file():
            parser.error(f"{tree} holds no structbench/report/figures/plots.py")
    if args.json:
        print(json.dumps(measure(args.out, args.suites)))
        return
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    results = {"this tree": measure(args.out, args.suites)}
    for tree in args.tree:
        command = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out), "--json"]
        if args.suites:
            command += ["--suites", str(args.suites)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree.resolve()), str(ROOT)))}
        done = subprocess.run(command, env=env, cwd=tree, stdout=subprocess.PIPE, text=True, check=True)
        results[str(tree)] = json.loads(done.stdout)
    for label, result in results.items():
        print_table(result, label)
    if args.tree:
        print("\ntotals, draw + save CPU seconds over all suites:")
        for label, result in results.items():
            seconds = total(result["current"], "draw") + total(result["current"], "save")
            print(f"  {label}: {seconds:.2f} s")
    print(f"load average after: {os.getloadavg()[0]:.1f} (a shared machine distorts these: compare ratios)")


if __name__ == "__main__":
    main()

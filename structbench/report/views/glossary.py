"""The report's "how to read" section: each number's definition in plain words (the modules hold the maths)."""

from __future__ import annotations

from structbench.report.analysis.profiles import TAU_MAX
from structbench.report.analysis.stats import ALPHA, LEVEL, MIN_BEST_SEEDS, MIN_SEEDS, RESAMPLES, SEED
from structbench.report.analysis.summary import FEW_EVALUATIONS
from structbench.report.analysis.targets import WIDE_SPAN

DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "Median and its interval",
        f"Each number is the median over seeds. Below it: with fewer than {MIN_SEEDS} seeds the smallest and largest "
        f"seed's value, labelled 'min–max' (so few seeds support no confidence interval); from {MIN_SEEDS} seeds the "
        f"{LEVEL:.0%} percentile-bootstrap confidence interval, labelled '95% CI' ({RESAMPLES:,} resamples with "
        f"replacement, fixed seed {SEED}; scipy.stats.bootstrap's percentile interval). A single seed shows n=1. A "
        f"number is marked best in its column only when it is a median of at least {MIN_BEST_SEEDS} seeds.",
    ),
    (
        "Splits",
        "Image tasks hold out a seeded validation subset of the training split (task_args.val_fraction, default "
        "10%; 0 holds none out); language tasks divide their held-out documents into a validation and a test split. "
        "Every choice and every timing uses validation: the setting selected among several, a target from a "
        "baseline, time to target and speed-ups. The test split is reported for the selected setting only (final "
        "test loss and metric, the paired comparison of final metrics, the ranks). Columns say their split: val, "
        "test, or exact (a quadratic's exact objective). Runs without a validation split are timed on their "
        "evaluation and selected on training loss, and the report says so.",
    ),
    (
        "Which runs count",
        "Final loss and metric, step time, compile time, memory and state bytes: runs that ended ok. Time to "
        "target: every run with a result (ok, diverged, oom, solver_error); one that never reached the target "
        "counts as not reached, so a failure weighs against its optimizer. When a seed ran more than once, one run "
        "counts: the latest with a final status (ok, diverged, oom, solver_error, timeout) if there is one, else the "
        "latest (an error or interrupted run then shows as the seed's failure). So an interrupted or failed rerun "
        "never hides an earlier result; the seed's other runs are listed as superseded.",
    ),
    (
        "Steps and time to target",
        "Measured on the validation split where the runs hold one out. Interpolated linearly between the two "
        "evaluations that bracket the first crossing of the target (the runner records only the first evaluation "
        "past it). Time is cumulative training wall-clock with "
        "evaluation excluded, the first timed step included; the run's warm-up steps (run untimed before its "
        "clock and undone, stored as warmup_s) excluded. 'not reached': the target was never crossed.",
    ),
    (
        "Speed-up",
        "The baseline's median steps (time) to target divided by the optimizer's: 2.00x reaches the target in half "
        "the steps (time).",
    ),
    (
        "Target from a baseline",
        "A suite whose target names `from_baseline` (the RACS/Alice papers' definition) takes as target that "
        "optimizer's final evaluation of the metric on the validation split (the test split for runs without one): "
        "the median over its ok seeds of its last evaluation, under the same task, budget and schedule. Speed-up is "
        "then the baseline's total steps (the step of its last evaluation) or total training time, medians over "
        "its seeds, divided by the optimizer's steps (time) to that target; 'not reached' when it never gets there. "
        "Without an ok baseline run the target is 'unavailable'.",
    ),
    (
        "Effective throughput",
        "With a target from a baseline whose runs record a throughput: the items (tokens) the baseline trained on "
        "(its throughput times its training time after the first step, scaled to all its steps; median over seeds) "
        "divided by the optimizer's median time to the target; 'not reached' when the target never is.",
    ),
    (
        "Paired comparison",
        "On the seeds both ran, the per-seed difference (optimizer minus the baseline of its store); its median and "
        f"interval as above. Below {MIN_SEEDS} paired seeds there is no verdict: 'too few seeds (n=2; need "
        f"{MIN_SEEDS})' (with 3 seeds, three differences of one sign happen 1 time in 4 by chance). From "
        f"{MIN_SEEDS}: the exact two-sided Wilcoxon signed-rank test of the differences (its p-value is shown); a "
        f"direction ('faster', 'worse', ...) needs p < {ALPHA:g} and a 95% CI that excludes 0 (an interval that "
        "touches 0 gives 'no detectable difference'). With 5 pairs the smallest possible p is 0.0625, so a "
        "direction needs at least 6 pairs.",
    ),
    (
        "Budget warnings",
        f"⚠ beside a time to target or speed-up: a run evaluated fewer than {FEW_EVALUATIONS} times (its curve is a "
        "straight line between its ends), or a crossing interpolated over one interval longer than "
        f"{WIDE_SPAN:.0%} of the run (the crossing may lie anywhere in it). `run --steps N` shortens eval_every "
        "and log_every in proportion when the suite's would leave fewer than 5 evaluations.",
    ),
    (
        "Hyperparameters",
        "Each row says where its hyperparameters come from: the suite's (the suite names the optimizer: tuned for "
        "it, or the paper's values), set on the command line, selected from a sweep, or 'untuned here' (an "
        "optimizer outside the suite's list, run at the registry's defaults: its numbers are not a finding).",
    ),
    (
        "Selected setting",
        "An optimizer run under several settings (a sweep) appears once per setting in its suite's every-setting "
        "table, and is represented elsewhere by one selected setting, never chosen on the evaluation the report "
        "compares on (the test split): the best median over seeds of the validation metric where the runs record "
        "one, else of the validation loss, else of the final training loss ('selected on training loss (no "
        "validation split)'; one minibatch's loss, damped only by the median over seeds). A setting with a "
        "diverged, oom, solver_error or timeout run is never selected over one without. The notes say which metric "
        "selected each optimizer's setting.",
    ),
    (
        "Sweeps",
        "For an optimizer whose settings differ only in hyperparameters: the selection metric (median over ok "
        "seeds, bars from the smallest to the largest seed, n = ok seeds) against each swept hyperparameter, the "
        "selected setting ringed; with several swept hyperparameters, each is plotted with the others at the "
        "selected setting's values. Learning rates, and positive values spanning more than a factor 10, are on "
        "a log axis. 'At the edge of the grid': the selected value is the smallest or largest run, so a better "
        "one may lie outside the grid.",
    ),
    (
        "Performance profile",
        "For each suite with a target that an optimizer ran, its ratio r = its median time to target / the fastest "
        f"optimizer's there (infinite if not reached). ρ(τ) is the fraction of the suites it ran with r ≤ τ, τ in "
        f"[1, {TAU_MAX:g}]; the score is the area under ρ divided by {TAU_MAX - 1:g} (AlgoPerf, Dahan et al. 2023). "
        "A suite an optimizer did not run does not count for or against it; 'suites run' is its coverage.",
    ),
    (
        "Rank",
        "On each suite, the optimizers that ran it ranked by median final test metric (ties share the mean rank; "
        "no ok run ties for last among them); an optimizer that did not run a suite has no rank there. The table "
        "averages each optimizer's ranks over the suites it ran and shows how many that is. Smoke suites (a few "
        "dozen steps at default hyperparameters) are left out of profiles and ranks unless --include-smoke, and so "
        "is a suite where no run ended ok (nothing there to rank).",
    ),
    (
        "Memory and state",
        "Peak memory as the store measured it (source: cuda = max allocated, nvml, rss-delta = on CPU, the "
        "process's peak resident set during the run above its size just before it; rss = the whole process's peak, "
        "older stores). Resident-set figures are approximate: allocator caches, and in the first run of a process "
        "the one-time allocations torch makes on first use (`run --executor local` gives each run its own process), "
        "so on CPU the quality-vs-memory Pareto front uses optimizer-state bytes. State: exact bytes of the "
        "optimizer's state tensors as stored; analytic: the optimizer's own formula when the store records it.",
    ),
)

"""The report's "how to read" section: each number's definition in plain words (the modules hold the maths)."""

from __future__ import annotations

from structbench.report.profiles import TAU_MAX
from structbench.report.stats import LEVEL, MIN_PAIRS, RESAMPLES, SEED

DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "Median and CI",
        f"Each number is the median over seeds; brackets give its {LEVEL:.0%} percentile-bootstrap confidence "
        f"interval ({RESAMPLES:,} resamples with replacement, fixed seed {SEED}, bounds taken as observed "
        "resample medians). A single seed shows n=1 and no interval.",
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
        "Interpolated linearly between the two evaluations that bracket the first crossing of the target (the "
        "runner records only the first evaluation past it). Time is cumulative training wall-clock with "
        "evaluation excluded, compile / warm-up step included. 'not reached': the target was never crossed.",
    ),
    (
        "Speed-up",
        "The baseline's median steps (time) to target divided by the optimizer's: 2.00x reaches the target in half "
        "the steps (time).",
    ),
    (
        "Target from a baseline",
        "A suite whose target names `from_baseline` (the RACS/Alice papers' definition) takes as target that "
        "optimizer's final evaluation of the metric: the median over its ok seeds of its last evaluation, under the "
        "same task, budget and schedule. Speed-up is then the baseline's total steps (the step of its last "
        "evaluation) or total training time, medians over its seeds, divided by the optimizer's steps (time) to that "
        "target; 'not reached' when it never gets there. Without an ok baseline run the target is 'unavailable'.",
    ),
    (
        "Effective throughput",
        "With a target from a baseline whose runs record a throughput: the items (tokens) the baseline trained on "
        "(its throughput times its training time after the first step, scaled to all its steps; median over seeds) "
        "divided by the optimizer's median time to the target; 'not reached' when the target never is.",
    ),
    (
        "Paired comparison",
        "On the seeds both ran, the per-seed difference (optimizer minus baseline); its median and bootstrap CI. "
        f"A verdict ('faster', 'worse', ...) needs at least {MIN_PAIRS} paired seeds and a CI that excludes 0; "
        "otherwise 'no detectable difference at n=K'. With 3 to 5 seeds the interval spans the range of the "
        "differences, so a verdict means every seed went the same way.",
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
        "For each suite with a target, an optimizer's ratio r = its median time to target / the fastest "
        f"optimizer's (infinite if not reached or not run). ρ(τ) is the fraction of suites with r ≤ τ, τ in [1, "
        f"{TAU_MAX:g}]; the score is the area under ρ divided by {TAU_MAX - 1:g} (AlgoPerf, Dahan et al. 2023).",
    ),
    (
        "Rank",
        "On each suite, optimizers ranked by median final eval metric (ties share the mean rank; no ok run ties "
        "for last); the table averages the ranks over suites.",
    ),
    (
        "Memory and state",
        "Peak memory as the store measured it (source: cuda = max allocated, nvml, rss = the process's peak "
        "resident set on CPU). State: exact bytes of the optimizer's state tensors as stored; analytic: the "
        "optimizer's own formula when the store records it.",
    ),
)

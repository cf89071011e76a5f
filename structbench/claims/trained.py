"""Training claims: two optimizers compared over paired seeds on a small vision or language suite.

Scales (the budget is stored with each verdict):
- ci: a few steps and 2 seeds, which exercises the whole path; with fewer than 5 pairs the verdict is "not testable
  here (too few seeds)", never "no difference";
- cpu: 6 evaluation seeds (with 5 pairs the smallest two-sided Wilcoxon p is 0.0625, so a direction needs 6) and
  each optimizer's learning rate chosen from three values a factor ~3 apart around its suite's (or paper's) value,
  on 2 tuning seeds disjoint from the evaluation seeds, by the median validation loss;
- gpu: the cpu protocol with longer budgets and 10 seeds.
Verdicts: "better" claims need a detectable paired difference in the claimed direction (claims.base.better);
"matches" claims a 95% bootstrap interval of the paired difference above minus a stated margin (claims.base.within).
"""

from __future__ import annotations

import math

from structbench.claims.base import (
    HOLDS,
    ClaimDef,
    Context,
    Outcome,
    better,
    median_of,
    paired_numbers,
    paired_text,
    seeds_text,
    untestable,
    within,
)
from structbench.claims.training import Comparison, Result, run_comparison, seeds_of, steps_to_reach

EVAL_SEEDS = {"ci": (0, 1), "cpu": tuple(range(6)), "gpu": tuple(range(10))}
TUNING_SEEDS = {"ci": (), "cpu": (100, 101), "gpu": (100, 101, 102)}

VISION_OVERRIDES = {
    "ci": ("budget.epochs=0", "budget.steps=20", "budget.log_every=10"),
    "cpu": ("budget.epochs=5",),
    "gpu": (),
}
LM_OVERRIDES = {
    "ci": (
        "budget.steps=8",
        "budget.eval_every=4",
        "budget.log_every=4",
        "budget.batch_size=4",
        "task_args.seq_len=32",
        "task_args.eval_tokens=1024",
    ),
    "cpu": (
        "budget.steps=200",
        "budget.eval_every=20",
        "budget.log_every=20",
        "budget.batch_size=8",
        "task_args.seq_len=64",
        "task_args.eval_tokens=8192",
    ),
    "gpu": ("budget.steps=2000", "budget.eval_every=100"),
}
SUITE_EXTRAS = {
    "shampoo-4bit": ("hparams.shampoo-4bit.stat_interval=10", "hparams.shampoo-4bit.root_interval=50"),
}
"""The 4-bit Shampoo on digits takes 32-bit Shampoo's short-run intervals (the suite sets them for `shampoo`)."""


def _grid(lr: float | None, scale: str) -> tuple[float, ...]:
    if scale == "ci" or lr is None:
        return ()
    return (float(f"{lr / 3:.3g}"), lr, float(f"{lr * 3:.3g}"))


def comparison(suite: str, optims: tuple[str, str], overrides: tuple[str, ...], lrs: dict[str, float], scale: str):
    extras = tuple(o for name in optims for o in SUITE_EXTRAS.get(name, ()))
    return Comparison(
        suite=suite,
        optims=optims,
        eval_seeds=EVAL_SEEDS[scale],
        tuning_seeds=TUNING_SEEDS[scale],
        lr_grid={o: _grid(lrs.get(o), scale) for o in optims if _grid(lrs.get(o), scale)},
        overrides=overrides + extras,
        select="val_loss",
    )


def _common(result: Result, scale: str) -> dict[str, str]:
    note = "; lrs not tuned at scale ci" if scale == "ci" else "; lr chosen on the validation loss of the tuning seeds"
    return {"budget": result.budget, "tuning": result.tuning_text() + note}


def _final_comparison(
    result: Result, mine: str, theirs: str, column: str, label: str, margin: float | None, scale: str
) -> Outcome:
    if result.failures():
        return untestable(f"runs failed: {'; '.join(result.failures())}", **_common(result, scale))
    a, b = result.values(mine, column), result.values(theirs, column)
    lower = column != "final_eval_metric" or result.rows[mine][seeds_of(result)[0]]["eval_metric_mode"] == "min"
    if margin is None:
        verdict, paired = better(a, b, lower_is_better=lower)
    else:
        verdict, paired = within(a, b, margin, higher_is_better=not lower)
    numbers = {f"{mine}_{label}": median_of(a), f"{theirs}_{label}": median_of(b)}
    numbers.update(paired_numbers(f"{mine}_vs_{theirs}", paired))
    rule = "" if margin is None else f" (margin {margin:g}; positive = {mine} better)"
    summary = (
        f"median test {label}: {mine} {median_of(a):.4g} vs {theirs} {median_of(b):.4g}; {paired_text(paired)}{rule}"
    )
    return Outcome(
        verdict,
        {k.replace("-", "_"): v for k, v in numbers.items()},
        summary,
        seeds=seeds_text(seeds_of(result), "test split (lr chosen on validation)"),
        reason=paired.verdict if verdict != HOLDS else "",
        **_common(result, scale),
    )


def vision_claim(
    paper: str,
    claim_id: str,
    statement: str,
    source: str,
    paper_value: str,
    mine: str,
    theirs: str,
    margin: float,
    lrs: dict[str, float],
) -> ClaimDef:
    """`mine` matches `theirs` on digits: test accuracy at most `margin` below, by the paired 95% interval."""

    def run(scale: str, ctx: Context) -> Outcome:
        setup = comparison("digits", (mine, theirs), VISION_OVERRIDES[scale], lrs, scale)
        result = run_comparison(setup, ctx.device, ctx.data_root, ctx.progress)
        return _final_comparison(result, mine, theirs, "final_eval_metric", "accuracy", margin, scale)

    return ClaimDef(paper, claim_id, statement, source, paper_value, run, needs=frozenset({mine, theirs}))


LM_LRS = {"adamw": 0.001, "racs": 0.02, "alice": 0.02, "galore": 0.02, "sumo": 0.02, "muon": 0.02, "fismo": 0.02}
"""shakespeare-llama's learning rates (RACS/Alice Tables 7-9 and 11 at 60M; Muon's and FISMO's defaults), and
SUMO at GaLore's: the centres of the cpu scale's grids."""


def lm_claim(
    paper: str,
    claim_id: str,
    statement: str,
    source: str,
    paper_value: str,
    mine: str,
    theirs: str,
    margin: float | None = None,
) -> ClaimDef:
    """On a small LLaMA: `mine` has a lower final test loss than `theirs` (margin None), or one at most `margin`
    nats higher."""

    def run(scale: str, ctx: Context) -> Outcome:
        setup = comparison("shakespeare-llama", (mine, theirs), LM_OVERRIDES[scale], LM_LRS, scale)
        result = run_comparison(setup, ctx.device, ctx.data_root, ctx.progress)
        return _final_comparison(result, mine, theirs, "final_eval_loss", "loss", margin, scale)

    return ClaimDef(paper, claim_id, statement, source, paper_value, run, needs=frozenset({mine, theirs}))


def speedup_claim(paper: str, claim_id: str, statement: str, source: str, paper_value: str, mine: str) -> ClaimDef:
    """`mine` reaches AdamW's final validation perplexity (per seed) in fewer steps than AdamW's budget."""

    def run(scale: str, ctx: Context) -> Outcome:
        setup = comparison("shakespeare-llama", (mine, "adamw"), LM_OVERRIDES[scale], LM_LRS, scale)
        result = run_comparison(setup, ctx.device, ctx.data_root, ctx.progress)
        if result.failures():
            return untestable(f"runs failed: {'; '.join(result.failures())}", **_common(result, scale))
        seeds = seeds_of(result)
        total = {s: float(result.rows["adamw"][s]["steps"]) for s in seeds}
        reach = {
            s: steps_to_reach(result.rows[mine][s], float(result.rows["adamw"][s]["final_val_metric"])) for s in seeds
        }
        verdict, paired = better(reach, total, lower_is_better=True)
        finite = [total[s] / reach[s] for s in seeds if math.isfinite(reach[s]) and reach[s] > 0]
        speedups = {s: total[s] / reach[s] if reach[s] > 0 else math.inf for s in seeds}
        numbers = {
            "median_speedup": median_of(speedups),
            "seeds_reaching_target": float(len(finite)),
        }
        numbers.update(paired_numbers(f"{mine}_steps_minus_adamw_steps", paired))
        summary = (
            f"steps to AdamW's final val perplexity: {mine} "
            + ", ".join("never" if math.isinf(reach[s]) else f"{reach[s]:.0f}" for s in seeds)
            + f" vs AdamW's {median_of(total):.0f}; median speed-up {numbers['median_speedup']:.3g}x; "
            + paired_text(paired)
        )
        return Outcome(
            verdict,
            numbers,
            summary,
            seeds=seeds_text(seeds, "validation split (the target and the time to it)"),
            reason=paired.verdict if verdict != HOLDS else "",
            **_common(result, scale),
        )

    return ClaimDef(paper, claim_id, statement, source, paper_value, run, needs=frozenset({mine, "adamw"}))

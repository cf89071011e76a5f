"""update-cond: condition numbers of the update matrices of Adam, Muon (NS5, NS7, exact SVD) and FISMO (FISMO §7).

FISMO (Xu, Yan & Zhang 2026, arXiv 2601.21750) §7 / Fig. 3 track the average condition number kappa = s_max / s_min
of the update matrices during training and report kappa_Adam > 1e8 >> kappa_FISMO ~ 1e2-1e3 (stable) >
kappa_Muon(NS=5) > kappa_Muon(NS=7) -> kappa_Muon-ideal = 1. The task, the averaging and the treatment of zero
singular values are unstated (§7, Fig. 3); this experiment fixes them as follows (structbench's choices).

Gradient trace: one real training run records the gradient of every hidden matrix at every step, and every method
then sees exactly that sequence. `trace="mlp"` (default): the synthetic-classification task (an MLP on a seeded
Gaussian mixture; by default 10 classes, dim 32, hidden 64, separation 0.6: hidden matrices 64 x 32 and 64 x 64,
the 10 x 64 head excluded as in every structured method's routing), trained by SGD with momentum (lr 0.05, 0.9,
batch 64, mean cross-entropy), a method compared with none of the others. `trace="quadratic"`: the quadratic task's
Kronecker problem (32 x 16) with gradient noise, where every gradient is full rank.

Methods, each built by `structbench.optim.make_optimizer` and fed the trace with its own state: "adam" (registry
`adamw` with weight decay 0: Adam, as Fig. 3 names it), "muon-ns5", "muon-ns7", "muon-svd" (registry `muon` in the
paper's form: EMA momentum, no Nesterov, no shape scale; Newton–Schulz in float32 with Muon's quintic, or the exact
polar factor U V^T), "fismo" (registry defaults, Newton–Schulz 5) and "fismo-svd" (exact polar: the
preconditioner's own contribution). FISMO is not invariant to the gradient scale (Algorithm 1 line 4), so it is also run
on the trace multiplied by each of `fismo_grad_scales`. The update D_t of a step is read exactly: lr = 1 and the
weights are reset to zero before each step (none of the methods' updates depends on W with weight decay 0), so
W_t = -D_t.

Condition numbers, from float64 singular values of each float32 update: `cond` = s_max / s_min over all singular
values (the paper's definition; infinite when an update is exactly rank-deficient, e.g. rows of dead ReLU units);
`cond_nonzero` = s_max / the smallest singular value above max(m, n) * eps_float32 * s_max; `rank_deficient` =
whether some singular value is at or below that threshold. Table: per method, gradient scale and layer, one row
per `log_every` steps and a summary row (step empty) over all steps, plus a summary pooled over layers (layer
"all"): median cond, median cond_nonzero, geometric and arithmetic mean of cond_nonzero, the fraction of
rank-deficient updates, the fraction with cond > 1e8, and the paper's statement. Layers are kept apart because
they differ in kind (on the default trace the 64 x 32 gradients are full rank while dead ReLU units zero rows and
columns of the 64 x 64 ones), so a median pooled over them falls between two distributions. Claims are judged on
the per-layer median cond_nonzero (zero singular values excluded, one definition for every method; the paper's
all-singular-value kappa is in the evidence) and hold only when they hold on every layer.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn

from structbench.experiments.base import Claim, ExperimentDef, ExperimentResult
from structbench.optim import make_optimizer
from structbench.optim.partition import split
from structbench.tasks.base import TaskContext, TaskDef
from structbench.tasks.quadratic import QUADRATIC
from structbench.tasks.synthetic_classification import SYNTHETIC_CLASSIFICATION

TRACES: dict[str, tuple[TaskDef, dict[str, Any], int, dict[str, Any]]] = {
    "mlp": (
        SYNTHETIC_CLASSIFICATION,
        {"classes": 10, "dim": 32, "hidden": 64, "separation": 0.6, "train_size": 2048, "test_size": 1024},
        64,
        {"lr": 0.05, "momentum": 0.9},
    ),
    "quadratic": (QUADRATIC, {"problem": "kronecker", "noise_scale": 0.1}, 1, {"lr": 0.2, "momentum": 0.9}),
}
"""trace -> (task, its arguments over the task defaults, batch size, SGD hyperparameters of the trace run)."""

MUON_PAPER_FORM: dict[str, Any] = {"nesterov": False, "scale": "none", "ns_dtype": "float32"}
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "adam": ("adamw", {"weight_decay": 0.0}),
    "muon-ns5": ("muon", {**MUON_PAPER_FORM, "polar": "ns", "ns_steps": 5}),
    "muon-ns7": ("muon", {**MUON_PAPER_FORM, "polar": "ns", "ns_steps": 7}),
    "muon-svd": ("muon", {**MUON_PAPER_FORM, "polar": "svd"}),
    "fismo": ("fismo", {"ns_dtype": "float32"}),
    "fismo-svd": ("fismo", {"polar": "svd"}),
}
"""method -> (registry name, hyperparameters over its defaults; lr is set to 1)."""

PAPER: dict[str, str] = {
    "adam": "> 1e8",
    "muon-ns5": "> Muon NS7, > 1",
    "muon-ns7": "-> 1 (closer than NS5)",
    "muon-svd": "= 1",
    "fismo": "~1e2-1e3, stable; > Muon NS5",
}
"""FISMO §7 / Fig. 3, per method (fismo-svd is not in the paper)."""

HUGE = 1e8
DEFAULTS: dict[str, Any] = {
    "trace": "mlp",
    "trace_args": {},
    "steps": 200,
    "log_every": 20,
    "methods": list(METHODS),
    "fismo_grad_scales": [0.01, 100.0],
}


def condition_numbers(update: Tensor) -> tuple[float, float, bool]:
    """(cond over all singular values, cond over those above max(m, n) eps_float32 s_max, rank-deficient?)."""
    s = torch.linalg.svdvals(update.detach().to("cpu", torch.float64))
    top = float(s[0])
    if top == 0.0:
        return math.nan, math.nan, True
    tol = max(update.shape[-2:]) * torch.finfo(torch.float32).eps * top
    kept = s[s > tol]
    smallest = float(s[-1])
    cond = top / smallest if smallest > 0.0 else math.inf
    return cond, top / float(kept[-1]), len(kept) < len(s)


def gradient_trace(args: Mapping[str, Any], seed: int, device: torch.device) -> dict[str, list[Tensor]]:
    """Hidden-matrix name -> its gradient at each step of one SGD training run of the chosen task."""
    task_def, preset, batch_size, sgd = TRACES[args["trace"]]
    task_args = {**task_def.defaults, **preset, **args["trace_args"]}
    task = task_def.build(task_args, TaskContext(seed=seed, device=device, data_root=Path("."), batch_size=batch_size))
    named = list(task.model.named_parameters())
    layers = split(task.model, named).structured
    params = dict(named)
    optimizer = make_optimizer("sgd", task.model, **sgd)
    trace: dict[str, list[Tensor]] = {name: [] for name in layers}
    for step in range(int(args["steps"])):
        optimizer.zero_grad(set_to_none=True)
        task.train_loss(step).backward()
        for name in layers:
            trace[name].append(params[name].grad.detach().clone())
        optimizer.step()
    return trace


def method_updates(
    method: str, trace: Mapping[str, list[Tensor]], grad_scale: float = 1.0
) -> Iterator[tuple[int, str, Tensor]]:
    """(step, layer, D_t) for `method` fed the trace times `grad_scale`, with its own state from step 0."""
    name, hparams = METHODS[method]
    params = [(layer, nn.Parameter(torch.zeros_like(grads[0]))) for layer, grads in trace.items()]
    optimizer = make_optimizer(name, params, **{**hparams, "lr": 1.0})
    steps = len(next(iter(trace.values())))
    for step in range(steps):
        for layer, param in params:
            with torch.no_grad():
                param.zero_()
            param.grad = grad_scale * trace[layer][step]
        optimizer.step()
        for layer, param in params:
            yield step, layer, -param.detach()


def _summary(rows: pd.DataFrame) -> dict[str, Any]:
    nonzero = rows["cond_nonzero"].dropna()
    return {
        "updates": len(rows),
        "cond": float(rows["cond"].median()),
        "cond_nonzero": float(nonzero.median()),
        "geomean_cond_nonzero": float(10 ** nonzero.map(math.log10).mean()),
        "mean_cond_nonzero": float(nonzero.mean()),
        "rank_deficient": float(rows["rank_deficient"].mean()),
        "frac_cond_above_1e8": float((rows["cond"] > HUGE).mean()),
    }


@contextlib.contextmanager
def _single_thread(device: torch.device) -> Iterator[None]:
    """One intra-op thread on CPU for the duration (restored after): the matrices are at most 64 wide, where
    threads only add overhead; on a loaded 2-core machine two threads made the default run 14x slower."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run(args: dict[str, Any], seed: int, device: torch.device) -> ExperimentResult:
    with _single_thread(device):
        return _run(args, seed, device)


def validate_args(params: Mapping[str, Any]) -> None:
    """Raise ValueError for an unknown trace or method, counts below 1, non-positive gradient scales, or trace task
    arguments the task itself refuses (its preflight's usage error)."""
    if params["trace"] not in TRACES:
        raise ValueError(f"unknown trace {params['trace']!r}; valid: {', '.join(TRACES)}")
    unknown = sorted(set(params["methods"]) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; valid: {', '.join(METHODS)}")
    if int(params["steps"]) < 1 or int(params["log_every"]) < 1:
        raise ValueError(f"steps and log_every must be >= 1; got {params['steps']}, {params['log_every']}")
    if not all(float(scale) > 0 for scale in params["fismo_grad_scales"]):
        raise ValueError(f"fismo_grad_scales must be > 0; got {params['fismo_grad_scales']}")
    task_def, preset, batch_size, _ = TRACES[params["trace"]]
    unknown = sorted(set(params["trace_args"]) - set(task_def.defaults))
    if unknown:
        raise ValueError(f"trace_args has no field(s) {unknown}; valid: {', '.join(sorted(task_def.defaults))}")
    if task_def.preflight is not None:
        task_def.preflight({**task_def.defaults, **preset, **params["trace_args"]}, Path("."), batch_size)


def _run(args: dict[str, Any], seed: int, device: torch.device) -> ExperimentResult:
    params = {**DEFAULTS, **args}
    validate_args(params)
    trace = gradient_trace(params, seed, device)
    shapes = {layer: "x".join(str(d) for d in grads[0].shape) for layer, grads in trace.items()}
    runs = [(method, 1.0) for method in params["methods"]]
    if "fismo" in params["methods"]:
        runs += [("fismo", float(scale)) for scale in params["fismo_grad_scales"] if float(scale) != 1.0]
    records = []
    for method, scale in runs:
        for step, layer, update in method_updates(method, trace, scale):
            cond, cond_nonzero, deficient = condition_numbers(update)
            records.append(
                {
                    "method": method,
                    "grad_scale": scale,
                    "layer": layer,
                    "shape": shapes[layer],
                    "step": step,
                    "cond": cond,
                    "cond_nonzero": cond_nonzero,
                    "rank_deficient": deficient,
                }
            )
    table = _table(pd.DataFrame(records), int(params["log_every"]))
    return ExperimentResult(table=table, claims=_claims(table, params["trace"]))


def _table(per_update: pd.DataFrame, log_every: int) -> pd.DataFrame:
    """Per method, gradient scale and layer: rows at the logged steps and a summary row (step empty); plus a
    summary pooled over layers (layer "all")."""
    rows = []
    for (method, scale), group in per_update.groupby(["method", "grad_scale"], sort=False):
        key = {"method": method, "grad_scale": scale, "paper": PAPER.get(method, "") if scale == 1.0 else ""}
        for (layer, shape), at_layer in group.groupby(["layer", "shape"], sort=False):
            last = at_layer["step"].max()
            logged = at_layer[(at_layer["step"] % log_every == 0) | (at_layer["step"] == last)]
            for step, at_step in logged.groupby("step"):
                rows.append({**key, "layer": layer, "shape": shape, "step": step, **_summary(at_step)})
            rows.append({**key, "layer": layer, "shape": shape, "step": None, **_summary(at_layer)})
        rows.append({**key, "layer": "all", "shape": "", "step": None, **_summary(group)})
    table = pd.DataFrame(rows)
    table["step"] = table["step"].astype("Int64")
    columns = ["method", "grad_scale", "layer", "shape", "step"]
    return table[columns + [c for c in table.columns if c not in columns]]


def _per_layer(table: pd.DataFrame, method: str, scale: float = 1.0) -> pd.DataFrame:
    """The summary rows of each layer (not the pooled row) of one method at one gradient scale."""
    rows = table[(table["method"] == method) & (table["grad_scale"] == scale) & table["step"].isna()]
    return rows[rows["layer"] != "all"].set_index("layer")


def _describe(label: str, rows: pd.DataFrame) -> str:
    return f"{label}: " + "; ".join(
        f"{row.shape} median cond_nonzero {row.cond_nonzero:.3g} (cond over all singular values {row.cond:.3g}, "
        f"{100 * row.frac_cond_above_1e8:.0f}% above 1e8, {100 * row.rank_deficient:.0f}% rank-deficient)"
        for row in rows.itertuples()
    )


def _claims(table: pd.DataFrame, trace: str) -> list[Claim]:
    """Verdicts on median cond_nonzero per layer over all steps; a claim holds when it holds on every layer."""
    source = f"FISMO §7 / Fig. 3 ({trace} trace)"
    found = {m: _per_layer(table, m) for m in METHODS}
    found = {m: rows for m, rows in found.items() if len(rows)}
    claims = []
    if "adam" in found:
        adam = found["adam"]
        claims.append(
            Claim(
                source,
                "Adam's update matrices are ill-conditioned: kappa > 1e8",
                bool((adam["cond_nonzero"] > HUGE).all()),
                _describe("adam", adam),
            )
        )
    if "fismo" in found:
        fismo = found["fismo"]
        per_step = table[(table["method"] == "fismo") & (table["grad_scale"] == 1.0) & table["step"].notna()]
        spread = "; ".join(
            f"{shape} per logged step {rows['cond_nonzero'].min():.3g}-{rows['cond_nonzero'].max():.3g}"
            for shape, rows in per_step.groupby("shape", sort=False)
        )
        claims.append(
            Claim(
                source,
                "FISMO's kappa is stable at about 1e2-1e3",
                bool(fismo["cond_nonzero"].between(100.0, 1000.0).all()),
                _describe("fismo", fismo)
                + f"; {spread}"
                + (
                    "; fismo-svd (exact polar: the preconditioner's own effect) median cond_nonzero "
                    + ", ".join(f"{row.shape} {row.cond_nonzero:.4g}" for row in found["fismo-svd"].itertuples())
                    if "fismo-svd" in found
                    else ""
                ),
            )
        )
    order = [m for m in ("adam", "fismo", "muon-ns5", "muon-ns7", "muon-svd") if m in found]
    if len(order) > 1:
        layers = found[order[0]].index
        holds = all(
            found[a].loc[layer, "cond_nonzero"] > found[b].loc[layer, "cond_nonzero"]
            for layer in layers
            for a, b in itertools.pairwise(order)
        )
        evidence = "; ".join(
            f"{found[order[0]].loc[layer, 'shape']}: "
            + ", ".join(f"{m} {found[m].loc[layer, 'cond_nonzero']:.4g}" for m in order)
            for layer in layers
        )
        claims.append(
            Claim(
                source,
                "Ordering kappa_Adam >> kappa_FISMO > kappa_Muon(NS5) > kappa_Muon(NS7) > kappa_ideal-Muon = 1",
                holds,
                "median cond_nonzero, in the claimed order: " + evidence,
            )
        )
    if "muon-svd" in found:
        svd = found["muon-svd"]
        claims.append(
            Claim(
                source,
                "Ideal (exact-SVD) Muon updates have kappa = 1",
                bool(((svd["cond_nonzero"] - 1.0).abs() < 1e-3).all()),
                _describe("muon-svd", svd) + "; the compact polar factor of a rank-deficient momentum is "
                "rank-deficient too, so its cond over all singular values is infinite there",
            )
        )
    if "muon-ns5" in found and "muon-ns7" in found:
        ns5, ns7 = found["muon-ns5"], found["muon-ns7"]
        claims.append(
            Claim(
                source,
                "More Newton–Schulz steps bring Muon's kappa closer to 1 (NS7 < NS5)",
                bool((ns7["cond_nonzero"] < ns5["cond_nonzero"]).all()),
                "median cond_nonzero NS5 vs NS7: "
                + "; ".join(
                    f"{row.shape} {row.cond_nonzero:.4g} vs {ns7.loc[layer, 'cond_nonzero']:.4g}"
                    for layer, row in zip(ns5.index, ns5.itertuples(), strict=True)
                )
                + "; Muon's quintic settles singular values in about [0.7, 1.2] rather than at 1 (see orth-error)",
            )
        )
    scales = sorted(float(s) for s in table.loc[table["method"] == "fismo", "grad_scale"].unique())
    if len(scales) > 1:
        by_scale = {scale: _per_layer(table, "fismo", scale)["cond_nonzero"] for scale in scales}
        at_one = by_scale.get(1.0, by_scale[scales[0]])
        change = max((rows / at_one - 1.0).abs().max() for rows in by_scale.values())
        evidence = "; ".join(
            f"{found['fismo'].loc[layer, 'shape'] if 'fismo' in found else layer}: "
            + ", ".join(f"x{scale:g} {by_scale[scale][layer]:.4g}" for scale in scales)
            + (f" (Muon NS5: {found['muon-ns5'].loc[layer, 'cond_nonzero']:.4g})" if "muon-ns5" in found else "")
            for layer in at_one.index
        )
        claims.append(
            Claim(
                "FISMO Algorithm 1 line 4 (scale sensitivity, derived in structbench/optim/fismo.py)",
                "FISMO's kappa is not invariant to the gradient scale (it changes by more than 10%; Muon's cannot)",
                bool(change > 0.1),
                f"median cond_nonzero by gradient scale: {evidence}; largest relative change {change:.3g}",
            )
        )
    return claims


UPDATE_COND = ExperimentDef(
    name="update-cond",
    summary=(
        "Condition numbers of Adam, Muon (NS5, NS7, exact SVD) and FISMO update matrices on one shared gradient "
        "trace from a small training run, against FISMO §7's kappa_Adam > 1e8 >> kappa_FISMO ~ 1e2-1e3 > Muon > 1"
    ),
    defaults=DEFAULTS,
    run=run,
    validate=validate_args,
)

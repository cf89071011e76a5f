"""orth-error: Newton–Schulz vs the exact SVD polar factor against SUMO's Lemma 3.2 bound (SUMO §3.1).

SUMO (Refael et al. 2025, arXiv 2505.24749) Lemma 3.2: for A (m x n, m <= n), after i Newton–Schulz iterations
||E_i||_F <= sqrt(r) (1 - 1/kappa)^(2^i), with kappa = cond(A A^T) = cond(A)^2 and r the largest index with
sigma_r > sigma_{r+1} = ... = sigma_m (the values above the bottom plateau). Remark 3.7 reads it at
(1 - 1/kappa) = 0.99, five iterations: "the error would be ~0.99^32 = 0.725, relative to the norm of the moment".

Matrices A = U diag(s) V^T are built from known factors (U, V orthonormal from the QR of seeded Gaussians, in
float64), so the exact polar factor U V^T is known without any solver. Spectra, with cond(A) = kappa_a:
- "geometric": m distinct values from 1 down to 1/kappa_a (r = m - 1);
- "plateau": m/4 values geometric from 1 down (not reaching 1/kappa_a), the other 3m/4 all equal to 1/kappa_a
  (r = m/4), which tests the sqrt(r) factor.
Methods (structbench.optim.linalg, as SUMO calls them): "ns_cubic" — X <- 1.5 X - 0.5 X X^T X from
X0 = A / ||A||_2, the iteration the lemma's proof analyses; "ns_quintic" — Muon's NS5 coefficients from
X0 = A / (||A||_F + 1e-7), SUMO-NS5's operator; "svd" — linalg.polar_svd, SUMO's Orthogonalization_SVD.

Columns: error = ||X - U V^T||_F; rel_error = error / ||U V^T||_F = error / sqrt(m); bound = the lemma as
stated; bound_all_directions = sqrt(m - mult(sigma_1)) (1 - 1/kappa)^(2^i), the bound with every direction
below sigma_1 counted: per direction, d = 1 - (sigma_j / sigma_1)^2 obeys d_{k+1} = d_k^2 (3 + d_k) / 4 <= d_k^2
under the cubic step and bounds that direction's error 1 - x_k, so this corrected bound always holds for the
cubic iteration, while the lemma's sqrt(r) undercounts a bottom plateau. within_* allow 100 sqrt(m) eps of the
dtype for rounding. sv_min / sv_max: extreme singular values of X. paper: Remark 3.7's 0.725 (a relative
error) on the kappa = 100 (cond(A) = 10), 5-step rows. spec_check: an independent numpy computation of the same error
(16 x 256, geometric, float64, 5 steps), where it has a value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from structbench.experiments.base import Claim, ExperimentDef, ExperimentResult
from structbench.optim import linalg
from structbench.tasks.base import check_memory

SPECTRA = ("geometric", "plateau")
DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32}
METHODS = ("ns_cubic", "ns_quintic", "svd")
X0 = {"ns_cubic": "A/||A||_2", "ns_quintic": "A/(||A||_F+1e-7)", "svd": ""}
REMARK_3_7 = 0.725
"""SUMO Remark 3.7: 0.99^32 ~ 0.725, the relative error after five iterations at (1 - 1/kappa) = 0.99."""

SPEC_CHECK: dict[str, dict[float, float]] = {
    "ns_cubic": {1.0: 0.0, 2.0: 0.0, 5.0: 0.070, 10.0: 0.502, 100.0: 2.147, 1e4: 3.138, 1e6: 3.425},
    "ns_quintic": {1.0: 1.142, 2.0: 0.823, 5.0: 0.841, 10.0: 0.805, 100.0: 0.724, 1e4: 1.936, 1e6: 2.750},
    "svd": {1.0: 0.0, 2.0: 0.0, 5.0: 0.0, 10.0: 0.0, 100.0: 0.0, 1e4: 0.0, 1e6: 0.0},
}
"""An independent numpy computation (made outside structbench), to 3 decimals: ||NS_5(A) - U V^T||_F for A
16 x 256 with geometric singular values (numpy, float64)."""

DEFAULTS: dict[str, Any] = {
    "rows": 16,
    "cols": 256,
    "kappas": [1.0, 2.0, 5.0, 10.0, 100.0, 1e3, 1e4, 1e6],
    "steps": [5, 7],
    "spectra": list(SPECTRA),
    "dtypes": list(DTYPES),
}


def spectrum(kind: str, m: int, kappa_a: float) -> Tensor:
    """m singular values, descending, largest 1 and smallest 1/kappa_a (float64)."""
    if kind == "geometric":
        return torch.logspace(0.0, -math.log10(kappa_a), m, dtype=torch.float64)
    if kind == "plateau":
        top = max(1, m // 4)
        head = torch.logspace(0.0, -math.log10(kappa_a), top + 1, dtype=torch.float64)[:top]
        return torch.cat([head, torch.full((m - top,), 1.0 / kappa_a, dtype=torch.float64)])
    raise ValueError(f"unknown spectrum {kind!r}; valid: {', '.join(SPECTRA)}")


def lemma_r(s: Sequence[float]) -> int:
    """Lemma 3.2's r: the largest index with s_r > s_{r+1} = ... = s_m (0 when all are equal)."""
    values = list(s)
    r = len(values)
    while r > 0 and values[r - 1] == values[-1]:
        r -= 1
    return r


def lemma_bound(count: int, kappa: float, steps: int) -> float:
    """sqrt(count) (1 - 1/kappa)^(2^steps)."""
    return math.sqrt(count) * (1.0 - 1.0 / kappa) ** (2**steps)


def _factors(m: int, n: int, seed: int, device: torch.device) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=torch.float64))
    return u.to(device), v.to(device)


def _orthogonalize(method: str, a: Tensor, steps: int) -> Tensor:
    if method == "svd":
        return linalg.polar_svd(a)
    if method == "ns_cubic":
        return linalg.newton_schulz(a, steps, linalg.NS_CUBIC, eps=0.0, dtype=a.dtype, normalize="spectral")
    return linalg.newton_schulz(a, steps, linalg.NS_QUINTIC, dtype=a.dtype)


def _singular_value_range(x: Tensor) -> tuple[Tensor, Tensor]:
    """Extreme singular values of each wide X (batched), from the eigenvalues of the small Gram X X^T."""
    x64 = x.to(torch.float64)
    evals = torch.linalg.eigvalsh(x64 @ x64.mT).clamp_min(0.0).sqrt()
    return evals[..., 0], evals[..., -1]


def validate_args(params: Mapping[str, Any]) -> None:
    """Raise ValueError unless the arguments describe matrices the lemma covers and known spectra and dtypes."""
    m, n = int(params["rows"]), int(params["cols"])
    if not 2 <= m <= n:
        raise ValueError(f"orth-error needs 2 <= rows <= cols (the lemma's m <= n); got {m} x {n}")
    if not all(float(k) >= 1 for k in params["kappas"]):
        raise ValueError(f"kappas are condition numbers, each >= 1; got {params['kappas']}")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in params["steps"]):
        raise ValueError(f"steps are Newton-Schulz iteration counts, each an int >= 0; got {params['steps']}")
    unknown = sorted(set(params["spectra"]) - set(SPECTRA)) + sorted(set(params["dtypes"]) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown spectra or dtypes {unknown}; valid: {', '.join([*SPECTRA, *DTYPES])}")
    check_memory(f"orth-error: {len(params['kappas'])} float64 {m} x {n} matrices", 8 * m * n * len(params["kappas"]))


def run(args: dict[str, Any], seed: int, device: torch.device) -> ExperimentResult:
    params = {**DEFAULTS, **args}
    validate_args(params)
    m, n = int(params["rows"]), int(params["cols"])
    kappas = [float(k) for k in params["kappas"]]
    u, v = _factors(m, n, seed, device)
    exact = u @ v.mT
    rows: list[dict[str, Any]] = []
    for kind in params["spectra"]:
        spectra = [spectrum(kind, m, k) for k in kappas]
        a64 = torch.stack([(u * s.to(device)) @ v.mT for s in spectra])
        for dtype_name in params["dtypes"]:
            dtype = DTYPES[dtype_name]
            tol = 100.0 * math.sqrt(m) * torch.finfo(dtype).eps
            for method in METHODS:
                for steps in [None] if method == "svd" else [int(i) for i in params["steps"]]:
                    x = _orthogonalize(method, a64.to(dtype), steps or 0)
                    errors = torch.linalg.matrix_norm(x.to(torch.float64) - exact).tolist()
                    sv_min, sv_max = (t.tolist() for t in _singular_value_range(x))
                    for j, (kappa_a, s) in enumerate(zip(kappas, spectra, strict=True)):
                        rows.append(
                            _row(kind, dtype_name, method, steps, kappa_a, s.tolist(), m, errors[j], tol)
                            | {"sv_min": sv_min[j], "sv_max": sv_max[j]}
                        )
    table = pd.DataFrame(rows)
    table["steps"] = table["steps"].astype("Int64")
    return ExperimentResult(table=table, claims=_claims(table, m))


def _row(
    kind: str,
    dtype: str,
    method: str,
    steps: int | None,
    kappa_a: float,
    s: list[float],
    m: int,
    error: float,
    tol: float,
) -> dict[str, Any]:
    kappa = kappa_a**2
    r = lemma_r(s)
    below_top = m - sum(1 for value in s if value == s[0])
    bound = lemma_bound(r, kappa, steps) if steps is not None else math.nan
    bound_all = lemma_bound(below_top, kappa, steps) if steps is not None else math.nan
    at_remark = steps == 5 and math.isclose(kappa, 100.0) and kind == "geometric"
    in_spec_table = m == 16 and kind == "geometric" and dtype == "float64" and steps in (5, None)
    return {
        "spectrum": kind,
        "dtype": dtype,
        "method": method,
        "x0": X0[method],
        "steps": steps,
        "kappa_a": kappa_a,
        "kappa": kappa,
        "lemma_r": r,
        "error": error,
        "rel_error": error / math.sqrt(m),
        "bound": bound,
        "within_bound": bool(error <= bound + tol) if steps is not None else None,
        "bound_all_directions": bound_all,
        "within_bound_all_directions": bool(error <= bound_all + tol) if steps is not None else None,
        "paper": REMARK_3_7 if at_remark else math.nan,
        "spec_check": SPEC_CHECK[method].get(kappa_a, math.nan) if in_spec_table else math.nan,
    }


def _fmt(values: Iterable[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


def _nondecreasing(values: Sequence[float]) -> bool:
    return all(b >= a - 1e-12 for a, b in itertools.pairwise(values))


def _describe(row: Any) -> str:
    return f"cond(A) = {row.kappa_a:g}, {int(row.steps)} steps: error {row.error:.3g} vs bound {row.bound:.3g}"


def _errors_by_kappa(rows: pd.DataFrame, steps: int) -> list[float]:
    return rows[rows["steps"] == steps].sort_values("kappa_a")["error"].tolist()


def _claims(table: pd.DataFrame, m: int) -> list[Claim]:
    """Verdicts on the paper's statements (and structbench's own); NS claims use the float64 rows when present."""
    exact = table[table["dtype"] == "float64"] if (table["dtype"] == "float64").any() else table
    cubic = exact[exact["method"] == "ns_cubic"]
    quintic = exact[(exact["method"] == "ns_quintic") & (exact["spectrum"] == "geometric")]
    claims = _lemma_claims(cubic, m) + _quintic_claims(quintic)
    remark = exact[exact["paper"].notna()]
    if not remark.empty:
        claims.append(
            Claim(
                "SUMO Remark 3.7",
                "At (1 - 1/kappa) = 0.99 (cond(A) = 10) five Newton–Schulz iterations leave an error of about "
                "0.725 relative to the moment's norm",
                bool(((remark["rel_error"] - REMARK_3_7).abs() < 0.1).any()),
                "0.99^32 = 0.725 is the lemma's bound factor, not a measurement; error / ||U V^T||_F measured: "
                + ", ".join(f"{row.method} {row.rel_error:.3f}" for row in remark.itertuples()),
            )
        )
    return claims + _svd_claims(table)


def _lemma_claims(cubic: pd.DataFrame, m: int) -> list[Claim]:
    claims: list[Claim] = []
    geometric = cubic[cubic["spectrum"] == "geometric"]
    plateau = cubic[cubic["spectrum"] == "plateau"]
    if not geometric.empty:
        example = geometric[(geometric["kappa_a"] == 10.0) & (geometric["steps"] == 5)]
        claims.append(
            Claim(
                "SUMO Lemma 3.2",
                "The cubic Newton–Schulz error from X0 = A/||A||_2 is within sqrt(r) (1 - 1/kappa)^(2^i), "
                "kappa = cond(A A^T), for distinct singular values",
                bool(geometric["within_bound"].all()),
                f"{int(geometric['within_bound'].sum())}/{len(geometric)} geometric-spectrum rows within; largest "
                f"error - bound = {(geometric['error'] - geometric['bound']).max():.3g}"
                + "".join(f"; e.g. {_describe(row)}" for row in example.itertuples()),
            )
        )
        misread = [
            row.error > lemma_bound(row.lemma_r, row.kappa_a, int(row.steps)) + 1e-12
            for row in geometric.itertuples()
            if row.kappa_a > 1
        ]
        claims.append(
            Claim(
                "SUMO Lemma 3.2 (kappa is the condition number of A A^T)",
                "Lemma 3.2's kappa must be cond(A A^T) = cond(A)^2: read as cond(A), the bound fails for the cubic",
                any(misread),
                f"{sum(misread)}/{len(misread)} geometric rows with cond(A) > 1 exceed sqrt(r) (1 - 1/cond(A))^(2^i); "
                f"{int((~geometric['within_bound'].astype(bool)).sum())} exceed it with cond(A)^2",
            )
        )
        steps = sorted(int(i) for i in geometric["steps"].dropna().unique())
        by_steps = {i: _errors_by_kappa(geometric, i) for i in steps}
        claims.append(
            Claim(
                "SUMO §3.1 (after Lemma 3.2)",
                "The (cubic) Newton–Schulz error grows with the condition number",
                all(_nondecreasing(errors) for errors in by_steps.values()),
                "cubic, geometric, by increasing cond(A): "
                + "; ".join(f"{i} steps: {_fmt(errors)}" for i, errors in by_steps.items()),
            )
        )
    if not plateau.empty:
        broken = plateau[~plateau["within_bound"].astype(bool)]
        claims.append(
            Claim(
                "SUMO Lemma 3.2",
                "The bound holds as stated, with r the number of singular values above the bottom plateau",
                broken.empty,
                f"plateau spectra (r = {int(plateau['lemma_r'].max())} of m = {m}): {len(broken)}/{len(plateau)} "
                "rows exceed it"
                + "".join(f", e.g. {_describe(row)}" for row in broken.head(1).itertuples())
                + "; counting every direction below sigma_1, sqrt(m - mult(sigma_1)) (1 - 1/kappa)^(2^i) holds on "
                f"{int(cubic['within_bound_all_directions'].sum())}/{len(cubic)} cubic rows",
            )
        )
    return claims


def _quintic_claims(quintic: pd.DataFrame) -> list[Claim]:
    if quintic.empty:
        return []
    steps = sorted(int(i) for i in quintic["steps"].dropna().unique())
    banded = quintic[quintic["kappa_a"] <= 100.0]
    at_one = quintic[quintic["kappa_a"] == 1.0]
    first = _errors_by_kappa(quintic, steps[0])
    return [
        Claim(
            "SUMO §3.1 / Remark 3.7 (Newton–Schulz5)",
            "Muon's quintic NS5 error grows with the condition number",
            _nondecreasing(first),
            f"quintic, {steps[0]} steps, by increasing cond(A): {_fmt(first)}",
        ),
        Claim(
            "SUMO §2 (Newton-Schulz5, after Muon); KellerJordan/Muon muon.py coefficients",
            "Muon's quintic does not converge to the exact polar factor: its singular values end in about [0.68, 1.13]",
            bool((banded["error"] > 0.1).all() and banded["sv_min"].min() > 0.6 and banded["sv_max"].max() < 1.25),
            f"cond(A) <= 100: singular values in [{banded['sv_min'].min():.3f}, {banded['sv_max'].max():.3f}]; "
            f"error at cond(A) = 1 after {_fmt(at_one['steps'].tolist())} steps: {_fmt(at_one['error'].tolist())}; "
            + "; ".join(f"{i} steps: {_fmt(_errors_by_kappa(banded, i))}" for i in steps),
        ),
    ]


def _svd_claims(table: pd.DataFrame) -> list[Claim]:
    svd = table[(table["method"] == "svd") & (table["dtype"] == "float32")]
    if svd.empty:
        return []
    ns5 = table[(table["method"] == "ns_quintic") & (table["steps"] == 5)]
    paired = svd.merge(ns5, on=["spectrum", "dtype", "kappa_a"], suffixes=("", "_ns5"))
    ratio = (
        f"; NS5's error is >= {(paired['error_ns5'] / paired['error']).min():.3g}x larger on every row"
        if len(paired)
        else ""
    )
    within = svd[svd["error"] <= 1e-5]
    first = svd[svd["spectrum"] == svd["spectrum"].iloc[0]].sort_values("kappa_a")
    return [
        Claim(
            "SUMO §3.2 (Orthogonalization_SVD is exact); 1e-5 is structbench's float32 tolerance",
            "The SVD polar factor's error is <= 1e-5 in float32",
            len(within) == len(svd),
            f"{len(within)}/{len(svd)} float32 rows within, up to cond(A) = "
            f"{within['kappa_a'].max() if len(within) else math.nan:g}; {first['spectrum'].iloc[0]} by increasing "
            f"cond(A): {_fmt(first['error'].tolist())} (float32 rounding amplified by cond(A)){ratio}",
        )
    ]


ORTH_ERROR = ExperimentDef(
    name="orth-error",
    summary=(
        "Newton–Schulz (cubic, Muon quintic; 5 and 7 steps) vs the exact SVD polar factor on matrices of controlled "
        "condition number, against SUMO's Lemma 3.2 bound sqrt(r) (1 - 1/kappa)^(2^i), kappa = cond(A A^T)"
    ),
    defaults=DEFAULTS,
    run=run,
    validate=validate_args,
)

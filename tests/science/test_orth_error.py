"""Tests for the orth-error experiment against independent facts.

- Newton–Schulz keeps the singular vectors and maps each singular value x = s_j / ||A|| through its scalar
  polynomial, so ||NS_i(A) - U V^T||_F = sqrt(sum_j (f^i(x_j) - 1)^2): recomputed here with a plain Python loop
  over spectra written out by hand.
- The bound column is sqrt(r) (1 - 1/cond(A)^2)^(2^i) with r counted by hand (m - 1 for distinct values, m/4
  above a plateau, 0 for equal values); exact orthogonal input (cond 1) gives cubic error 0.
- An independent numpy computation (16 x 256, float64, 5 steps, SPEC_CHECK) is reproduced to its printed digits.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from structbench.experiments.orth_error import ORTH_ERROR, lemma_r, run

CUBIC = (1.5, -0.5, 0.0)
QUINTIC = (3.4445, -4.7750, 2.0315)
M = 16
N = 256
"""The experiment's matrices are 16 x 256."""
U64 = 2.0**-53
"""float64 unit roundoff."""


def _gamma(n: int, u: float = U64) -> float:
    return n * u / (1 - n * u)


def _ns_rounding(steps: int, gain: float) -> float:
    """Frobenius bound on a float64 NS run's rounding: each step X' = a X + (b A + c A^2) X with A = X X^T rounds by
    <= 3 gamma_(M+N) || |X| |X|^T |X| ||_F <= 3 gamma_(M+N) ||X||_F^3 (products of magnitudes), ||X||_F <= 1.2 sqrt(M)
    (singular values stay below 1.2), and each step multiplies earlier errors by at most the polynomial's largest
    slope on [0, 1.2] (`gain`, the divided differences of an odd polynomial being its slopes): sum_k gain^k."""
    per_step = 3 * _gamma(M + N) * (1.2 * M**0.5) ** 3
    return per_step * sum(gain**k for k in range(steps + 1))


CUBIC_GAIN, QUINTIC_GAIN = 1.5, 3.9
"""max |p'(x)| on [0, 1.2]: 1.5 - 1.5 x^2 peaks at 1.5 (x = 0); the quintic's at 3.9 (x = 1.2)."""


@pytest.fixture(scope="module")
def result() -> tuple[pd.DataFrame, dict[str, bool]]:
    out = ORTH_ERROR.run(dict(ORTH_ERROR.defaults), 0, torch.device("cpu"))
    return out.table, {claim.statement: claim.holds for claim in out.claims}


def _hand_spectrum(kind: str, kappa_a: float) -> list[float]:
    if kind == "geometric":
        return [kappa_a ** (-j / (M - 1)) for j in range(M)]
    top = [kappa_a ** (-j / (M // 4)) for j in range(M // 4)]
    return top + [1 / kappa_a] * (M - M // 4)


def _scalar_error(s: list[float], method: str, steps: int) -> float:
    a, b, c = CUBIC if method == "ns_cubic" else QUINTIC
    norm = max(s) if method == "ns_cubic" else math.sqrt(sum(v * v for v in s)) + 1e-7
    total = 0.0
    for value in s:
        x = value / norm
        for _ in range(steps):
            x = a * x + b * x**3 + c * x**5
        total += (x - 1.0) ** 2
    return math.sqrt(total)


def _ns_rows(table: pd.DataFrame, dtype: str = "float64") -> pd.DataFrame:
    return table[(table["method"] != "svd") & (table["dtype"] == dtype)]


def test_exact_orthogonal_input_gives_zero_cubic_error(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    table, _ = result
    rows = _ns_rows(table)
    at_one = rows[(rows["kappa_a"] == 1.0) & (rows["method"] == "ns_cubic")]
    assert len(at_one) == 4  # two spectra x two step counts
    # exact in exact arithmetic (all singular values 1, a fixed point); float64 rounding per `_ns_rounding`, plus
    # X0's spectral norm (an SVD, M u ||A||): ~4e-11. X0 = A / ||A||_F (1/4 here) leaves 1e-1.
    assert all(row.error <= _ns_rounding(row.steps, CUBIC_GAIN) + M * U64 for row in at_one.itertuples())
    assert (at_one["bound"] == 0.0).all() and at_one["within_bound"].all()
    assert (at_one["lemma_r"] == 0).all()


def test_bound_column_recomputed_by_hand(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    table, _ = result
    for row in _ns_rows(table).itertuples():
        r = 0 if row.kappa_a == 1.0 else (M - 1 if row.spectrum == "geometric" else M // 4)
        assert row.lemma_r == r
        expected = math.sqrt(r) * (1 - 1 / row.kappa_a**2) ** (2**row.steps)
        # the same float64 formula in either order: 1 - 1/kappa^2 to 3 u, raised to 2^steps (x 2^steps), sqrt and
        # product (2 u), on both sides; abs 1e-300 for the underflowed values
        rel = 2 * (3 * 2**row.steps + 2) * U64
        assert row.bound == pytest.approx(expected, rel=rel, abs=1e-300)
        all_directions = 0 if row.kappa_a == 1.0 else M - 1
        assert row.bound_all_directions == pytest.approx(
            math.sqrt(all_directions) * (1 - 1 / row.kappa_a**2) ** (2**row.steps), rel=rel, abs=1e-300
        )


def test_errors_match_the_scalar_newton_schulz_map(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    table, _ = result
    rows = _ns_rows(table)
    assert len(rows) == 2 * 2 * 2 * 8  # spectra x methods x steps x kappas
    for row in rows.itertuples():
        predicted = _scalar_error(_hand_spectrum(row.spectrum, row.kappa_a), row.method, row.steps)
        # the matrix run's float64 rounding (`_ns_rounding`, up to ~5e-8 for 7 quintic steps) and the scalar map's
        # (4 u a step per value, through the same slopes, 16 values); a wrong coefficient or X0 moves it by >= 1e-3
        gain = CUBIC_GAIN if row.method == "ns_cubic" else QUINTIC_GAIN
        scalar = 4 * U64 * M * sum(gain**k for k in range(row.steps + 1))
        assert row.error == pytest.approx(predicted, abs=_ns_rounding(row.steps, gain) + scalar), row


def test_float32_rows_agree_with_float64_to_rounding(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    table, _ = result
    merged = _ns_rows(table, "float32").merge(
        _ns_rows(table), on=["spectrum", "method", "steps", "kappa_a"], suffixes=("_32", "_64")
    )
    well_conditioned = merged[merged["kappa_a"] <= 100.0]
    # (c) Measured: `_ns_rounding` with float32's u is above 1e-1 for 7 quintic steps, so no a-priori bound is
    # useful; max |error_32 - error_64| = 1.25e-6 on AVX2, without SIMD and with one thread alike; allowed 1e-4 (80x).
    assert ((well_conditioned["error_32"] - well_conditioned["error_64"]).abs() < 1e-4).all()


def test_reproduces_the_specs_numpy_check(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    """Printed to 3 decimals (the cubic at cond(A) = 5 prints 0.070 for 0.0695); its SVD column reads "~0"."""
    table, _ = result
    checked = table[table["spec_check"].notna()]
    assert set(checked["method"]) == {"ns_cubic", "ns_quintic", "svd"} and len(checked) == 21
    ns = checked[checked["method"] != "svd"]
    # Not rounding: a printed, independent numpy computation. 3 decimals (half a unit, 5e-4), and the spec's own
    # value can sit beyond that (at cond 5 it notes 0.0695, printed 0.070; ours is 0.06946): 1e-3 (1 + value) covers
    # both, while a wrong step count or coefficient is off by >= 1e-2.
    assert ((ns["error"] - ns["spec_check"]).abs() <= 1e-3 * (1 + ns["spec_check"])).all()
    svd64 = table[(table["method"] == "svd") & (table["dtype"] == "float64") & (table["kappa_a"] <= 1e4)]
    # float64 SVD polar factor: backward error N u ||A|| moves U V^T by <= 2 N u cond(A) (the polar factor's
    # condition 2 / s_min), and U, V are orthonormal to M u and N u: <= 2 N u (cond + 1) ~ 6e-10 at 1e4
    assert len(svd64) and (svd64["error"] <= 2 * N * U64 * (svd64["kappa_a"] + 1)).all()


def test_paper_column_holds_remark_3_7_beside_the_bound_factor(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    table, _ = result
    rows = table[table["paper"].notna()]
    assert set(rows["method"]) == {"ns_cubic", "ns_quintic"}
    assert (rows["kappa_a"] == 10.0).all() and (rows["steps"] == 5).all()
    assert (rows["paper"] == 0.725).all()
    assert abs(0.99**32 - 0.725) < 5e-4  # the remark prints 0.725: 3 decimals, within half a unit of 0.99^32
    assert (rows["bound"] / math.sqrt(M - 1)).round(3).eq(0.725).all()


def test_svd_rows_are_the_polar_factor(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    table, _ = result
    svd = table[table["method"] == "svd"]
    assert svd["steps"].isna().all() and svd["bound"].isna().all()
    # (c) Measured: float32's worst-case polar bound (2 N u cond) is 3e-4 at cond 10, above the experiment's 1e-5
    # claim; the errors measured on AVX2, without SIMD and with one thread are <= 3.5e-6 (allowed 1e-5, 2.9x).
    assert (svd[svd["kappa_a"] <= 10.0]["error"] < 1e-5).all()
    # U (M x M) and V (N x M) orthonormal to M u and N u: U V^T's singular values within (M + N) u of 1
    u = svd["dtype"].map({"float32": 2.0**-24, "float64": U64})
    assert (svd["sv_max"] <= 1 + (M + N) * u).all()
    # Numerically full rank (smallest relative singular value above max(m, n) * eps): a unit singular spectrum.
    # Below that tolerance (float32 at cond(A) = 1e6) the compact polar factor drops the direction: 0 up to rounding,
    # (c) measured <= 3.6e-8 on the three kernel settings, allowed 1e-6.
    eps = svd["dtype"].map({"float32": 2.0**-23, "float64": 2.0**-52})
    resolved = 1.0 / svd["kappa_a"] > 256 * eps
    assert (svd[resolved]["sv_min"] >= 1 - (M + N) * u[resolved]).all()
    assert (svd[~resolved]["sv_min"] < 1e-6).all() and (~resolved).sum() == 2


def test_claims(result: tuple[pd.DataFrame, dict[str, bool]]) -> None:
    """Verdicts: the lemma holds for the cubic with distinct singular values and kappa = cond(A)^2, fails on
    plateaus; the quintic has an error floor (1.14 at cond 1, measured above) and no monotone growth; the
    remark's 0.725 is a loose bound (measured 0.125 / 0.201); float32 SVD errors pass 1e-5 only to cond(A) 10."""
    _, claims = result
    verdicts = {statement.split(":")[0][:40]: holds for statement, holds in claims.items()}
    assert verdicts == {
        "The cubic Newton–Schulz error from X0 = ": True,
        "Lemma 3.2's kappa must be cond(A A^T) = ": True,
        "The (cubic) Newton–Schulz error grows wi": True,
        "The bound holds as stated, with r the nu": False,
        "Muon's quintic NS5 error grows with the ": False,
        "Muon's quintic does not converge to the ": True,
        "At (1 - 1/kappa) = 0.99 (cond(A) = 10) f": False,
        "The SVD polar factor's error is <= 1e-5 ": False,
    }


def test_cubic_direction_error_contracts_like_the_corrected_bound() -> None:
    """The derivation behind bound_all_directions: d = 1 - x^2 obeys d' <= d^2 under x' = 1.5 x - 0.5 x^3,
    and 1 - x <= d, for every x in (0, 1]."""
    for k in range(1, 1001):
        x = k / 1000
        d = 1 - x * x
        x_next = 1.5 * x - 0.5 * x**3
        assert 1 - x_next * x_next <= d * d + 1e-15
        assert 1 - x <= d + 1e-15


def test_lemma_r_counts_values_above_the_bottom_plateau() -> None:
    assert lemma_r([1.0, 0.5, 0.1, 0.1]) == 2
    assert lemma_r([3.0, 2.0, 1.0]) == 2
    assert lemma_r([1.0, 1.0, 1.0]) == 0


def test_small_custom_run_and_bad_shape() -> None:
    args = {"rows": 4, "cols": 8, "kappas": [1.0, 10.0], "steps": [3]}
    table = run(args, 1, torch.device("cpu")).table
    assert len(table) == 2 * 2 * 3 * 2  # spectra x dtypes x (cubic, quintic, svd) x kappas
    with pytest.raises(ValueError, match="rows <= cols"):
        run({"rows": 8, "cols": 4}, 0, torch.device("cpu"))

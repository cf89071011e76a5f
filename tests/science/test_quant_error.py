"""quant-error experiment (4-bit Shampoo Tables 1, 5, 6) against independent facts."""

from __future__ import annotations

import math

import pytest
import torch

from structbench.experiments import quant_error as qe


def _hadamard(order: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.size(0) < order:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(order)


def test_metrics_on_hand_checkable_pairs():
    """The angle is arccos of a cosine; at cos = 1 - d arccos turns float64 rounding d into sqrt(2 d) radians: the
    cosine <a, b> / (||a|| ||b||) of parallel 16 x 16 matrices is 1 up to d <= 2 gamma_256 + 4 u (the sum of products,
    the two sums of squares, the sqrts, the product and the quotient), so the angle is within sqrt(2 d) radians
    (~2e-5 degrees) of 0, not exactly 0. The NREs are exact: a - a = 0 and ||a - 2a|| = ||a||."""
    a = torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    u = 2.0**-53
    d = 2 * 256 * u / (1 - 256 * u) + 4 * u
    angle = math.degrees(math.sqrt(2 * d))
    nre, ae = qe.nre_ae(a, a)
    assert nre == 0.0 and ae == pytest.approx(0.0, abs=angle)
    nre, ae = qe.nre_ae(a, 2 * a)  # same direction, twice the norm (2 a and a - 2 a are exact)
    assert nre == 1.0 and ae == pytest.approx(0.0, abs=angle)
    assert qe.nre_ae(torch.eye(2), torch.tensor([[0.0, 1.0], [1.0, 0.0]]))[1] == 90.0  # cos 0 exactly: acos(0)


def test_exactly_representable_eigenvectors_give_zero_error():
    """A normalised Hadamard matrix's rows are +-c in every block: absmax c maps them onto the Linear-2 codes
    -1 and +1 exactly, so quantizing U loses nothing (DT has no -1 and must err)."""
    u = _hadamard(128)
    evals = torch.cat((torch.full((64,), 1000.0), torch.ones(64))).double()
    lin = {r["scheme"]: r["nre"] for r in qe.error_rows(u, evals, "linear-2", 4) if r["part"] == "full"}
    dt = {r["scheme"]: r["nre"] for r in qe.error_rows(u, evals, "dt", 4) if r["part"] == "full"}
    # Quantized exactly up to float32: every entry is +-float32(c), c = 128^-1/2, so V = (1 + e) U, |e| <= u32, and
    # the root scales by (1 + e)^-1/2. The root itself is linalg.inverse_root_eigh's float32 result: eigenvectors
    # rounded to float32 (orthonormal to 2 u32), the pow (2 u32), and V r V^T with gamma_128 (|V| r |V|^T), whose
    # Frobenius norm here is sum(r) (|V| is all c) against ||root||_F = ||r||: NRE <= e / 2 + 2 u32 + 2 u32 +
    # gamma_128 sum(r) / ||r|| ~ 8e-5. DT, without -1, errs by >= 1e-2.
    u32 = 2.0**-24
    r = (evals + 1e-6 * 1000.0) ** -0.25
    bound = u32 / 2 + 4 * u32 + 128 * u32 / (1 - 128 * u32) * float(r.sum() / r.norm())
    assert lin["U"] <= bound and lin["U+OR"] <= bound
    assert dt["U"] > 1e-2


def test_8bit_errors_are_below_4bit_errors():
    u, evals = qe.synthetic_matrix(128, 1000.0, 1.0, 0.5, seed=0)
    for codebook in ("linear-2", "dt"):
        four = {(r["scheme"], r["part"]): r["nre"] for r in qe.error_rows(u, evals, codebook, 4)}
        eight = {(r["scheme"], r["part"]): r["nre"] for r in qe.error_rows(u, evals, codebook, 8)}
        for key in four:
            assert eight[key] < four[key], key


def test_synthetic_matrix_has_two_eigenvalues_and_orthogonal_u():
    u, evals = qe.synthetic_matrix(64, 1000.0, 1.0, 0.25, seed=3)
    # a float64 Householder QR factor is orthonormal to n u (fismo's convention), n = 64
    torch.testing.assert_close(u.mT @ u, torch.eye(64, dtype=torch.float64), rtol=0, atol=64 * 2.0**-53)
    assert sorted(set(evals.tolist())) == [1.0, 1000.0] and int((evals == 1000.0).sum()) == 16


def test_paper_orderings_hold_at_a_small_order():
    result = qe.QUANT_ERROR.run({"order": 256}, 0, torch.device("cpu"))
    assert set(result.table["scheme"]) == set(qe.SCHEMES)
    ordering = [c for c in result.claims if "within 25%" not in c.statement]
    assert ordering and all(c.holds for c in ordering), [c.evidence for c in ordering if not c.holds]


# 4-bit Shampoo (arXiv 2405.18144) Appendix D.1, Table 6, synthetic A2 column (NRE, AE in degrees) of the
# off-diagonal part f(A) = A^-1/4 - Diag(diag(A^-1/4)), as printed.
TABLE_6_A2 = {
    ("dt", "U+OR"): (0.1427, 8.1415),
    ("dt", "B"): (0.1391, 7.9813),
    ("dt", "(U,B)+OR"): (0.1992, 11.393),
    ("linear-2", "U+OR"): (0.1088, 6.2176),
    ("linear-2", "B"): (0.1078, 6.1755),
    ("linear-2", "(U,B)+OR"): (0.1532, 8.7534),
}


def test_rectified_and_stored_root_rows_reproduce_the_papers_printed_values():
    """At the paper's order 1200, with one Björck step (Section 3.2: "Table 1 illustrates the benefit of rectifying V
    into V_1"), the off-diagonal errors of the rectified and stored roots match Table 6's A2 column to 0.5% (observed
    0.2% at most; the paper prints 4-5 digits and its random U is not ours). Order 1200 is the fact being checked, so
    the test cannot be smaller: two 1200 x 1200 float64 eigendecompositions, about 10 s on two cores. The
    quantize-A rows are not compared: they are Newton roots of an indefinite D(Q(A)), set by the iteration's
    details rather than by A (module docstring of structbench.experiments.quant_error)."""
    u, evals = qe.synthetic_matrix(1200, 1000.0, 1.0, 0.5, seed=0)
    for codebook in ("dt", "linear-2"):
        schemes = [s for (cb, s) in TABLE_6_A2 if cb == codebook]
        rows = qe.error_rows(u, evals, codebook, 4, t2=qe.DEFAULTS["t2"], schemes=schemes)
        measured = {r["scheme"]: (r["nre"], r["ae_deg"]) for r in rows if r["part"] == "offdiag"}
        for scheme in schemes:
            nre, ae = measured[scheme]
            paper_nre, paper_ae = TABLE_6_A2[(codebook, scheme)]
            assert nre == pytest.approx(paper_nre, rel=5e-3), (codebook, scheme)
            assert ae == pytest.approx(paper_ae, rel=5e-3), (codebook, scheme)

"""Tests for structbench.optim.fira against independent facts.

- Hand-derived updates (float64, from the reference code's equations, xichen-fy/Fira optimizer_torch/fira_adamw.py):
  GaLore's low-rank HF-style Adam step plus the compensation R Diag(phi), phi_c = ||N_c|| / (||sigma_c|| +
  1e-8) along the r dimension, R = G - alpha U U^T G, and the norm-growth limiter with gamma = 1.01. The basis
  is the float64 SVD of a gradient with well-separated singular values.
- Structure: compensation "none" is GaLore bit for bit; the "orthogonal" residual lies outside span(U); Fira+
  has the norm alpha_c * alpha * ||N|| (F.7).
- Parity with pytorch_optimizer 4.1.0 `Fira` (test-only oracle), see `test_parity_with_pytorch_optimizer`.
- Exact state bytes from Table 6's GaLore/Fira count 2nr + mr plus the limiter scalar, in float32.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from structbench import measure
from structbench.optim import memory, registry
from structbench.optim.fira import Fira
from structbench.optim.galore import GaLore
from tests.support.lowrank_helpers import (
    EXACT,
    F64,
    U32,
    Rounding,
    assert_resume_is_bit_identical,
    assert_svd_basis,
    bucket_case,
    growth_outside_the_subspace,
    hand_channel_ratio,
    hand_projected_adam,
    known_matrix,
    spread,
    step_together,
    steps_beside_oracle,
    top_basis,
)

HP = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "scale": 0.25, "weight_decay": 0.0}


def hand_fira(
    w0: Tensor,
    grads: list[Tensor],
    basis: Tensor,
    right: bool,
    hp: dict[str, Any],
    gamma: float = 1.01,
    rounding: Rounding = EXACT,
) -> tuple[Tensor, list[Tensor]]:
    """W after Fira steps with a fixed basis, and each step's (limited) compensation C, all float64.

    `rounding` models the optimizer's float32 operations (`lowrank_helpers.Rounding`): the projection, moments and
    channel ratios as in `hand_projected_adam`; U sigma (r terms) and R = G - scale U sigma (2 more, may cancel);
    C = R phi; the limiter's ||C|| (mn-term sum, sqrt), eta = gamma / (||C|| / psi) and C eta, psi = eta ||C||; the
    update addmm(C, U, N, alpha=scale) (r + 2, may cancel) and W - lr_bc update (the float32 alpha, the product and
    the sum: 3, may cancel); the decay W - lr wd W (2)."""
    w = w0.to(F64)
    r = basis.shape[1]

    def back(x: Tensor, magnitude: bool = False) -> Tensor:
        b = basis.abs() if magnitude else basis
        return x @ b.T if right else b @ x

    psi = None
    comps = []
    for step in hand_projected_adam(grads, basis, right, hp["lr"], (hp["beta1"], hp["beta2"]), hp["eps"], rounding):
        phi = hand_channel_ratio(step.normalized, step.projected, right, rounding)
        in_span = rounding.summed(back(step.projected), back(step.projected.abs(), True), r)
        residual = step.grad - hp["scale"] * in_span
        residual = rounding.summed(residual, step.grad.abs() + hp["scale"] * in_span.abs(), 2)
        comp = rounding.rounded(residual * phi)
        norm = rounding.rounded(comp.norm(), comp.numel() + 1)
        if psi is not None and norm / psi > gamma:
            eta = rounding.rounded(gamma / rounding.rounded(norm / psi))
            comp = rounding.rounded(comp * eta)
            psi = rounding.rounded(eta * norm)
        else:
            psi = comp.norm() if rounding is EXACT else norm
        comps.append(comp)
        low = back(step.normalized)
        update = hp["scale"] * low + comp
        update = rounding.summed(update, hp["scale"] * back(step.normalized.abs(), True) + comp.abs(), r + 2)
        w = rounding.summed(w - step.step_size * update, w.abs() + step.step_size * update.abs(), 3)
        if hp["weight_decay"]:
            w = rounding.rounded(w - hp["lr"] * hp["weight_decay"] * w, 2)
    return w, comps


def own_basis(opt: torch.optim.Optimizer, param: nn.Parameter, right: bool) -> Tensor:
    """The optimizer's float32 projection as the hand steps' float64 basis (n x r on the right, m x r on the left)."""
    projection = opt.state[param]["projection"].to(F64)
    return projection.T if right else projection


def step_bound(w0: Tensor, grads: list[Tensor], basis: Tensor, right: bool, hp: dict[str, Any]) -> Tensor:
    """Entrywise first-order bound on |W_float32 - W_hand| (`hand_fira` under `Rounding`)."""
    rounding = Rounding()
    w, _ = hand_fira(w0, grads, basis, right, hp, rounding=rounding)
    return rounding.bound(w)


def run(cls: type, w0: Tensor, grads: list[Tensor], **kwargs: Any) -> tuple[nn.Parameter, torch.optim.Optimizer]:
    param = nn.Parameter(w0.clone())
    opt = cls([param], **{**HP, "rank": 3, "update_proj_gap": 1000, **kwargs})
    for g in grads:
        param.grad = g.clone()
        opt.step()
    return param, opt


# --- hand-derived updates -------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "right"), [((6, 10), False), ((10, 6), True)], ids=["wide-left", "tall-right"])
def test_first_step_is_galore_step_plus_hand_compensation(shape: tuple[int, int], right: bool) -> None:
    rows, cols = shape
    w0 = known_matrix(rows, cols, spread(6), seed=1)
    g = 1e-2 * known_matrix(rows, cols, spread(6), seed=2)
    fira, opt = run(Fira, w0, [g])
    galore, _ = run(GaLore, w0, [g])
    basis = own_basis(opt, fira, right)
    assert_svd_basis(basis, g, right)
    expected, (comp,) = hand_fira(w0, [g], basis, right, HP)
    # The float32 step's first-order rounding bound (~1e-7 of entries O(1)); a missing bias correction, the residual
    # without scale or an unnormalised ratio move W by >= 1e-3.
    bound = step_bound(w0, [g], basis, right, HP)
    assert bool(((fira.detach().to(F64) - expected).abs() <= bound).all())
    step_size = HP["lr"] * math.sqrt(1 - 0.999) / (1 - 0.9)
    # Fira - GaLore is the compensation step (GaLore computes the same SVD of the same gradient: the same basis, and
    # the same low-rank step); its size (~1e-2) dwarfs the bound: Fira's rounding bound and GaLore's (W + scale lr_bc
    # U N: its own r + 2 roundings of lr_bc scale |U| |N| and of |W|), and the float32 difference (u |difference|).
    difference = (fira.detach() - galore.detach()).to(F64)
    assert float(difference.abs().max()) > 1e-3
    galore_rounding = Rounding()
    (step,) = hand_projected_adam([g], basis, right, HP["lr"], (0.9, 0.999), HP["eps"], galore_rounding)
    low = step.normalized @ basis.T if right else basis @ step.normalized
    low_size = step.normalized.abs() @ basis.abs().T if right else basis.abs() @ step.normalized.abs()
    w_galore = w0.to(F64) - step.step_size * HP["scale"] * low
    w_galore = galore_rounding.summed(w_galore, w0.to(F64).abs() + step.step_size * HP["scale"] * low_size, 3 + 3)
    allowed = bound + galore_rounding.bound(w_galore) + U32 * difference.abs()
    assert bool(((difference + step_size * comp).abs() <= allowed).all())


def test_limiter_caps_compensation_norm_growth_at_gamma() -> None:
    """Step 2 adds a large gradient outside span(U): the raw compensation grows far more than 1.01x."""
    w0, g1, g2, basis = growth_outside_the_subspace(seed=3)
    g3 = g2.clone()
    param, opt = run(Fira, w0, [g1, g2, g3])
    own = own_basis(opt, param, False)  # one refresh at t = 1 (gap 1000); the float64 basis is g1's
    assert_svd_basis(own, g1, False)
    expected, comps = hand_fira(w0, [g1, g2, g3], own, False, HP)
    _, unlimited = hand_fira(w0, [g1, g2], basis, False, HP, gamma=1e9)
    assert unlimited[1].norm() > 5 * comps[0].norm()  # the limiter must engage at step 2
    # float64 hand values: ||C (gamma psi / ||C||)|| is gamma psi up to the norm (mn + 1 roundings), the quotient
    # and the products (3): (mn + 4) u64 relative
    u64, mn = 2.0**-53, g1.numel()
    assert math.isclose(comps[1].norm(), 1.01 * comps[0].norm(), rel_tol=2 * (mn + 4) * u64)
    assert comps[2].norm() <= 1.01 * comps[1].norm() * (1 + 2 * (mn + 4) * u64)
    bound = step_bound(w0, [g1, g2, g3], own, False, HP)
    assert bool(((param.detach().to(F64) - expected).abs() <= bound).all())
    # psi is float32 eta ||C||: its first-order bound from the same model. A psi kept before limiting, or gamma
    # applied twice, is off by >= 1e-2.
    rounding = Rounding()
    _, modelled = hand_fira(w0, [g1, g2, g3], own, False, HP, rounding=rounding)
    psi = comps[2].norm()
    assert abs(float(opt.state[param]["limiter_norm"]) - float(psi)) <= float(
        rounding.bound(modelled[2].norm())
    ) + U32 * float(psi)


def test_weight_decay_after_the_update_and_three_steps_with_a_fixed_basis() -> None:
    hp = {**HP, "weight_decay": 0.1}
    w0 = known_matrix(10, 6, spread(6), seed=6)
    grads = [1e-2 * known_matrix(10, 6, spread(6), seed=7)]
    gen = torch.Generator().manual_seed(8)
    grads += [grads[0] + 1e-3 * torch.randn(10, 6, generator=gen) for _ in range(2)]
    param, opt = run(Fira, w0, grads, weight_decay=0.1)
    basis = own_basis(opt, param, True)
    assert_svd_basis(basis, grads[0], True)
    expected, _ = hand_fira(w0, grads, basis, True, hp)
    # first-order float32 rounding bound; decay before the update, or with the bias-corrected lr, moves W by >= 1e-4
    assert bool(((param.detach().to(F64) - expected).abs() <= step_bound(w0, grads, basis, True, hp)).all())


# --- structure: switches --------------------------------------------------------------------------------


def test_compensation_none_is_galore_bit_for_bit_across_refreshes() -> None:
    gen = torch.Generator().manual_seed(9)
    shapes = [(6, 10), (10, 6), (4, 2, 3, 3)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    steps = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(5)]
    finals = []
    for cls, extra in ((GaLore, {}), (Fira, {"compensation": "none"})):
        params = [nn.Parameter(w.clone()) for w in start]
        opt = cls(params, **{**HP, "rank": 3, "update_proj_gap": 2, "weight_decay": 0.1}, **extra)
        for grads in steps:
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            opt.step()
        finals.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*finals, strict=True))


def test_orthogonal_residual_lies_outside_the_subspace_and_reference_one_does_not() -> None:
    w0 = torch.zeros(6, 10)  # no cancellation in the difference of the two updates
    g = 1e-2 * known_matrix(6, 10, spread(6), seed=11)
    basis = top_basis(g, 3, right=False)
    galore, _ = run(GaLore, w0, [g])
    inside, allowed = {}, 0.0
    for residual in ("orthogonal", "reference"):
        fira, opt = run(Fira, w0, [g], residual=residual)
        comp_step = (fira.detach() - galore.detach()).to(F64)
        inside[residual] = float((basis.T @ comp_step).norm() / comp_step.norm())
        if residual == "orthogonal":
            # The optimizer's float32 residual G - U (U^T G) is orthogonal to its own U up to gamma_(m+r+1) (|U|
            # |U|^T |G| + |G|) entrywise; that U is within sin(theta) <= k u ||G|| / (s_3 - s_4) of the float64 basis
            # (Wedin); the compensation scales columns (phi, 2 u) and lr_bc (u); the two float32 weights from 0 round
            # by u |W| each. A residual G - scale U U^T G keeps 0.75 of its top-3 part (below).
            own = opt.state[fira]["projection"].to(F64)
            gd = g.to(F64)
            (step,) = hand_projected_adam([g], own, False, HP["lr"], (0.9, 0.999), HP["eps"])
            phi = hand_channel_ratio(step.normalized, step.projected, False)
            residual_error = 10 * U32 / (1 - 10 * U32) * (own.abs() @ own.abs().T @ gd.abs() + gd.abs())
            s = torch.linalg.svdvals(gd)
            sine = 10 * U32 * float(s[0] / (s[2] - s[3]))
            step_size = HP["lr"] * math.sqrt(1 - 0.999) / (1 - 0.9)
            rounding = step_size * float((residual_error * phi).norm()) + 4 * U32 * float(comp_step.norm())
            rounding += U32 * float((fira.detach().abs() + galore.detach().abs()).to(F64).norm())
            allowed = sine + rounding / float(comp_step.norm())
    assert inside["orthogonal"] <= allowed
    assert inside["reference"] > 0.5  # (1 - alpha) = 0.75 of the top-3 part stays in the residual


def test_fira_plus_rescales_to_the_low_rank_update_norm_times_alpha_c() -> None:
    """F.7: the compensation gets ||alpha back(N)||_F = alpha ||N||_F (orthonormal basis), times alpha_c."""
    w0 = known_matrix(10, 6, spread(6), seed=12)
    g = 1e-2 * known_matrix(10, 6, spread(6), seed=13)
    galore, _ = run(GaLore, w0, [g])
    plain, _ = run(Fira, w0, [g])
    plus, _ = run(Fira, w0, [g], compensation="fira+", alpha_c=0.4)
    step_size = HP["lr"] * math.sqrt(1 - 0.999) / (1 - 0.9)
    sigma = g.to(F64) @ top_basis(g, 3, right=True)
    n_hat = 0.1 * sigma / (math.sqrt(0.001) * sigma.abs() + HP["eps"])
    comp_plus = (galore.detach() - plus.detach()).to(F64) / step_size
    comp_plain = (galore.detach() - plain.detach()).to(F64) / step_size

    def relative(weights: Tensor, comp: Tensor) -> float:
        """Relative error of a compensation read as (W_galore - W) / lr_bc: each float32 weight rounded (u |W|),
        the compensation's own float32 scalings (||N||, ||C|| as 60-term norms: 2 gamma_61, the ratio, alpha_c
        and the products: 6 u), and the update's addmm and lr_bc (3 u)."""
        w_round = U32 * float((galore.detach().abs() + weights.detach().abs()).to(F64).norm())
        return w_round / (step_size * float(comp.norm())) + 2 * 61 * U32 / (1 - 61 * U32) + 9 * U32

    # ||N|| from the float64 basis vs ours: N ~ sign(sigma) 0.1 / sqrt(0.001) except within eps / sqrt(0.001) of 0,
    # a relative sensitivity ~ 1e-9 here. Bounds ~2.5e-4; no alpha_c, no scale or a spectral norm are off >= 30%.
    rel_plus, rel_plain = relative(plus, comp_plus), relative(plain, comp_plain)
    assert math.isclose(float(comp_plus.norm()), 0.4 * 0.25 * float(n_hat.norm()), rel_tol=rel_plus)
    # fira+ rescales the very C of plain Fira (eta = 1 at step 1): parallel up to those errors, and the angle
    # between x + dx and y + dy, x || y, has sin <= |dx| / |x| + |dy| / |y|, so 1 - cos <= (rel + rel)^2 / 2.
    cosine = float((comp_plus * comp_plain).sum() / (comp_plus.norm() * comp_plain.norm()))
    assert cosine >= 1 - (rel_plus + rel_plain) ** 2 / 2


# --- buckets of same-shape matrices ---------------------------------------------------------------------


def test_each_matrix_of_a_bucket_steps_as_it_would_alone() -> None:
    """Same-shape matrices are stepped as one stack: each keeps its own basis, ratios phi, limiter norm psi and
    step size. Matrix 0's limiter engages at step 2, the others' do not; matrix 2 (a filter in a bucket of plain
    matrices) starts a step late; weight decay on. Each matrix is compared with the per-matrix float64 formulas
    (`hand_fira`, its own float32 SVD basis checked against its own first gradient's by Wedin's bound) within
    their first-order float32 bound, and its psi with that model's bound (as in the limiter test). A norm or psi
    over the whole stack, or another matrix's basis or step size, moves W by >= 1e-3 relative."""
    hp = {**HP, "weight_decay": 0.1}
    case = bucket_case(seed=50)
    params, opt = step_together(lambda ps: Fira(ps, **{**hp, "rank": 3, "update_proj_gap": 1000}), case)
    for param, start, grads, right in zip(params, case.starts, case.grads, case.rights, strict=True):
        rows = start.shape[0]
        w0, grads = start.reshape(rows, -1), [g.reshape(rows, -1) for g in grads]
        basis = own_basis(opt, param, right)
        assert_svd_basis(basis, grads[0], right)
        expected, comps = hand_fira(w0, grads, basis, right, hp)
        bound = step_bound(w0, grads, basis, right, hp)
        assert bool(((param.detach().reshape(rows, -1).to(F64) - expected).abs() <= bound).all())
        rounding = Rounding()
        _, modelled = hand_fira(w0, grads, basis, right, hp, rounding=rounding)
        psi = comps[-1].norm()
        allowed = float(rounding.bound(modelled[-1].norm())) + U32 * float(psi)
        assert abs(float(opt.state[param]["limiter_norm"]) - float(psi)) <= allowed
    assert opt.state[params[2]]["step"] == opt.state[params[0]]["step"] - 1


def test_fira_plus_rescales_each_matrix_of_a_bucket_to_its_own_low_rank_update_norm() -> None:
    """F.7 per matrix in a stack: the compensation of matrix j, read as (W_galore - W_fira+) / lr_bc after one
    step, has the norm alpha_c alpha ||N_j|| of its own N_j (float64 from its own float32 basis). Its relative error
    is as in `test_fira_plus_rescales_to_the_low_rank_update_norm_times_alpha_c`: each float32 weight rounded (u
    |W|, both runs), the float32 norms of N and C (60-term: 2 gamma_61), the ratio, alpha_c and products (6 u), the
    update's addmm and lr_bc (3 u). A norm taken over the whole stack is off by >= 30%."""
    full = bucket_case(seed=60)
    case = full._replace(grads=[g[:1] for g in full.grads])
    settings = {**HP, "rank": 3, "update_proj_gap": 1000}
    galore, _ = step_together(lambda ps: GaLore(ps, **settings), case)
    plus, opt = step_together(lambda ps: Fira(ps, **settings, compensation="fira+", alpha_c=0.4), case)
    step_size = HP["lr"] * math.sqrt(1 - 0.999) / (1 - 0.9)
    for a, b, param, (g,), right in zip(galore, plus, plus, case.grads, case.rights, strict=True):
        g = g.reshape(g.shape[0], -1)
        (step,) = hand_projected_adam([g], own_basis(opt, param, right), right, HP["lr"], (0.9, 0.999), HP["eps"])
        comp = (a.detach() - b.detach()).to(F64) / step_size
        w_round = U32 * float((a.detach().abs() + b.detach().abs()).to(F64).norm())
        rel = w_round / (step_size * float(comp.norm())) + 2 * 61 * U32 / (1 - 61 * U32) + 9 * U32
        assert math.isclose(float(comp.norm()), 0.4 * 0.25 * float(step.normalized.norm()), rel_tol=rel)


# --- parity with the oracle -----------------------------------------------------------------------------


def test_parity_with_pytorch_optimizer() -> None:
    """pytorch_optimizer 4.1.0 `Fira`, projection_type 'std', 8 steps with T = 3 (refreshes at t = 1, 3, 6).

    Matching switches: refresh_schedule='paper' (the oracle refreshes at group step % T == 0, 1-based, and at
    t = 1), residual='reference' (its project_back multiplies by scale, so R = G - scale U U^T G, as the
    official code), compensation='fira', reproject_moments=False, gamma=1.01. Both take torch.linalg.svd of the
    gradient itself, wide ones included, so the singular-vector signs (on which, without re-projection, the
    carried-over moments depend) agree. Differences not exercised here: the
    oracle's limiter divides by psi + 1e-8 (ours by psi: a relative 1e-8 here); it counts steps per group
    (ours per parameter); it gives non-2-D parameters plain Adam (ours projects conv filters); it projects
    bfloat16 gradients in bfloat16 (ours float32); its projector object is not a state_dict tensor.
    Rounding differs in the last bits (lerp_ vs mul/add, p *= 1 - lr wd vs p -= lr wd p).
    """
    from pytorch_optimizer import Fira as OracleFira

    moved = steps_beside_oracle(
        lambda ours: Fira(ours, lr=0.01, rank=4, update_proj_gap=3, scale=0.25, weight_decay=0.1, eps=1e-6),
        lambda theirs: OracleFira(
            [{"params": theirs, "rank": 4, "update_proj_gap": 3, "scale": 0.25, "projection_type": "std"}],
            lr=0.01,
            weight_decay=0.1,
            eps=1e-6,
        ),
        shapes=[(12, 6), (6, 12), (8, 8), (5, 20), (20, 5)],
        seed=14,
        # (c) Measured: both run float32 on identical gradients in other operation orders (lerp_ vs mul/add, the
        # decay form, psi + 1e-8), with refreshes and carried moments: a first-order bound would model both codes.
        # Max |ours - oracle| over 8 steps: 7.2e-7 on AVX2, without SIMD (ATEN_CPU_CAPABILITY=default) and with one
        # thread alike (~2 float32 ulps of the O(1) weights); allowed 2e-5 (28x). A wrong beta, lr or limiter
        # factor is off by >= 1e-3 after 8 steps of size ~1e-2.
        atol=2e-5,
    )
    assert moved > 5e-2


# --- resume, state bytes, registry ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_resume_is_bit_identical_across_a_refresh(dtype: torch.dtype) -> None:
    assert_resume_is_bit_identical(
        lambda params: Fira(params, rank=3, update_proj_gap=2),
        shapes=[(6, 10), (10, 6), (3, 2, 2, 2)],
        dtype=dtype,
        seed=15,
        loaded_dtypes={"limiter_norm": torch.float32},
    )


def test_state_bytes_are_table6_count_plus_the_limiter_scalar() -> None:
    """Table 6: Fira = mn + 2nr + mr (m <= n, moments r x n, U m x r), + 1 limiter scalar; float32 here."""
    shapes = [(6, 10), (10, 4), (4, 2, 3, 3)]  # (m, n) oriented: (6, 10), (4, 10), (4, 18)
    params = [nn.Parameter(torch.randn(s)) for s in shapes]
    opt = Fira(params, rank=3)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    paper = [(6, 10, 3), (4, 10, 3), (4, 18, 3)]
    expected = sum(4 * (2 * n * r + m * r + 1) for m, n, r in paper)
    assert measure.state_bytes(opt) == expected
    entry = registry.get("fira")
    hp = registry.resolve_hparams("fira", {"rank": 3})
    assert entry.state_bytes(shapes, [], hp) == expected
    assert 4 * memory.structured_state_elements("fira", shapes, hp) == expected
    assert memory.matrix_state_elements("fira", (512, 1376)) == 2 * 1376 * 128 + 512 * 128 + 1


def test_entry_defaults_and_routing() -> None:
    entry = registry.get("fira")
    keys = ("lr", "scale", "rank", "update_proj_gap", "gamma", "eps", "head_to_fallback", "residual")
    assert {k: entry.defaults[k] for k in keys} == {
        "lr": 0.02,  # Table 7, 60M (GaLore and Fira)
        "scale": 0.3,
        "rank": 128,
        "update_proj_gap": 200,
        "gamma": 1.01,  # F.2
        "eps": 1e-6,  # reference code
        "head_to_fallback": False,  # Table 2 'Ppl.': the LM head trained by Fira
        "residual": "reference",
    }
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    _, routing = registry.build_with_routing("fira", model, {})
    assert set(routing.structured) == {"1.weight", "3.weight"}
    _, to_adam = registry.build_with_routing("fira", model, {"head_to_fallback": True})
    assert set(to_adam.structured) == {"1.weight"}


def test_bad_switches_are_rejected() -> None:
    with pytest.raises(ValueError, match="compensation"):
        Fira([nn.Parameter(torch.zeros(4, 4))], compensation="optimal")
    with pytest.raises(ValueError, match="gamma"):
        Fira([nn.Parameter(torch.zeros(4, 4))], gamma=0.5)
    with pytest.raises(ValueError, match="1-D parameter"):
        Fira([nn.Parameter(torch.zeros(4))])

"""ASGO and DASGO stepped side by side with float64 transcriptions of the authors' released code (issue 36 item 4).

The code: infinity-stars/ASGO at commit d3ef14beb8b3e5489e1ed9eb0a2a59565ac362ca, read for its computation and written
here in the tests' style (nothing of it is copied):
- `optimizers/asgo.py`, `asgo.step` lines 46-76: momentum M <- lerp(M, G, 1 - momentum); V <- lerp(V, G G^T, 1 - beta2)
  when rows < cols, else lerp(V, G^T G, ...) (line 56: a square matrix takes the right side); the inverse root of V by
  `_matrix_inverse_root_PolarExpress` with N = 10 every step (no tau); U = root M (left) or M root (right), rescaled to
  Frobenius norm 0.2 sqrt(rows cols) (line 69); W <- (1 - lr wd) W, then W <- W - lr U (lines 74-76). Defaults lines
  17-23 (lr 1e-2, momentum 0.9, wd 0.1, beta2 0.8, eps 1e-10, PolarExpress, 10 steps), which are what its training
  script runs: `optimizers/utils/utils.py` line 99-102 passes only the learning rate.
- `optimizers/utils/matrix_decom.py`, `_matrix_inverse_root_PolarExpress` lines 98-125: eight (a, b, c) triples (the
  first seven divided by 1.01, 1.01^3, 1.01^5), X / (1.01 ||X + eps I||_F), the coupled iteration ZY, B = b ZY +
  c (ZY)^2, Y <- a Y + Y B, Z <- a Z + B Z, the last triple repeated up to N; Z / sqrt(normaliser).
- `optimizers/dasgo.py`, `dasgo.step` lines 41-54: v <- lerp(v, column sums of G^2, 1 - beta2), U = M (v + eps)^-1/2
  per column, the same rescale, decay and step; defaults lines 17-21 (lr 1e-3, momentum 0.9, wd 0.1, beta2 0.95,
  eps 1e-8).
- `optimizers/utils/utils.py` lines 72 and 80-86: parameters with "emb" in their name and 1-D ones go to
  torch.optim.Adam(lr = the matrix lr, betas (0.9, 0.95), weight_decay 0, eps 1e-8).

Our side runs the released code's switches (`RELEASED_CODE_SWITCHES`: update_rms 0.2, weight_decay 0.1) with the
code's beta2, eps and tau = 1, and ASGO's root "polar-express" (the code's root, linalg.inverse_sqrt_polar_express) or
"eigh", the exact (V + eps I)^{-1/2}. The code's root is not that: its PolarExpress polynomial approximates V^{-1/2}
(eps enters only the normaliser), and is exact only where the iteration has converged. In exact arithmetic the
iteration acts on each eigenvalue lambda of V alone (everything is a polynomial in V): s = sqrt(lambda / n) goes through
s <- a s + b s^3 + c s^5, and the root's eigenvalue is s_final / sqrt(lambda). So, for "eigh", the test computes that
scalar map for V's eigenvalues and allows, per step, the update difference it implies: a relative root error e (the
largest over eigenvalues, against (lambda + eps)^{-1/2}) changes the update by at most e ||U||_F and, after the rescale
to a fixed norm N, by 2 e N; the gradients being given, M and V are the same in both runs, so W's difference is the sum
of these (each shrunk by the decay's 1 - lr wd). These statistics are full rank and well conditioned enough that the
iteration has converged (asserted: e <= 1e-4, else the test would be weak). The ill-conditioned case (one direction of
the gradients scaled by 1e-5, so V's smallest eigenvalue is about 1e-10 of ||V||_F, where the code's root is 0.5 to 0.9
off the exact one) is passed by "polar-express" and failed by "eigh" (both asserted). Float32 holds such a V only
because it is graded (the small direction is a coordinate axis, so every entry keeps its own relative precision); there
the transcription's statistics are perturbed entrywise (`GradedNoise`), since the normwise perturbation below would
erase the small eigenvalue that float32 keeps.
Conv filters: the code raises for them (asgo.py lines 46 and 71-72: `ValueError('Missing Training Param')`; dasgo.py
line 47 lerps a (in,)-vector towards an (in, kh, kw) tensor), so the transcription runs on our (out, in*kh*kw) view.

Tolerance for float32 (ours) against float64 (the transcription): the transcription is run again with each statistic
it takes a root of perturbed by a random symmetric matrix of norm k u ||V||_2 (a float32 eigh's backward error, k the
size, u = 2^-24) and each gradient entry moved by d u |g| (d the larger side: the rounding of the products), three
seeds; ours must lie within 4x the largest of these self-deviations, plus the PolarExpress term above ("eigh"), plus
2 t u max|W| for W's own rounding over t steps. Nothing in it comes from our optimizer's observed gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor, nn

from structbench.optim import linalg, registry
from structbench.optim.asgo import ASGO, DASGO
from tests.support.rounding_noise import Noise

ASGO_COMMIT = "d3ef14beb8b3e5489e1ed9eb0a2a59565ac362ca"
F64 = torch.float64
U32 = 2.0**-24
STEPS = 8
UPDATE_RMS = 0.2
"""asgo.py line 69, dasgo.py line 51."""
POLAR_EXPRESS = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
"""matrix_decom.py lines 101-108."""
POLAR_EXPRESS_STEPS = 10
"""asgo.py line 23 (`matalg_steps`)."""
ASGO_CODE = {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1, "beta2": 0.8, "eps": 1e-10}
"""asgo.py lines 17-21."""
DASGO_CODE = {"lr": 1e-3, "momentum": 0.9, "weight_decay": 0.1, "beta2": 0.95, "eps": 1e-8}
"""dasgo.py lines 17-21."""
SHAPES = {"wide": (4, 10), "tall": (10, 4), "square": (6, 6), "conv": (4, 2, 3, 3)}


class GradedNoise(Noise):
    """`Noise` with each statistic perturbed entrywise: v_ij (1 + k u r_ij), r_ij = +-1 symmetric, k the size. Float32
    storage and the lerp round each entry of V relatively, which keeps a graded V's small eigenvalue (test module doc);
    the gradients are perturbed as in `Noise`."""

    def statistic(self, v: Tensor) -> Tensor:
        k = v.size(0)
        signs = torch.randint(0, 2, (k, k), generator=self.generator, dtype=F64) * 2 - 1
        signs = torch.triu(signs) + torch.triu(signs, diagonal=1).T
        return v * (1 + k * U32 * signs)


def polar_express_schedule(steps: int) -> list[tuple[float, float, float]]:
    """matrix_decom.py lines 111 and 119: the first seven triples made safe by 1.01, the last repeated up to `steps`."""
    safe = [(a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in POLAR_EXPRESS[:-1]] + [POLAR_EXPRESS[-1]]
    return safe[:steps] + [safe[-1]] * max(0, steps - len(safe))


def code_polar_express_inverse_root(v: Tensor, eps: float, steps: int = POLAR_EXPRESS_STEPS) -> Tensor:
    """matrix_decom.py lines 112-125 in float64: the coupled PolarExpress iteration for V^{-1/2}."""
    identity = torch.eye(v.size(-1), dtype=F64)
    normaliser = float(torch.linalg.matrix_norm(v + eps * identity)) * 1.01
    y, z = v / normaliser, identity
    for a, b, c in polar_express_schedule(steps):
        zy = z @ y
        poly = b * zy + c * zy @ zy
        y = a * y + y @ poly
        z = a * z + poly @ z
    return z / math.sqrt(normaliser)


def polar_express_root_error(v: Tensor, eps: float, steps: int = POLAR_EXPRESS_STEPS) -> float:
    """The largest relative difference, over V's eigenvalues, between the PolarExpress root in exact arithmetic
    (the scalar map s <- a s + b s^3 + c s^5 from s = sqrt(lambda / n), root s_final / sqrt(lambda)) and
    (lambda + eps)^{-1/2}."""
    identity = torch.eye(v.size(-1), dtype=F64)
    normaliser = float(torch.linalg.matrix_norm(v + eps * identity)) * 1.01
    lam = torch.linalg.eigvalsh(v)
    assert float(lam.min()) > 0, "the statistic must be full rank for the scalar map"
    s = (lam / normaliser).sqrt()
    for a, b, c in polar_express_schedule(steps):
        s = a * s + b * s**3 + c * s**5
    return float((s * ((lam + eps) / lam).sqrt() - 1).abs().max())


def _rescaled(update: Tensor) -> Tensor:
    """asgo.py line 69 / dasgo.py line 51: U * 0.2 sqrt(rows cols) / ||U||_F."""
    return update * (UPDATE_RMS * math.sqrt(update.numel()) / float(torch.linalg.matrix_norm(update)))


def _descend(param: Tensor, update: Tensor, lr: float, weight_decay: float) -> Tensor:
    """asgo.py lines 74-76 / dasgo.py lines 52-54: decay first, then the step."""
    return param * (1 - lr * weight_decay) - lr * update


@dataclass
class CodeState:
    """The code's per-parameter state (asgo.py lines 50-52, dasgo.py lines 43-45), float64."""

    momentum: Tensor
    precond: Tensor
    root_errors: list[float] = field(default_factory=list)


def code_asgo_step(state: CodeState, param: Tensor, grad: Tensor, noise: Noise | None) -> Tensor:
    """asgo.py lines 54-76 for a matrix: returns the new parameter (and logs the PolarExpress root error)."""
    hp = ASGO_CODE
    grad = noise.gradient(grad) if noise else grad
    left = grad.size(0) < grad.size(1)
    state.momentum = state.momentum.lerp(grad, 1 - hp["momentum"])
    outer = grad @ grad.T if left else grad.T @ grad
    state.precond = state.precond.lerp(outer, 1 - hp["beta2"])
    statistic = noise.statistic(state.precond) if noise else state.precond
    root = code_polar_express_inverse_root(statistic, hp["eps"])
    state.root_errors.append(polar_express_root_error(statistic, hp["eps"]))
    update = root @ state.momentum if left else state.momentum @ root
    return _descend(param, _rescaled(update), hp["lr"], hp["weight_decay"])


def code_dasgo_step(state: CodeState, param: Tensor, grad: Tensor, noise: Noise | None) -> Tensor:
    """dasgo.py lines 46-54: returns the new parameter."""
    hp = DASGO_CODE
    grad = noise.gradient(grad) if noise else grad
    state.momentum = state.momentum.lerp(grad, 1 - hp["momentum"])
    state.precond = state.precond.lerp((grad * grad).sum(dim=0), 1 - hp["beta2"])
    update = state.momentum * (state.precond + hp["eps"]).pow(-0.5)
    return _descend(param, _rescaled(update), hp["lr"], hp["weight_decay"])


CodeStep = Callable[[CodeState, Tensor, Tensor, "Noise | None"], Tensor]


def _code_run(
    step: CodeStep, w0: Tensor, grads: list[Tensor], size: int, noise: Noise | None
) -> tuple[list[Tensor], CodeState]:
    """The transcription's W_t - W_0 after each step, and its state (for the root errors)."""
    precond = torch.zeros(size, size, dtype=F64) if step is code_asgo_step else torch.zeros(size, dtype=F64)
    state = CodeState(momentum=torch.zeros_like(w0), precond=precond)
    param, changes = w0, []
    for grad in grads:
        param = step(state, param, grad, noise)
        changes.append(param - w0)
    return changes, state


def _stream(shape: tuple[int, ...], seed: int) -> tuple[Tensor, list[Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), [torch.randn(*shape, generator=gen) for _ in range(STEPS)]


SMALL_DIRECTION = 1e-5
"""The scale of the graded stream's small direction: V's smallest eigenvalue is about its square, 1e-10, of ||V||_F."""


def _graded_stream(shape: tuple[int, ...], seed: int) -> tuple[Tensor, list[Tensor]]:
    """`_stream` with the preconditioned side's last coordinate scaled by `SMALL_DIRECTION` in every gradient (the last
    row of the matrix view when rows < cols, as ASGO and the code precondition the left side there, else the last
    column)."""
    w0, grads = _stream(shape, seed)
    rows, cols = shape[0], math.prod(shape[1:])
    scaled = []
    for grad in grads:
        matrix = grad.reshape(rows, cols).clone()
        if rows < cols:
            matrix[-1] *= SMALL_DIRECTION
        else:
            matrix[:, -1] *= SMALL_DIRECTION
        scaled.append(matrix.reshape(shape))
    return w0, scaled


def _our_changes(optimizer: torch.optim.Optimizer, param: nn.Parameter, grads: list[Tensor]) -> list[Tensor]:
    w0 = param.detach().double().clone()
    changes = []
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()
        changes.append((param.detach().double() - w0).reshape(param.size(0), -1))
    return changes


def _assert_within(
    ours: list[Tensor], reference: list[Tensor], perturbed: list[list[Tensor]], extra: list[float], w_max: float
) -> None:
    """Per step: max|ours - code| <= 4 (the code's largest self-deviation) + extra[t] + 2 (t + 1) u max|W|."""
    for t, (mine, theirs) in enumerate(zip(ours, reference, strict=True)):
        spread = max(float((other[t] - theirs).abs().max()) for other in perturbed)
        tolerance = 4 * spread + extra[t] + 2 * (t + 1) * U32 * w_max
        gap = float((mine - theirs).abs().max())
        assert gap <= tolerance, f"step {t + 1}: |ours - code| = {gap:.3g} > {tolerance:.3g}"


def _asgo_gaps(
    shape: tuple[int, ...], w0: Tensor, grads: list[Tensor], root: str, noise: type[Noise]
) -> tuple[list[float], list[float], CodeState]:
    """ASGO with the released code's switches, values and `root`, against the float64 transcription of
    infinity-stars/ASGO optimizers/asgo.py: per step, max|ours - code| of W_t - W_0 and the tolerance of
    `_assert_within` without its PolarExpress term; and the transcription's state."""
    param = nn.Parameter(w0.clone())
    hp = ASGO_CODE
    optimizer = ASGO(
        [param],
        lr=hp["lr"],
        beta1=hp["momentum"],
        beta2=hp["beta2"],
        eps=hp["eps"],
        tau=1,
        root=root,
        update_rms=UPDATE_RMS,
        weight_decay=hp["weight_decay"],
    )
    ours = _our_changes(optimizer, param, grads)
    rows, cols = shape[0], math.prod(shape[1:])
    matrix_grads = [g.double().reshape(rows, cols) for g in grads]
    w0_code = w0.double().reshape(rows, cols)
    size = min(rows, cols)
    reference, state = _code_run(code_asgo_step, w0_code, matrix_grads, size, None)
    perturbed = [_code_run(code_asgo_step, w0_code, matrix_grads, size, noise(seed))[0] for seed in (1, 2, 3)]
    assert float(reference[-1].abs().max()) > 2 * hp["lr"]  # the run moved by more than two steps of size lr
    w_max = float(w0.abs().max()) + float(max(change.abs().max() for change in reference))
    gaps = [float((mine - theirs).abs().max()) for mine, theirs in zip(ours, reference, strict=True)]
    tolerances = [
        4 * max(float((other[t] - reference[t]).abs().max()) for other in perturbed) + 2 * (t + 1) * U32 * w_max
        for t in range(STEPS)
    ]
    return gaps, tolerances, state


@pytest.mark.parametrize("root", ["polar-express", "eigh"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_asgo_follows_the_released_code(kind, root):
    """W_t - W_0 of ASGO with the released code's switches and values against the float64 transcription of
    infinity-stars/ASGO optimizers/asgo.py (commit in the module doc), 8 steps, each a root refresh (tau = 1). The
    statistics are well conditioned: "polar-express" is the code's root, and "eigh" is allowed the difference between
    the exact root and the code's converged one (the PolarExpress term, module doc)."""
    shape = SHAPES[kind]
    w0, grads = _stream(shape, seed=36)
    gaps, tolerances, state = _asgo_gaps(shape, w0, grads, root, Noise)
    assert max(state.root_errors) <= 1e-4, "PolarExpress has not converged on these statistics: the test is weak"
    polar = [0.0] * STEPS
    if root == "eigh":
        norm = UPDATE_RMS * math.sqrt(shape[0] * math.prod(shape[1:]))
        polar = [ASGO_CODE["lr"] * 2 * norm * sum(state.root_errors[: t + 1]) for t in range(STEPS)]
    for t, (gap, tolerance) in enumerate(zip(gaps, tolerances, strict=True)):
        assert gap <= tolerance + polar[t], f"step {t + 1}: |ours - code| = {gap:.3g} > {tolerance + polar[t]:.3g}"


def _departing_case(kind: str) -> tuple[tuple[int, ...], Tensor, list[Tensor]]:
    """The graded stream on `kind`, checked to be the case the test needs: the transcription's last V has its
    smallest eigenvalue at or below 1e-9 of ||V||_F, and the code's root there is at least 0.5 off the exact one."""
    shape = SHAPES[kind]
    w0, grads = _graded_stream(shape, seed=36)
    rows, cols = shape[0], math.prod(shape[1:])
    matrix_grads = [g.double().reshape(rows, cols) for g in grads]
    _, state = _code_run(code_asgo_step, w0.double().reshape(rows, cols), matrix_grads, min(rows, cols), None)
    smallest = float(torch.linalg.eigvalsh(state.precond).min())
    assert smallest <= 1e-9 * float(torch.linalg.matrix_norm(state.precond))
    assert min(state.root_errors) >= 0.5
    return shape, w0, grads


@pytest.mark.parametrize("kind", list(SHAPES))
def test_asgo_polar_express_follows_the_released_code_where_its_root_departs_from_the_exact_one(kind):
    """On the graded stream (V's smallest eigenvalue about 1e-10 of ||V||_F, where 10 PolarExpress iterations leave
    that eigenvalue's gain 0.5 to 0.9 below (lambda + eps)^{-1/2}), root="polar-express" follows the transcription at
    every step, within 4 times the transcription's response to `GradedNoise` plus W's own float32 rounding."""
    shape, w0, grads = _departing_case(kind)
    gaps, tolerances, _ = _asgo_gaps(shape, w0, grads, "polar-express", GradedNoise)
    for t, (gap, tolerance) in enumerate(zip(gaps, tolerances, strict=True)):
        assert gap <= tolerance, f"step {t + 1}: |ours - code| = {gap:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("kind", list(SHAPES))
def test_asgo_eigh_root_departs_from_the_released_code_on_an_ill_conditioned_statistic(kind):
    """The same case with root="eigh" (the exact (V + eps I)^{-1/2}, whose gain along the small direction is 2 to 10
    times the code's) is outside that tolerance by more than 10x at every step: the test above can tell the roots
    apart."""
    shape, w0, grads = _departing_case(kind)
    gaps, tolerances, _ = _asgo_gaps(shape, w0, grads, "eigh", GradedNoise)
    assert all(gap > 10 * tolerance for gap, tolerance in zip(gaps, tolerances, strict=True))


@pytest.mark.parametrize("kind", list(SHAPES))
def test_dasgo_follows_the_released_code(kind):
    """W_t - W_0 of DASGO with the released code's switches and values against the float64 transcription of
    infinity-stars/ASGO optimizers/dasgo.py (commit in the module doc), 8 steps."""
    shape = SHAPES[kind]
    w0, grads = _stream(shape, seed=37)
    param = nn.Parameter(w0.clone())
    hp = DASGO_CODE
    optimizer = DASGO(
        [param],
        lr=hp["lr"],
        beta1=hp["momentum"],
        beta2=hp["beta2"],
        eps=hp["eps"],
        update_rms=UPDATE_RMS,
        weight_decay=hp["weight_decay"],
    )
    ours = _our_changes(optimizer, param, grads)
    rows, cols = shape[0], math.prod(shape[1:])
    matrix_grads = [g.double().reshape(rows, cols) for g in grads]
    w0_code = w0.double().reshape(rows, cols)
    reference, _ = _code_run(code_dasgo_step, w0_code, matrix_grads, cols, None)
    perturbed = [_code_run(code_dasgo_step, w0_code, matrix_grads, cols, Noise(seed))[0] for seed in (1, 2, 3)]

    assert float(reference[-1].abs().max()) > 2 * hp["lr"]  # the run moved by more than two steps of size lr
    w_max = float(w0.abs().max()) + float(max(change.abs().max() for change in reference))
    _assert_within(ours, reference, perturbed, [0.0] * STEPS, w_max)


class _Net(nn.Module):
    """An embedding (named "embed", which utils.py line 72 matches by "emb"), a biased hidden layer and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 5)
        self.hidden = nn.Linear(5, 6)
        self.head = nn.Linear(6, 3)


def code_adam(param: Tensor, grads: list[Tensor], lr: float) -> Tensor:
    """torch.optim.Adam as utils.py lines 80-86 configure it (betas (0.9, 0.95), eps 1e-8, no weight decay), in
    float64: m, v EMAs; p <- p - lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""
    beta1, beta2, eps = 0.9, 0.95, 1e-8
    m, v = torch.zeros_like(param), torch.zeros_like(param)
    for t, grad in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad.square()
        denom = v.sqrt() / math.sqrt(1 - beta2**t) + eps
        param = param - lr / (1 - beta1**t) * m / denom
    return param


@pytest.mark.parametrize(("name", "switches"), [("asgo", {"one_d": "adamw", "embeddings": "adamw"}), ("dasgo", {})])
def test_embeddings_and_vectors_take_the_released_codes_adam(name, switches):
    """With the code's routing (utils.py line 72: "emb" in the name or 1-D) the embedding and the biases are stepped by
    the Adam of utils.py lines 80-86 at the matrix lr (the code config's 0.01), transcribed in float64; the weight
    matrices are not. Tolerance: float32 Adam rounds each of its few operations per step, <= 8 u relative per step on
    an update of size lr, so 8 t u lr + 2 t u max|W| over t steps."""
    torch.manual_seed(0)
    model = _Net()
    lr = 0.01
    optimizer, routing = registry.build_with_routing(name, model, {**switches, "adamw_lr": lr})
    expected_fallback = {n for n, p in model.named_parameters() if "emb" in n.lower() or p.ndim == 1}
    assert set(routing.fallback) == expected_fallback
    start = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(5)
    grads = {n: [torch.randn(p.shape, generator=gen) for _ in range(STEPS)] for n, p in model.named_parameters()}
    for t in range(STEPS):
        for n, p in model.named_parameters():
            p.grad = grads[n][t].clone()
        optimizer.step()
    for n, p in model.named_parameters():
        if n not in expected_fallback:
            continue
        expected = code_adam(start[n], [g.double() for g in grads[n]], lr)
        w_max = float(start[n].abs().max()) + STEPS * lr
        tolerance = STEPS * (8 * U32 * lr + 2 * U32 * w_max)
        torch.testing.assert_close(p.detach().double(), expected, rtol=0, atol=tolerance)


@pytest.mark.parametrize(("smallest", "low", "high"), [(1e-6, 1e-5, 1e-4), (1e-8, 1e-3, 1e-2), (1e-10, 0.5, 0.9)])
def test_polar_express_root_error_is_the_scalar_maps_and_grows_below_its_convergence_range(smallest, low, high):
    """The tolerance above rests on the PolarExpress iteration acting on each eigenvalue alone: on a V with known
    eigenvalues (1, 0.5, `smallest`) in a random basis, the matrix iteration's root (transcribed) has the eigenvalues
    the scalar map gives, to float64 rounding (u ||V|| moves the smallest eigenvalue, 1e-10, by a relative 1e-6:
    1e-5 of the error allowed); and its relative error against (lambda + eps)^{-1/2}, as
    docs/optimizers.md and the asgo module doc state, is 5e-5, 4e-3 and 0.7 at smallest = 1e-6, 1e-8, 1e-10."""
    eps = ASGO_CODE["eps"]
    basis, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(3), dtype=F64))
    lam = torch.tensor([1.0, 0.5, smallest], dtype=F64)
    v = basis @ torch.diag(lam) @ basis.T
    root = code_polar_express_inverse_root(v, eps)
    exact = (lam + eps).rsqrt()
    matrix_error = float(((basis.T @ root @ basis).diagonal() / exact - 1).abs().max())
    scalar_error = polar_express_root_error(v, eps)
    assert abs(matrix_error - scalar_error) <= 1e-5 * max(scalar_error, 1e-3)
    assert low <= scalar_error <= high


@pytest.mark.parametrize("steps", [3, 8, 10, 12])
def test_inverse_sqrt_polar_express_is_the_scalar_map_on_each_eigenvalue(steps):
    """linalg.inverse_sqrt_polar_express on a float64 stack of two V with known eigenvalues (spanning 1 to 1e-10 of the
    largest, so both converged and unconverged ones) in random bases has, in each basis, the diagonal the scalar map
    gives: s = sqrt(lambda / c), c = 1.01 ||V + eps I||_F computed from the eigenvalues, through this module's
    schedule (8 and 12 steps: the triples cut and the last repeated), root s / sqrt(lambda); and nothing off it.
    Tolerance 1e-5 relative: float64 products have backward error about k u64 ||V|| (u64 = 2^-53), which moves the
    smallest eigenvalue 1e-10 by a relative 5 * 1.1e-16 / 1e-10 = 6e-6 and its gain by at most half that."""
    eps = ASGO_CODE["eps"]
    gen = torch.Generator().manual_seed(4)
    spectra = torch.tensor([[2.0, 0.7, 1e-4, 1e-8, 2e-10], [5.0, 5.0, 1e-2, 3e-6, 5e-10]], dtype=F64)
    bases = torch.linalg.qr(torch.randn(2, 5, 5, generator=gen, dtype=F64))[0]
    v = bases @ torch.diag_embed(spectra) @ bases.mT
    root = linalg.inverse_sqrt_polar_express(v, eps, steps)
    normaliser = 1.01 * (spectra + eps).square().sum(dim=-1, keepdim=True).sqrt()
    s = (spectra / normaliser).sqrt()
    for a, b, c in polar_express_schedule(steps):
        s = a * s + b * s**3 + c * s**5
    expected = s / spectra.sqrt()
    in_basis = bases.mT @ root @ bases
    torch.testing.assert_close(in_basis.diagonal(dim1=-2, dim2=-1), expected, rtol=1e-5, atol=0.0)
    off = in_basis - torch.diag_embed(in_basis.diagonal(dim1=-2, dim2=-1))
    assert float(off.abs().max()) <= 1e-5 * float(expected.max())


def test_inverse_sqrt_polar_express_runs_float32_as_the_code_and_leaves_its_input():
    """The code casts V to float32 (matrix_decom.py line 112): a float32 V gives a float32 root, and V is unchanged."""
    v = torch.eye(3, dtype=torch.float32) * 2.0
    before = v.clone()
    assert linalg.inverse_sqrt_polar_express(v, 1e-10, 10).dtype == torch.float32
    assert torch.equal(v, before)


def test_polar_express_root_replaces_a_non_finite_root_by_the_identity():
    """asgo.py lines 61-64: with eps 0 a zero gradient makes V = 0 and the PolarExpress root 0/0; the code (and ours)
    takes I instead, so W stays finite and, with no decay and a zero momentum, unchanged; the next gradient moves it."""
    param = nn.Parameter(torch.ones(3, 5))
    optimizer = ASGO([param], eps=0.0, root="polar-express", tau=1)
    param.grad = torch.zeros(3, 5)
    optimizer.step()
    assert torch.equal(optimizer.state[param]["inv_root"], torch.eye(3))
    assert torch.equal(param.detach(), torch.ones(3, 5))
    param.grad = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    optimizer.step()
    assert bool(param.isfinite().all()) and not torch.equal(param.detach(), torch.ones(3, 5))


@pytest.mark.parametrize("switch", [{"eps_placement": "outside"}, {"eigenvalue_floor": "resolution"}])
def test_polar_express_root_rejects_switches_it_would_ignore(switch):
    """The code's root has eps only in its normaliser and no floor: asking for either with it is a usage error."""
    with pytest.raises(ValueError, match="polar-express"):
        ASGO([nn.Parameter(torch.zeros(3, 5))], root="polar-express", **switch)

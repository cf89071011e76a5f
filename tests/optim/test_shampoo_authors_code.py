"""32-bit Shampoo (SGD-M and AdamW bases) stepped side by side with a float64 transcription of the authors' code.

Reference: Sike-Wang/low-bit-Shampoo at commit fc46867b3afbc8e4f72a541475bb883ce94e8d4c, `optimizers/shampoo1.py`
at prec_bits=32 with `optimizers/matrix_functions.py` (transcribed in tests/support/low_bit_shampoo_code.py, which
names the lines). Settings: T1 = 1, T2 = 3, nine steps (three root refreshes), beta 0.95, eps 1e-6, weight decay on,
blocks of at most 16 (so the wide and conv parameters are cut into blocks), on wide (8 x 20), tall (20 x 8), square
(12 x 12) and conv (6 x 3 x 3 x 3, viewed as 6 x 27) float32 parameters, from identical float32 gradients.

Tolerance. Our optimizer computes in float32, as the authors' code does; the transcription runs in float64. The same
transcription run in float32 on the same inputs differs from its float64 run by what float32 arithmetic alone changes
in the authors' computation (rounding of W itself, of the statistics, and of the Newton iteration, whose stopping
test at 1e-6 sits near float32's resolution). A float32 implementation of the same computation may round in another
order, so it is allowed four times that gap, step by step; a change of the algorithm (a missing ridge, a symmetrised
or transposed statistic, another grafting or base) moves W_t - W_0 by orders of magnitude more.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from structbench.optim.shampoo import Shampoo
from tests.support.low_bit_shampoo_code import Shampoo32Code

SHAPES = {"wide": (8, 20), "tall": (20, 8), "square": (12, 12), "conv": (6, 3, 3, 3)}
BASES = {"sgd": (0.1, 5e-4), "adamw": (1e-3, 0.05)}
STEPS, T1, T2, MAX_ORDER = 9, 1, 3, 16
FLOAT32_SLACK = 4.0


def gradients(shape: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen) for _ in range(STEPS)]


def relative(delta: torch.Tensor, reference: torch.Tensor) -> float:
    """max |delta - reference| / max |reference|, in float64."""
    return float((delta.double() - reference).abs().max() / reference.abs().max())


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_shampoo_follows_the_authors_code_step_by_step(base: str, shape_name: str) -> None:
    shape = SHAPES[shape_name]
    lr, weight_decay = BASES[base]
    w0 = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    param = nn.Parameter(w0.clone())
    ours = Shampoo(
        [param],
        base=base,
        lr=lr,
        stat_interval=T1,
        root_interval=T2,
        max_order=MAX_ORDER,
        **{f"{base}_weight_decay": weight_decay},
    )
    settings = dict(base=base, lr=lr, stat_interval=T1, root_interval=T2, max_order=MAX_ORDER)
    code64 = Shampoo32Code(w0.double(), weight_decay=weight_decay, **settings)
    code32 = Shampoo32Code(w0.clone(), weight_decay=weight_decay, **settings)
    for step, grad in enumerate(gradients(shape), start=1):
        param.grad = grad.clone()
        ours.step()
        code64.step(grad.double())
        code32.step(grad.clone())
        reference = code64.param - w0.double()
        bound = FLOAT32_SLACK * relative(code32.param - w0, reference)
        gap = relative(param.detach() - w0, reference)
        assert gap <= bound, f"step {step}: W_t - W_0 differs by {gap:.3g} (float32 bound {bound:.3g})"

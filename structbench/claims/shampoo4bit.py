"""4-bit Shampoo's claims (Wang, Zhou, Li & Huang, "4-bit Shampoo for Memory-Efficient Network Training",
NeurIPS 2024, arXiv 2405.18144).

Section 3.1 and Tables 1 and 5 (A2 column: the synthetic matrix with two distinct eigenvalues): quantizing the
preconditioner's eigenvector matrix U gives a much smaller error in A^{-1/4} than quantizing A itself; Section 3.2
(Eq. 2): Björck orthogonal rectification of the dequantized U lowers it further (both via the quant-error
experiment). Section 5 and Appendix G: the states that build the preconditioners and their inverse roots are about
7x smaller in 4 bits, 32 / (4 + 0.5) with one fp32 scale per block of 64. Table 2: 4-bit Shampoo's test accuracy
is within -0.7% to +0.5% of 32-bit Shampoo's on CIFAR-100 / Tiny-ImageNet / ImageNet.
"""

from __future__ import annotations

from typing import Any

import torch

from structbench import optim
from structbench.claims.base import FAILS, HOLDS, ClaimDef, Context, Outcome
from structbench.claims.numerical import experiment
from structbench.claims.trained import vision_claim

PAPER = "4bit-shampoo"
ARXIV = "arXiv 2405.18144"
TABLE5 = {  # (codebook, scheme) -> NRE, A2 column of Table 5 (4-bit, block size 64)
    ("dt", "A"): 0.4615,
    ("dt", "U"): 0.1224,
    ("dt", "U+OR"): 0.0878,
    ("linear-2", "A"): 0.4465,
    ("linear-2", "U"): 0.0942,
    ("linear-2", "U+OR"): 0.0669,
}
VIT_SMALL_BLOCK = {"qkv": (1152, 384), "proj": (384, 384), "fc1": (1536, 384), "fc2": (384, 1536)}
RESNET34_CONV = {"layer4.conv": (512, 512, 3, 3)}
"""Real layer shapes: one ViT-Small transformer block (width 384, MLP 1536; Table 2's ViT-Small) and ResNet-34's
widest 3x3 convolution (Table 2's ResNet34); every block of the networks repeats these shapes."""
SEVEN = 32 / 4.5
"""Appendix G: 4 bits + 32 bits per block of 64 = 4.5 bits per element against 32."""


def _args(scale: str) -> dict[str, Any]:
    return {"order": 256 if scale == "ci" else 1200, "bits": [4], "codebooks": ["dt", "linear-2"]}


def _nre(scale: str, ctx: Context) -> dict[tuple[str, str], float]:
    table = experiment("quant-error", _args(scale), 0, ctx.device).table
    full = table[(table["part"] == "full") & (table["bits"] == 4)]
    return {(row.codebook, row.scheme): float(row.nre) for row in full.itertuples()}


def _budget(scale: str) -> str:
    return f"synthetic PD matrix of order {_args(scale)['order']} (paper: 1200), eigenvalues 1000 and 1 (half each)"


def _numbers(nre: dict[tuple[str, str], float], schemes: tuple[str, ...]) -> dict[str, float]:
    numbers = {}
    for (codebook, scheme), value in nre.items():
        if scheme in schemes:
            key = f"{codebook}_{scheme}".replace("-", "").replace("+", "_")
            numbers[f"nre_{key}"] = value
            if (codebook, scheme) in TABLE5:
                numbers[f"ratio_to_paper_{key}"] = value / TABLE5[(codebook, scheme)]
    return numbers


def _describe(nre: dict[tuple[str, str], float], schemes: tuple[str, ...]) -> str:
    return "; ".join(
        f"{cb}: " + ", ".join(f"{s} {nre[(cb, s)]:.4f} (paper {TABLE5[(cb, s)]:.4f})" for s in schemes)
        for cb in ("dt", "linear-2")
    )


def _eigenvectors(scale: str, ctx: Context) -> Outcome:
    nre = _nre(scale, ctx)
    holds = all(nre[(cb, "A")] > 2 * nre[(cb, "U")] for cb in ("dt", "linear-2"))
    return Outcome(
        HOLDS if holds else FAILS,
        _numbers(nre, ("A", "U")),
        "4-bit NRE of A^-1/4: " + _describe(nre, ("A", "U")) + " (holds when NRE(A) > 2 NRE(U) for both codebooks)",
        seeds="1 (matrix seed 0; one evaluation)",
        budget=_budget(scale),
    )


def _rectification(scale: str, ctx: Context) -> Outcome:
    nre = _nre(scale, ctx)
    holds = all(nre[(cb, "U+OR")] < nre[(cb, "U")] for cb in ("dt", "linear-2"))
    return Outcome(
        HOLDS if holds else FAILS,
        _numbers(nre, ("U", "U+OR")),
        "4-bit NRE of A^-1/4 without / with one Björck step (Table 1's setting): " + _describe(nre, ("U", "U+OR")),
        seeds="1 (matrix seed 0; one evaluation)",
        budget=_budget(scale),
    )


def _preconditioner_state(name: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """Bytes of the preconditioner states (statistics / eigenpairs and inverse roots) after one step, read from the
    optimizer's state tensors; the grafting optimizer's momentum is left out (the same in both)."""
    generator = torch.Generator().manual_seed(0)
    params = {n: torch.nn.Parameter(torch.zeros(shape)) for n, shape in shapes.items()}
    optimizer = optim.make_optimizer(name, list(params.items()), stat_interval=1, root_interval=1)
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=generator)
    optimizer.step()
    parts = getattr(optimizer, "parts", {"all": optimizer})
    total = 0
    for part in parts.values():
        for state in part.state.values():
            for key, value in state.items():
                if key.startswith(("left_", "right_")) and isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
    return total


def _memory(scale: str, ctx: Context) -> Outcome:
    shapes = {"proj": VIT_SMALL_BLOCK["proj"]} if scale == "ci" else {**VIT_SMALL_BLOCK, **RESNET34_CONV}
    full = _preconditioner_state("shampoo", shapes)
    low = _preconditioner_state("shampoo-4bit", shapes)
    ratio = full / low
    holds = 0.9 * SEVEN <= ratio <= 1.1 * SEVEN
    return Outcome(
        HOLDS if holds else FAILS,
        {"bytes_32bit": float(full), "bytes_4bit": float(low), "ratio": ratio, "paper_ratio": SEVEN},
        f"preconditioner states after one step on {', '.join(f'{n} {s}' for n, s in shapes.items())}: "
        f"32-bit {full:,} B, 4-bit {low:,} B, ratio {ratio:.2f} (paper ~7, 32/4.5 = {SEVEN:.2f}; holds within 10%)",
        seeds="1 (exact byte count; deterministic)",
        budget="one optimizer step, statistics and roots computed at that step",
    )


CLAIMS = [
    ClaimDef(
        PAPER,
        "eigenvectors-beat-preconditioner",
        "Quantizing the preconditioner's eigenvector matrix gives a much smaller error in A^-1/4 than quantizing "
        "the preconditioner itself",
        f"{ARXIV} §3.1, Table 1 and Table 5 (A2 column)",
        "4-bit NRE, A vs U: DT 0.4615 vs 0.1224; Linear-2 0.4465 vs 0.0942",
        _eigenvectors,
    ),
    ClaimDef(
        PAPER,
        "bjorck-rectification-reduces-error",
        "Björck orthogonal rectification of the dequantized eigenvectors reduces the error further",
        f"{ARXIV} §3.2 Eq. 2, Table 5 (A2 column)",
        "4-bit NRE, U vs U+OR: DT 0.1224 -> 0.0878; Linear-2 0.0942 -> 0.0669",
        _rectification,
    ),
    ClaimDef(
        PAPER,
        "state-seven-times-smaller",
        "The states forming the preconditioners and their inverse roots are about 7x smaller for 4-bit Shampoo",
        f"{ARXIV} §5 'Main results' and Appendix G",
        "~7x (32 / (4 + 0.5))",
        _memory,
        needs=frozenset({"shampoo", "shampoo-4bit"}),
    ),
    vision_claim(
        PAPER,
        "trains-like-32bit",
        "4-bit Shampoo reaches the test accuracy of 32-bit Shampoo (differences -0.7% to +0.5%)",
        f"{ARXIV} §5 'Main results', Table 2",
        "test accuracy difference 4-bit - 32-bit in [-0.7, +0.5] points (e.g. ResNet34/CIFAR-100 79.17 vs 79.71)",
        "shampoo-4bit",
        "shampoo",
        margin=0.007,
        lrs={"shampoo-4bit": 0.1, "shampoo": 0.1},
    ),
]

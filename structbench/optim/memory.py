"""Analytic optimizer-state sizes from the RACS/Alice paper's memory formulas.

Paper: Gong, Scetbon, Ma & Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher
Approximation with a Low-Rank Extension" — Table 1 (per-matrix memory), Table 6 (breakdown of the low-rank
optimizers) and Table 3 (whole-model estimates: weights + Adam states of the non-matrix parameters + the
candidate's states of the matrix parameters, BF16 = 2 bytes per element, reported in GiB).

Conventions: a matrix is (m, n) with m <= n (the paper's orientation; a tall matrix is transposed, conv
filters are seen as (out, in*kh*kw)); the rank r is capped at m. Every count here is of STATE elements only
(the paper's totals add the mn weight elements, see `whole_model_elements`).

    adamw / adam   2mn                      (first and second moment)
    sgd            0                        (plain SGD, the paper's "SGD-like" reference point)
    galore         2nr + mr                 (Table 6: moments r x n, projection U m x r)
    fira           2nr + mr + 1             (Table 6 lists Fira = GaLore; + the limiter scalar it omits)
    apollo-svd     2nr + mr + 1             (App. B.12: "the same memory as GaLore"; + the limiter scalar)
    apollo-mini    2nr + 2 = 2n + 2 (r = 1) (App. B.12 / E.5: rank-1 moments + the projection seed + the
                                            limiter scalar; the random projection is regenerated from the seed)
    racs           m + n + 1                (Table 1 / Sec. 4: s, q and the limiter scalar)
    alice          2nr + mr + n + r^2 + 1   (Table 6 + the limiter scalar phi of Alg. 3, which Table 6 omits)
    alice-0        2nr + mr + n + 1         (no tracking state Q~)
    eigen-adam     2mn + 2m^2               (Table 1: m, v, Q and U_f)
    soap           2mn + 2m^2 + 2n^2        (Table 1)

structbench stores statistics in float32 (and Apollo's seed in int32), so an optimizer's measured state in
bytes is 4 x these counts (plus its AdamW fallback) — the registry entries' `state_bytes` are built from this
module or, for the GaLore family (whose `proj_type` may project the larger side), from the same counts per side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from structbench.optim.partition import matrix_shape

BF16_BYTES = 2
FLOAT32_BYTES = 4
GIB = 1024**3

PAPER_TABLE3_GIB: dict[str, tuple[float | None, float]] = {
    "adamw": (None, 0.32),
    "galore": (0.21, 0.26),
    "fira": (0.21, 0.26),
    "apollo-mini": (None, 0.23),
    "apollo-svd": (None, 0.26),
    "racs": (None, 0.23),
    "alice-0": (0.21, 0.26),
    "alice": (0.22, 0.26),
}
"""Table 3, LLaMA 60M: (Mem = last layer by the candidate, Mem* = last layer by Adam), GiB; None = NA."""


def oriented(shape: Sequence[int]) -> tuple[int, int]:
    """(m, n) with m <= n for a parameter of `shape` (conv filters as (out, in*kh*kw))."""
    rows, cols = matrix_shape(shape)
    return (rows, cols) if rows <= cols else (cols, rows)


def matrix_state_elements(name: str, shape: Sequence[int], hp: Mapping[str, Any] | None = None) -> int:
    """State elements the paper's formula gives optimizer `name` for one matrix of `shape`."""
    hp = dict(hp or {})
    m, n = oriented(shape)
    r = min(int(hp.get("rank", 1 if name == "apollo-mini" else 128)), m)
    if name in ("adamw", "adam"):
        return 2 * m * n
    if name == "sgd":
        return 0
    if name == "galore":
        return 2 * n * r + m * r
    if name == "fira":
        return 2 * n * r + m * r + 1
    if name in ("apollo-mini", "apollo-svd"):
        projection = hp.get("projection", "random" if name == "apollo-mini" else "svd")
        return 2 * n * r + m * r + 1 if projection == "svd" else 2 * n * r + 2
    if name == "racs":
        return m + n + 1
    if name == "alice":
        tracking = float(hp.get("beta3", 0.999)) > 0.0
        return 2 * n * r + m * r + n + (r * r if tracking else 0) + 1
    if name == "alice-0":
        return 2 * n * r + m * r + n + 1
    if name == "eigen-adam":
        return 2 * m * n + 2 * m * m
    if name == "soap":
        return 2 * m * n + 2 * m * m + 2 * n * n
    raise ValueError(f"no memory formula for optimizer {name!r}")


def structured_state_elements(name: str, shapes: Iterable[Sequence[int]], hp: Mapping[str, Any] | None = None) -> int:
    return sum(matrix_state_elements(name, shape, hp) for shape in shapes)


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def whole_model_elements(
    name: str,
    structured: Iterable[Sequence[int]],
    fallback: Iterable[Sequence[int]],
    hp: Mapping[str, Any] | None = None,
) -> int:
    """Table 3 convention: every weight + the candidate's states on `structured` + Adam's 2 states on `fallback`."""
    structured, fallback = list(structured), list(fallback)
    weights = sum(_numel(s) for s in structured) + sum(_numel(s) for s in fallback)
    return weights + structured_state_elements(name, structured, hp) + 2 * sum(_numel(s) for s in fallback)


def whole_model_gib(
    name: str,
    structured: Iterable[Sequence[int]],
    fallback: Iterable[Sequence[int]],
    hp: Mapping[str, Any] | None = None,
    bytes_per_element: int = BF16_BYTES,
) -> float:
    return whole_model_elements(name, structured, fallback, hp) * bytes_per_element / GIB


def llama_shapes(
    hidden: int = 512, intermediate: int = 1376, layers: int = 8, vocab: int = 32000
) -> dict[str, list[tuple[int, ...]]]:
    """Parameter shapes of a LLaMA decoder (untied embedding and head, RMSNorm, SwiGLU, no biases).

    Defaults: the 60M model of Table 10 (hidden 512, intermediate 1376, 8 layers); vocab 32000 is GaLore's
    config (the paper does not state it; inference). Returns {"matrix", "head", "other"} shape lists.
    """
    block = [(hidden, hidden)] * 4 + [(intermediate, hidden)] * 2 + [(hidden, intermediate)]
    return {
        "matrix": block * layers,
        "head": [(vocab, hidden)],
        "other": [(vocab, hidden)] + [(hidden,)] * (2 * layers + 1),
    }

"""Analytic memory of the LLaMA-60M shape set next to the RACS/Alice paper's Table 3 (60M columns).

Usage: python benchmarks/memory_table.py [--rank 128] [--vocab 32000]

Convention of Table 3: BF16 (2 bytes per element) weights + Adam states (2 per element) of the parameters
Adam trains (embeddings, norms, and the LM head for "Mem*") + the candidate's states (`structbench.optim.memory`,
Tables 1 and 6) on the attention and MLP matrices, and on the LM head for "Mem". GiB. The vocabulary is not
stated in the paper; 32000 is GaLore's LLaMA config (inference).
"""

from __future__ import annotations

import argparse

from structbench.optim import memory

OPTIMIZERS = ("adamw", "sgd", "galore", "fira", "apollo-mini", "apollo-svd", "racs", "alice", "alice-0")
RANK_OVERRIDES = {"apollo-mini": 1}
"""Apollo-mini is rank 1 by definition (App. B.12); every other low-rank method uses --rank."""


def table(rank: int, vocab: int) -> list[tuple[str, float, float, float | None, float | None]]:
    shapes = memory.llama_shapes(vocab=vocab)
    rows = []
    for name in OPTIMIZERS:
        hp = {"rank": RANK_OVERRIDES.get(name, rank), "beta3": 0.999}
        head_candidate = memory.whole_model_gib(name, shapes["matrix"] + shapes["head"], shapes["other"], hp)
        head_adam = memory.whole_model_gib(name, shapes["matrix"], shapes["head"] + shapes["other"], hp)
        paper = memory.PAPER_TABLE3_GIB.get(name, (None, None))
        rows.append((name, head_candidate, head_adam, paper[0], paper[1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=128, help="low-rank r (Table 11, 60M: 128)")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary size (paper silent; GaLore: 32000)")
    args = parser.parse_args()
    shapes = memory.llama_shapes(vocab=args.vocab)
    params = sum(memory._numel(s) for group in shapes.values() for s in group)
    print(f"LLaMA-60M shape set: {params / 1e6:.2f}M parameters, r = {args.rank}, BF16, GiB")
    print(f"{'optimizer':<12} {'Mem':>8} {'Mem*':>8} {'paper Mem':>10} {'paper Mem*':>11}")
    for name, mem, mem_star, paper, paper_star in table(args.rank, args.vocab):

        def fmt(x: float | None) -> str:
            return "NA" if x is None else f"{x:.2f}"

        print(f"{name:<12} {mem:>8.3f} {mem_star:>8.3f} {fmt(paper):>10} {fmt(paper_star):>11}")


if __name__ == "__main__":
    main()

"""Bit-identity of every registered optimizer across two checkouts of structbench.

`record OUT` runs every registered optimizer, in many configurations, on a fixed model with a fixed sequence of
gradients, and pickles the final parameters with each entry's registry fields; `compare A B` reports, per
optimizer and configuration, whether two such records hold bit-identical parameters and equal hyperparameters.
Run `record` once per checkout (PYTHONPATH pointing at it), then `compare`:

    PYTHONPATH=/path/to/old python benchmarks/hparams_identity.py record old.pkl
    PYTHONPATH=$PWD python benchmarks/hparams_identity.py record new.pkl
    python benchmarks/hparams_identity.py compare old.pkl new.pkl

Configurations per optimizer: the registry defaults; the conformance kit's `check_hparams` (refreshes and root
updates within the run); and, on top of `check_hparams`, every bool hyperparameter flipped, every alternative of a
choice hyperparameter and a few numeric switches. A configuration the optimizer refuses is recorded as refused, so
the two checkouts must also agree on what they refuse (the exception's type may differ). The registry fields are
compared as sets, with `lr` first. Only the registry's public functions are used.
"""

from __future__ import annotations

import math
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from structbench import optim
from structbench.errors import UsageError

STEPS = 8

CHOICES: dict[str, tuple[str, ...]] = {
    "accumulation": ("ema", "sum"),
    "base": ("sgd", "adamw"),
    "batch_matrices": ("auto", "on", "off"),
    "codebook": ("linear-2", "dt"),
    "compensation": ("optimal", "fira", "fira+", "none"),
    "damping": ("algorithm", "theorem"),
    "embeddings": ("asgo", "dasgo", "adamw"),
    "eps_placement": ("inside", "outside"),
    "moment_transform": ("rotate", "reset", "keep"),
    "momentum_form": ("ema", "sum"),
    "ns_coefficients": ("quintic", "cubic"),
    "ns_dtype": ("auto", "bfloat16", "float32"),
    "ns_normalize": ("frobenius", "spectral"),
    "one_d": ("asgo", "adamw"),
    "order": ("gauss_seidel", "jacobi"),
    "orth": ("svd", "ns_quintic", "ns_cubic"),
    "oversize": ("muon", "adamw"),
    "polar": ("ns", "svd"),
    "precondition_from": ("grad", "momentum"),
    "proj_side": ("paper", "galore", "left", "right"),
    "proj_type": ("std", "reverse_std"),
    "projection": ("random", "svd"),
    "refresh": ("qr", "eigh"),
    "refresh_schedule": ("paper", "reference"),
    "residual": ("reference", "orthogonal"),
    "root": ("eigh", "newton"),
    "root_dtype": ("float32", "float64"),
    "root_method": ("newton", "eigh"),
    "scale": ("shape", "rms", "none"),
    "scaled_gradient": ("raw", "projected"),
    "scaling": ("channel", "tensor"),
    "shape_scale": ("sqrt_max", "none"),
    "side": ("smaller", "left", "right"),
    "sides": ("both", "smaller", "left", "right"),
    "subspace": ("randomized", "exact"),
    "svd_method": ("exact", "randomized"),
    "switching": ("proposed", "none", "gaussian", "gaussian-mix", "full-basis"),
}
"""Every value a choice hyperparameter takes in some optimizer (an optimizer refuses the others)."""

NUMERIC: tuple[tuple[str, Any], ...] = (
    ("beta3", 0.0),
    ("bits", 8),
    ("bits", 32),
    ("eps", 1e-3),
    ("leading", 0),
    ("max_factor_dim", 10),
    ("max_order", 5),
    ("precond_every", 2),
    ("rank", 1),
    ("shampoo_beta", 0.5),
    ("stat_decay", 1.0),
    ("tau", 3),
    ("update_rms", 0.2),
    ("weight_decay", 0.1),
)


class Net(nn.Module):
    """An embedding table, a conv filter, a wide and a tall matrix, a norm's 1-D parameters and a classifier head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.conv = nn.Conv2d(2, 4, 3)
        self.wide = nn.Linear(18, 8)
        self.tall = nn.Linear(8, 20)
        self.norm = nn.LayerNorm(20)
        self.head = nn.Linear(20, 5)


def configurations(name: str) -> list[tuple[str, dict[str, Any]]]:
    entry = optim.get(name)
    check = dict(entry.check_hparams)
    configs = [("defaults", {}), ("check", check), ("check, lr x 0.5", {**check, "lr": 0.5 * entry.defaults["lr"]})]
    for key, default in entry.defaults.items():
        if isinstance(default, bool):
            configs.append((f"check, {key}={not default}", {**check, key: not default}))
        elif isinstance(default, str):
            configs += [(f"check, {key}={v}", {**check, key: v}) for v in CHOICES.get(key, ()) if v != default]
    for key, value in NUMERIC:
        if key in entry.defaults and entry.defaults[key] != value:
            configs.append((f"check, {key}={value}", {**check, key: value}))
    return configs


def gradient(shape: torch.Size, step: int, index: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(10_000 * step + index)
    return torch.randn(shape, generator=generator)


def run(name: str, hparams: dict[str, Any]) -> dict[str, torch.Tensor] | str:
    """The final parameters after STEPS steps on the fixed gradients, or why the optimizer refused `hparams`."""
    torch.manual_seed(0)
    model = Net()
    try:
        optimizer = optim.make_optimizer(name, model, **hparams)
    except (ValueError, TypeError, UsageError) as exc:
        return f"refused: {type(exc).__name__}"
    for step in range(STEPS):
        for index, param in enumerate(model.parameters()):
            param.grad = gradient(param.shape, step, index)
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def record(out: Path) -> None:
    torch.set_num_threads(1)
    results: dict[str, Any] = {"entries": {}, "runs": {}}
    for name in optim.names():
        entry = optim.get(name)
        results["entries"][name] = {
            "first": next(iter(entry.defaults)),
            "defaults": sorted((k, type(v).__name__, v) for k, v in entry.defaults.items()),
            "check_hparams": dict(entry.check_hparams),
            "lr_keys": entry.lr_keys,
            "compile_supported": entry.compile_supported,
        }
        for label, hparams in configurations(name):
            results["runs"][(name, label)] = run(name, hparams)
    out.write_bytes(pickle.dumps(results))
    print(f"recorded {len(results['runs'])} runs of {len(results['entries'])} optimizers to {out}")


def compare(old_path: Path, new_path: Path) -> int:
    old, new = pickle.loads(old_path.read_bytes()), pickle.loads(new_path.read_bytes())
    problems = []
    for name in sorted(set(old["entries"]) | set(new["entries"])):
        if old["entries"].get(name) != new["entries"].get(name):
            problems.append(f"{name}: registry fields differ: {old['entries'].get(name)} vs {new['entries'].get(name)}")
    largest, identical, refused = 0.0, 0, 0
    for key in sorted(set(old["runs"]) | set(new["runs"])):
        a, b = old["runs"].get(key), new["runs"].get(key)
        if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
            if isinstance(a, str) and isinstance(b, str):
                refused += 1
            else:
                problems.append(f"{key}: {a if isinstance(a, str) else 'ran'} vs {b if isinstance(b, str) else 'ran'}")
            continue
        diff = max(float((a[n].double() - b[n].double()).abs().max()) for n in a)
        same = all(torch.equal(a[n], b[n]) for n in a)
        largest = max(largest, diff if math.isfinite(diff) else math.inf)
        if same:
            identical += 1
        else:
            problems.append(f"{key}: parameters differ (max |difference| {diff:.3g})")
    optimizers = len({name for name, _ in old["runs"]})
    print(
        f"{optimizers} optimizers, {len(old['runs'])} configurations: {identical} bit-identical, {refused} refused by "
        f"both, {len(problems)} differences; largest parameter difference {largest:.3g}"
    )
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)

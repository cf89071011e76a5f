"""One `lr` for every optimizer: each registered entry takes `lr` as its main step size, listed first.

`--set "hparams.*.lr=..."` must mean the same thing everywhere: the step size of the structured method (of the
grafted base for Shampoo), never of a hybrid's AdamW fallback (that is `adamw_lr`).
"""

from __future__ import annotations

import pytest
import torch

from structbench.optim import conformance as ck
from structbench.optim import hparams, registry

NAMES = registry.names()
SHAMPOOS = ("shampoo", "shampoo-4bit", "shampoo-4bit-naive")


@pytest.mark.parametrize("name", NAMES)
def test_lr_is_a_hyperparameter_listed_first_and_validated(name: str) -> None:
    entry = registry.get(name)
    assert "lr" in entry.defaults
    assert next(iter(entry.defaults)) == "lr"  # `structbench list optims` shows lr first
    assert "lr" in entry.lr_keys
    assert next(iter(registry.resolve_hparams(name, {}))) == "lr"


def test_register_puts_lr_first_and_refuses_an_entry_without_lr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", {})
    build = registry.get  # never called
    b, lr = hparams.integer("b", 1, hparams.ours("-")), hparams.real("lr", 0.5, hparams.ours("-"), "(0, inf)")

    def entry(name: str, *fields: hparams.Hyperparameter, **kwargs: object) -> registry.OptimizerEntry:
        return registry.OptimizerEntry(
            name=name, summary="-", reference="-", hparams=hparams.Declaration(*fields), build=build, **kwargs
        )

    late = registry.register(entry("late-lr", b, lr))
    assert list(late.defaults) == ["lr", "b"] and registry.get("late-lr") is late
    with pytest.raises(ValueError, match="lr"):
        registry.register(entry("no-lr", b))
    with pytest.raises(ValueError, match="lr"):
        registry.register(entry("lr-unchecked", lr, lr_keys=("x",)))


def _first_moving_step(name: str, lr: float) -> tuple[int, dict, dict, registry.Routing]:
    """(step index, params before it, update it made) of the first step that moves a structured parameter."""
    entry = registry.get(name)
    model = ck.toy_model()
    optimizer, routing = registry.build_with_routing(name, model, {**entry.check_hparams, "lr": lr})
    for step in range(3):
        before = ck.params_of(model)
        ck.train(model, optimizer, range(step, step + 1))
        update = {n: p - before[n] for n, p in ck.params_of(model).items()}
        if any(bool(update[n].any()) for n in routing.structured):
            return step, before, update, routing
    raise AssertionError(f"{name}: no structured parameter moved in 3 steps")


@pytest.mark.parametrize("name", NAMES)
def test_lr_scales_the_structured_step_and_leaves_the_adamw_fallback_alone(name: str) -> None:
    entry = registry.get(name)
    lr = {**entry.defaults, **entry.check_hparams}["lr"]
    step, before, update, routing = _first_moving_step(name, lr)
    step2, before2, update2, _ = _first_moving_step(name, 2 * lr)
    # Until the structured parameters first move, lr changed nothing; that step is then from the same point.
    assert step2 == step
    assert ck.identical(before, before2) == []
    u = 2.0**-24  # float32 unit roundoff
    decay = float(registry.resolve_hparams(name, {**entry.check_hparams, "lr": lr}).get("weight_decay", 0.0))
    for n in routing.structured:
        assert not torch.equal(update[n], update2[n]), n
        # lr is a step size: twice lr, twice the step dW, to first order: a decoupled decay applied after the update,
        # W <- (W - lr S) (1 - lr wd), adds lr^2 wd S, so dW(2 lr) - 2 dW(lr) = 2 lr wd (lr S) exactly; with
        # |lr S| <= |dW| + lr wd |W| that is <= 2 lr wd (|dW| + lr wd |W|) (6e-5 relative for SOAP's defaults).
        # Rounding: each run rounds at most twice on the scale of W (a decay factor, the sum W + dW) and 4 times on
        # that of dW (lr-dependent scalars: a bias-corrected step size, lr alpha, their float32 casts), and the update
        # is read back as fl(fl(W + dW) - W) (u |dW|): per run e <= u (3 |W| + 5 |dW|), and e_2 + 2 e_1 in all. A
        # step that is not linear in lr (lr^2, lr inside a normalisation) is off by O(|dW|).
        w = before[n].abs()
        allowed = u * (3 * w + 5 * update2[n].abs() + 2 * (3 * w + 5 * update[n].abs()))
        allowed += 2 * lr * decay * (update[n].abs() + lr * decay * w)
        assert bool(((update2[n] - 2 * update[n]).abs() <= allowed).all()), f"{name}: {n}"
    if routing.fallback_name == "adamw":  # the fallback's step size is adamw_lr, not lr
        assert "adamw_lr" in entry.lr_keys
        for n in routing.fallback:
            assert torch.equal(update[n], update2[n]), n


def _graft_scale(g: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.norm(g)
    return norm / (norm + 1e-12)


@pytest.mark.parametrize("name", SHAMPOOS)
@pytest.mark.parametrize("base", ["sgd", "adamw"])
def test_shampoo_first_step_is_the_grafted_bases_step_of_size_lr(name: str, base: str) -> None:
    """Before the first root update the roots are I, so G^ = G and G~ = G ||G|| / (||G|| + 1e-12); one step of
    SGD-M from zero momentum is W - lr (G~ + wd W) (L2 decay added after grafting), one AdamW step is
    W (1 - lr wd) - lr G~ / (|G~| + eps) (bias-corrected first moments: m^ = G~, sqrt(v^) = |G~|)."""
    hp = registry.resolve_hparams(name, {"base": base})
    wd, eps = hp[f"{base}_weight_decay"], hp["adamw_eps"]
    base_lr = hp["lr"] if base == "sgd" else 1e-3  # the paper's AdamW-base lr (App. G)
    for lr in (base_lr, 2 * base_lr):
        model = ck.toy_model()
        optimizer = registry.make_optimizer(name, model, base=base, lr=lr)
        gen = torch.Generator().manual_seed(7)
        w0, grads = {}, {}
        for n, p in model.named_parameters():
            p.grad = torch.randn(p.shape, generator=gen)
            w0[n], grads[n] = p.detach().double().clone(), p.grad.double()
        optimizer.step()
        for n, p in model.named_parameters():
            u = grads[n] * _graft_scale(grads[n])
            if base == "sgd":
                expected = w0[n] - lr * (u + wd * w0[n])
                step = lr * (u.abs() + wd * w0[n].abs())
            else:
                expected = w0[n] * (1 - lr * wd) - lr * u / (u.abs() + eps)
                step = lr * torch.ones_like(u)
            # float32 rounding, entrywise: the graft scale is fl(||G||) / fl(fl(||G||) + 1e-12), the same norm twice,
            # so 1 within 2 u; SGD: + wd W, the momentum buffer, - lr buf (3 u of each term); AdamW: the moments,
            # bias corrections, sqrt, + eps and the quotient (8 u of lr), the decay factor and W's roundings
            # (3 u |W|). A step of lr twice, or L2 decay in place of decoupled decay, is off by >= 1e-4.
            allowed = 8 * 2.0**-24 * (step + w0[n].abs() + expected.abs())
            error = (p.detach().double() - expected).abs()
            assert bool((error <= allowed).all()), f"{name} {base} {n}: {float((error / allowed).max()):.3g}"


@pytest.mark.parametrize("name", SHAMPOOS)
def test_shampoo_takes_no_second_name_for_its_step_size(name: str) -> None:
    defaults = registry.get(name).defaults
    assert "sgd_lr" not in defaults and "adamw_lr" not in defaults
    assert registry.get(name).lr_keys == ("lr",)

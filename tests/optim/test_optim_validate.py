"""`optim.validate`: every registered optimizer refuses hyperparameters outside the ranges their math allows.

The ranges come from what each kind of hyperparameter is, whichever optimizer takes it: a momentum or an EMA beta is
a geometric weight in [0, 1); an eps is added under a root or to a denominator and a weight decay shrinks towards zero,
so neither is negative; ranks, intervals and iteration counts are positive integers; a learning rate or a step scale
is positive; no hyperparameter is NaN or infinite.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from structbench import optim
from structbench.errors import UsageError

BETA = re.compile(r"(^|_)(beta\d?|momentum)$")
EPS = re.compile(r"(^|_)eps$")
DECAY = re.compile(r"(^|_)weight_decay$")
COUNT = re.compile(
    r"^(rank|update_interval|update_proj_gap|update_freq|ns_steps|precond_every|precondition_frequency|"
    r"stat_interval|root_interval|max_order|inverse_root_order|iterations|tau|block_size|svd_iters)$"
)
NON_NEGATIVE_COUNT = re.compile(
    r"^(leading|max_precond_dim|max_factor_dim|rsvd_oversample|rsvd_power_iters|rectify_t1|rectify_t2|min_lowbit_numel)$"
)
STEP_SCALE = re.compile(r"^(alpha|scale|mu)$")
"""A factor of the step (RACS, SUMO, Alice alpha; GaLore-family scale) or FISMO's damping mu: both must be > 0."""
OTHER_RANGES = [
    # A norm-growth limiter lets the update norm grow by at most gamma >= 1 per step (Fira, RACS, Alice, APOLLO, SUMO).
    *[(name, "gamma", 0.5) for name in ("alice", "alice-0", "racs", "fira", "apollo-mini", "apollo-svd")],
    ("sumo", "nl_gamma", 0.5),
    # FISMO's gamma and Shampoo's stat_decay are EMA weights of statistics: [0, 1], 1 meaning a plain sum / no decay.
    ("fismo", "gamma", 1.5),
    ("fismo", "gamma", -0.1),
    ("shampoo", "stat_decay", 1.5),
    ("shampoo-4bit", "stat_decay", -0.1),
    # A compensation weight is >= 0; AdaGrad-Norm's b0 starts a running sum that is divided by: > 0.
    ("alice", "alpha_c", -0.1),
    ("fira", "alpha_c", -0.1),
    ("adagrad-norm", "b0", 0.0),
]


def out_of_range(key: str, default: object) -> list[object]:
    """Values the math of a hyperparameter named `key` (with this default) rules out."""
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return []
    bad: list[object] = [math.nan, math.inf] if isinstance(default, float) else []
    if BETA.search(key):
        # SOAP's shampoo_beta < 0 stands for "use beta2"; 1 is out of range for it too.
        bad += [1.0, 1.5] if key == "shampoo_beta" else [-0.1, 1.0, 1.5]
    if EPS.search(key) or DECAY.search(key):
        bad.append(-1e-3)
    if COUNT.match(key):
        bad.append(0)
    if NON_NEGATIVE_COUNT.match(key):
        bad.append(-1)
    if key == "lr" or key.endswith("_lr") or (STEP_SCALE.match(key) and isinstance(default, float)):
        bad += [0.0, -1.0]
    return bad


CASES = [
    (name, key, value)
    for name in optim.names()
    for key, default in optim.get(name).defaults.items()
    for value in out_of_range(key, default)
] + OTHER_RANGES


def test_the_cases_cover_every_registered_optimizer():
    assert len(optim.names()) == 21
    assert {name for name, _, _ in CASES} == set(optim.names())


@pytest.mark.parametrize("name", optim.names())
def test_every_optimizer_accepts_its_own_defaults(name):
    assert optim.validate(name, {}) == dict(optim.get(name).defaults)


@pytest.mark.parametrize(("name", "key", "value"), CASES, ids=[f"{n}-{k}={v}" for n, k, v in CASES])
def test_an_out_of_range_hyperparameter_is_a_usage_error_naming_it(name, key, value):
    with pytest.raises(UsageError) as caught:
        optim.validate(name, {key: value})
    message = str(caught.value)
    assert f"'{name}'" in message
    assert key in message
    assert "\n" not in message


def test_a_value_bad_only_with_another_names_the_one_that_fails_alone():
    # Alice's leading count l must not exceed its rank r (Alg. 4 keeps l of the r tracked directions).
    with pytest.raises(UsageError, match=r"rejects rank=4: leading must be an int in \[0, rank\]"):
        optim.validate("alice", {"rank": 4, "leading": 8})
    assert optim.validate("alice", {"rank": 8, "leading": 8})["leading"] == 8


def test_a_wrongly_typed_choice_is_a_usage_error():
    with pytest.raises(UsageError, match="optimizer 'muon' rejects polar=3"):
        optim.validate("muon", {"polar": 3})


def test_validating_draws_nothing_from_the_global_generator():
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    for name in optim.names():
        optim.validate(name, {})
    assert torch.equal(torch.rand(4), expected)

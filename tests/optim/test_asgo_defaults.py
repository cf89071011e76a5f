"""ASGO's and DASGO's defaults are the paper's tuned GPT-2 settings: An et al., "ASGO: Adaptive Structured Gradient
Optimization" (arXiv 2503.20762), Appendix C.2, Table 4 ("Optimal hyperparameter selection for pretraining GPT-2"):

    Optimizer  Learning Rate  beta1  beta2  Damping eps  Update Freq. (tau)
    DASGO      0.01           0.9    0.99   1e-6         N/A
    ASGO       0.1            0.9    0.95   1e-6         1

The expected values below are copied from that table, not from the code.
"""

from __future__ import annotations

import pytest

from structbench.optim import registry

TABLE_4 = {
    "asgo": {"lr": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-6, "tau": 1},
    "dasgo": {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-6},
}


@pytest.mark.parametrize("name", sorted(TABLE_4))
def test_defaults_are_table_4_of_the_asgo_paper(name):
    resolved = registry.resolve_hparams(name, {})
    assert {key: resolved[key] for key in TABLE_4[name]} == TABLE_4[name]

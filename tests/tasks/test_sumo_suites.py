"""SUMO's settings in the LLaMA pre-training suites, and the step-size reading stored with every SUMO run.

SUMO (Refael et al., arXiv 2505.24749) Table 3 gives the rank for LLaMA pre-training on C4 ("r/d_model": 128/256 at
60M, 256/768 at 130M). The paper states no learning rate, projection-back scale or subspace interval for C4 and
follows GaLore's evaluation, whose C4 scripts (jiaweizzhao/GaLore scripts/benchmark_c4/llama_60m.sh and
llama_130m.sh) use lr 0.01, galore_scale 0.25 and update_proj_gap 200 for every parameter's AdamW. The registry's
defaults are the GLUE fine-tuning values (rank 4, lr 1e-5, Table 7), which must not reach pre-training.
"""

from __future__ import annotations

import json

import pytest
import torch

from structbench.execution.runner import execute
from structbench.plan import spec

TABLE_3_RANK = {"llama-60m": 128, "llama-130m": 256}
GALORE_C4 = {"lr": 0.01, "alpha": 0.25, "update_freq": 200, "adamw_lr": 0.01}


@pytest.mark.parametrize("suite_name", sorted(TABLE_3_RANK))
def test_llama_suites_give_sumo_the_papers_pretraining_settings(suite_name):
    [suite], _ = spec.load_suites(suite_name, [])
    hp = suite.hparams["sumo"]
    assert hp["rank"] == TABLE_3_RANK[suite_name]
    assert {key: hp[key] for key in GALORE_C4} == GALORE_C4
    assert hp["shape_scale"] == "sqrt_max"
    assert suite.run_spec("sumo", 0)["hparams"]["shape_scale"] == "sqrt_max"


@pytest.mark.parametrize("reading", ["sqrt_max", "none"])
def test_every_sumo_run_stores_its_shape_scale(tmp_path, reading):
    """The stored hyperparameters of a SUMO run say which step size it took: lr alpha sqrt(max(m, n)) Q O (the
    Block 4 text) or lr alpha Q O (the box as printed)."""
    overrides = [
        "budget.steps=3",
        "budget.log_every=1",
        *([f"hparams.sumo.shape_scale={reading}"] if reading == "none" else []),
    ]
    [suite], _ = spec.load_suites("smoke-quadratic", overrides)
    outcome = execute(suite, "sumo", 0, torch.device("cpu"), tmp_path)
    assert outcome.row["status"] == "ok"
    assert json.loads(outcome.row["hparams"])["shape_scale"] == reading
    assert json.loads(outcome.row["spec"])["hparams"]["shape_scale"] == reading

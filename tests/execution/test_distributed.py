"""One run as a torch.distributed job (DDP, gloo on CPU, 2 processes): optimizers, sharding, the runner, the store
row, a failing rank, a hung rank, and a 2-task Slurm job.

Each torchrun launch costs seconds (two Python processes importing torch), so the checks are grouped: one launch
runs every optimizer, sharding and runner check (tests/support/ddp_checks.py, its findings asserted here), two CLI grids
each run a failing (raising, hanging) and a healthy run, and one Slurm job runs a healthy run.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from structbench import optim
from structbench.cli.app import EXIT_RUN_ERROR
from structbench.tasks.base import Shard
from tests.support.paths import ROOT
from tests.support.slurm_cluster import quiet_submitit_sacct, require_slurm
from tests.support.store import assert_indexes_the_store, read_runs
from tests.support.system_parts import missing

U = 2.0**-24
"""float32 unit roundoff."""


def require_torchrun() -> None:
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError as exc:
        missing(f"torchrun ({exc})", "a torch build with torch.distributed")


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_torchrun()
    out = tmp_path_factory.mktemp("ddp") / "findings.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    result = subprocess.run(
        [*command, str(ROOT / "tests" / "support" / "ddp_checks.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_optimizer_under_ddp_equals_a_single_process_stepped_on_the_averaged_gradient(findings):
    """DDP's all-reduce gives each rank g0/2 + g1/2 (two terms: one rounding, in either order; halving is exact), so
    a replicated optimizer must end bit-identical on both ranks and to one process fed that gradient."""
    assert sorted(findings["optimizers"]) == optim.names()
    for name, found in findings["optimizers"].items():
        assert found["ranks_identical"], name
        assert found["bit_identical"], (name, found["max_abs_diff"])


def test_sharded_optimizers_equal_their_replicated_form_and_hold_half_the_state(findings):
    """Each matrix's update depends on its own gradient and state only, so the owner computes what every rank
    computes when replicated. Muon steps each matrix on its own: bit for bit. Shampoo batches the roots of all
    same-order statistics into one solver call, and a different batch may round differently in the last place:
    at most a few units in the last place of the parameters per step (4 u max|theta| per step, over 3 steps).
    Every state tensor is held by exactly one rank, and the greedy split (largest first, to the least loaded rank)
    leaves no rank more than one parameter's state above an even split; Muon's four equal matrices split two and
    two."""
    sharded = {n for n in optim.names() if "distributed" in optim.get(n).defaults}
    assert {"muon", "shampoo", "fismo"} <= sharded
    assert set(findings["sharding"]) == sharded
    for name, found in findings["sharding"].items():
        assert found["ranks_identical"], name
        assert found["max_abs_diff"] <= 3 * 4 * U * found["param_scale"], (name, found["max_abs_diff"])
        per_rank = found["state_bytes_per_rank"]
        replicate = [r["replicate"] for r in per_rank]
        shard = [r["shard"] for r in per_rank]
        assert replicate[0] == replicate[1], name
        assert sum(shard) == replicate[0], (name, shard, replicate)
        assert max(shard) <= replicate[0] / 2 + found["largest_param_state"], (name, shard, replicate)
    assert findings["sharding"]["muon"]["bit_identical"]
    muon = [r["shard"] for r in findings["sharding"]["muon"]["state_bytes_per_rank"]]
    assert muon[0] == muon[1] == 4 * 2 * 16 * 16, "two 16x16 momentum buffers per rank"


@pytest.mark.parametrize("suite", ["shakespeare-llama", "digits"])
def test_a_run_at_world_size_2_matches_world_size_1(findings, suite):
    """SGD's update is linear in the gradient, and the gradient of the global batch at world size 2 differs from
    world size 1 only in summation order (two half-batch means averaged instead of one mean). A sum of n terms in
    float32 is off by at most gamma_n = n u / (1 - n u) relative to the sum of the terms' magnitudes; with the largest
    parameter update standing in for that magnitude, k steps move the parameters apart by at most k gamma_n times the
    largest update (n: the examples, or tokens, the batch's reductions run over)."""
    found = findings["runner"][suite]
    assert found["status"] == ["ok", "ok"] and found["world_size"] == 2
    n, k = found["reduction_length"], found["steps"]
    gamma = n * U / (1 - n * U)
    assert found["max_update"] > 0
    assert found["max_abs_diff"] <= k * gamma * found["max_update"], found
    assert found["train_loss"][0] == pytest.approx(found["train_loss"][1], rel=k * gamma)
    # The ranks trained on different halves of the batch, whose losses average to the whole batch's.
    first = found["first_loss_per_rank"]
    assert first[0] != first[1]
    assert sum(first) / 2 == pytest.approx(found["first_loss_one_process"], rel=gamma)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_partition_every_batch_and_their_weights_average_to_one(world_size):
    for count in range(12):
        spans = [Shard(rank, world_size).span(count) for rank in range(world_size)]
        covered = [i for start, stop in spans for i in range(start, stop)]
        assert covered == list(range(count)), (count, spans)
        sizes = [stop - start for start, stop in spans]
        assert max(sizes) - min(sizes) <= 1
        if count:
            weights = [Shard(r, world_size).weight(n, count) for r, n in enumerate(sizes)]
            assert sum(weights) / world_size == pytest.approx(1.0)


FAILING_OPTIMIZER = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    from structbench.optim import registry
    from structbench.optim.hparams import Declaration, ours, real


    class FailsOnRank1(torch.optim.SGD):
        def step(self, closure=None):
            if dist.is_initialized() and dist.get_rank() == 1:
                raise RuntimeError("deliberate failure on rank 1")
            return super().step(closure)


    registry.register(
        registry.OptimizerEntry(
            name="fail-on-rank-1",
            summary="SGD that raises on rank 1 of a distributed run",
            reference="test",
            hparams=Declaration(real("lr", 0.1, ours("test"), "(0, inf)")),
            build=lambda named, routing, hp: FailsOnRank1([p for _, p in named], lr=hp["lr"]),
        )
    )
    """
)

SUITE = """
description = "two runs at world size 2: the first fails on rank 1"
task = "synthetic-classification"
optims = ["fail-on-rank-1", "sgd"]
seeds = [0]

[budget]
steps = 4
batch_size = 16
log_every = 2
"""


def test_a_failing_rank_ends_its_run_error_with_its_traceback_and_the_grid_goes_on(tmp_path):
    """The optimizer (defined here, registered in every process through sitecustomize) raises on rank 1 only."""
    require_torchrun()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FAILING_OPTIMIZER)
    (tmp_path / "suite.toml").write_text(SUITE)
    out = tmp_path / "out"
    command = ["run", "--suite", str(tmp_path / "suite.toml"), "--device", "cpu", "--nproc-per-node", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "structbench", *command, "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"},
        check=False,
    )
    assert result.returncode == EXIT_RUN_ERROR, result.stdout + result.stderr
    runs = read_runs(out).set_index("optim")
    assert len(runs) == 2 and runs.run_key.nunique() == 2, "exactly one row per run"
    failed, healthy = runs.loc["fail-on-rank-1"], runs.loc["sgd"]
    assert failed.status == "error"
    assert failed.error.startswith("rank 1 of 2 ended error:")
    assert "Traceback" in failed.error and "RuntimeError: deliberate failure on rank 1" in failed.error
    assert healthy.status == "ok" and healthy.steps == 4
    assert healthy.world_size == 2 and healthy.distributed_backend == "gloo" and healthy.executor == "torchrun"
    assert healthy.command.endswith(shlex.join([*command, "--out", str(out), "--quiet"])), "the user's command"
    peaks = json.loads(healthy.peak_mem_bytes_per_rank)
    assert len(peaks) == 2 and all(p > 0 for p in peaks) and healthy.peak_mem_bytes == max(peaks)
    # SGD with momentum keeps one float32 buffer per parameter element, whole on every rank.
    assert json.loads(healthy.state_bytes_per_rank) == [4 * healthy.param_count] * 2
    assert healthy.state_bytes == 4 * healthy.param_count and healthy.state_bytes_total == 8 * healthy.param_count
    assert not list((out / ".distributed").glob("*/rank-*.json")), "failure notes are removed once stored"
    assert_indexes_the_store(out)  # a grid with a failed run is indexed too


HANGING_OPTIMIZER = textwrap.dedent(
    """
    import time

    import torch
    import torch.distributed as dist

    from structbench.execution import distributed
    from structbench.optim import registry
    from structbench.optim.hparams import Declaration, ours, real

    distributed.COLLECTIVE_MARGIN_S = {margin}


    class HangsOnRank1(torch.optim.SGD):
        def step(self, closure=None):
            while dist.is_initialized() and dist.get_rank() == 1:
                time.sleep(0.1)
            return super().step(closure)


    registry.register(
        registry.OptimizerEntry(
            name="hang-on-rank-1",
            summary="SGD whose step never returns on rank 1 of a distributed run",
            reference="test",
            hparams=Declaration(real("lr", 0.1, ours("test"), "(0, inf)")),
            build=lambda named, routing, hp: HangsOnRank1([p for _, p in named], lr=hp["lr"]),
        )
    )
    """
)

HANG_MAX_TIME_S, HANG_MARGIN_S = 1.0, 2.0
LAUNCH_ALLOWANCE_S = 45.0
"""One torchrun launch on a loaded 2-core machine: torchrun and two ranks start Python and import torch, build the
task and tear down (a few seconds when the machine is quiet)."""
TORCHRUN_GRACE_S = 30.0
"""How long torchrun waits after SIGTERM before it SIGKILLs the ranks it stops (torch.distributed.elastic's
`PContext.close` default)."""


def processes_mentioning(marker: str) -> list[Any]:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(marker in part for part in cmdline):
            found.append(process)
    return found


def test_a_hung_rank_is_bounded_by_the_time_limit_its_ranks_are_stopped_and_the_grid_goes_on(tmp_path):
    """Rank 1's optimizer step never returns (no collective: it just sleeps), so rank 0 waits in the run's next
    collective until the process group's timeout, budget.max_time_s + COLLECTIVE_MARGIN_S (the margin made 2 s here,
    in every process, by the same sitecustomize). The temporary directory holding each launch's job file is put
    under this test's tmp_path, so every rank's command line names it: the marker of leftover processes."""
    require_torchrun()
    import psutil  # noqa: F401

    site, scratch = tmp_path / "site", tmp_path / "tmp"
    site.mkdir()
    scratch.mkdir()
    (site / "sitecustomize.py").write_text(HANGING_OPTIMIZER.replace("{margin}", repr(HANG_MARGIN_S)))
    suite = SUITE.replace("fail-on-rank-1", "hang-on-rank-1") + f"max_time_s = {HANG_MAX_TIME_S}\n"
    (tmp_path / "suite.toml").write_text(suite)
    out = tmp_path / "out"
    collective_timeout = HANG_MAX_TIME_S + HANG_MARGIN_S
    # Two launches (the hung run and the healthy one), the hung run's wait and torchrun's stopping of its ranks.
    bound = 2 * LAUNCH_ALLOWANCE_S + collective_timeout + TORCHRUN_GRACE_S
    command = ["run", "--suite", str(tmp_path / "suite.toml"), "--device", "cpu", "--nproc-per-node", "2"]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "structbench", *command, "--out", str(out), "--quiet"],
            capture_output=True,
            text=True,
            timeout=bound,
            env={**os.environ, "PYTHONPATH": f"{site}:{ROOT}", "TMPDIR": str(scratch)},
            check=False,
        )
        leftover = [(p.pid, p.info["cmdline"]) for p in processes_mentioning(str(tmp_path))]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the grid with a hung rank was not over within {bound:g} s")
    finally:
        for process in processes_mentioning(str(tmp_path)):
            process.kill()
    assert not leftover, f"rank processes still running after the command ended: {leftover}"
    assert result.returncode == EXIT_RUN_ERROR, result.stdout + result.stderr
    runs = read_runs(out).set_index("optim")
    assert len(runs) == 2 and runs.run_key.nunique() == 2, "exactly one row per run"
    hung, healthy = runs.loc["hang-on-rank-1"], runs.loc["sgd"]
    assert hung.status == "error"
    assert hung.error.startswith(
        f"a collective of rank 0 of 2 timed out after {collective_timeout:g} s "
        f"(budget.max_time_s {HANG_MAX_TIME_S:g} s + {HANG_MARGIN_S:g} s): rank 1 never joined it"
    ), hung.error
    # Rank 0 waited the whole timeout inside its run: the limit does not cut a run short of it.
    assert (hung.finished_at - hung.started_at).total_seconds() >= collective_timeout
    assert healthy.status == "ok" and healthy.steps == 4 and healthy.world_size == 2
    assert not list((out / ".distributed").glob("*/rank-*.json")), "failure notes are removed once stored"


def test_a_two_task_slurm_job_runs_one_run_at_world_size_2(cli, tmp_path):
    require_slurm()
    quiet_submitit_sacct()
    result = cli(
        "run", "--suite", "smoke-mlp", "--optim", "sgd", "--steps", "4", "--device", "cpu", "--out", tmp_path,
        "--executor", "slurm", "--wait", "--slurm-time", "5", "--nproc-per-node", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [row] = read_runs(tmp_path).itertuples()
    assert row.status == "ok" and row.steps == 4
    assert row.world_size == 2 and row.distributed_backend == "gloo" and row.executor == "slurm"
    assert len(json.loads(row.peak_mem_bytes_per_rank)) == 2
    assert_indexes_the_store(tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "smoke-mlp", "--nnodes", "2"], "--nnodes needs --nproc-per-node"),
        (["--suite", "smoke-mlp", "--nproc-per-node", "2", "--executor", "local"], "not local"),
        (["--suite", "smoke-mlp", "--nproc-per-node", "2", "--nnodes", "2"], "--nnodes > 1 needs --executor slurm"),
        (["--suite", "smoke-mlp", "--nproc-per-node", "0"], "must be >= 1"),
        (["--suite", "smoke-quadratic", "--nproc-per-node", "2"], "cannot train under --nproc-per-node"),
        (["--suite", "smoke-mlp", "--nproc-per-node", "3"], "divide evenly among the 3 processes"),
        (
            ["--suite", "smoke-mlp", "--nproc-per-node", "2", "--set", "budget.checkpoint_every=5"],
            "checkpoint_every is not supported",
        ),
    ],
)
def test_distributed_options_that_cannot_run_are_one_line_exit_2_and_write_nothing(cli, tmp_path, args, message):
    result = cli("run", *args, "--device", "cpu", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_the_run_key_holds_the_world_size_and_a_single_process_ignores_the_distributed_switch():
    from structbench.plan import grid, spec

    [default], _ = spec.load_suites("smoke-mlp", ["budget.steps=3"], ["muon"], [0])
    overrides = ["budget.steps=3", "hparams.muon.distributed=replicate"]
    [replicate], _ = spec.load_suites("smoke-mlp", overrides, ["muon"], [0])
    one = {grid.run_key(s, "muon", 0, "cpu", 1) for s in (default, replicate)}
    two = {grid.run_key(s, "muon", 0, "cpu", 2) for s in (default, replicate)}
    assert len(one) == 1 and len(two) == 2 and not one & two

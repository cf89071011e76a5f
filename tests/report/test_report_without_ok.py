"""Issue 35, item 5: a suite where no run ended ok is left out of the cross-suite ranks and profiles (before, its one
optimizer "tied for last" there and ranked first), and the report says so."""

from __future__ import annotations

from structbench.report import build
from structbench.store import write as store
from tests.support.store import adamw_evals, muon_evals, write_run


def failed_suite_store(out):
    """Suite "alpha": adamw and muon, ok. Suite "beta": muon alone, every run diverged."""
    store.prepare(out)
    for seed in range(2):
        write_run(out, f"a-adamw-{seed}", "adamw", seed, adamw_evals(seed), suite="alpha")
        write_run(out, f"a-muon-{seed}", "muon", seed, muon_evals(seed), suite="alpha")
        write_run(out, f"b-muon-{seed}", "muon", seed, muon_evals(seed), suite="beta", status="diverged")
    return out


def rank_table_lines(stdout: str) -> list[str]:
    """The lines of the terminal's rank table, from its title to its caption's end."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Rank across suites"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    return lines[start : end + 1]


def test_a_suite_without_an_ok_run_is_left_out_of_ranks_and_profiles(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = failed_suite_store(tmp_path / "results")
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    ranks = "\n".join(rank_table_lines(result.stdout))
    assert "alpha" in ranks and "beta" not in ranks and "no ok run" not in ranks
    assert "suite(s) beta have no ok run: left out of the cross-suite profiles and ranks" in result.stdout
    report = build.build_report(out)
    assert [s.name for s in report.aggregated] == ["alpha"]
    assert list(report.ranks.ranks.index) == ["alpha"]
    assert report.ranks.coverage.to_dict() == {"adamw": 1, "muon": 1}
    assert report.profile_steps is None or list(report.profile_steps.ratios.index) == ["alpha"]

"""Provenance stored with every run, each field against a fact obtained independently: git's own answer in a
repository this test makes dirty, the command line and thread variables a subprocess was given, `nproc`, `lscpu`,
pip's list of installed distributions, nvidia-smi (where there is a GPU); the report's environments table; and
`structbench --version` against pyproject.toml."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import torch

from structbench import environment, measure
from structbench.report import build
from structbench.report.views import tables
from structbench.store import write as store
from tests.support.paths import ROOT
from tests.support.report_store import final, write_run


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_git_dirty_is_true_exactly_when_tracked_files_differ_from_the_commit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    assert environment.git_commit(repo) == _git(repo, "log", "-1", "--format=%H")
    assert environment.git_dirty(repo) is False
    (repo / "notes.txt").write_text("untracked\n")
    assert environment.git_dirty(repo) is False, "untracked files do not count (as git describe --dirty)"
    (repo / "a.py").write_text("x = 2\n")
    assert environment.git_dirty(repo) is True
    _git(repo, "add", "a.py")
    assert environment.git_dirty(repo) is True, "a staged change is uncommitted too"
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two")
    assert environment.git_dirty(repo) is False
    plain = tmp_path / "plain"
    plain.mkdir()
    assert environment.git_dirty(plain) is None and environment.git_commit(plain) is None
    assert environment.git_dirty(None) is None


def test_torch_threads_and_thread_variables_are_read_when_the_run_is_recorded(monkeypatch):
    for name in environment.THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("KMP_AFFINITY", "granularity=fine,compact")
    monkeypatch.setenv("UNRELATED_THREADS", "9")
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        recorded = measure.environment(torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
    assert recorded["torch_threads"] == 3
    assert json.loads(recorded["thread_env"]) == {"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "3"}


def _installed() -> dict[str, str]:
    """Distribution name (normalised) -> version, as pip lists them."""
    done = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(done.stdout)}


def _lscpu_model() -> str | None:
    if shutil.which("lscpu") is None:
        return None
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def test_a_run_on_worker_processes_records_the_command_line_it_was_given_and_its_machine(tmp_path):
    """The run happens in a worker process (--executor local), whose own command line is the executor's: the row
    must hold the command the user typed."""
    out = tmp_path / "results"
    command = [sys.executable, "-m", "structbench", "run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0",
               "--steps", "3", "--out", str(out), "--executor", "local", "--jobs", "1", "--quiet"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in environment.THREAD_ENV_VARS}
    env.update(PYTHONPATH=str(ROOT), MKL_NUM_THREADS="5", OMP_PROC_BIND="false")
    subprocess.run(command, check=True, capture_output=True, timeout=300, env=env, cwd=tmp_path)
    (row,) = pq.read_table(out / "runs").to_pylist()

    assert row["command"] == shlex.join(command)
    assert json.loads(row["thread_env"]) == {"MKL_NUM_THREADS": "5", "OMP_PROC_BIND": "false"}
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    assert row["cpu_usable"] == nproc
    assert row["torch_threads"] == nproc, "one local worker gets every usable core"
    assert row["cpu_count"] == int(subprocess.run(["nproc", "--all"], capture_output=True, text=True).stdout)
    model = _lscpu_model()
    if model is not None:
        assert row["cpu_model"] == model
    installed = _installed()
    for distribution in ("numpy", "pytorch-optimizer", "tokenizers", "torchvision"):
        column = distribution.replace("-", "_") + "_version"
        assert row[column] == installed.get(distribution), column
    if (ROOT / ".git").exists():
        assert row["git_commit"] == _git(ROOT, "rev-parse", "HEAD")
        assert row["git_dirty"] == bool(_git(ROOT, "status", "--porcelain", "--untracked-files=no"))
    smi = shutil.which("nvidia-smi")
    if torch.cuda.is_available() and smi:
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        gpus = [line.split(", ") for line in subprocess.run(query, capture_output=True, text=True).stdout.splitlines()]
        assert row["gpu_count"] == len(gpus) and row["cuda_driver_version"] == gpus[0][1]
    elif not torch.cuda.is_available():
        assert row["gpu_count"] == 0
        assert row["gpu_name"] is None and row["cuda_driver_version"] is None and row["cudnn_version"] is None


def test_version_prints_the_version_pyproject_declares(cli):
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout == f"structbench {declared}\n"


def test_the_reports_environments_table_shows_the_provenance_and_the_runs_their_command(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    write_run(out, "r0", "sgd", 0, final(10, 0.8, 0.8), git_dirty=True, torch_threads=4, cpu_count=64,
              thread_env='{"OMP_NUM_THREADS": "4"}', numpy_version="2.4.6", command="structbench run --suite vision")
    write_run(out, "r1", "sgd", 1, final(10, 0.8, 0.8))  # a run stored before these columns existed  # fmt: skip
    report = build.build_report(out)
    table = tables.environment_table(report)
    assert [c.name for c in table.columns] == ["field", "E1", "E2"]
    rows = {row[0].text: [cell.text for cell in row[1:]] for row in table.rows}
    assert sorted(rows["git_dirty"]) == ["-", "True"]
    assert sorted(rows["torch_threads"]) == ["-", "4"] and sorted(rows["cpu_count"]) == ["-", "64"]
    assert sorted(rows["thread_env"]) == ["-", '{"OMP_NUM_THREADS": "4"}']
    assert sorted(rows["numpy_version"]) == ["-", "2.4.6"] and rows["runs"] == ["1", "1"]
    dirty = ["E1", "E2"][rows["git_dirty"].index("True")]
    assert report.environment_of_runs() == {"r0": dirty, "r1": ({"E1", "E2"} - {dirty}).pop()}
    [suite] = report.suites
    runs = tables.runs_of_variant(suite.variants[0].variant, report.environment_of_runs())
    commands = {row[0].text: row[-1].text for row in runs.rows}
    assert commands == {"r0": "structbench run --suite vision", "r1": "-"}

"""`structbench report` and `--help` start without torch, a report whose figures are all cached draws none, and a
terminal report does not load matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.store import adamw_and_muon_store, adamw_evals, write_run

# Runs in a fresh interpreter: the test process has usually imported torch already.
PROBE = """
import json, sys
from typer.testing import CliRunner
from structbench.cli.app import app

for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, (args, result.output)
torch = sorted(name for name in sys.modules if name.split(".")[0] == "torch")
drew = "structbench.report.figures.plots" in sys.modules
print(json.dumps({"torch": torch, "drew": drew, "matplotlib": "matplotlib" in sys.modules}))
"""


def probe(*commands: list[str]) -> dict[str, object]:
    """What the commands, run in one fresh interpreter, loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_report_does_not_import_torch_and_reuses_cached_figures(tmp_path: Path) -> None:
    out = adamw_and_muon_store(tmp_path / "results")
    write_run(out, "smoke-0", "adamw", 0, adamw_evals(0), suite="smoke-mlp")  # `--suite smoke` stands for it
    term = ["report", "--out", str(out), "--suite", "smoke", "--suite", "hand"]
    assert probe(term) == {"torch": [], "drew": False, "matplotlib": False}
    every_format = ["report", "--out", str(out), "--format", "all"]
    commands = (["--help"], ["report", "--help"], [*every_format, "--to", str(tmp_path / "report")], term)
    assert probe(*commands) == {"torch": [], "drew": True, "matplotlib": True}
    assert (tmp_path / "report" / "report.html").is_file()
    assert probe(*commands[:2], [*every_format, "--to", str(tmp_path / "again")]) == {
        "torch": [],
        "drew": False,
        "matplotlib": True,
    }

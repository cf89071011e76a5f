"""benchmarks/gpu_suite.py on a machine without a GPU: one line and exit 2, bad arguments likewise, the vision suite
chosen by what is on disk, and the dry run (`--device cpu --tiny`) of a part, with a failing part reported while the
others run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import deadline, gpu_suite, vision_overhead
from structbench.data.cifar import CIFAR10


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on a machine without a GPU, wherever the tests run; the thread count the dry run sets is restored."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "needs a CUDA device and torch sees none on this machine"),
        (["--part", "overhead"], "needs a CUDA device"),
        (["--device", "cpu"], "--device cpu runs only with --tiny"),
        (["--device", "cpu", "--tiny", "--part", "speed"], "argument --part: invalid choice: 'speed'"),
        (["--tiny", "--steps", "3"], "unrecognized arguments: --steps 3"),
    ],
)
def test_without_cuda_or_with_bad_arguments_one_line_and_exit_2(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        gpu_suite.main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and message in err


def test_vision_suite_is_cifar10_speed_only_where_cifar10_is_on_disk(tmp_path: Path) -> None:
    assert gpu_suite.vision_suite(tmp_path) == ("fashion-mnist", ["task_args.model=cnn"])
    folder = tmp_path / CIFAR10.folder
    folder.mkdir()
    for name in CIFAR10.member_files:
        (folder / name).write_bytes(b"")
    assert gpu_suite.vision_suite(tmp_path) == ("cifar10-speed", [])


def test_dry_run_of_a_part_and_a_failing_part(monkeypatch, capsys, tmp_path) -> None:
    def broken(argv: list[str]) -> None:
        raise RuntimeError("no such data\nsecond line")

    monkeypatch.setattr(vision_overhead, "main", broken)
    argv = ["--device", "cpu", "--tiny", "--data-dir", str(tmp_path), "--part", "overhead", "--part", "step-time"]
    assert gpu_suite.main(argv) == 1
    out = capsys.readouterr().out
    assert "overhead FAILED: RuntimeError: no such data\n" in out
    table = out[out.index("# step-time") :]
    assert "## gpt2-small: 4 tensors, 0.37M parameters" in table  # the quarter-width layer: 2*192^2 + 2*768*192
    for name in ("adamw-foreach", "adamw", "muon", "soap"):
        assert f"\n{name} " in table
    assert out.rstrip().splitlines()[-2] == "parts failed: overhead"


def test_a_part_that_can_stop_early_gets_its_share_of_the_budget_left(monkeypatch, tmp_path) -> None:
    """Budget 100 s on a stopped clock, parts step-time then memory: step-time is handed 100 x 0.3 / (0.3 + 0.28) =
    51 s (whole seconds, down), and memory all that is left when it starts (its share of the parts still to run is
    1): 100 s, none having passed."""
    handed: dict[str, str] = {}
    monkeypatch.setattr(deadline, "time", SimpleNamespace(monotonic=lambda: 0.0))

    def record(name: str):
        def main(argv: list[str]) -> None:
            handed[name] = argv[argv.index("--budget-s") + 1]

        return main

    monkeypatch.setattr(gpu_suite.optim_step, "main", record("step-time"))
    monkeypatch.setattr(gpu_suite.lm_throughput, "main", record("memory"))
    argv = ["--device", "cpu", "--tiny", "--data-dir", str(tmp_path), "--part", "step-time", "--part", "memory"]
    assert gpu_suite.main([*argv, "--budget-s", "100"]) == 0
    assert handed == {"step-time": str(int(100 * 0.3 / 0.58)), "memory": "100"}

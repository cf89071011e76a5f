"""benchmarks/optim_step.py: one-line errors with exit 2, the --quick shapes, and independent implementations that are
not installed named in the output rather than left out."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from benchmarks import deadline, optim_step
from structbench.optim import cost_profile
from structbench.tasks.vision.resnet import CifarResNet


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    """--quick sets torch's threads to 1; the tests after these keep their own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--steps", "two"],
        ["--warmup", "-1"],
        ["--layers", "0"],
        ["--threads", "0"],
        ["--optim", "adamw", "--optim", "no-such-optimizer"],
        ["--shapes", "vgg"],
        ["--device", "tpu"],
        ["--device", "cuda:99"],
        ["--no-such-flag"],
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        optim_step.main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_unknown_optimizer_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        optim_step.parse(["--optim", "fismoo"])
    err = capsys.readouterr().err
    assert err.startswith("error: unknown optimizer fismoo; registered: ") and " fismo," in err


def test_resnet18_shapes_are_the_models_matrix_weights() -> None:
    """Full widths: the shapes of the CIFAR ResNet-18's conv and linear weights (the model itself is the oracle);
    divisor 4: every channel count / 4."""
    for divisor in (1, 4):
        model = CifarResNet(18, in_channels=3, num_classes=10, width_div=divisor)
        weights = sorted(tuple(p.shape) for p in model.parameters() if p.dim() >= 2)
        assert sorted(optim_step.resnet18(1, divisor)) == weights


def test_gpt2_quick_shapes() -> None:
    """One layer at width 768 / 4 = 192: attention 192x192 twice, MLP 768x192 and 192x768 (2*192^2 + 2*768*192)."""
    assert optim_step.gpt2_small(1, 4) == [(192, 192), (192, 192), (768, 192), (192, 768)]
    assert sum(torch.Size(s).numel() for s in optim_step.gpt2_small(12, 1)) == 12 * (2 * 768**2 + 2 * 3072 * 768)


def rows(text: str) -> dict[str, str]:
    """Table rows of the output by optimizer name (the first word)."""
    return {line.split()[0]: line for line in text.splitlines() if line and not line.startswith(("#", "device"))}


def test_missing_independent_implementations_are_listed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pytorch_optimizer", None)  # `import pytorch_optimizer` raises ImportError
    monkeypatch.delattr(torch.optim, "Muon", raising=False)
    optim_step.main(["--quick", "--shapes", "gpt2-small", "--optim", "sgd", "--optim", "soap", "--optim", "muon",
                     "--steps", "1", "--warmup", "0"])  # fmt: skip
    out = capsys.readouterr().out
    assert "## gpt2-small: 4 tensors, 0.37M parameters" in out  # 2*192^2 + 2*768*192 = 368,640
    table = rows(out)
    assert "pytorch_optimizer.SOAP not installed" in table["soap"]
    assert "torch.optim.Muon not installed" in table["muon"]
    assert "installed" not in table["sgd"]  # no independent implementation to name


def test_installed_independent_implementation_is_timed_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    optim_step.main(["--quick", "--shapes", "gpt2-small", "--optim", "galore", "--steps", "2", "--warmup", "0"])
    line = rows(capsys.readouterr().out)["galore"]
    assert "ours/pytorch_optimizer.GaLore = " in line and "by median" in line and "not installed" not in line


def test_amortised_time_spreads_the_refresh_phases_over_the_default_interval() -> None:
    """Cycles of 3 steps whose phase 2 refreshes: steady is the median of phases 0 and 1 (1 ms), the refresh step
    the median of phase 2 (6 ms, from 5 and 7), and over a 10-step interval the mean step is 1 + (6 - 1) / 10."""
    times = [1.0, 1.0, 5.0, 1.0, 1.0, 7.0]
    found = optim_step.amortised_times(times, 3, {2}, 10)
    assert (found.steady, found.refresh, found.amortised) == (1.0, 6.0, 1.5)
    flat = optim_step.amortised_times([2.0, 4.0, 3.0], 1, set(), 1)
    assert (flat.steady, flat.refresh, flat.amortised) == (3.0, None, 3.0)


@pytest.mark.parametrize("name", ["soap", "galore", "shampoo"])
def test_the_timed_run_refreshes_at_the_phases_the_profile_names(name: str) -> None:
    """A run started as `time_refresh_cycles` starts it (shortened interval, one step, one cycle, whole warm-up
    cycles) refreshes exactly at the steps whose index mod the cycle is in the profile's refresh phases: counted
    here step by step (a refresh step is the one that runs more kernels than the cheapest)."""
    shapes = optim_step.gpt2_small(1, 12)
    counted = cost_profile.profile(name, shapes)
    _, hparams = cost_profile.shortened_hparams(name, {})
    optimizer = optim_step.ours(name, optim_step.make_params(shapes, torch.device("cpu"), False), hparams)
    for _ in range(1 + 2 * counted.cycle):
        optimizer.step()
    launches = [cost_profile.count(optimizer.step, optimizer).launches for _ in range(2 * counted.cycle)]
    refreshing = {i % counted.cycle for i, n in enumerate(launches) if n > min(launches)}
    assert refreshing == counted.refresh_phases() and len(refreshing) == 1


class TickingClock:
    """time.monotonic advancing one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_a_budget_stops_the_loop_and_names_what_it_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Budget 2 s on a clock that reads 1 s later each time: set at 1 (deadline 3), the first check reads 2 (sgd runs),
    the second 3 (the budget is spent: adamw and dasgo are named, not measured)."""
    monkeypatch.setattr(deadline, "time", TickingClock())
    optim_step.main(["--quick", "--shapes", "gpt2-small", "--optim", "sgd", "--optim", "adamw", "--optim", "dasgo",
                     "--steps", "1", "--warmup", "0", "--budget-s", "2"])  # fmt: skip
    out = capsys.readouterr().out
    table = rows(out)
    assert "sgd" in table and "adamw" not in table and "dasgo" not in table
    assert "cut at the time budget: not measured: adamw (gpt2-small), dasgo (gpt2-small)" in out

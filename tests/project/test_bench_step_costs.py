"""benchmarks/step_costs.py: one-line errors with exit 2, and a row per optimizer with the profile's counts."""

from __future__ import annotations

import pytest

from benchmarks import step_costs
from structbench.optim import cost_profile


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--optim", "nope"], "unknown optimizer(s) nope"),
        (["--divisor", "5"], "does not divide"),
        (["--layers", "0"], "--layers"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        step_costs.main(arguments)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error:") and message in err


def test_each_row_shows_the_profiles_launches_and_host_reads(capsys):
    step_costs.main(["--layers", "1", "--divisor", "8", "--optim", "sgd", "--optim", "asgo"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["sgd", "asgo"]
    asgo = cost_profile.profile("asgo", step_costs.shapes(1, 8))
    launches = f"{asgo.steady.launches}/{asgo.refresh.launches}/{asgo.amortised(lambda cost: cost.launches):.0f}"
    assert rows[1][2] == launches
    # ASGO's four matrices share one preconditioner size (96): one stack, one deferred root check read per step,
    # and no host read
    assert (rows[1][4], rows[1][6]) == ("none", "1")

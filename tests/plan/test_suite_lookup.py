"""Suite lookup: the user's ./suites/ and $STRUCTBENCH_SUITES before the built-in suites, the `cifar` alias, and
`data status` naming the file to fetch for a missing dataset."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from structbench.data import ChecksumWarning, dataset_status
from structbench.plan import spec, suite_file, suite_lookup
from tests.support.datasets import write_cifar10
from tests.support.store import read_runs

TINY_QUADRATIC = 'description = "{label}"\ntask = "quadratic"\noptims = ["sgd"]\nseeds = [0]\n[budget]\nsteps = 2\n'


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory as the current directory, with an empty ./suites/ and no $STRUCTBENCH_SUITES."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(suite_lookup.SUITES_ENV, raising=False)
    (tmp_path / "suites").mkdir()
    return tmp_path


def write(directory: Path, name: str, label: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(TINY_QUADRATIC.format(label=label))
    return path


def test_cifar_runs_the_cifar10_suite_on_tiny_files_in_the_cifar10_pickle_layout(cli, tmp_path):
    data = tmp_path / "D"
    write_cifar10(data, per_batch=4)
    out = tmp_path / "results"
    # ResNet-18 at 1/32 of its width: FISMO factorises each conv filter's (in*kh*kw)-sided Fisher factor every step,
    # 4608 x 4608 at full width, which takes minutes per step on a CPU.
    # the files' md5s differ from the published ones: the reader warns and reads them (its checksum policy)
    with pytest.warns(ChecksumWarning, match="differs from the published"):
        result = cli(
            "run", "--suite", "cifar", "--optim", "fismo", "--data-dir", data, "--steps", "2", "--out", out,
            "--set", "task_args.model_options={width_div=32}",
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "is an alias of 'cifar10'" in result.stdout
    run = read_runs(out).iloc[0]
    assert (run["suite"], run["optim"], run["status"], run["steps"]) == ("cifar10", "fismo", "ok", 2)
    assert run["data_source"].endswith(str(data / "cifar-10-batches-py"))
    # the cifar10 suite's own model, at the narrowed width
    assert '"model": "resnet18"' in run["spec"]


def test_list_suites_shows_the_alias_and_where_each_suite_comes_from(cli, project, monkeypatch):
    write(project / "suites", "quadratic", "a project's quadratic")
    write(project / "elsewhere", "mine", "from the environment")
    monkeypatch.setenv(suite_lookup.SUITES_ENV, str(project / "elsewhere"))
    result = cli("list", "suites")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 3}
    assert "alias of cifar10" in rows["cifar"]
    assert "built-in" in rows["cifar10"] and "built-in" in rows["cifar100"]
    assert "./suites:" in rows["quadratic"] and "hides the built-in" in result.stdout
    assert f"${suite_lookup.SUITES_ENV}:" in rows["mine"]


def test_project_suites_come_first_then_the_environment_directories_in_order_then_the_built_in_ones(
    project, tmp_path, monkeypatch
):
    first, second = tmp_path / "env1", tmp_path / "env2"
    write(second, "both", "second")
    write(second, "only-second", "second")
    write(first, "both", "first")
    monkeypatch.setenv(suite_lookup.SUITES_ENV, f"{first}{__import__('os').pathsep}{second}")
    assert suite_file.read_suite_file("both")[2]["description"] == "first"
    assert suite_file.read_suite_file("only-second")[2]["description"] == "second"
    write(project / "suites", "both", "project")
    assert suite_file.read_suite_file("both")[2]["description"] == "project"
    builtin = suite_file.read_suite_file("quadratic")
    assert builtin[1] == Path(spec.__file__).parents[1] / "suites" / "quadratic.toml"


def test_a_project_suite_hides_the_built_in_one_and_run_says_so(cli, project):
    write(project / "suites", "quadratic", "mine")
    out = project / "results"
    result = cli("run", "--suite", "quadratic", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert "takes precedence over the built-in suite" in " ".join(result.stdout.split())
    runs = read_runs(out)
    # the project's file ran: one optimizer, one seed, two steps (the built-in suite has two optimizers, three seeds)
    assert (len(runs), runs["optim"].tolist(), int(runs["steps"].iloc[0])) == (1, ["sgd"], 2)


def test_an_unknown_suite_name_suggests_the_closest_one_of_the_project(cli, project):
    write(project / "suites", "my-quadratic", "mine")
    result = cli("run", "--suite", "my-quadratc", "--dry-run", "--out", project / "results")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert "Did you mean 'my-quadratic'?" in result.stderr


def test_report_suite_cifar_selects_the_cifar10_runs():
    from structbench.report import suite_files

    assert suite_files.expand("cifar") == ["cifar10"]
    assert suite_files.expand("smoke") == ["smoke-quadratic", "smoke-mlp"]


def test_data_status_names_the_file_to_fetch_and_the_reader_finds_it_there(tmp_path, monkeypatch, cli):
    root = tmp_path / "root"
    root.mkdir()
    rows = {row["name"]: row for row in dataset_status(root)}
    assert rows["cifar10"]["fetch"] == (
        f"fetch https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and put it at {root}/cifar-10-python.tar.gz",
    )
    assert len(rows["mnist"]["fetch"]) == 4 and all(str(root / "mnist") in line for line in rows["mnist"]["fetch"])
    # put a (tiny) archive exactly where the line says: the dataset is then present, read from there
    write_cifar10(tmp_path / "unpacked")
    destination = Path(rows["cifar10"]["fetch"][0].rsplit(" and put it at ", 1)[1])
    with tarfile.open(destination, "w:gz") as tar:
        tar.add(tmp_path / "unpacked" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    shutil.rmtree(tmp_path / "unpacked")
    after = {row["name"]: row for row in dataset_status(root, verify=False)}
    assert after["cifar10"]["present"] and after["cifar10"]["where"] == destination and after["cifar10"]["fetch"] == ()
    result = cli("data", "status", "--data-dir", root)
    assert result.exit_code == 0 and "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz" in result.stdout

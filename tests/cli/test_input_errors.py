"""Every bad input to the command line is one `error: ...` line on stderr, exit code 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import usage_error
from tests.support.store import read_runs

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A results directory under a directory that does not exist yet either."""
    return tmp_path / "new" / "results"


def write_suite(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- seeds ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [INT64_MAX + 1, INT64_MIN - 1, 2**64])
def test_a_seed_outside_int64_on_the_command_line_is_refused_before_any_run(cli, out, seed):
    line = usage_error(
        cli("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--seed", seed, "--out", out), out
    )
    assert f"seed {seed} is out of range" in line
    assert "[-2^63, 2^63 - 1]" in line


def test_a_seed_outside_int64_in_set_seeds_is_refused(cli, out):
    line = usage_error(
        cli("run", "--suite", "quadratic", "--dry-run", "--set", f"seeds=[0,{2**63}]", "--out", out), out
    )
    assert f"seed {2**63} is out of range" in line


def test_a_seed_outside_int64_in_a_suite_file_is_refused(cli, tmp_path, out):
    suite = write_suite(tmp_path, "big-seed.toml", f'task = "quadratic"\nseeds = [{2**63}]\n')
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert f"seed {2**63} is out of range" in line


def test_the_int64_extremes_are_seeds_torch_takes_and_the_store_keeps(cli, tmp_path):
    result = cli(
        "run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--quiet",
        "--seed", INT64_MAX, "--seed", INT64_MIN, "--out", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = read_runs(tmp_path)
    assert sorted(runs.seed.tolist()) == [INT64_MIN, INT64_MAX]
    assert set(runs.status) == {"ok"}


# ---- suite files: types, structure, cycles, encoding ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("task = 3", "task"),
        ('task = "quadratic"\noptims = "adamw"', "optims"),
        ('task = "quadratic"\noptims = []', "optims"),
        ('task = "quadratic"\nseeds = "x"', "seeds"),
        ('task = "quadratic"\nseeds = [true]', "seeds"),
        ('task = "quadratic"\nbudget = 5', "budget"),
        ('task = "quadratic"\ndescription = []', "description"),
        ('include = "x"', "include"),
        ("experiment = 3", "experiment"),
        ('task = "quadratic"\ntask_args = [1]', "task_args"),
        ('task = "quadratic"\nhparams = {sgd = 3}', "hparams"),
        ('task = "quadratic"\nsweep = {sgd = 3}', "sweep"),
        ('task = "quadratic"\nchecks = "x"', "checks"),
        ('task = "quadratic"\ntarget = 1', "target"),
        ('task = "quadratic"\nschedule = true', "schedule"),
        ('task = "quadratic"\nresources = 1', "resources"),
    ],
)
def test_a_wrongly_typed_suite_field_names_the_file_and_the_field(cli, tmp_path, out, text, field):
    suite = write_suite(tmp_path, "typed.toml", text + "\n")
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert f"suite file {suite}: field '{field}' must be" in line


def test_a_wrongly_typed_hyperparameter_in_a_suite_file_names_it(cli, tmp_path, out):
    suite = write_suite(tmp_path, "hp.toml", 'task = "quadratic"\n[hparams.sgd]\nmomentum = "high"\n')
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert "hparams.sgd.momentum must be of type float" in line


@pytest.mark.parametrize(
    ("text", "named"),
    [("", "got none"), ('task = "quadratic"\ninclude = ["quadratic"]', "got task and include")],
)
def test_a_suite_names_exactly_one_of_task_experiment_and_include(cli, tmp_path, out, text, named):
    suite = write_suite(tmp_path, "kinds.toml", text + "\n")
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert f"suite file {suite} must name exactly one of task, experiment and include, {named}" in line


def test_a_suite_that_includes_itself_names_the_cycle(cli, tmp_path, out):
    suite = tmp_path / "self.toml"
    suite.write_text(f'include = ["{suite}"]\n')
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert line == f"error: suite file {suite} includes itself: {suite.resolve()} -> {suite.resolve()}."


def test_an_include_cycle_through_two_files_names_both(cli, tmp_path, out):
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(f'include = ["{second}"]\n')
    second.write_text(f'include = ["quadratic", "{first}"]\n')
    line = usage_error(cli("run", "--suite", first, "--dry-run", "--out", out), out)
    cycle = " -> ".join(str(p.resolve()) for p in (first, second, first))
    assert line == f"error: suite file {first} includes itself: {cycle}."


def test_a_binary_suite_file_is_refused_by_name(cli, tmp_path, out):
    suite = tmp_path / "binary.toml"
    suite.write_bytes(b'task = "quadratic"\n\xff\xfe\x00\x81')
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert line == f"error: suite file {suite} is not UTF-8 text (byte 19 cannot be decoded)."


@pytest.mark.parametrize("text", ['task = "quadratic', "task = quadratic", "[budget\nsteps = 3", "a = 1\na = 2"])
def test_a_suite_file_that_is_not_toml_is_refused_by_name(cli, tmp_path, out, text):
    suite = write_suite(tmp_path, "broken.toml", text + "\n")
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert line.startswith(f"error: suite file {suite} is not valid TOML: ")


def test_a_suite_file_nested_beyond_the_parser_is_refused_by_name(cli, tmp_path, out):
    suite = write_suite(tmp_path, "deep.toml", "x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert f"suite file {suite} nests its tables or arrays too deeply" in line


def test_a_line_break_in_a_suite_file_name_stays_on_the_one_error_line(cli, tmp_path, out):
    suite = write_suite(tmp_path, "two\nlines.toml", "task = 3\n")
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert f"suite file {tmp_path}/two lines.toml: field 'task' must be a string" in line


def test_a_directory_named_like_a_suite_file_is_named_as_a_directory(cli, tmp_path, out):
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    line = usage_error(cli("run", "--suite", folder, "--dry-run", "--out", out), out)
    assert line == f"error: suite file {folder} is a directory; give the path of a .toml file in it."


# ---- sizes -----------------------------------------------------------------------------------------------------


def test_a_quadratic_too_large_for_memory_is_refused_before_anything_is_built(cli, out):
    args = ("--set", "task_args.m=10000000", "--set", "task_args.n=10000000", "--out", out)
    line = usage_error(cli("run", "--suite", "quadratic", "--dry-run", *args), out)
    # A and B alone are 2 x (10^7)^2 float64 numbers: 1.6e15 bytes, far beyond any machine running this test.
    assert "m=10000000, n=10000000" in line and "GiB of memory" in line


def test_a_real_run_of_a_quadratic_too_large_for_memory_is_refused(cli, out):
    args = ("--set", "task_args.m=1000000", "--set", "task_args.n=1000000", "--out", out)
    line = usage_error(cli("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", *args), out)
    assert "m=1000000, n=1000000" in line


def test_a_synthetic_classification_too_large_for_memory_is_refused(cli, out):
    line = usage_error(
        cli("run", "--suite", "smoke-mlp", "--dry-run", "--set", "task_args.dim=10000000000", "--out", out), out
    )
    assert "dim 10000000000" in line and "GiB of memory" in line


def test_a_language_model_too_large_for_memory_is_refused(cli, tmp_path, out):
    # d_model 2^20 gives each block's q/k/v/o projections alone 4 x 2^40 parameters: 16 TiB in float32.
    (tmp_path / "data").mkdir()
    sizes = ("--set", "task_args.d_model=1048576", "--data-dir", tmp_path / "data", "--out", out)
    line = usage_error(cli("run", "--suite", "shakespeare-char", "--dry-run", *sizes), out)
    assert "language model 'gpt-tiny': its" in line and "float32 parameters need at least" in line


def test_an_image_model_too_large_for_memory_is_refused(cli, out):
    # The digits MLP with hidden width 10^6 has a 10^6 x 10^6 middle layer: 10^12 float32 parameters, 4 TB.
    line = usage_error(
        cli("run", "--suite", "digits", "--dry-run", "--set", "task_args.model_options={hidden=1000000}", "--out", out),
        out,
    )
    assert "model 'mlp' with options {'hidden': 1000000}: its" in line and "GiB of memory" in line


def test_a_batch_larger_than_the_training_split_with_drop_last_is_refused(cli, out):
    # scikit-learn's digits have 1,797 images in all, so 10^6 per batch leaves no full batch to train on.
    batch = ("--set", "budget.batch_size=1000000", "--set", "task_args.drop_last=true")
    line = usage_error(cli("run", "--suite", "digits", "--optim", "sgd", "--steps", "2", *batch, "--out", out), out)
    assert "batch size 1000000 exceeds the" in line and "with drop_last = true" in line


def test_image_model_options_no_model_could_build_are_refused(cli, out):
    line = usage_error(
        cli("run", "--suite", "digits", "--dry-run", "--set", "task_args.model_options={hidden=-1}", "--out", out), out
    )
    assert "model 'mlp' cannot take task_args.model_options {'hidden': -1}" in line


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("task_args.m=0", "quadratic shape must be positive, got m=0"),
        ("task_args.noise_rank=17", "noise_rank must be in [0, min(m, n)=16], got 17"),
        ("task_args.cond_left=0.5", "task_args.cond_left is a condition number: it must be >= 1, got 0.5"),
        ("task_args.spectrum=flat", "unknown task_args.spectrum 'flat'"),
        ("task_args.noise_scale=-1.0", "task_args.noise_scale must be >= 0, got -1.0"),
        ("target.metric=accuracy", "target.metric 'accuracy' is not reported by this task; use 'rel_subopt' or 'loss'"),
    ],
)
def test_task_arguments_a_run_would_reject_are_refused_before_the_store_exists(cli, out, setting, message):
    line = usage_error(
        cli("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--set", setting, "--out", out), out
    )
    assert message in line


def test_synthetic_classification_sizes_must_be_positive(cli, out):
    line = usage_error(
        cli("run", "--suite", "smoke-mlp", "--steps", "2", "--set", "task_args.hidden=0", "--out", out), out
    )
    assert "task_args.hidden must be >= 1, got 0" in line


def test_a_sweep_product_beyond_ten_thousand_settings_is_refused(cli, out):
    sweeps = ("--set", "hparams.sgd.lr=log(1e-4,1,1000)", "--set", "hparams.sgd.momentum=lin(0,0.9,1000)")
    line = usage_error(cli("run", "--suite", "quadratic", "--optim", "sgd", "--dry-run", *sweeps, "--out", out), out)
    assert "form 1000000 settings, more than 10000" in line


def test_a_search_beyond_ten_thousand_points_is_refused(cli, out):
    line = usage_error(
        cli("run", "--suite", "digits", "--sweep", "--search", f"halton:{10**20}", "--dry-run", "--out", out), out
    )
    assert "1 <= N <= 10000" in line


# ---- command-line syntax (click) --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "--suite", "quadratic", "--seed", "abc"), "Invalid value for '--seed'"),
        (("run", "--suite", "quadratic", "--steps", "0"), "Invalid value for '--steps'"),
        (("run", "--suite", "quadratic", "--bogus"), "No such option: --bogus"),
        (("run", "--dry-run"), "Missing option '--suite'"),
        (("run", "--suite"), "Option '--suite' requires an argument"),
        (("run", "--suite", "quadratic", "--set"), "Option '--set' requires an argument"),
        (("nosuchcommand",), "No such command 'nosuchcommand'"),
        (("data", "nosuchcommand"), "No such command 'nosuchcommand'"),
    ],
)
def test_command_line_syntax_errors_are_one_line(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    line = usage_error(cli(*args), tmp_path / "results")
    assert message in line
    assert list(tmp_path.iterdir()) == []


def test_help_still_prints_the_options(cli):
    result = cli("run", "--help")
    assert result.exit_code == 0
    assert "--suite" in result.stdout and "--data-dir" in result.stdout


# ---- paths --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--out", ""), "--out"),
        (("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--data-dir", ""), "--data-dir"),
        (("report", "--out", ""), "--out"),
        (("report", "--to", ""), "--to"),
        (("status", "--out", ""), "--out"),
        (("data", "status", "--data-dir", ""), "--data-dir"),
    ],
)
def test_an_empty_path_is_refused_and_nothing_lands_in_the_current_directory(cli, tmp_path, monkeypatch, args, option):
    monkeypatch.chdir(tmp_path)
    line = usage_error(cli(*args), tmp_path / "never")
    assert f"Invalid value for '{option}': an empty path" in line
    assert list(tmp_path.iterdir()) == []


MARKUP = "a[/]b[bold]c"


def test_markup_in_the_results_path_is_printed_as_text(cli, tmp_path):
    out = tmp_path / MARKUP
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--seed", "0", "--out", out)
    assert result.exit_code == 0, result.output
    assert str(out / "runs") in result.stderr.replace("\n", "")
    assert len(read_runs(out)) == 1
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    assert cli("status", "--out", out).exit_code == 0


def test_markup_in_a_suite_name_is_printed_as_text_by_run_and_report(cli, tmp_path):
    suite = write_suite(tmp_path, "x[bold]y[red].toml", 'task = "quadratic"\noptims = ["sgd"]\n')
    out = tmp_path / "results"
    result = cli("run", "--suite", suite, "--steps", "2", "--out", out)
    assert result.exit_code == 0, result.output
    assert "x[bold]y[red]" in result.stdout
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    assert "x[bold]y[red]" in report.stdout


def test_markup_in_the_data_root_is_printed_as_text(cli, tmp_path):
    root = tmp_path / MARKUP
    root.mkdir(parents=True)  # the markup holds a "/": a directory within a directory
    result = cli("data", "status", "--data-dir", root)
    assert result.exit_code == 0, result.output
    assert MARKUP in result.stdout.replace("\n", "")


# ---- optimizer hyperparameters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("optim", "setting", "named"),
    [
        ("sgd", "hparams.sgd.momentum=-1", "momentum=-1.0"),
        ("sgd", "hparams.sgd.momentum=1.0", "momentum=1.0"),
        ("fismo", "hparams.fismo.mu=0", "mu=0.0"),
        ("adamw", "hparams.adamw.beta2=1.5", "beta2=1.5"),
        ("adamw", "hparams.adamw.eps=-1e-8", "eps=-1e-08"),
        ("muon", "hparams.muon.weight_decay=-0.1", "weight_decay=-0.1"),
        ("galore", "hparams.galore.rank=0", "rank=0"),
        ("asgo", "hparams.asgo.adamw_beta1=1.5", "adamw_beta1=1.5"),
        ("shampoo", "hparams.shampoo.sgd_momentum=-0.5", "sgd_momentum=-0.5"),
    ],
)
def test_an_out_of_range_hyperparameter_is_refused_before_the_first_run(cli, out, optim, setting, named):
    line = usage_error(
        cli("run", "--suite", "quadratic", "--optim", optim, "--steps", "2", "--set", setting, "--out", out), out
    )
    assert line.startswith(f"error: optimizer '{optim}' rejects {named}: ")


def test_one_bad_setting_of_a_sweep_stops_the_whole_grid(cli, out):
    sweep = "hparams.sgd.momentum=[0.5,0.9,1.5]"
    line = usage_error(
        cli("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--set", sweep, "--out", out), out
    )
    assert "rejects momentum=1.5" in line


# ---- NaN, infinity and integers beyond int64 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("task_args.noise_scale=nan", "task_args.noise_scale must be a finite number, got nan"),
        ("task_args.init_scale=inf", "task_args.init_scale must be a finite number, got inf"),
        ("budget.grad_clip=nan", "budget.grad_clip must be a finite number"),
        ("budget.max_time_s=inf", "budget.max_time_s must be a finite number"),
        ("schedule.gamma=inf", "schedule.gamma must be a finite number, got inf"),
        ("schedule.min_lr_ratio=nan", "schedule.min_lr_ratio must be a finite number, got nan"),
        ("hparams.sgd.weight_decay=nan", "weight_decay must be a finite number >= 0, got nan"),
        ("hparams.sgd.lr=nan", "lr must be a positive finite number, got nan"),
        (f"budget.log_every={2**63}", f"budget.log_every must be a 64-bit integer (at most {INT64_MAX} in size)"),
        (f"hparams.galore.svd_seed={2**63}", f"svd_seed must be a 64-bit integer, got {2**63}"),
    ],
)
def test_non_finite_and_oversized_numbers_are_refused(cli, out, setting, message):
    optim = setting.split(".")[1] if setting.startswith("hparams.") else "sgd"
    line = usage_error(
        cli("run", "--suite", "quadratic", "--optim", optim, "--steps", "2", "--set", setting, "--out", out), out
    )
    assert message in line


def test_an_infinite_target_value_is_refused_and_nan_means_no_fixed_value(cli, tmp_path, out):
    target = ("--set", "target.metric=loss", "--set", "target.from_baseline=adamw")
    line = usage_error(
        cli("run", "--suite", "quadratic", "--dry-run", *target, "--set", "target.value=inf", "--out", out), out
    )
    assert "target.value must be a finite number, got inf" in line
    accepted = cli("run", "--suite", "quadratic", "--dry-run", *target, "--set", "target.value=nan", "--out", out)
    assert accepted.exit_code == 0, accepted.output


def test_a_key_below_a_single_value_says_so(cli, out):
    line = usage_error(cli("run", "--suite", "quadratic", "--dry-run", "--set", "budget.steps.x=3", "--out", out), out)
    assert "unknown key 'budget.steps.x': budget.steps is a single value, not a table" in line


# ---- numerical experiments ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suite", "setting", "message"),
    [
        ("quant-error", "task_args.order=0", "experiment 'quant-error': quant-error needs order >= 1"),
        ("quant-error", "task_args.bits=[5]", "unknown bits or codebooks [5]"),
        ("orth-error", "task_args.rows=1", "orth-error needs 2 <= rows <= cols"),
        ("orth-error", "task_args.kappas=[0.5]", "kappas are condition numbers, each >= 1; got [0.5]"),
        ("update-cond", "task_args.steps=0", "steps and log_every must be >= 1; got 0, 20"),
        ("update-cond", "task_args.trace=tower", "unknown trace 'tower'"),
    ],
)
def test_experiment_arguments_no_run_could_use_are_refused_before_the_store_exists(cli, out, suite, setting, message):
    line = usage_error(cli("run", "--suite", suite, "--set", setting, "--out", out), out)
    assert message in line


def test_an_experiment_too_large_for_memory_is_refused(cli, out):
    # U and A of order 10^8 in float64: 2 x 8 x 10^16 bytes.
    line = usage_error(cli("run", "--suite", "quant-error", "--set", "task_args.order=100000000", "--out", out), out)
    assert "quant-error of order 100000000: U and A in float64 need at least" in line


def test_update_cond_trace_arguments_in_a_suite_file_are_checked_by_the_trace_task(cli, tmp_path, out):
    unknown = write_suite(
        tmp_path, "unknown.toml", 'experiment = "update-cond"\n[task_args]\ntrace_args = {nope = 1}\n'
    )
    line = usage_error(cli("run", "--suite", unknown, "--out", out), out)
    assert "trace_args has no field(s) ['nope']" in line
    small = write_suite(tmp_path, "small.toml", 'experiment = "update-cond"\n[task_args]\ntrace_args = {dim = 4}\n')
    assert cli("run", "--suite", small, "--dry-run", "--out", out).exit_code == 0

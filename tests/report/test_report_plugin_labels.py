"""Issue 35, item 2: a store holding a plugin optimizer's runs beside a built-in one's stays readable in every report
format: the plugin's identity (how it was found, module, class, sha256) never enters a setting label (it stays in the
runs appendix's spec), an absent key is never shown as `None`, each optimizer's numbers appear, and the terminal's
table splitter never prints a part without its numbers."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from rich.console import Console

from structbench.report.views import tables, terminal
from structbench.store import write
from tests.optim.test_plugins import doc_command, site  # noqa: F401  (site: the doc's package, a pytest fixture)
from tests.support.store import adamw_evals, hand_spec, read_runs, write_run

PLUGIN = "mylion.plain:Lion"
IDENTITY_WORDS = ("optim_plugin", "sha256", "None")


@pytest.fixture
def plugin_store(cli, site, tmp_path):  # noqa: F811
    """docs/plugins.md's recipe (the plugin class and adamw on the quadratic suite), two seeds each."""
    out = tmp_path / "results"
    result = cli(*doc_command(PLUGIN, "run"), "--steps", "10", "--seed", "0", "--seed", "1", "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    runs = read_runs(out)
    assert set(runs["optim"]) == {PLUGIN, "adamw"} and set(runs["status"]) == {"ok"}
    return out


def median_losses(out) -> dict[str, str]:
    """Each optimizer's median final evaluation loss over its seeds, as a report prints a number (4 digits)."""
    runs = read_runs(out)
    return {
        optim: f"{statistics.median(group['final_eval_loss']):.4g}" for optim, group in runs.groupby("optim")
    }


def plugin_sha256(out) -> str:
    runs = read_runs(out)
    return json.loads(runs[runs["optim"] == PLUGIN].iloc[0]["spec"])["optim_plugin"]["sha256"]


def test_terminal_report_labels_hold_no_plugin_identity_and_show_every_number(cli, plugin_store):
    result = cli("report", "--out", plugin_store)
    assert result.exit_code == 0, result.output
    assert not [word for word in IDENTITY_WORDS if word in result.stdout]
    for optim, loss in median_losses(plugin_store).items():
        assert any(optim in line and loss in line for line in result.stdout.splitlines()), (optim, loss)


def test_markdown_and_html_labels_hold_no_plugin_identity_which_the_runs_appendix_keeps(cli, plugin_store, tmp_path):
    result = cli("report", "--out", plugin_store, "--format", "all", "--to", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    specs = {
        "md": re.findall(r"^```json\n(.*?)^```", markdown, flags=re.S | re.M),
        "html": re.findall(r"<pre>(.*?)</pre>", page, flags=re.S),
    }
    outside = {
        "md": re.sub(r"^```json\n.*?^```", "", markdown, flags=re.S | re.M),
        "html": re.sub(r"<pre>.*?</pre>|data:image/png;base64,[^\"']*", "", page, flags=re.S),
    }
    for form in ("md", "html"):
        assert not [word for word in IDENTITY_WORDS if word in outside[form]], form
        assert sum(plugin_sha256(plugin_store) in spec for spec in specs[form]) == 1, form
        for optim, loss in median_losses(plugin_store).items():
            assert loss in outside[form] and optim in outside[form], (form, optim, loss)


def test_a_label_wider_than_the_terminal_leaves_every_part_of_a_split_table_its_numbers():
    columns = [tables.Column("setting", left=True)]
    columns += [tables.Column(f"metric {i}", group="quality" if i < 3 else "cost") for i in range(6)]
    numbers = [f"{1.2345 + i:.4f}" for i in range(6)]
    label = "adamw " + ", ".join(f"task_args.option_{i}=value_{i}" for i in range(6))
    assert len(label) > 150
    table = tables.Table("final", columns, [[tables.Cell(label), *(tables.Cell(n) for n in numbers)]])
    console = Console(width=80, record=True, color_system=None)
    parts = terminal.rich_tables(table, console.width)
    for part in parts:
        console.print(part)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert all(number in text for number in numbers)
    assert all(len(part.columns) > 1 for part in parts)
    for part in parts:
        one = Console(width=80, record=True, color_system=None)
        one.print(part)
        shown = one.export_text()
        assert any(number in shown for number in numbers), shown


def test_a_setting_some_runs_lack_is_left_out_of_their_label_never_shown_as_none(cli, tmp_path):
    """adamw run on the full evaluation split (a spec written before task_args.eval_examples existed) and on a
    256-example subset: two settings, labelled "adamw" and "adamw task_args.eval_examples=256"."""
    out = tmp_path / "results"
    write.prepare(out)
    for run_id, extra in (("full", {}), ("subset", {"eval_examples": 256})):
        spec = hand_spec(suite="hand", task="t", steps=20, target=None, optim="adamw", hparams={"lr": 0.1}, seed=0)
        spec["task_args"] = {**spec.get("task_args", {}), **extra}
        write_run(out, run_id, "adamw", 0, adamw_evals(0), target=None, spec=json.dumps(spec))
    result = cli("report", "--out", out, "--format", "md", "--to", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    rows = [line for line in markdown.splitlines() if line.startswith("| [adamw")]
    labels = {re.match(r"\| \[([^\]]*)\]", row).group(1) for row in rows}
    assert labels == {"adamw", "adamw task_args.eval_examples=256"}
    assert "None" not in "".join(rows)

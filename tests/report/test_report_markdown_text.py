"""Issue 35, item 5: report.md reads as plain text. Only what Markdown would read as syntax is escaped, with a
backslash; names such as `rel_subopt`, intervals such as `[0.1, 0.2]` and comparisons such as `<= 0.01` stay as they
are (they used to be HTML references: `rel&#95;subopt`, `&#91;`)."""

from __future__ import annotations

import pytest

from structbench.report.views.markdown import escape
from structbench.store import write
from tests.support.cli import invoke
from tests.support.store import adamw_evals, muon_evals, write_run

METRIC = "rel_subopt"


@pytest.fixture(scope="module")
def report_md(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("plain") / "results"
    write.prepare(out)
    target = {"metric": METRIC, "value": 0.01}
    for seed in range(2):
        for optim, evals in (("adamw", adamw_evals(seed)), ("muon", muon_evals(seed))):
            write_run(out, f"{optim}-{seed}", optim, seed, evals, target=target, eval_metric_name=METRIC)
    result = invoke("report", "--out", out, "--format", "md", "--to", out.parent / "rep")
    assert result.exit_code == 0, result.output
    return (out.parent / "rep" / "report.md").read_text(encoding="utf-8")


def test_report_md_holds_no_html_character_references(report_md):
    assert "&#" not in report_md
    assert f"eval metric <code>{METRIC}</code>" in report_md and f"target: {METRIC} >= 0.01" in report_md
    assert "min–max [" in report_md


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rel_subopt", "rel_subopt"),
        ("min–max [0.5, 0.7] <= 0.01 & 3 > 2", "min–max [0.5, 0.7] <= 0.01 & 3 > 2"),
        ("_e_ *b* `c` a|b ~~s~~ $x$ \\", "\\_e\\_ \\*b\\* \\`c\\` a\\|b \\~\\~s\\~\\~ \\$x\\$ \\\\"),
        ("[click](x) ![i][r] [^1]", "[click\\](x) ![i\\][r] \\[^1]"),
        ("<b> &amp; #1 end ##", "\\<b> \\&amp; #1 end \\##"),
    ],
)
def test_escape_marks_only_markdown_syntax(text, expected):
    assert escape(text) == expected

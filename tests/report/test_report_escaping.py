"""Store text in the Markdown and HTML reports is shown as text: never live HTML, never Markdown syntax.

A store holds whatever its runs and suite files held, so suite, optimizer, task, metric and device names,
hyperparameter values, error messages and run ids here carry HTML tags with script handlers and Markdown
metacharacters. The reports are rendered the way a reader sees them (report.md through a CommonMark renderer
with raw HTML enabled, report.html as it is) and parsed with html.parser: no element or attribute may come from
store text, and each of those strings must appear in the page's text exactly as stored.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from structbench.store import write as store
from tests.support.cli import invoke
from tests.support.store import adamw_evals, muon_evals, write_run

SUITE = "<script>alert(1)</script> *s_uite* | #1 `x`"
OPTIM = "<img src=x onerror=alert(2)>"
SPLIT = "first line\n## injected heading\n<script>alert(10)</script>"
"""A hyperparameter value with line breaks: it must not end a table row or start a block."""
MODES = ("[click](javascript:alert(3)) **b** _e_ ~~s~~ \\& &amp; $x$", "<svg onload=alert(4)>", SPLIT)
TASK = "<iframe src=javascript:alert(5)></iframe>"
METRIC = "<u onmouseover=alert(6)>acc</u>"
DEVICE = "<marquee onstart=alert(7)>gpu</marquee>"
ERROR = "RuntimeError: <script>alert(8)</script>"
RUN_ID = "evil-<u>9"
STORE_TAGS = {"script", "svg", "iframe", "u", "marquee"}
"""Elements that only store text could bring: neither report emits them (the HTML report's own script aside)."""


class Page(HTMLParser):
    """Every element (name and attributes) and the text of a page, character references decoded."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.parts: list[str] = []
        self.headings: list[str] = []
        self._open: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._open.append(tag)
        if re.fullmatch(r"h[1-6]", tag):
            self.headings.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        self.parts.append(data)
        if any(re.fullmatch(r"h[1-6]", t) for t in self._open):
            self.headings[-1] += data

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def named(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.elements if name == tag]

    def ids(self) -> set[str]:
        return {str(attrs["id"]) for _, attrs in self.elements if attrs.get("id") is not None}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("escaping")
    out = root / "results"
    store.prepare(out)
    hostile = {"device_name": DEVICE, "eval_metric_name": METRIC, "task": TASK}
    for seed in range(2):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed), suite=SUITE, **hostile)
        for i, mode in enumerate(MODES):
            hparams = {"lr": 0.1, "mode": mode}
            write_run(
                out, f"{RUN_ID}-{i}-{seed}", OPTIM, seed, muon_evals(seed), suite=SUITE, hparams=hparams, **hostile
            )
    write_run(
        out,
        "evil-error",
        OPTIM,
        2,
        [(0, 0.0, 2.0, 0.1)],
        suite=SUITE,
        status="error",
        hparams={"lr": 0.1, "mode": MODES[1]},
        error=ERROR,
        **hostile,
    )
    result = invoke("report", "--out", out, "--format", "all", "--to", root / "rep")
    assert result.exit_code == 0, result.output
    return root / "rep"


def stored_texts() -> list[str]:
    """The store strings each report must show verbatim."""
    return [SUITE, OPTIM, *MODES, TASK, METRIC, DEVICE, ERROR, RUN_ID]


def check_page(page: Page, own_scripts: int) -> None:
    for name, attrs in page.elements:
        assert name not in STORE_TAGS or (name == "script" and own_scripts), name
        assert not [a for a in attrs if a.startswith("on")], (name, attrs)
        assert not str(attrs.get("href", "")).lower().startswith("javascript"), attrs
        assert not str(attrs.get("src", "")).lower().startswith("javascript"), attrs
    assert len(page.named("script")) == own_scripts
    visible = " ".join(page.text.split())  # as a browser shows it: runs of white space collapse to one space
    for text in stored_texts():
        assert " ".join(text.split()) in visible, text
    # Ids are plain tokens, and every in-page link lands on one.
    ids = page.ids()
    assert all(re.fullmatch(r"[\w-]+", i) for i in ids), ids
    links = {str(a["href"])[1:] for a in page.named("a") if str(a.get("href", "")).startswith("#")}
    assert links and links <= ids, links - ids


def test_markdown_report_shows_store_text_as_text(reports):
    markdown = (reports / "report.md").read_text(encoding="utf-8")
    page = Page(MarkdownIt("commonmark").render(markdown))
    check_page(page, own_scripts=0)
    assert all(str(img["src"]).startswith("figures/") for img in page.named("img"))
    assert {str(img["alt"]) for img in page.named("img")} >= {f"{SUITE}: memory", f"{SUITE}: step time"}
    assert SUITE in page.headings and not any("injected" in h for h in page.headings)
    # Spec JSON sits in fenced code: escaped by the renderer, shown as stored (JSON-quoted).
    assert json.dumps(SPLIT) in page.text


def test_html_report_shows_store_text_as_text(reports):
    page = Page((reports / "report.html").read_text(encoding="utf-8"))
    check_page(page, own_scripts=1)
    assert all(str(img["src"]).startswith("data:image/png;base64,") for img in page.named("img"))
    assert {str(img["alt"]) for img in page.named("img")} >= {f"{SUITE}: memory", f"{SUITE}: step time"}
    assert SUITE in page.headings

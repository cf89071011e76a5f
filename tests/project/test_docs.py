"""The documentation stands on its own.

- The README stays a short entry point (at most 120 lines); the reference lives in docs/.
- Every relative link in README.md and docs/*.md reaches a file of the repository, and a link to a heading
  (`file.md#heading`) reaches a heading of that file (GitHub's anchor rule).
- No file of the project cites notes a reader does not have (file names with section signs, the design and
  spec notes it was built from) and no tracked file names a path of the machine it was written on.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

README_MAX_LINES = 120

CITATION_PATTERNS = (
    # Written in pieces so that this file does not match its own patterns.
    r"\.md" + " §",
    "shared" + "/specs",
    "specs" + "/",
    "DESIGN" + r"\.md",
    "reference-" + "implementations",
    "offline-" + "data",
)
CITATION_SCOPE = ("structbench", "benchmarks", "tests", "docs", "README.md", ".ci", "pyproject.toml")
MACHINE_PATHS = ("/" + "work/",)

FENCED_CODE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INDENTED_CODE = re.compile(r"^(?: {4}|\t).*$", re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def tracked_files() -> list[Path]:
    """The repository's tracked files (what a clone holds), from git."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    return [ROOT / name for name in listing.split("\0") if name and (ROOT / name).is_file()]


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(markdown: str) -> str:
    """The text outside code: fenced blocks, indented blocks and inline code removed."""
    return INLINE_CODE.sub("", INDENTED_CODE.sub("", FENCED_CODE.sub("", markdown)))


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(prose(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


def test_docs_folder_has_an_index_linked_from_the_readme() -> None:
    assert "docs/index.md" in relative_links(ROOT / "README.md")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_files_and_headings(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve()
        if not destination.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and destination.suffix == ".md":
            anchors = {github_anchor(h) for h in HEADING.findall(prose(destination.read_text(encoding="utf-8")))}
            if anchor not in anchors:
                broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_github_anchor_rule() -> None:
    """Anchors as GitHub renders them for headings used in these docs."""
    assert github_anchor("Targets and speed-ups") == "targets-and-speed-ups"
    assert github_anchor("Sweeps and clusters") == "sweeps-and-clusters"
    assert github_anchor("1. Any `torch.optim.Optimizer`, by import path") == "1-any-torchoptimoptimizer-by-import-path"


def test_no_citation_of_notes_outside_the_repository() -> None:
    pattern = re.compile("|".join(CITATION_PATTERNS))
    found = []
    for path in tracked_files():
        relative = path.relative_to(ROOT)
        if relative.parts[0] not in CITATION_SCOPE:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "cite the paper, public code or docs/ instead:\n" + "\n".join(found)


def test_no_tracked_file_names_a_path_of_the_build_machine() -> None:
    home = str(Path.home())
    needles = MACHINE_PATHS + ((home.rstrip("/") + "/",) if len(home) > 1 else ())
    found = []
    for path in tracked_files():
        text = path.read_bytes().decode("utf-8", errors="replace")
        found += [f"{path.relative_to(ROOT)}: {needle}" for needle in needles if needle in text]
    assert not found, "\n".join(found)

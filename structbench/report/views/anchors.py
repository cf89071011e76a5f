"""Anchors: the HTML ids (and URL fragments) the Markdown and HTML reports link to, made from store text."""

from __future__ import annotations


def anchor(prefix: str, name: str) -> str:
    """`prefix-name` with every character of `name` but letters and digits replaced by "-": a valid HTML id that
    needs no quoting or escaping in an attribute, a Markdown link or a URL fragment, whatever `name` holds."""
    return f"{prefix}-" + "".join(c if c.isalnum() else "-" for c in name).strip("-")

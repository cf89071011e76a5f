"""What must never reach a terminal from stored text, by Unicode's own tables, and hostile strings that hold it."""

from __future__ import annotations

import unicodedata

BIDI_CLASSES = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}
"""The bidirectional classes of the embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069)."""
BIDI_MARKS = {"\u061c", "\u200e", "\u200f"}
"""The Arabic letter mark and the left-to-right and right-to-left marks: the rest of Unicode's Bidi_Control."""

ESCAPE_KINDS = {
    "hyperlink (OSC 8)": "\x1b]8;;https://evil.example/x\x1b\\click\x1b]8;;\x1b\\",
    "window title (OSC 0, OSC 2)": "\x1b]0;owned\x07\x1b]2;owned\x1b\\",
    "clipboard (OSC 52)": "\x1b]52;c;ZXZpbA==\x07",
    "CSI": "\x1b[2J\x1b[1;31m",
    "bare controls": "a\rb\bc\x07d\x7fe\tf",
    "C1 controls": "\x9b2J\x9d0;t\x9c",
    "bidi overrides": "\u202etxt\u202c\u2066x\u2069\u200f",
    "rich markup": "[red]red[/red][link=https://evil.example]x[/link]",
}
HOSTILE = "".join(ESCAPE_KINDS.values())
"""Every kind of escape in one string."""
HOSTILE_NAME = (
    "\x1b]8;;u\x1b\\L\x1b]8;;\x1b\\.\x1b]0;t\x07.\x1b]52;c;eA==\x07.\x1b[2J.\r\b\x07\x7f.\x9b2J\x9d0;t\x9c."
    "\u202ex\u2066.[red]r[bold]"
)
"""Every kind of escape in a string short enough for a file name and without "/"."""
VISIBLE = ("\\x1b", "\\x07", "\\x9b", "\\u202e", "[red]")
"""What the escaped forms of HOSTILE and HOSTILE_NAME show (short enough not to be folded in a table)."""


def is_active(char: str) -> bool:
    """Whether a terminal acts on `char` or it reorders what a reader sees: Unicode's general category Cc, or a
    Bidi_Control character."""
    category, bidi = unicodedata.category(char), unicodedata.bidirectional(char)
    return category == "Cc" or bidi in BIDI_CLASSES or char in BIDI_MARKS


def active_characters(text: str) -> list[str]:
    """The characters of `text` a terminal would act on, line breaks aside."""
    return [char for char in text if char != "\n" and is_active(char)]

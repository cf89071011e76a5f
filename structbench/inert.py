"""Text made inert before it reaches a terminal.

A store holds whatever its runs, grids and suite files held, so a name, hyperparameter, note, error message or file
name in it may carry characters a terminal acts on: ESC starts hyperlinks (OSC 8), window titles (OSC 0/2),
clipboard writes (OSC 52) and cursor moves (CSI); a carriage return or backspace overwrites what was shown; C1
controls (U+0080-U+009F) are single-byte forms of the same sequences; the bidirectional overrides and isolates
reorder what a reader sees. `inert` shows each such character as its escape (`\\x1b`, `\\r`, `\\u202e`) instead, so
the text prints as text and the reader still sees that the value was odd.
"""

from __future__ import annotations

import re

from rich.markup import escape

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Unicode's Bidi_Control characters (PropList.txt): the Arabic letter mark, the left-to-right and right-to-left
marks, the embeddings and overrides (U+202A-U+202E) and the isolates (U+2066-U+2069)."""
ACTIVE = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI_CONTROLS}]")
"""A character a terminal acts on or that reorders the text around it: Unicode's general category Cc (the C0 controls,
DEL and the C1 controls) and the Bidi_Control characters."""
ACTIVE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{BIDI_CONTROLS}]")
SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape_sequence(char: str) -> str:
    """How one active character is shown: `\\t`, `\\n`, `\\r`, `\\xNN` up to U+00FF, else `\\uNNNN`."""
    code = ord(char)
    if char in SHORT_ESCAPES:
        return SHORT_ESCAPES[char]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def inert(text: object, *, keep_newlines: bool = False) -> str:
    """`text` (str() of it) with every control and bidirectional control character shown as its escape; with
    `keep_newlines`, a line break ("\\n") stays one (text that is several lines, such as a table cell's)."""
    pattern = ACTIVE_BUT_NEWLINE if keep_newlines else ACTIVE
    return pattern.sub(lambda match: escape_sequence(match.group()), str(text))


def inert_markup(text: object) -> str:
    """`text` made inert and escaped for rich markup: a stored "[red]" is shown as written, not as a style."""
    return escape(inert(text))

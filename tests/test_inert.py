"""structbench.inert against Unicode's own tables: every control character (general category Cc) and every
bidirectional control is shown as an escape that Python's unicode_escape codec reads back as that character; every
other character passes unchanged."""

from __future__ import annotations

import codecs
import io
import sys

import pytest
from rich.console import Console

from structbench.inert import inert, inert_markup
from tests.support.terminal_text import is_active


def every_character() -> list[str]:
    """Every code point but the surrogates (which a str can hold but no text encodes)."""
    return [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]


@pytest.mark.parametrize("code", [*range(0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x61C, 0x200E, 0x200F])
def test_each_control_and_bidi_character_is_shown_as_its_escape(code):
    char = chr(code)
    shown = inert(f"<{char}>")
    if is_active(char):
        assert shown.startswith("<\\") and shown.endswith(">")
        assert codecs.decode(shown[1:-1], "unicode_escape") == char
        assert shown[1:-1].isascii() and shown[1:-1].isprintable()
    else:
        assert shown == f"<{char}>"


def test_only_the_active_characters_of_all_unicode_change():
    chars = every_character()
    shown = [inert(c) for c in chars]
    changed = {c for c, s in zip(chars, shown, strict=True) if s != c}
    assert changed == {c for c in chars if is_active(c)}
    assert len(changed) == 65 + 12  # Cc: C0 (32), DEL, C1 (32); Bidi_Control: 12 characters
    assert not any(is_active(s) for s in "".join(shown))


def test_newlines_are_kept_only_when_asked():
    text = "a\nb\tc\rd\x1be"
    assert inert(text) == "a\\nb\\tc\\rd\\x1be"
    assert inert(text, keep_newlines=True) == "a\nb\\tc\\rd\\x1be"


def test_inert_text_is_left_as_it_is():
    text = "".join(every_character()[:0x3000])
    once = inert(text)
    assert inert(once) == once


def test_markup_in_a_stored_string_is_printed_as_written():
    stored = "[red]alarm[/red] [link=https://evil.example]x[/link] \x1b]8;;https://evil.example\x1b\\y\\z"
    console = Console(file=io.StringIO(), width=400, force_terminal=True, color_system="truecolor")
    console.print(inert_markup(stored), highlight=False, end="")
    printed = console.file.getvalue()
    assert printed == "[red]alarm[/red] [link=https://evil.example]x[/link] \\x1b]8;;https://evil.example\\x1b\\y\\z"

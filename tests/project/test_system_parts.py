"""A test whose system part is missing skips outside CI and fails under CI=true (tests/support/system_parts.py)."""

from __future__ import annotations

import pytest

from tests.support import system_parts

ABSENT = system_parts.SystemPart("a part nobody has", lambda: False, "apt-get install nothing")


def test_a_missing_part_skips_outside_ci_saying_how_to_get_it(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(system_parts.SYSTEM_PARTS, "absent", ABSENT)
    expected = r"a part nobody has is missing \(get it: apt-get install nothing\)"
    with pytest.raises(pytest.skip.Exception, match=expected):
        system_parts.require("absent")


def test_a_missing_part_fails_under_ci(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setitem(system_parts.SYSTEM_PARTS, "absent", ABSENT)
    with pytest.raises(BaseException) as raised:  # a skip escaping here would mark this test skipped, not failed
        system_parts.require("absent")
    assert raised.type is pytest.fail.Exception
    assert "CI=true and a part nobody has is missing" in str(raised.value)


def test_a_present_part_neither_skips_nor_fails(monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setitem(system_parts.SYSTEM_PARTS, "present", system_parts.SystemPart("x", lambda: True, "-"))
    system_parts.require("present")


def test_the_marker_reaches_the_helper(monkeypatch) -> None:
    """conftest's setup hook skips a test marked `system_part` whose part is absent (outside CI)."""
    from tests import conftest

    class Marked:
        def iter_markers(self, name):
            return [pytest.mark.system_part("absent").mark] if name == "system_part" else []

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(system_parts.SYSTEM_PARTS, "absent", ABSENT)
    with pytest.raises(pytest.skip.Exception, match="a part nobody has is missing"):
        conftest.pytest_runtest_setup(Marked())

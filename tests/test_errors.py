"""Tests for structbench.errors: the one-line unknown-name message and `Registry`, and the registries built on it
(tasks, experiments, papers' claims), whose unknown names are usage errors naming the closest known one."""

from __future__ import annotations

import pytest

from structbench.claims import PAPERS, claims_of
from structbench.errors import Registry, UsageError, unknown_name_message
from structbench.experiments import get_experiment
from structbench.tasks import get_task


def test_the_message_names_the_kind_the_closest_name_and_every_known_one() -> None:
    known = ["muon", "shampoo", "soap"]
    assert unknown_name_message("optimizer", "shampo", known) == (
        "unknown optimizer 'shampo'. Did you mean 'shampoo'? Known: muon, shampoo, soap."
    )
    assert unknown_name_message("optimizer", "xyz", known) == "unknown optimizer 'xyz'. Known: muon, shampoo, soap."


def test_a_registry_refuses_a_name_twice_and_keeps_the_first() -> None:
    registry = Registry("colour", [("red", 1)])
    assert registry.register("blue", 2) == 2
    with pytest.raises(ValueError, match=r"^colour 'red' is registered twice$"):
        registry.register("red", 3)
    assert registry == {"red": 1, "blue": 2}


def test_lookup_gives_the_item_or_the_one_line_usage_error() -> None:
    registry = Registry("colour", [("red", 1), ("blue", 2), ("green", 3)])
    assert registry.lookup("green") == 3
    with pytest.raises(UsageError) as raised:
        registry.lookup("gren")
    assert str(raised.value) == "unknown colour 'gren'. Did you mean 'green'? Known: blue, green, red."
    with pytest.raises(UsageError) as raised:
        registry.lookup("purple")
    assert str(raised.value) == "unknown colour 'purple'. Known: blue, green, red."


def test_names_are_sorted_or_in_registration_order() -> None:
    items = [("red", 1), ("blue", 2), ("green", 3)]
    assert Registry("colour", items).names() == ["blue", "green", "red"]
    in_order = Registry("colour", items, sort=False)
    assert in_order.names() == ["red", "blue", "green"]
    with pytest.raises(UsageError, match=r"Known: red, blue, green\.$"):
        in_order.lookup("yellow")


def test_a_registry_is_a_dict_that_a_test_may_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry("colour", [("red", 1)])
    with monkeypatch.context() as patch:
        patch.setitem(registry, "blue", 2)
        assert registry.lookup("blue") == 2
    assert registry == {"red": 1}


@pytest.mark.parametrize(
    ("lookup", "typo", "message"),
    [
        (
            get_task,
            "quadratc",
            "unknown task 'quadratc'. Did you mean 'quadratic'? "
            "Known: image-classification, language-model, quadratic, synthetic-classification.",
        ),
        (
            get_experiment,
            "orth-eror",
            "unknown experiment 'orth-eror'. Did you mean 'orth-error'? Known: orth-error, quant-error, update-cond.",
        ),
        (
            claims_of,
            "sumoo",
            "unknown paper 'sumoo'. Did you mean 'sumo'? Known: 4bit-shampoo, racs-alice, asgo, sumo, fismo, all.",
        ),
    ],
)
def test_the_registries_unknown_names(lookup, typo: str, message: str) -> None:
    with pytest.raises(UsageError) as raised:
        lookup(typo)
    assert str(raised.value) == message


def test_claims_by_paper_and_all_in_paper_order() -> None:
    every = claims_of("all")
    assert [claim.paper for claim in every] == sorted(
        (claim.paper for claim in every), key=lambda paper: PAPERS.index(paper)
    )
    assert every == [claim for paper in PAPERS for claim in claims_of(paper)]
    assert all(claims_of(paper) and {claim.paper for claim in claims_of(paper)} == {paper} for paper in PAPERS)

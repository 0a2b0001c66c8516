"""Every fact fixture (tests/facts/<FactClassName>/<case>.json; the format: __init__.py): the
fact's command for "arg" is "command" where the fixture gives one, and process("output") is
"fact". Every fact has fixtures, among them no output at all and one blank line."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from tests.facts import (
    FIELDS,
    PROVENANCE,
    all_fixtures,
    cases,
    fact_classes,
    fixture,
    fixture_folders,
)

FACTS = fact_classes()
ALL = all_fixtures()


@pytest.mark.parametrize("name, case", ALL, ids=[f"{n}/{c}" for n, c in ALL])
def test_fixture(name, case):
    data = fixture(name, case)
    assert {"arg", "output", "fact"} <= set(data) <= FIELDS | PROVENANCE, sorted(data)
    fact = FACTS[name]()
    command = fact.command(**data["arg"])
    if "command" in data:
        assert command == data["command"]
    value = fact.process(data["output"])
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    assert value == data["fact"]


def test_every_fact_has_fixtures_and_every_folder_is_a_fact():
    assert list(FACTS) == fixture_folders()


@pytest.mark.parametrize("name", list(FACTS))
def test_every_fact_reads_no_output_and_a_blank_line(name):
    outputs = [fixture(name, case)["output"] for case in cases(name)]
    assert [] in outputs and [""] in outputs, f'{name}: add fixtures for [] and [""]'

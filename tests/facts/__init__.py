"""Fact fixtures, the way pyinfra tests its own facts: tests/facts/<FactClassName>/<case>.json is

    {"arg": {the fact's arguments},
     "command": "the command they make" (left out where it is long or generated),
     "output": ["each line the host printed", ...],
     "fact": the value process() returns (a pydantic value as its model_dump(mode="json"))}

and, where the output has a story, "kind" (recorded, composed, synthesized, constructed) and "note"
(where it comes from; "rc" and "context" where the recording kept them). A folder's README.md tells
the rest. test_facts.py checks every fixture; tests elsewhere read the outputs from here too."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

from pyinfra.api import FactBase

import specdeploy.host.facts

FIXTURES = Path(__file__).parent
FIELDS = {"arg", "command", "output", "fact"}
PROVENANCE = {"kind", "note", "rc", "context"}


def fixture(fact: str, case: str) -> dict:
    return json.loads((FIXTURES / fact / f"{case}.json").read_text())


def cases(fact: str) -> list[str]:
    return sorted(p.stem for p in (FIXTURES / fact).glob("*.json"))


def fixture_folders() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name != "__pycache__")


def all_fixtures() -> list[tuple[str, str]]:
    """(fact name, case) of every fixture."""
    return [(name, case) for name in fixture_folders() for case in cases(name)]


def fact_classes() -> dict[str, type[FactBase]]:
    """Every fact defined under specdeploy/host/facts (a pyinfra FactBase subclass with a command,
    so not the `Fact` base), by class name. Each module is imported first, so a new one is found
    without anyone listing it."""
    package = specdeploy.host.facts
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    found, todo = {}, [FactBase]
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            if cls.__module__.startswith(f"{package.__name__}.") and hasattr(cls, "command"):
                found[cls.__name__] = cls
    return dict(sorted(found.items()))


def snapshots() -> dict[str, dict]:
    """The model snapshots the ModelSnapshot fixtures hold, by repo (what the fact read from the
    checkpoints on the H200)."""
    values = (fixture("ModelSnapshot", case)["fact"] for case in cases("ModelSnapshot"))
    return {value["repo"]: value for value in values if value}

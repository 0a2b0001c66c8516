"""pyinfra's global arguments' type hints are computed once per process (host/pyinfra_speed.py)
and are exactly what pyinfra computes itself; its argument resolution still works."""

from __future__ import annotations

from typing import get_type_hints

from pyinfra.api import Config, Inventory, State, arguments

import specdeploy.host.on_host  # noqa: F401  (what every deploy imports)


def test_the_global_arguments_are_computed_once_and_are_pyinfras_own():
    assert hasattr(arguments.all_global_arguments, "cache_info")
    first = arguments.all_global_arguments()
    assert first is arguments.all_global_arguments()  # computed once
    assert first == list(get_type_hints(arguments.AllArguments).items())
    state = State(Inventory((["h1"], {"_sudo": True})), Config())
    popped, found = arguments.pop_global_arguments(state, state.inventory.get_host("h1"),
                                                   {"_timeout": 5})  # fmt: skip
    assert popped["_sudo"] is True and popped["_timeout"] == 5 and found == ["_timeout"]

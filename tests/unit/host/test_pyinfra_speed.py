"""pyinfra's global arguments' type hints are computed once per process (host/pyinfra_speed.py)
and are exactly what pyinfra computes itself; its argument resolution still works. The patch is
applied by whoever runs pyinfra (the CLI, the deploy flows), never by importing a module."""

from __future__ import annotations

import subprocess
import sys
from typing import get_type_hints

from pyinfra.api import Config, Inventory, State, arguments

from specdeploy.host.pyinfra_speed import compute_global_arguments_once


def test_the_global_arguments_are_computed_once_and_are_pyinfras_own():
    compute_global_arguments_once()
    compute_global_arguments_once()  # idempotent: one cache, not a cache of a cache
    assert hasattr(arguments.all_global_arguments, "cache_info")
    assert not hasattr(arguments.all_global_arguments.__wrapped__, "cache_info")
    first = arguments.all_global_arguments()
    assert first is arguments.all_global_arguments()  # computed once
    assert first == list(get_type_hints(arguments.AllArguments).items())
    state = State(Inventory((["h1"], {"_sudo": True})), Config())
    popped, found = arguments.pop_global_arguments(state, state.inventory.get_host("h1"),
                                                   {"_timeout": 5})  # fmt: skip
    assert popped["_sudo"] is True and popped["_timeout"] == 5 and found == ["_timeout"]


PATCHED = "import pyinfra.api.arguments as a; print(hasattr(a.all_global_arguments, 'cache_info'))"


def _fresh(code: str) -> str:
    """`code` in a fresh interpreter (this one's pyinfra may be patched by another test)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_importing_the_deploy_modules_leaves_pyinfra_unpatched():
    modules = ["specdeploy.host.on_host", "specdeploy.host.pyinfra_speed", "specdeploy.cli",
               "specdeploy.flows.serve", "specdeploy.flows.measure"]  # fmt: skip
    assert _fresh("; ".join(f"import {m}" for m in modules) + "; " + PATCHED) == "False"


def test_the_cli_and_the_deploy_entries_apply_it():
    """The CLI's main applies it before any command runs; the serve and measurement deploys as
    their first step (read from their code: running them needs a pyinfra state)."""
    code = "import specdeploy.cli as c; c.main(['releases', 'list'])\n" + PATCHED
    assert _fresh(code).splitlines()[-1] == "True"
    import inspect

    from specdeploy.flows import measure, serve

    assert "compute_global_arguments_once()" in inspect.getsource(serve.serve)
    assert "compute_global_arguments_once()" in inspect.getsource(measure.measurement_deploy)

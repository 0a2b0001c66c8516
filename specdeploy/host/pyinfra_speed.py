"""pyinfra 3.x recomputes its global arguments' type hints (`typing.get_type_hints` on the
`AllArguments` TypedDict) on every operation call, fact read and `on_host` command: two thirds of
the control node's planning time for 200 hosts (cProfile of benchmarks/fleet_scale/plan_fleet.py:
40 s, 15 s with them computed once). They are a constant of the installed pyinfra, so they are
computed once per process, by whoever runs pyinfra (the CLI's main, the deploy flows' entries),
explicitly and never on import: importing a specdeploy module leaves pyinfra as it is. pyinfra's
own `pop_global_arguments` then reads the same list."""

from __future__ import annotations

import functools

from pyinfra.api import arguments


def compute_global_arguments_once() -> None:
    """Idempotent: wraps pyinfra's `all_global_arguments` in a cache (once)."""
    if not hasattr(arguments.all_global_arguments, "cache_info"):
        arguments.all_global_arguments = functools.cache(arguments.all_global_arguments)

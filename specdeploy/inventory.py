"""Read a pyinfra inventory (with its group_data) without connecting to any host."""

from __future__ import annotations

import os
from typing import Any

from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory


def host_data(
    inventory_path: str, group_data_dirs: list[str] | None = None, cwd: str | None = None
) -> dict[str, dict[str, Any]]:
    """{host name: merged host data}, exactly as `pyinfra INVENTORY ...` would see it."""
    if not os.path.exists(inventory_path):
        raise FileNotFoundError(f"inventory file not found: {inventory_path}")
    # pyinfra executes inventory and group_data files inside a State context, as its CLI does.
    with ctx_state.use(State()):
        inventory = make_inventory(
            inventory_path, cwd=cwd or os.getcwd(), group_data_directories=group_data_dirs or None
        )
    return {host.name: host.data.dict() for host in inventory}

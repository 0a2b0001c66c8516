"""Read a pyinfra inventory (with its group_data) without connecting to any host: the one loader
`check`, `render`, `rollout`, `status` and the host tests use."""

from __future__ import annotations

import os
from typing import Any

from pyinfra.api import Inventory, State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory


def load_inventory(
    inventory_path: str,
    group_data_dirs: list[str] | None = None,
    *,
    cwd: str | None = None,
    state: State | None = None,
) -> Inventory:
    """The inventory exactly as `pyinfra INVENTORY ...` builds it. pyinfra executes inventory and
    group_data files inside a State context, as its CLI does (`state`: the one to use)."""
    if not os.path.exists(inventory_path):
        raise FileNotFoundError(f"inventory file not found: {inventory_path}")
    with ctx_state.use(state or State()):
        return make_inventory(
            inventory_path, cwd=cwd or os.getcwd(), group_data_directories=group_data_dirs or None
        )


def hosts_with_data(
    inventory_path: str, group_data_dirs: list[str] | None = None, cwd: str | None = None
) -> list[tuple[str, list[str], dict[str, Any]]]:
    """[(host name, [groups] in inventory order, merged host data)], in inventory order."""
    inventory = load_inventory(inventory_path, group_data_dirs, cwd=cwd)
    return [(h.name, list(h.groups), h.data.dict()) for h in inventory]


def host_data(
    inventory_path: str, group_data_dirs: list[str] | None = None, cwd: str | None = None
) -> dict[str, dict[str, Any]]:
    """{host name: merged host data}, exactly as `pyinfra INVENTORY ...` would see it."""
    return {name: data for name, _, data in hosts_with_data(inventory_path, group_data_dirs, cwd)}

"""Host tests for a deployed fleet:
`pytest tests/host --inventory inventories/prod.py [--limit HOST]`.

The pyinfra inventory (with its group_data, exactly as `pyinfra INVENTORY ...` sees it) is turned
into testinfra hosts: every host's SSH settings (ssh_hostname, ssh_user, ssh_port, ssh_key,
ssh_known_hosts_file, ssh_strict_host_key_checking, _sudo) become one `Host` entry of a generated
ssh_config, used by testinfra's `ssh://` backend (the system ssh client, with connection sharing).
Every expectation is derived from the same config the deploy used:
`specdeploy.checks.host_data.check_config` on the host's data, and `specdeploy.render.units` /
`specdeploy.render.argv.serve_argv` for the unit and argv.

Without --inventory this directory is not collected, so a plain `pytest tests` skips it.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_addoption(parser):
    group = parser.getgroup("specdeploy host tests")
    group.addoption(
        "--inventory", help="pyinfra inventory file of the deployed fleet (enables tests/host)"
    )
    group.addoption("--limit", action="append", default=None, help="only this host (repeatable)")


def _explicitly_requested(config) -> bool:
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if config.getoption("inventory", None):
        return None
    if HERE == Path(collection_path).resolve() or HERE in Path(collection_path).resolve().parents:
        if _explicitly_requested(config):
            raise pytest.UsageError(
                "tests/host checks a deployed fleet: pass --inventory INVENTORY "
                "(e.g. pytest tests/host --inventory inventories/prod.py)"
            )
        return True
    return None


def _fleet(config) -> dict[str, dict]:
    cached = getattr(config, "_specdeploy_fleet", None)
    if cached is None:
        from specdeploy.config.inventory import host_data

        inventory = config.getoption("inventory")
        hosts = host_data(inventory)
        limit = config.getoption("limit")
        if limit:
            unknown = sorted(set(limit) - set(hosts))
            if unknown:
                raise pytest.UsageError(f"--limit {', '.join(unknown)}: not in {inventory}")
            hosts = {name: data for name, data in hosts.items() if name in limit}
        if not hosts:
            raise pytest.UsageError(f"{inventory}: no hosts")
        cached = config._specdeploy_fleet = hosts
    return cached


def _whole_box(data: dict) -> int:
    """How many instances the host data asks for (0: one server, as without the key)."""
    instances = data.get("instances")
    return len(instances) if isinstance(instances, list) else int(instances or 0)


def pytest_generate_tests(metafunc):
    """Every server test runs once per server: a host's one, or each instance of a whole box
    (`host/N`); a test of `box_name` (the balancer) once per whole box."""
    fleet = _fleet(metafunc.config)
    if "box_name" in metafunc.fixturenames:  # host_name given directly: no `server` needed
        boxes = [name for name, data in fleet.items() if _whole_box(data)]
        metafunc.parametrize("host_name", boxes, ids=boxes, scope="session")
    elif "server" in metafunc.fixturenames:
        servers = [
            (name, i) for name, data in fleet.items() for i in range(_whole_box(data)) or [None]
        ]
        ids = [name if i is None else f"{name}/{i}" for name, i in servers]
        metafunc.parametrize("server", servers, ids=ids, scope="session")


def ssh_config_text(hosts: dict[str, dict]) -> str:
    """One ssh_config `Host` block per pyinfra host, from its pyinfra SSH settings."""
    blocks = []
    for name, data in hosts.items():
        lines = [f"Host {name}", f"    HostName {data.get('ssh_hostname') or name}"]
        if data.get("ssh_user"):
            lines.append(f"    User {data['ssh_user']}")
        if data.get("ssh_port"):
            lines.append(f"    Port {data['ssh_port']}")
        if data.get("ssh_key"):
            lines += [f"    IdentityFile {data['ssh_key']}", "    IdentitiesOnly yes"]
        if data.get("ssh_known_hosts_file"):
            lines.append(f"    UserKnownHostsFile {data['ssh_known_hosts_file']}")
        strict = data.get("ssh_strict_host_key_checking")
        if strict is not None:
            lines.append(
                "    StrictHostKeyChecking "
                f"{strict if isinstance(strict, str) else ('yes' if strict else 'no')}"
            )
        if data.get("ssh_allow_agent") is False:
            lines.append("    ForwardAgent no")
        lines += ["    BatchMode yes", "    ConnectTimeout 10"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


@pytest.fixture(scope="session")
def fleet(request) -> dict[str, dict]:
    return _fleet(request.config)


@pytest.fixture(scope="session")
def ssh_config(fleet, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("specdeploy-ssh") / "ssh_config"
    path.write_text(ssh_config_text(fleet))
    os.chmod(path, 0o600)
    return str(path)


@pytest.fixture(scope="session")
def host_name(server) -> str:
    """The host of the server under test (a balancer test is given it directly)."""
    return server[0]


@pytest.fixture(scope="session")
def box_name(host_name) -> str:
    return host_name


@pytest.fixture(scope="session")
def host_data(fleet, host_name) -> dict:
    return fleet[host_name]


@pytest.fixture(scope="session")
def th(host_name, host_data, ssh_config):
    """The testinfra host for `host_name`."""
    import testinfra

    return testinfra.get_host(
        f"ssh://{host_name}",
        ssh_config=ssh_config,
        sudo=bool(host_data.get("_sudo")),
        controlpersist=120,
        timeout=30,
    )


@pytest.fixture(scope="session")
def box_cfg(host_name, host_data):
    """The host's own config (a whole box's: the balancer's, on vllm_port)."""
    from specdeploy.checks.host_data import check_config

    return check_config(host_name, host_data)


@pytest.fixture(scope="session")
def box_layout(th, box_cfg):
    """A whole box's instances, split from the host's GPUs or cores as the deploy split them."""
    from specdeploy.render import instances
    from specdeploy.steps.servers import available_devices

    def get_fact(cls, **kwargs):  # the deploy's facts, read with their own commands
        out = th.run(f"sh -c {shlex.quote(cls().command(**kwargs))}")
        return cls().process(out.stdout.splitlines())

    return instances.expand(box_cfg, available_devices(box_cfg, get_fact))


@pytest.fixture(scope="session")
def instance(request, server, box_layout):
    """The whole box's instance under test, or None for a host with one server."""
    return None if server[1] is None else box_layout.instances[server[1]]


@pytest.fixture(scope="session")
def host_cfg(request, server, box_cfg):
    """The server's config: the host's, or its instance's (own unit, port, devices, record)."""
    return box_cfg if server[1] is None else request.getfixturevalue("instance").cfg

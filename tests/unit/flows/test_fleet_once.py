"""Planning work that does not depend on the host is done once per fleet, not once per host
(issue 37): the release tables are read and parsed once per process, and a moving Hub ref is
resolved once per endpoint + repo + revision however many hosts ask. Each test counts the real
calls, so a cache that broke (or a new per-host read beside it) fails here."""

from __future__ import annotations

import json

import pytest

from specdeploy.config import revisions
from specdeploy.config.schema import ServeConfig
from specdeploy.releases import capabilities
from tests.unit.conftest import VALID

HOSTS = 20


def test_release_tables_are_parsed_once_for_a_fleet(monkeypatch):
    parsed: list[int] = []
    real_loads = json.loads

    def counting_loads(text, *args, **kwargs):
        parsed.append(1)
        return real_loads(text, *args, **kwargs)

    capabilities._tables.cache_clear()
    monkeypatch.setattr(capabilities.json, "loads", counting_loads)
    try:
        for version in capabilities.known_versions() * HOSTS:  # every host asks every question
            capabilities.speculative_keys(version)
            assert capabilities.release_of(version).flag_names
            capabilities.release_of(version).draft_model_runtime()
        tables = len(capabilities._tables())
    finally:
        capabilities._tables.cache_clear()
    assert tables > 0
    assert len(parsed) == tables  # one parse per release file, not per host or per question


@pytest.fixture
def hub_calls(monkeypatch):
    asked: list[tuple[str, str]] = []

    def ask_hub(cfg, repo, revision):
        asked.append((repo, revision))
        return f"{len(asked):040x}"

    monkeypatch.setattr(revisions, "_resolved", {})
    monkeypatch.delenv(revisions.PINNED_REVISIONS_ENV, raising=False)
    monkeypatch.setattr(revisions, "_ask_hub", ask_hub)
    return asked


def test_a_moving_ref_is_resolved_once_for_a_fleet(hub_calls):
    cfg = ServeConfig(**{**VALID, "target_revision": "main"})
    pins = [revisions.pin(cfg)[1] for _ in range(HOSTS)]
    expected = [(repo, rev) for _, repo, rev in revisions.moving_refs(cfg)]
    assert expected and sorted(hub_calls) == sorted(expected)  # once each, not once per host
    assert all(p == pins[0] for p in pins)  # every host serves the one commit


def test_each_repo_and_revision_is_resolved_once(hub_calls):
    main = ServeConfig(**{**VALID, "target_revision": "main"})
    other = ServeConfig(**{**VALID, "target_revision": "release"})
    revisions.pins_for_hosts([main, other] * HOSTS)
    expected = {(repo, rev) for c in (main, other) for _, repo, rev in revisions.moving_refs(c)}
    assert len(expected) >= 2 and sorted(hub_calls) == sorted(expected)


def test_a_pin_is_looked_up_in_the_release_tables_once(monkeypatch):
    """`check_config` and `check_warnings` of a host ask the release tables many questions (keys,
    rules, runtime, flags, builds); the table that describes the pin is looked up once and handed
    to every check, and a fleet of hosts on one pin shares that lookup (issue 49; before: 24
    lookups for one host)."""
    from specdeploy.checks import host_data

    looked_up: list[tuple] = []
    real = capabilities.table_for

    def counting(*args, **kwargs):
        looked_up.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(capabilities, "table_for", counting)
    capabilities.reread_tables()
    data = {
        **VALID,
        "target_revision": "0" * 40,
        "vllm_extra_args": ["--tensor-parallel-size", "2"],
    }
    data["speculative_config"] = {**VALID["speculative_config"], "draft_tensor_parallel_size": 1}
    try:
        host_data.check_config("one", data)
        host_data.check_warnings("one", data)
        assert len(looked_up) == 1, looked_up
        for i in range(HOSTS):
            host_data.check_config(f"host-{i}", data)
            host_data.check_warnings(f"host-{i}", data)
        assert len(looked_up) == 1, looked_up
    finally:
        capabilities.reread_tables()


def test_engine_flags_are_parsed_once_per_config(monkeypatch):
    """CONTRIBUTING: the engine flags are read once. The checks of one config that need its
    parallel sizes (release rules, draft TP, data-parallel load) and its instance layout share one
    parse of its vllm_extra_args (before: 7 parses here)."""
    from specdeploy.checks import host_data
    from specdeploy.render import argv, instances

    parses: list[int] = []
    real = argv.EngineFlags

    class Counting(real):
        def __init__(self, *args, **kwargs):
            parses.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(argv, "EngineFlags", Counting)
    argv.parse_engine_flags.cache_clear()
    data = {
        **VALID,
        "vllm_extra_args": ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"],
    }
    try:
        cfg = host_data.config_from_data(data)
        host_data.check_host("one", data)
        host_data.check_warnings("one", data)
        assert instances.devices_per_instance(cfg) == 4
        assert len(parses) == 1
    finally:
        argv.parse_engine_flags.cache_clear()  # no counting flags left for later tests


def test_a_hosts_checks_are_handed_its_release(monkeypatch):
    """check_version looks the pin's Release up once and every check of the host reads that one
    (keys, flag names, rules, draft TP, warnings), none asks again from the version string (before:
    3 lookups for check_host, 4 more for check_warnings)."""
    from specdeploy.checks import host_data

    asked: list[tuple] = []
    real = capabilities.release_of

    def counting(*args, **kwargs):
        asked.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(capabilities, "release_of", counting)
    data = {**VALID, "vllm_extra_args": ["--tensor-parallel-size", "2"], "tensor_parallel_sise": 2}
    data["speculative_config"] = {**VALID["speculative_config"], "draft_tensor_parallel_size": 1}
    assert host_data.check_host("one", data)  # the typo is found: the flag names were read
    assert len(asked) == 1, asked
    asked.clear()
    del data["tensor_parallel_sise"]
    assert host_data.check_warnings("one", data)  # draft TP ignored: the runtime was read
    assert len(asked) == 1, asked


def test_specdeploy_check_checks_each_host_once(tmp_path, monkeypatch, capsys):
    """`specdeploy check` says a host's problems, warnings and notes from one check of its data
    (before: three, one each for the problems, the warnings and the moving-ref notes)."""
    from specdeploy.checks import host_data
    from specdeploy.cli import main

    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.28.1"\ntarget_model = "t/t"\ngpu_memory_utilization = 0.9\n'
        'speculative_config = {"method": "draft_model", "model": "d/d", '
        '"num_speculative_tokens": 2}\n'
    )
    (tmp_path / "inv.py").write_text('hosts = ["h1", "h2", "h3"]\n')
    monkeypatch.chdir(tmp_path)
    checked: list[str] = []
    real = host_data._check_host

    def counting(host, data):
        checked.append(host)
        return real(host, data)

    monkeypatch.setattr(host_data, "_check_host", counting)
    assert main(["check", "inv.py"]) == 0
    out = capsys.readouterr()
    assert "3 host(s) valid." in out.out and "0.28.0's table" in out.out  # warned, from the one
    assert "moving ref" in out.err  # and noted
    assert sorted(checked) == ["h1", "h2", "h3"]

"""What a deployed host must look like; every expectation comes from the host's own config.

Run: `pytest tests/host --inventory inventories/prod.py` (see conftest.py)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex

import pytest

from specdeploy.config.record import read_record
from specdeploy.config.revisions import as_deployed
from specdeploy.host.facts.cuda_boot import CUDA_BOOT_COMMAND, NVIDIA_MODPROBE, parse_cuda_boot
from specdeploy.host.scripts import source
from specdeploy.render.argv import (
    LEGACY_SPECULATIVE_FLAGS,
    SHORT_SPECULATIVE_FLAGS,
    argv_diff,
    flag_value,
    serve_argv,
    served_speculative_config,
    unit_exec_argv,
)
from specdeploy.render.units import render_unit, secrets


def run(th, command: str) -> str:
    result = th.run(command)
    assert result.rc == 0, (
        f"{th.backend.hostname}: `{command[:120]}` failed (rc {result.rc}): {result.stderr[-2000:]}"
    )
    return result.stdout


@pytest.fixture(scope="session")
def record(th, host_cfg):
    text = th.run(f"cat {shlex.quote(host_cfg.record_path)}").stdout
    return json.loads(text) if text.strip() else None


@pytest.fixture(scope="session")
def cfg(host_cfg, record):
    """The host's config with the moving refs at the commits the deployment record pinned
    (revisions.as_deployed: never resolved again, upstream may have moved)."""
    return as_deployed(host_cfg, read_record(record))


@pytest.fixture(scope="session")
def rendered(th, cfg, record):
    """The unit this config renders, for the role the deploy chose (the speculation gate may pick
    the baseline; the record says which)."""
    role = (record or {}).get("role") or "speculative"
    return render_unit(cfg, role, cuda_boot=cuda_boot(th, cfg))


def cuda_boot(th, cfg):
    """The host's CudaBoot fact, read with the fact's own command (the CUDA build only)."""
    if cfg.vllm_package != "vllm":
        return None
    return parse_cuda_boot(run(th, f"sh -c {shlex.quote(CUDA_BOOT_COMMAND)}").splitlines())


@pytest.fixture(scope="session")
def unit_file(th, rendered):
    path = run(th, f"systemctl show -p FragmentPath --value {rendered.name}").strip()
    assert path, f"{rendered.name} is not installed (no unit file)"
    return path, run(th, f"cat {shlex.quote(path)}")


@pytest.fixture(scope="session")
def installed_argv(unit_file):
    path, text = unit_file
    argv = unit_exec_argv(text)
    assert argv, f"{path} has no ExecStart="
    return argv


def curl(th, cfg, path: str) -> str:
    """GET `path` on the host. The API key goes from the root-only env file to curl's stdin through
    the shell's builtin printf: it is in no command line (ps) and not in sudo's log."""
    env = shlex.quote(cfg.env_file)
    header = 'header = "Authorization: Bearer %s"\\n'
    script = (
        f"set -a; [ -f {env} ] && . {env}; set +a; "
        f'{{ [ -n "$VLLM_API_KEY" ] && printf \'{header}\' "$VLLM_API_KEY"; true; }} | '
        f"curl -sS --fail-with-body -m 30 -K - {shlex.quote(cfg.base_url + path)}"
    )
    return run(th, f"sh -c {shlex.quote(script)}")


def test_vllm_version_is_the_pin(th, cfg):
    code = f"import importlib.metadata as m; print(m.version({cfg.vllm_package!r}))"
    found = run(th, f"{shlex.quote(cfg.venv)}/bin/python -c {shlex.quote(code)}").strip()
    assert found == cfg.vllm_version, (
        f"{cfg.vllm_package} in {cfg.venv} is {found}, pinned {cfg.vllm_version}"
    )


def test_unit_argv_is_the_rendered_one(installed_argv, rendered, unit_file):
    diff = argv_diff(
        installed_argv, rendered.argv, old_name=unit_file[0], new_name="rendered from host data"
    )
    assert installed_argv == rendered.argv, (
        f"the installed unit's ExecStart differs from the argv rendered from the host's data "
        f"(edited by hand, or a deploy did not finish):\n{diff}"
    )


def test_speculative_config_json(th, installed_argv, rendered, cfg):
    if rendered.role != "speculative":
        assert "--speculative-config" not in installed_argv, "the baseline unit must not speculate"
        return
    text = flag_value(installed_argv, "--speculative-config")
    assert text is not None, "ExecStart has no --speculative-config"
    served = served_speculative_config(cfg)
    assert json.loads(text) == served, (
        f"--speculative-config is {text}, host data says {json.dumps(served, sort_keys=True)}"
    )
    if served.get("model") != cfg.speculative_config.get("model"):  # a pinned draft, by its path
        marker = shlex.quote(f"{served['model']}/.specdeploy-complete")
        assert run(th, f"test -f {marker} && echo complete").strip() == "complete"


def test_no_deprecated_flags(installed_argv):
    bad = [
        w.split("=", 1)[0]
        for w in installed_argv
        if w.split("=", 1)[0] in LEGACY_SPECULATIVE_FLAGS
        or w.split("=", 1)[0] in SHORT_SPECULATIVE_FLAGS
    ]
    assert not bad, f"removed/bypassing speculative flags on the command line: {bad}"


def test_argv_starts_with_the_venv_launcher(installed_argv, cfg):
    assert installed_argv[: len(cfg.vllm_cli) + 1] == cfg.vllm_cli + ["serve"]


def test_loaded_unit_is_the_file_on_disk(th, rendered):
    assert run(th, f"systemctl show -p NeedDaemonReload --value {rendered.name}").strip() == "no", (
        f"{rendered.name} changed on disk but systemd runs an older copy (daemon-reload missing)"
    )


def test_service_enabled_and_running_as_service_user(th, cfg, rendered):
    service = th.service(rendered.name)
    assert service.is_enabled, f"{rendered.name} is not enabled"
    assert service.is_running, (
        f"{rendered.name} is not running: {th.run(f'systemctl is-active {rendered.name}').stdout}"
    )
    pid = run(th, f"systemctl show -p MainPID --value {rendered.name}").strip()
    user = run(th, f"ps -o user= -p {pid}").strip()
    assert user == cfg.service_user, (
        f"{rendered.name} (pid {pid}) runs as {user}, not {cfg.service_user}"
    )
    assert cfg.service_user != "root"


def test_hardening_directives_in_force(th, rendered, cfg):
    props = dict(
        line.split("=", 1)
        for line in run(
            th,
            f"systemctl show -p NoNewPrivileges -p ProtectSystem -p ProtectHome -p PrivateTmp "
            f"-p ReadWritePaths -p ReadOnlyPaths -p User {rendered.name}",
        )
        .strip()
        .splitlines()
    )
    assert props["NoNewPrivileges"] == "yes" and props["ProtectSystem"] == "strict"
    assert props["ProtectHome"] == "yes" and props["PrivateTmp"] == "yes"
    # the server writes only its home; the weights are root's and read-only to it
    assert set(props["ReadWritePaths"].split()) == {cfg.server_home}
    assert cfg.hf_home in props["ReadOnlyPaths"].split()
    assert props["User"] == cfg.service_user


def test_cuda_unit_waits_for_the_driver_and_creates_device_nodes(th, cfg, rendered, unit_file):
    """CUDA at boot: ordered after nvidia-persistenced (and nvidia-fabricmanager where the host has
    it), and nvidia-modprobe run as root (`+`: NoNewPrivileges=yes blocks its setuid) before the
    server where it is installed."""
    if cfg.vllm_package != "vllm":
        pytest.skip(
            f"{cfg.vllm_package} host: the CUDA boot lines are for the vllm build only "
            "(the sandbox is CPU-only)"
        )
    boot = cuda_boot(th, cfg)
    props = dict(
        line.split("=", 1)
        for line in run(th, f"systemctl show -p After -p Wants -p ExecStartPre {rendered.name}")
        .strip()
        .splitlines()
        if "=" in line
    )
    wanted = ["nvidia-persistenced.service"] + (
        ["nvidia-fabricmanager.service"] if boot.fabricmanager else []
    )
    for unit in wanted:
        assert unit in props["After"].split(), f"{rendered.name} is not ordered after {unit}"
        assert unit in props["Wants"].split(), f"{rendered.name} does not want {unit}"
    lines = unit_file[1].splitlines()
    if boot.nvidia_modprobe:
        assert f"ExecStartPre=+{NVIDIA_MODPROBE} -u -c0" in lines, (
            f"{unit_file[0]} does not run {NVIDIA_MODPROBE} -u -c0 as root (+) first"
        )
        assert f"path={NVIDIA_MODPROBE}" in props.get("ExecStartPre", ""), (
            f"systemd has not loaded {rendered.name}'s ExecStartPre (daemon-reload missing?)"
        )
    else:
        assert not [line for line in lines if NVIDIA_MODPROBE in line]


def test_what_root_later_uses_is_root_owned(th, cfg):
    """Rollback copies, records and benchmark output: a compromised server must not write them."""
    for path in (cfg.state_dir, cfg.records_dir, cfg.rollback_dir, cfg.bench_dir, cfg.venv):
        f = th.file(path)
        assert f.exists and f.user == "root" and not f.mode & 0o022, (
            f"{path} is {f.user}:{f.group} {oct(f.mode)}; "
            "it must be root's, not group/world-writable"
        )
    # nothing inside the release venv either: root runs its python (pip, benchmarks)
    theirs = run(th, f"find {cfg.venv} -user {cfg.service_user} -print -quit")
    assert not theirs.strip(), f"{theirs.strip()} in {cfg.venv} belongs to {cfg.service_user}"


def test_weights_are_roots_and_read_only_to_the_server(th, cfg):
    """Root writes the weights (downloads, refs, markers): the service user owns nothing there and
    can write nothing there; it reads them through the cache's group."""
    top = th.file(cfg.hf_home)
    assert (top.user, top.group, top.mode) == ("root", cfg.service_user, 0o750), (
        f"{cfg.hf_home} is {top.user}:{top.group} {oct(top.mode)}, "
        f"expected root:{cfg.service_user} 0o750"
    )
    quoted = shlex.quote(cfg.hf_home)
    theirs = run(th, f"find -P {quoted} ! -user root -print -quit")
    assert not theirs.strip(), f"{theirs.strip()} is not root's"
    writable = run(th, f"find -P {quoted} ! -type l -perm /022 -print -quit")
    assert not writable.strip(), f"{writable.strip()} is group/world-writable"


def test_port_listening_on_configured_address(th, cfg):
    sockets = run(th, "ss -Hltn")
    local = {line.split()[3] for line in sockets.splitlines() if line.strip()}
    wanted = (
        f"{cfg.vllm_host}:{cfg.vllm_port}"
        if ":" not in cfg.vllm_host
        else f"[{cfg.vllm_host}]:{cfg.vllm_port}"
    )
    if cfg.vllm_host == "0.0.0.0":
        wanted = f"0.0.0.0:{cfg.vllm_port}"
    assert wanted in local, f"nothing listens on {wanted}; listening: {sorted(local)}"


def test_health_and_models_answer(th, cfg):
    curl(th, cfg, "/health")
    served = [m["id"] for m in json.loads(curl(th, cfg, "/v1/models"))["data"]]
    assert served == [cfg.effective_served_name], f"/v1/models lists {served}"


def test_spec_decode_counters_present(th, cfg, rendered):
    if rendered.role != "speculative":
        pytest.skip("the host serves the baseline (speculation gate)")
    metrics = curl(th, cfg, "/metrics")
    names = set(re.findall(r"^(vllm:spec_decode_\w+?)(?:_total)?[{ ]", metrics, re.M))
    assert names, "/metrics has no vllm:spec_decode_* counters: speculation is not on"


def test_weights_present_at_pinned_revisions(th, cfg, record):
    for role, repo, revision in cfg.hub_models:
        args = " ".join(shlex.quote(a) for a in (cfg.hf_home, repo, revision))
        facts = json.loads(run(th, f"python3 -c {shlex.quote(source('model_facts'))} {args}"))
        assert facts is not None, f"{role} {repo}@{revision} is not completely in {cfg.hf_home}"
        if re.fullmatch(r"[0-9a-f]{40}", revision):
            assert facts["sha"] == revision, (
                f"{role} {repo}: snapshot {facts['sha']} is not the pin {revision}"
            )
        if record:
            assert record[role]["resolved_sha"] == facts["sha"], (
                f"record's {role} sha differs from the host's cache"
            )


def test_secret_files_root_0600(th, cfg, box_cfg):
    # the HF token is the host's (downloads are; a whole box's instances share them)
    paths = [cfg.env_file] + ([box_cfg.hf_token_file] if cfg.hf_token else [])
    for path in paths:
        f = th.file(path)
        assert f.exists, f"{path} missing"
        assert (f.user, f.group, f.mode) == ("root", "root", 0o600), (
            f"{path} is {f.user}:{f.group} {oct(f.mode)}, expected root:root 0o600"
        )


def test_secrets_only_in_the_env_file(th, cfg, unit_file, installed_argv, rendered):
    for name, value in secrets(cfg).items():
        assert value not in unit_file[1], f"{name} appears in the unit file"
        assert all(value not in word for word in installed_argv), f"{name} appears in argv"
        cmdline = run(
            th,
            f"cat /proc/$(systemctl show -p MainPID --value {rendered.name})/cmdline "
            "| tr '\\0' ' '",
        )
        assert value not in cmdline, f"{name} appears in the running process's command line"
        # searched here, not with grep on the host: a grep argument would put it in sudo's log
        journal = run(th, f"journalctl -u {rendered.name} --no-pager -o cat")
        assert value not in journal, f"{name} appears in the journal of {rendered.name}"
    if cfg.hf_token:
        assert cfg.hf_token not in unit_file[1] and cfg.hf_token not in " ".join(installed_argv)


def test_deployment_record_consistent(record, cfg, rendered, unit_file):
    assert record is not None, f"no deployment record at {cfg.record_path}"
    assert record["unit"]["name"] == rendered.name
    assert record["unit"]["argv"] == rendered.argv, argv_diff(
        record["unit"]["argv"], rendered.argv, old_name="record", new_name="rendered"
    )
    assert record["unit"]["sha256"] == hashlib.sha256(unit_file[1].encode()).hexdigest(), (
        "the unit file is not the one the deployment record describes"
    )
    assert (record["vllm"]["package"], record["vllm"]["version"]) == (
        cfg.vllm_package,
        cfg.vllm_version,
    )
    assert record["vllm"]["venv"] == cfg.venv
    assert record["target"]["model"] == cfg.target_model
    if rendered.role == "speculative":
        assert record["speculative_config"] == cfg.speculative_config
    assert serve_argv(cfg, speculative=rendered.role == "speculative") == rendered.argv

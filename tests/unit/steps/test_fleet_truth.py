"""Fleet safety after the rollout (issue 21, items 4 and 5 and the --no-wait guard): the record's
pins are what status/compare/tune/host tests use, a moving ref is never resolved again; pyinfra's
`--no-wait` is refused before any host is touched (the real pyinfra CLI); the weights tree is
root's and the download script never writes through a symlink."""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import subprocess
import sys

import pytest

from specdeploy.config import revisions
from specdeploy.config.record import read_record
from specdeploy.config.schema import config_from_data
from specdeploy.observe.status import unit_drift
from specdeploy.render.units import render_unit
from tests.unit import REPO

RECORD = REPO / "tests/unit/data/deployment-record-a83c70e.json"
DEPLOYED = "d" * 40  # what "main" meant at the rollout
MOVED = "e" * 40  # what it means now


def record_with(pins: dict, model: str = "Qwen/Qwen3-8B"):
    data = json.loads(RECORD.read_text())
    data["target"] = {"model": model, "revision": DEPLOYED, "resolved_sha": DEPLOYED}
    data["revisions"] = pins
    return read_record(data)


MAIN_PIN = {"target": {"requested": "main", "resolved": DEPLOYED, "resolved_on": "control node"}}


@pytest.fixture
def valid_data(valid_data):
    """The target on the moving "main", the draft pinned to a commit."""
    valid_data["speculative_config"]["revision"] = "a" * 40
    return valid_data


def test_the_record_answers_the_moving_ref_without_asking_the_hub(valid_data, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("a moving ref was resolved again")

    monkeypatch.setattr(revisions, "_ask_hub", no_hub)
    cfg = config_from_data(valid_data)  # target_revision = "main"
    deployed = revisions.as_deployed(cfg, record_with(MAIN_PIN))
    assert deployed.target_revision == DEPLOYED and cfg.target_revision == "main"
    # pin() on the deployed config finds no moving ref left: nothing is resolved
    assert revisions.pin(deployed) == (deployed, {})


@pytest.mark.parametrize(
    "pins, model, why",
    [
        ({}, "Qwen/Qwen3-8B", "an older record pinned nothing"),
        ({"target": {**MAIN_PIN["target"], "requested": "v2"}}, "Qwen/Qwen3-8B", "another ref"),
        (MAIN_PIN, "Qwen/Other", "another repo"),
        ({"target": {**MAIN_PIN["target"], "resolved": "main"}}, "Qwen/Qwen3-8B", "no commit"),
    ],
)
def test_a_pin_that_does_not_answer_the_host_data_is_not_applied(valid_data, pins, model, why):
    cfg = config_from_data(valid_data)
    assert revisions.recorded_pins(cfg, record_with(pins, model)) == {}, why
    assert revisions.as_deployed(cfg, record_with(pins, model)).target_revision == "main"
    assert revisions.as_deployed(cfg, None) is cfg


def test_status_sees_no_drift_on_a_moved_branch_and_drift_on_a_new_commit(valid_data):
    """The unit the rollout installed, compared the way `specdeploy status` does: with the
    record's pins it matches; a host data pin of another commit is drift on --revision."""
    cfg = config_from_data(valid_data)
    installed = render_unit(revisions.apply_pins(cfg, MAIN_PIN))
    sha1 = hashlib.sha1(installed.text.encode()).hexdigest()
    record = record_with(MAIN_PIN)
    same = unit_drift(installed.text, sha1, render_unit(revisions.as_deployed(cfg, record)))
    assert same.drift is False
    moved = config_from_data({**valid_data, "target_revision": MOVED})
    drift = unit_drift(installed.text, sha1, render_unit(revisions.as_deployed(moved, record)))
    assert drift.drift is True and drift.keys == ["--revision"]


def test_measurements_and_status_read_the_record_pins():
    """The consumers use the one helper (a new consumer that resolves refs itself would drift)."""
    uses = {
        "specdeploy/observe/status.py": "as_deployed(cfg, record)",
        "specdeploy/flows/measure.py": "host_inputs_as_deployed()",
        "tests/host/test_deployed_host.py": "as_deployed(host_cfg, read_record(record))",
    }
    for path, call in uses.items():
        assert call in (REPO / path).read_text(), path


# --- pyinfra's --no-wait ------------------------------------------------------------------------


def test_no_wait_is_refused_with_a_clear_message():
    from specdeploy.steps import rollback

    inventory, deploy = "inventories/prod.py", "deploys/serve.py"
    rollback.refuse_no_wait([inventory, deploy])  # the default run: nothing to say
    rollback.refuse_no_wait(["--serial", inventory, deploy])  # host by host: safe
    for argv in ([inventory, deploy, "--no-wait"], ["-y", "--no-wait", "--limit", "h1", inventory,
                                                   deploy]):  # fmt: skip
        with pytest.raises(rollback.NoWaitRefused) as refused:
            rollback.refuse_no_wait(argv)
        message = str(refused.value)
        assert "--no-wait" in message and "one host at a time" in message
        assert "run it without --no-wait" in message
    rollback.refuse_no_wait()  # not pyinfra's CLI (the API, a test): nothing to check


@pytest.mark.parametrize("deploy", ["deploys/serve.py", "deploys/compare.py"])
def test_the_real_pyinfra_cli_refuses_no_wait_before_touching_a_host(deploy, tmp_path):
    """`pyinfra --no-wait` on the real CLI: refused while planning, before any fact or operation
    (the inventory's host does not even exist: a connection attempt would fail differently)."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text("hosts = [('@local', {})]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(inventory), str(REPO / deploy), "--no-wait"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "--no-wait" in out and "one host at a time" in out, out[-2000:]
    assert "host data invalid" not in out and "vllm_version" not in out, out[-2000:]


# --- root never trusts what the service user can write --------------------------------------------

FETCH = runpy.run_path(str(REPO / "specdeploy/host/scripts/fetch_weights.py"))


def test_the_download_script_replaces_a_planted_link_and_never_follows_it(tmp_path):
    hub = tmp_path / "hub"
    refs = hub / "models--org--m" / "refs"
    refs.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    (refs / "main").symlink_to(victim)  # planted at the name root writes
    FETCH["write_no_follow"](str(refs), "main", "a" * 40, str(hub))
    assert victim.read_text() == "root's file\n"
    assert not (refs / "main").is_symlink() and (refs / "main").read_text() == "a" * 40
    assert sorted(p.name for p in refs.iterdir()) == ["main"]  # no temp file left


def test_the_download_script_refuses_a_linked_directory_on_the_way(tmp_path):
    hub = tmp_path / "hub"
    elsewhere = tmp_path / "etc"
    (elsewhere / "refs").mkdir(parents=True)
    hub.mkdir()
    (hub / "models--org--m").symlink_to(elsewhere)  # the repo dir points out of the cache
    with pytest.raises(SystemExit) as refused:
        FETCH["write_no_follow"](str(hub / "models--org--m" / "refs"), "main", "x", str(hub))
    assert "symbolic link" in str(refused.value) and "refusing" in str(refused.value)
    assert not (elsewhere / "refs" / "main").exists()
    with pytest.raises(SystemExit):
        FETCH["refuse_links"](str(tmp_path / "other"), str(hub))  # outside the cache


def test_the_unit_lets_the_server_write_only_its_home(valid_data):
    cfg = config_from_data(valid_data)
    lines = render_unit(cfg).text.splitlines()
    assert f"ReadWritePaths={cfg.server_home}" in lines
    assert f"ReadOnlyPaths={cfg.hf_home}" in lines


class FindHost:
    """The three Find* facts of the HF cache, as `find ! -user root` would answer them."""

    def __init__(self, foreign: dict[str, list[str]]):
        self.foreign, self.asked, self.noops = foreign, [], []

    def get_fact(self, fact, **kwargs):
        self.asked.append((fact.__name__, kwargs["args"]))
        return self.foreign.get(fact.__name__, [])

    def noop(self, description):
        self.noops.append(description)


def test_a_root_owned_cache_schedules_nothing_and_a_foreign_entry_is_taken_back(
    monkeypatch, valid_data
):
    from specdeploy.steps import weights

    cfg = config_from_data(valid_data)
    shells: list[list[str]] = []
    monkeypatch.setattr(weights.server, "shell", lambda name, commands: shells.append(commands))
    fake = FindHost({})
    monkeypatch.setattr(weights, "host", fake)
    weights.weights_are_roots._inner(cfg)
    assert shells == []  # the no-change path
    assert fake.noops == [f"every entry under {cfg.hf_home} is root's and closed to others"]
    asked = sorted((name, tuple(args)) for name, args in fake.asked)
    assert asked == sorted(
        [(kind, ("!", "-user", "root")) for kind in ("FindDirectories", "FindFiles", "FindLinks")]
        + [(kind, ("-perm", "/022")) for kind in ("FindDirectories", "FindFiles")]
    )
    fake = FindHost({"FindLinks": [f"{cfg.hf_home}/hub/models--x/snapshots/s/config.json"]})
    monkeypatch.setattr(weights, "host", fake)
    weights.weights_are_roots._inner(cfg)
    assert shells == [
        [
            f"find -P {cfg.hf_home} -mindepth 1 ! -user root -exec chown -h root:root {{}} +",
            f"find -P {cfg.hf_home} -mindepth 1 ! -type l -perm /022 -exec chmod go-w {{}} +",
        ]
    ]


def test_the_download_script_leaves_no_lock_file_writable_by_others(tmp_path):
    locks = tmp_path / ".locks" / "models--org--m"
    locks.mkdir(parents=True)
    lock = locks / "abc.lock"
    lock.write_text("")
    lock.chmod(0o666)  # as filelock leaves it (seen on the sandbox host)
    (locks / "link.lock").symlink_to(tmp_path / "elsewhere")
    FETCH["not_writable_by_others"](str(tmp_path / ".locks"))
    assert lock.stat().st_mode & 0o777 == 0o644


# --- the measurement watchdog ---------------------------------------------------------------------

FAKE_SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$LOG"
if [ "$1" = list-units ]; then cat "$UNITS"; fi
"""
FAKE_SYSTEMD_RUN = """#!/bin/sh
echo "systemd-run $*" >> "$LOG"
for a in "$@"; do case "$a" in --unit=*) echo "${a#--unit=}.timer loaded active waiting x" \
    >> "$UNITS";; esac; done
"""


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """server.sh runs its commands here, against a systemctl/systemd-run that log their argv and
    list the timers systemd-run started (the real ones: test_status_prometheus, on the sandbox)."""
    from specdeploy.host import watchdog

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("systemd-run", FAKE_SYSTEMD_RUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log, units = tmp_path / "log", tmp_path / "units"
    units.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log),
           "UNITS": str(units)}  # fmt: skip

    def sh(command, check=True, **kwargs):
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
        assert done.returncode == 0 or not check, done.stderr
        return done.stdout

    monkeypatch.setattr(watchdog, "sh", sh)
    return watchdog, log


def test_the_watchdog_is_renewed_without_a_gap_and_removed_at_the_end(fake_systemd, valid_data):
    watchdog, log = fake_systemd
    cfg = config_from_data(valid_data)
    first = watchdog.arm_watchdog(cfg, "specdeploy-vllm.service", 1234)
    assert first.startswith("specdeploy-vllm-measure-watchdog-") and first.endswith(".timer")
    run_line = [line for line in log.read_text().splitlines() if line.startswith("systemd-run")]
    assert len(run_line) == 1 and "--on-active=1234s" in run_line[0]
    assert "AccuracySec=1s" in run_line[0] and "--collect" in run_line[0]
    second = watchdog.arm_watchdog(cfg, "specdeploy-vllm.service", 1234)
    lines = log.read_text().splitlines()
    started = lines.index(next(line for line in lines[2:] if line.startswith("systemd-run")))
    stopped = lines.index(f"systemctl stop {first}")
    assert started < stopped  # the new timer runs before the old one goes: never none
    assert f"systemctl stop {second}" not in lines
    watchdog.disarm_watchdog(cfg)
    assert f"systemctl stop {second}" in log.read_text().splitlines()


def test_the_watchdog_restores_the_deployed_unit_and_removes_the_measurement(valid_data):
    from specdeploy.host import watchdog

    cfg = config_from_data(valid_data)
    script = watchdog.watchdog_script(cfg, "specdeploy-vllm.service")
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    steps = [step.strip() for step in script.split(" && ")]
    measure = "specdeploy-vllm-measure.service"
    assert steps.index(f"(systemctl stop {measure} || true)") < steps.index(
        "systemctl start specdeploy-vllm.service"
    )
    assert f"rm -f /etc/systemd/system/{measure}" in steps
    assert "$" not in script and "%" not in script  # systemd would expand them in ExecStart
    # systemd-run writes the command into the unit file; a daemon-reload re-reads ";" as "\\;"
    assert "'" not in script and '"' not in script and ";" not in script


def test_the_watchdog_readmits_the_drained_instance_last(valid_data):
    """Issue 36 item 7: a control node that dies while an instance of a box is drained leaves it
    in MAINT for good unless the watchdog puts it back `ready` (its /health check decides), after
    the deployed unit is started; in the same quote- and ";"-free form systemd keeps intact."""
    from specdeploy.host import watchdog

    cfg = config_from_data(valid_data)
    script = watchdog.watchdog_script(
        cfg, "specdeploy-vllm-1.service", ("/run/specdeploy-vllm-haproxy.sock", "specdeploy-vllm-1")
    )
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    steps = [step.strip() for step in script.split(" && ")]
    assert steps[-2] == "systemctl start specdeploy-vllm-1.service"
    assert steps[-1] == (
        "echo set server instances/specdeploy-vllm-1 state ready | socat -t 5 stdio "
        "UNIX-CONNECT:/run/specdeploy-vllm-haproxy.sock"
    )
    assert "'" not in script and '"' not in script and ";" not in script and "$" not in script
    single = watchdog.watchdog_script(cfg, "specdeploy-vllm.service")
    assert "socat" not in single  # a single server has no balancer to tell


def test_the_watchdog_time_covers_one_sample_or_the_host_data(valid_data):
    from specdeploy.host.bench import bench_time_limit
    from specdeploy.host.server import WARM_UP_TIMEOUT_S
    from specdeploy.measure.harness import WATCHDOG_GRACE_S, watchdog_seconds

    cfg = config_from_data(valid_data)
    one_sample = cfg.health_timeout_s + WARM_UP_TIMEOUT_S + bench_time_limit(cfg, cfg.workload)
    assert watchdog_seconds(cfg, cfg.workload) == one_sample + WATCHDOG_GRACE_S
    assert watchdog_seconds(cfg) == cfg.health_timeout_s + WATCHDOG_GRACE_S  # the restore
    short = config_from_data({**valid_data, "measure_watchdog_s": 45})
    assert watchdog_seconds(short, short.workload) == watchdog_seconds(short) == 45

"""`specdeploy status INVENTORY`: what every host serves right now, changing nothing.

Per host, in parallel, within a bounded time: reachable (and why not); the venv's vLLM version
vs the pin; the installed unit vs the one the host data renders now (argv diff key by key, the
secrets env file changed or not, a unit edited on disk but not reloaded), vs the one the deployment
record verified (its sha256, as the deploy tests it: host/server.unverified_unit) and vs the
process that runs (started before the unit file changed: a turn cut off after its swap); service
state, since when, restarts; the deployment record (time, role, k, smoke TPOT); live figures from
two /metrics scrapes `interval` seconds apart (metrics.live_figures); GPU memory used (nvidia-smi,
if any).
A whole box (host data `instances`): the same per instance, and its balancer (status_box.py).

Every read on a host is a pyinfra fact over pyinfra's own connection, so `_sudo`/`_su_user` and the
SSH settings in host data apply as they do for a deploy. The API key (host data `vllm_api_key`)
reaches curl on its stdin as curl config (`-K -`), never on a command line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
import time
from datetime import UTC

from specdeploy.checks.host_data import ConfigError, check_config
from specdeploy.checks.live import class_hosts, inventory_configs
from specdeploy.config.inventory import limit_hosts, load_inventory
from specdeploy.config.record import DeploymentRecord, SmokeSummary, service_record
from specdeploy.config.revisions import as_deployed
from specdeploy.decide.load_rule import batch_outside_proven, proof_range, schedule_standing
from specdeploy.decide.metrics import live_figures
from specdeploy.host.facts.files import FileSha1, FileText, JsonFile
from specdeploy.host.facts.http import HttpGet
from specdeploy.host.facts.nvidia import CudaBoot, GpuMemory
from specdeploy.host.facts.systemd import ServiceShow
from specdeploy.host.facts.vllm import VllmVersion
from specdeploy.host.server import NEVER_VERIFIED, curl_config, unverified_unit
from specdeploy.observe.live_verdict import judge_names, live_summary, status_lines
from specdeploy.observe.rows import (
    GateSummary,
    HealthCheck,
    HostStatus,
    LiveFigures,
    RecordSummary,
    ServerStatus,
    ServiceStatus,
    UnitDrift,
    UnitStatus,
    VllmStatus,
)
from specdeploy.observe.status_table import format_table
from specdeploy.render.argv import argv_diff, unit_exec_argv
from specdeploy.render.control import arm_of
from specdeploy.render.units import render_env_file, render_unit
from specdeploy.steps.gate import gate_settled_unit

DEFAULT_TIMEOUT = 30.0  # seconds per host, connect + every read + the scrape interval
DEFAULT_INTERVAL = 5.0  # seconds between the two /metrics scrapes

# --------------------------------------------------------------------------------------------------
# Drift


def changed_keys(diff: str) -> list[str]:
    """The flags (and --speculative-config keys) an argv diff from rollout.argv_diff touches."""
    keys: list[str] = []
    for line in diff.splitlines():
        if line[:1] not in "+-" or line.startswith(("+++ ", "--- ")):  # not the file headers
            continue
        words = line[1:].split(" ", 1)
        key = words[0]
        if key in ("--speculative-config", "-sc") and len(words) > 1:
            key = f"{key}.{words[1].split('=', 1)[0]}"
        if key not in keys:
            keys.append(key)
    return keys


def unit_drift(installed_text: str | None, installed_sha1: str | None, expected) -> UnitDrift:
    """Compare the unit installed on a host (its text and sha1) with the RenderedUnit the host data
    renders now."""
    if installed_sha1 is None:
        return UnitDrift(installed=False, drift=True, keys=[], argv_diff="", other=False)
    same = installed_sha1 == hashlib.sha1(expected.text.encode()).hexdigest()
    diff = "" if same else argv_diff(unit_exec_argv(installed_text), expected.argv)
    return UnitDrift(
        installed=True,
        drift=not same,
        keys=changed_keys(diff),
        argv_diff=diff,
        other=not same and not diff,
    )


# A unit file's modification time (mtime, whole seconds) against its main process's start (systemd's
# monotonic stamp, put on the host's clock through its uptime): two clocks, read a moment apart and
# rounded, so a restart right after the swap may seem up to this much earlier than the swap.
CLOCK_SLACK_S = 2.0


def started_before_change(show: dict, changed: float | None) -> bool | None:
    """Whether the unit's running main process started before its unit file last changed
    (`changed`, seconds since the epoch): then what runs is not what is installed. `show`: the
    ServiceShow fact (its monotonic stamp, the host's uptime and clock). None where that is not
    known: the unit is not running, systemd did not say, or no change time."""
    if show.get("ActiveState") != "active" or show.get("MainPID", "0") in ("", "0"):
        return None
    try:
        started = int(show["ExecMainStartTimestampMonotonic"]) / 1e6
        uptime, now = float(show["Uptime"]), float(show["Now"])
    except (KeyError, ValueError):
        return None
    if not started or changed is None:
        return None
    return now - (uptime - started) < changed - CLOCK_SLACK_S


def _changed_at(stat) -> float | None:
    """When the unit's content was last written (seconds since the epoch) from pyinfra's File fact
    (naive UTC), or None. The modification time, not the inode's change time: the swap is `cp -p`
    of the staged file and a `mv`, so it keeps the staging time (before the restart), and putting
    the same file back (`cp -p` … `mv`) is no change, while any edit of the content is one."""
    mtime = stat.get("mtime") if isinstance(stat, dict) else None
    return mtime.replace(tzinfo=UTC).timestamp() if mtime else None


# --------------------------------------------------------------------------------------------------
# One host


def ssh_target(host) -> str:
    """user@address:port as the SSH connector reaches the host (for messages)."""
    data = host.data
    user = getattr(data, "ssh_user", None)
    port = getattr(data, "ssh_port", None) or 22
    address = getattr(data, "ssh_hostname", None) or host.name
    return f"{user + '@' if user else ''}{address}:{port}"


def _age(show: dict) -> float | None:
    try:
        entered = int(show.get("ActiveEnterTimestampMonotonic", "0")) / 1e6
        uptime = float(show["Uptime"])
    except (KeyError, ValueError):
        return None
    return round(uptime - entered, 1) if entered else None


def _record_summary(record: DeploymentRecord | None) -> RecordSummary | None:
    if record is None:
        return None
    smoke = record.smoke or SmokeSummary()
    gate = record.gate
    return RecordSummary(
        finished_at=record.finished_at,
        role=record.role,
        k=record.k,
        smoke_tpot_ms=smoke.median_tpot_ms,
        smoke_itl_ms=smoke.median_itl_ms,
        smoke_acceptance_rate=smoke.spec_decode_acceptance_rate,
        vllm_version=record.vllm.version,
        unit_sha256=record.unit.sha256,
        gate=GateSummary(gate.passed, gate.reason) if gate is not None else None,
        validated_by=record.validated_by.authority if record.validated_by else None,
        schedule=schedule_standing(record.speculative_config, record.schedule_proof),
    )


class HostProbe:
    """Reads one host; keeps its last /metrics text so `--watch` needs one scrape per round."""

    def __init__(self, state, host, interval: float):
        self.state, self.host, self.interval = state, host, interval
        self.last_scrape: dict[str, tuple[float, str | None]] = {}  # per server URL
        self.step = "connecting"

    def fact(self, cls, **kwargs):
        from pyinfra.api.facts import get_fact

        # apply_failed_hosts=False: a fact that cannot be read is reported; the host is not failed
        # (each fact's default, facts.Fact, where the command printed nothing or failed)
        return get_fact(self.state, self.host, cls, kwargs=kwargs, apply_failed_hosts=False)

    def scrape(self, cfg) -> tuple[float, str | None]:
        got = self.fact(HttpGet, url=f"{cfg.base_url}/metrics", timeout=10, _stdin=curl_config(cfg))
        ok = got["exit"] == 0 and got["http"] == 200
        return time.monotonic(), got["body"] if ok else None

    def class_arm(self, cfg, problems: list[str]) -> str:
        """The unit a plain host's data plans for it: the baseline on a control host of its class
        (render/control.py), else speculative; a class its checks refuse is said as a problem."""
        try:
            peers = class_hosts(self.host.name, self.state and self.state.inventory)
        except ConfigError as error:
            problems.append(f"control class invalid: {str(error).splitlines()[0]}")
            return "speculative"
        return arm_of(cfg, peers, self.host.name, "speculative")

    def prime(self, cfgs: list) -> None:
        """A first /metrics scrape of each server that has none from the last round, then one
        interval for all of them (a whole box's instances share it)."""
        new = [c for c in cfgs if c.base_url not in self.last_scrape]
        for c in new:
            self.last_scrape[c.base_url] = self.scrape(c)
        if new:
            time.sleep(self.interval)

    def read_server(self, cfg, problems: list[str], role: str = "speculative") -> ServerStatus:
        """One server (the host's, or one instance of a whole box): its record, unit drift,
        service, /health and live figures (its problems onto `problems`). `role`: the unit the
        host data plans for it (a box's control arm: the baseline)."""
        from pyinfra.facts.files import File, Sha1File, Sha256File

        host = self.host
        record = service_record(cfg, lambda path: self.fact(JsonFile, path=path), host=host.name)
        if record is None:
            problems.append(f"no deployment record at {cfg.record_path}")
        # moving refs at the commits the rollout pinned: upstream moving on is not drift
        cfg = as_deployed(cfg, record)
        # the CUDA unit renders from the host's CudaBoot fact, read here and passed in
        boot = self.fact(CudaBoot) if cfg.vllm_package == "vllm" else None
        if record is not None and record.live_fallback:  # the autopilot rolled it to baseline
            role = "baseline"
        expected = gate_settled_unit(cfg, render_unit(cfg, role, cuda_boot=boot), record)
        path = cfg.unit_path(expected.name)
        drift = unit_drift(self.fact(FileText, path=path), self.fact(Sha1File, path=path), expected)
        # the record's unit as the deploy tests it (host/server.unverified_unit); None: nothing to
        # compare (no record, no unit, or the record serves with the other one)
        installed_sha256 = self.fact(Sha256File, path=path) if drift.installed else None
        verified = None
        if record is not None and record.unit.name == expected.name and installed_sha256:
            verified = not unverified_unit(expected.name, installed_sha256, record.unit)
        env_sha = self.fact(FileSha1, path=cfg.env_file)
        env_file = env_sha != hashlib.sha1(render_env_file(cfg).encode()).hexdigest()
        if env_sha in ("missing", "unreadable"):
            env_file = env_sha
        if not drift.installed:
            problems.append(f"{path} is not installed")
        elif drift.drift:
            what = ", ".join(drift.keys) if drift.keys else "lines outside ExecStart"
            problems.append(f"unit drift: {path} differs from the host data ({what})")
        if verified is False:
            problems.append(
                f"{path}: {NEVER_VERIFIED} (sha256 {installed_sha256[:12]}; "
                f"the record verified {record.unit.sha256[:12]})"
            )
        if env_file == "unreadable":
            problems.append(
                f"{cfg.env_file} (root-only) is unreadable: set _sudo in host data to read it"
            )
        elif env_file == "missing":
            problems.append(f"{cfg.env_file} is missing")
        elif env_file:
            problems.append(f"{cfg.env_file} differs from the host data (values not shown)")

        self.step = "reading the service"
        show = self.fact(ServiceShow, unit=expected.name)
        service = ServiceStatus(
            active=show.get("ActiveState"),
            sub=show.get("SubState"),
            enabled=show.get("UnitFileState"),
            since=show.get("ActiveEnterTimestamp") or None,
            seconds=_age(show),
            restarts=int(show["NRestarts"]) if show.get("NRestarts", "").isdigit() else None,
            main_pid=int(show["MainPID"]) if show.get("MainPID", "").isdigit() else None,
            needs_daemon_reload=show.get("NeedDaemonReload") == "yes",
        )
        if service.active != "active":
            problems.append(f"{expected.name} is {service.active} ({service.sub})")
        if service.needs_daemon_reload:
            problems.append(f"{path} changed on disk; systemd still runs the old one")
        before = None  # the process that runs is older than the unit installed (never restarted)
        if drift.installed and service.active == "active" and service.main_pid:
            before = started_before_change(show, _changed_at(self.fact(File, path=path)))
        if before:
            problems.append(f"{expected.name} still runs the process started before {path} changed")
        unit = UnitStatus.of(
            expected.name,
            expected.role,
            drift,
            env_file,
            verified=verified,
            started_before_change=before,
        )

        self.step = "checking /health and scraping /metrics"
        url = cfg.base_url
        auth = curl_config(cfg)  # the API key header, on curl's stdin
        got = self.fact(HttpGet, url=f"{url}/health", timeout=5, _stdin=auth)
        health = HealthCheck(
            http=got["http"], error=None if got["exit"] == 0 else got["body"][-300:]
        )
        if got["http"] != 200:
            problems.append(f"{url}/health: {got['http'] or got['body'][-200:] or 'no answer'}")

        before = self.last_scrape.get(url) or (time.monotonic(), None)
        now = self.scrape(cfg)
        if now[1] is not None:
            self.last_scrape[url] = now
        else:
            self.last_scrape.pop(url, None)
        live = None
        if now[1] is None:
            problems.append(f"{url}/metrics could not be scraped")
        else:
            seconds = round(now[0] - before[0], 2)
            live = LiveFigures(
                window=live_figures(before[1], now[1], seconds) if before[1] else None,
                since_start=live_figures(None, now[1], None),
            )
            if expected.role == "speculative" and not live.since_start["speculative"]:
                problems.append("/metrics has no vllm:spec_decode_* counters: speculation is off")
            outside = batch_outside_proven(  # a schedule its proof proves up to its top level
                proof_range(record.schedule_proof if record else None),
                live.since_start.get("requests_running"),
            )
            if outside and expected.role == "speculative":
                problems.append(outside)
        return ServerStatus(
            record=_record_summary(record),
            unit=unit,
            service=service,
            health=health,
            live=live,
            healthy=service.active == "active" and got["http"] == 200 and live is not None,
            matches_unit=not drift.drift and not env_file,
        )

    def read(self) -> HostStatus:
        from pyinfra.api.exceptions import ConnectError

        host = self.host
        row = HostStatus(host=host.name, groups=sorted(host.groups))
        problems = row.problems
        try:
            cfg = check_config(host.name, host.data.dict())
        except ConfigError as error:
            cfg = None
            problems.append(f"host data invalid: {str(error).splitlines()[0]}")
        self.step = "connecting"
        try:
            host.connect(show_errors=False, raise_exceptions=True)
        except ConnectError as error:
            row.reachable = False
            row.why = f"{ssh_target(host)}: {error.args[0] if error.args else error}"
            problems.append(f"unreachable: {row.why}")
            return row
        row.reachable = True
        if cfg is None:
            return row

        self.step = "reading the install and unit"
        installed = self.fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package)
        row.vllm = VllmStatus(cfg.vllm_package, pinned=cfg.vllm_version, installed=installed)
        if installed != cfg.vllm_version:
            problems.append(
                f"{cfg.vllm_package} in {cfg.venv} is {installed}, pinned {cfg.vllm_version}"
            )

        if cfg.instances is None:
            self.prime([cfg])
            row.server = self.read_server(cfg, problems, role=self.class_arm(cfg, problems))
            row.healthy, row.matches_unit = row.server.healthy, row.server.matches_unit
        else:  # a whole box: one entry per instance, and the balancer (status_box.py)
            from specdeploy.observe.status_box import read_box

            read_box(self, cfg, row)
        self.step = "reading GPU memory"
        row.gpu = row.gpu or self.fact(GpuMemory)
        row.matches_data = installed == cfg.vllm_version and row.matches_unit
        return row


# --------------------------------------------------------------------------------------------------
# The fleet


class Fleet:
    """The inventory as pyinfra loads it (host data, group_data, SSH settings); a probe per host."""

    def __init__(
        self,
        inventory_path: str,
        *,
        limit: list[str] | None = None,
        group_data: list[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        interval: float = DEFAULT_INTERVAL,
    ):
        from pyinfra.api import Config, State

        if timeout <= interval:
            raise ValueError(
                f"--timeout ({timeout}s) must be longer than --interval ({interval}s), the wait "
                "between the two /metrics scrapes — raise --timeout or lower --interval"
            )
        self.timeout, self.interval = timeout, interval
        state = State(check_for_changes=False)
        inventory = load_inventory(inventory_path, group_data, state=state)
        state.init(inventory, Config(CONNECT_TIMEOUT=max(1, int(min(10, timeout / 2)))))
        chosen = limit_hosts([(h.name, list(h.groups)) for h in inventory], limit, inventory_path)
        hosts = [h for h in inventory if h.name in chosen]
        self.state = state
        self.probes = [HostProbe(state, h, interval) for h in hosts]

    def inventory(self):
        """pyinfra's inventory of the fleet (every host, whatever --limit picks)."""
        return self.state.inventory

    def _one(self, probe: HostProbe) -> HostStatus:
        import gevent

        started = time.monotonic()
        name, groups = probe.host.name, sorted(probe.host.groups)
        try:
            with gevent.Timeout(self.timeout):
                result = probe.read()
        except gevent.Timeout:
            connected = bool(probe.host.connected) and probe.step != "connecting"
            why = f"no answer within {self.timeout:g}s while {probe.step}"
            if probe.step == "connecting":
                why = f"{ssh_target(probe.host)}: {why}"
            result = HostStatus(name, groups, reachable=connected, problems=[why])
            if not connected:
                result.why = why
                result.problems = [f"unreachable: {why}"]
            probe.host.connected = False  # reconnect from scratch next round
            probe.last_scrape = {}
        except Exception as error:  # a report, never a traceback
            result = HostStatus(
                name,
                groups,
                reachable=bool(probe.host.connected),
                problems=[f"status failed while {probe.step}: {type(error).__name__}: {error}"],
            )
        result.ok = bool(result.reachable) and not result.problems
        result.checked_in_s = round(time.monotonic() - started, 1)
        return result

    def round(self) -> list[HostStatus]:
        """Read every host in parallel; each within `timeout` seconds."""
        import gevent

        self.greenlets = [gevent.spawn(self._one, probe) for probe in self.probes]
        gevent.joinall(self.greenlets)
        return [g.value for g in self.greenlets]


# --------------------------------------------------------------------------------------------------
# Output


def run_status(
    inventory: str,
    *,
    limit: list[str] | None = None,
    group_data: list[str] | None = None,
    as_json: bool = False,
    watch: float | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    out=sys.stdout,
) -> int:
    """`specdeploy status`: exit 0 only when every host is reachable, healthy, as its data says."""
    import gevent
    import gevent.event

    if os.environ.get("SPECDEPLOY_DEBUG") != "1":
        for name in ("pyinfra", "paramiko"):  # failures are in the report, not in log lines
            logging.getLogger(name).setLevel(logging.CRITICAL)
    fleet = Fleet(inventory, limit=limit, group_data=group_data, timeout=timeout, interval=interval)
    code = 1
    stop = gevent.event.Event()

    def interrupted():  # Ctrl-C: stop now, without gevent's KeyboardInterrupt report
        stop.set()
        gevent.killall(getattr(fleet, "greenlets", []), block=False)

    gevent.signal_handler(signal.SIGINT, interrupted)
    try:
        while not stop.is_set():
            results = fleet.round()
            if stop.is_set():
                break
            code = 0 if results and all(row.ok for row in results) else 1
            # a box with a control arm, or a host of a control class: its judge's latest verdict
            configs = inventory_configs(fleet.inventory())
            if as_json:
                rows = [row.to_json() for row in results]
                for row in rows:
                    (judge,) = judge_names([row.get("host", "")], configs)
                    if (live := live_summary(judge)) is not None:
                        row["live_verdict"] = live
                print(
                    json.dumps(rows, indent=None if watch else 2, default=str),
                    file=out,
                    flush=True,
                )
            else:
                if watch and out.isatty():
                    print("\033[H\033[2J", end="", file=out)
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                print(f"specdeploy status {inventory}  {stamp}", file=out)
                print(format_table(results), file=out, flush=True)
                for line in status_lines(judge_names([row.host for row in results], configs)):
                    print(line, file=out, flush=True)
            if not watch:
                return code
            stop.wait(watch)
    except KeyboardInterrupt:
        pass
    return code

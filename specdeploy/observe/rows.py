"""`specdeploy status`'s rows: what status.py (and status_box.py) read on a host, and what the table
(status_table.py) and `--json` show. One `HostStatus` per host; a host with one server carries it
as `server`, a whole box one `InstanceStatus` per instance and its `BalancerStatus`.

`HostStatus.to_json()` is the `--json` object, key for key as it has always been: a key is there
only when status got as far as reading it (an unreachable host has `why` and no `vllm`; a single
server's figures sit on the host's own object; a whole box lists `instances` and `balancer`), and
`matches_unit` shows on a host's object only where its vLLM is not the pinned one (the dict this
replaced kept that key only there).
The live figures (`LiveFigures.window`/`since_start`) stay decide.metrics.live_figures' dicts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

# a file status compares with what the host data renders: differs (True), the same (False), or
# could not be compared
FileDrift = bool | Literal["missing", "unreadable"]


@dataclass
class UnitDrift:
    """The unit installed on a host against the one its host data renders now
    (status.unit_drift)."""

    installed: bool
    drift: bool
    keys: list[str]  # the flags (and --speculative-config keys) the argv diff touches
    argv_diff: str
    other: bool  # the file differs outside ExecStart (Environment=, hardening, ...)


@dataclass
class UnitStatus:
    """A server's unit: its name and role, its drift from the host data (UnitDrift's fields), its
    env file's, and whether it is what the deployment record verified and what runs. `drift` is
    any of them: the installed unit differs from the host data, is not the one the record
    verified, or started no process yet (an interrupted turn, swapped in after the running server
    started)."""

    name: str
    role: str
    installed: bool
    drift: bool
    keys: list[str]
    argv_diff: str
    other: bool
    env_file: FileDrift  # the secrets env file (its values are never shown)
    # the installed unit is the one the record verified (its sha256); None: nothing to compare
    # (no record, the unit not installed, or the record names another unit)
    verified: bool | None = None
    # the running main process started before the unit file last changed; None: not known
    started_before_change: bool | None = None

    @classmethod
    def of(
        cls,
        name: str,
        role: str,
        drift: UnitDrift,
        env_file: FileDrift,
        *,
        verified: bool | None = None,
        started_before_change: bool | None = None,
    ) -> UnitStatus:
        unit = cls(name, role, **asdict(drift), env_file=env_file)
        unit.verified, unit.started_before_change = verified, started_before_change
        unit.drift = drift.drift or verified is False or started_before_change is True
        return unit


@dataclass
class ServiceStatus:
    """systemd's view of a unit (`systemctl show`); None where it did not say."""

    active: str | None = None
    sub: str | None = None
    enabled: str | None = None
    since: str | None = None
    seconds: float | None = None  # in this state for
    restarts: int | None = None
    main_pid: int | None = None
    needs_daemon_reload: bool = False


@dataclass
class HealthCheck:
    """GET /health: the HTTP status (None: no answer) and curl's error when it failed."""

    http: int | None = None
    error: str | None = None


@dataclass
class LiveFigures:
    """decide.metrics.live_figures over two /metrics scrapes (`window`, None without a first one)
    and over the server's whole life (`since_start`)."""

    window: dict[str, Any] | None = None
    since_start: dict[str, Any] = field(default_factory=dict)


@dataclass
class GateSummary:
    passed: bool | None = None
    reason: str | None = None


@dataclass
class RecordSummary:
    """What status shows of the deployment record."""

    finished_at: str | None = None
    role: str | None = None
    k: int | None = None
    smoke_tpot_ms: float | None = None
    smoke_itl_ms: float | None = None
    smoke_acceptance_rate: float | None = None
    vllm_version: str | None = None
    unit_sha256: str | None = None
    gate: GateSummary | None = None
    validated_by: str | None = None  # what stood behind the unit's argv (ValidatedBy.authority)
    schedule: str | None = None  # a schedule's evidence: proven (where) or unproven (why)


@dataclass
class ServerStatus:
    """One vLLM server (the host's, or one instance of a whole box) as HostProbe.read_server read
    it."""

    record: RecordSummary | None = None
    unit: UnitStatus | None = None
    service: ServiceStatus | None = None
    health: HealthCheck | None = None
    live: LiveFigures | None = None  # None: /metrics could not be scraped
    healthy: bool = False  # active, /health 200, /metrics scraped
    matches_unit: bool = False  # the unit and env file are what the host data renders

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class InstanceStatus:
    """One instance of a whole box: where it serves, its server, its problems (said once more on
    the host, prefixed with its name)."""

    name: str
    port: int
    devices: str  # "GPUs 0,1", "cores 0-3"
    problems: list[str]
    server: ServerStatus
    gpu: list[dict[str, Any]] | None = None  # its GPUs' memory (GpuMemory); None: a CPU instance

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "port": self.port, "devices": self.devices}
        out |= {"problems": self.problems, **self.server.to_json()}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        return out


@dataclass
class BackendServer:
    """One backend of the balancer as HAProxy's `show stat` lists it."""

    status: str | None = None
    check_status: str | None = None
    check_desc: str | None = None
    scur: str | None = None
    lastchg: str | None = None


BACKEND_FIELDS = tuple(f.name for f in fields(BackendServer))  # the columns of `show stat` kept


@dataclass
class BalancerStatus:
    """A whole box's local balancer (status_box.read_balancer)."""

    unit: str
    active: str | None
    restarts: int | None
    since: str | None
    health: int | None  # GET /health on vllm_port through it: the HTTP status
    stat: str  # the admin socket's answer: "ok", "missing", "failed"
    servers: dict[str, BackendServer]
    up: int
    total: int
    config_drift: FileDrift
    healthy: bool = False  # active, /health 200, no backend down

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VllmStatus:
    package: str
    pinned: str
    installed: str | None  # None: no vLLM in the venv


@dataclass
class HostStatus:
    """One host's row of `specdeploy status`. `vllm` is None until status got past connecting
    with valid host data; then exactly one of `server` (one server) or `instances` (a whole box,
    with `balancer`) is set, and `gpu`, `healthy`, `matches_data`."""

    host: str
    groups: list[str]
    reachable: bool | None = None
    problems: list[str] = field(default_factory=list)
    why: str | None = None  # unreachable: why
    vllm: VllmStatus | None = None
    server: ServerStatus | None = None
    instances: list[InstanceStatus] | None = None
    balancer: BalancerStatus | None = None
    gpu: list[dict[str, Any]] | None = None  # GpuMemory: used/total per GPU
    healthy: bool | None = None
    matches_unit: bool | None = None  # units (and a box's balancer config) as rendered
    matches_data: bool | None = None  # that, and vLLM as pinned
    ok: bool = False  # reachable and no problem (Fleet sets it)
    checked_in_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The `--json` object of this host."""
        out: dict[str, Any] = {"host": self.host, "groups": self.groups}
        out |= {"reachable": self.reachable, "problems": self.problems}
        if self.why is not None:
            out["why"] = self.why
        if self.vllm is not None:
            out["vllm"] = asdict(self.vllm)
            unpinned = self.vllm.installed != self.vllm.pinned
            if self.instances is None:  # one server: its figures on the host's own object
                server = self.server.to_json() if self.server else {}
                if not unpinned:
                    server.pop("matches_unit", None)
                out |= {**server, "gpu": self.gpu}
            else:
                out |= {
                    "gpu": self.gpu,
                    "instances": [member.to_json() for member in self.instances],
                    "balancer": self.balancer.to_json() if self.balancer else None,
                    "healthy": self.healthy,
                }
                if unpinned:
                    out["matches_unit"] = self.matches_unit
            out["matches_data"] = self.matches_data
        return out | {"ok": self.ok, "checked_in_s": self.checked_in_s}

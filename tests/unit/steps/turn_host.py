"""A STAND-IN host for the turn's property tests (tests/unit/steps/test_turn_machine.py): systemd,
the unit and record files and a whole box's balancer, as the server lifecycle (host/server.py) sees
them, with every call a step boundary where a failure or a kill of the control node can be
injected.

The real rolling restart runs on it: steps/rollback.roll_servers, verify_or_rollback, the turn
(steps/turn.py), verify.verify_and_record, the speculation gate (steps/gate.py: its arms through
steps/sampling.Sampler), steps/unit.UnitChange.apply. Only what talks to the host is replaced:
host/server.py's lifecycle calls (a model of systemd below: units start, hold their port, fail
when their config is bad or their port is taken), the smoke benchmark, the gate's benchmark runs
(a recorded vLLM bench JSON with a drawn TPOT), the record's write, the lock's renewal. Planning
(`plan`) does what flows/serve.py's planning does to a host: keep the current unit for rollback,
stage the new one, decide what needs its turn, from the host's state."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

from specdeploy.config.record import BenchResult, GateDecision, UnitRef
from specdeploy.config.schema import ServeConfig
from specdeploy.host import server
from specdeploy.host.on_host import HostCommandError
from specdeploy.render import instances
from specdeploy.render.argv import flag_value, unit_exec_argv
from specdeploy.render.instances import instance_of_unit
from specdeploy.render.units import render_unit
from specdeploy.sampling import sampler as sampling
from specdeploy.steps import gate, install, lock, record, rollback, smoke, verify

try:  # absent from releases before the turn was one (the case tests run against those too)
    from specdeploy.steps import turn
except ImportError:
    turn = None
from specdeploy.steps.servers import HostServers, ServerPlan, the_one_server
from specdeploy.steps.unit import UnitChange
from tests.unit import DATA

BENCH = DATA / "replays" / "box_gate" / "bench"
HOST = "h1"


class Killed(BaseException):
    """The control node is gone: nothing of it runs any more (not even a `finally` that would
    touch the host: every later call raises this again)."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Fault:
    """One injected event: at the host call numbered `at`, `kind` "fail" (the call raises, like
    a host command that failed or a lost connection), "lost" (the deploy lock was taken over) or
    "kill" (the control node dies there);
    `after`: the call's effect on the host happened first."""

    kind: str
    at: int
    after: bool = False


@dataclass
class FakeHost:
    files: dict[str, str] = field(default_factory=dict)
    enabled: set[str] = field(default_factory=set)
    state: dict[str, str] = field(default_factory=dict)  # unit -> active / failed
    ready: dict[str, str] = field(default_factory=dict)  # instance -> ready / maint (balancer)
    live_members: list[tuple[str, int]] = field(default_factory=list)  # the balancer: (name, port)
    staged_members: list[tuple[str, int]] = field(default_factory=list)
    kept_members: list[tuple[str, int]] | None = None
    bad: set[str] = field(default_factory=set)  # unit texts that never get healthy
    speed: str = "faster"  # the speculative arm against the baseline in the gate's runs
    fault: Fault | None = None
    calls: int = 0
    killed: bool = False
    restoring: int = 0  # inside a restore path (a fault there may leave the run unfinished)
    fault_in_restore: bool = False
    log: list[str] = field(default_factory=list)

    # --- step boundaries ---------------------------------------------------------------------

    def step(self, what: str, effect=lambda: None):
        if self.killed:
            raise Killed(what)
        self.calls += 1
        self.log.append(what)
        fault = self.fault
        if fault is not None and fault.at == self.calls:
            self.fault = None
            self.fault_in_restore = self.restoring > 0
            if fault.after:
                effect()
            if fault.kind == "kill":
                self.killed = True
                raise Killed(what)
            if fault.kind == "lost":  # the deploy lock taken over (steps/lock.py)
                raise lock.LockLost(f"{HOST}: the deploy lock is no longer this deploy's")
            raise HostCommandError(f"{HOST}: `{what}` failed: injected")
        return effect()

    # --- systemd -----------------------------------------------------------------------------

    def port_of(self, unit: str) -> int | None:
        if unit.endswith("-balancer.service"):
            return 8000
        argv = unit_exec_argv(self.files.get(server_path(unit)) or "") or []
        port = flag_value(argv, "--port")
        return int(port) if port else None

    def holder(self, port: int) -> str | None:
        return next((u for u, s in self.state.items() if s == "active" and self.port_of(u) == port),
                    None)  # fmt: skip

    def start(self, unit: str) -> None:
        if self.state.get(unit) == "active":
            return
        text = self.files.get(server_path(unit))
        if unit.endswith("-balancer.service"):
            text = "the balancer's unit (steps/balancer.py stages it)"
        port = self.port_of(unit)
        taken = port is not None and self.holder(port) not in (None, unit)
        if not text or text in self.bad or taken:
            self.state[unit] = "failed"
        else:
            self.state[unit] = "active"

    def stop(self, unit: str) -> None:
        self.state.pop(unit, None)

    def healthy_on(self, port: int) -> str | None:
        unit = self.holder(port)
        if unit is None:
            return None
        if unit.endswith("-balancer.service"):
            ok = any(self.ready.get(n) == "ready" and self.holder(p) for n, p in self.live_members)
            return unit if ok else None
        return unit

    def record(self, cfg: ServeConfig) -> dict | None:
        text = self.files.get(cfg.record_path)
        return json.loads(text) if text else None


def server_path(unit: str) -> str:
    return f"/etc/systemd/system/{unit}"


# --- the lifecycle on the stand-in (host/server.py's calls) ------------------------------------


def on_stand_in(monkeypatch, fake: FakeHost, tmp_path) -> None:
    """The real steps, on `fake`: host/server.py's calls, the smoke, the gate's bench runs, the
    record and the lock replaced (see the module)."""
    S = fake.step

    def wait_healthy(cfg, unit, *, speculative=True, timeout_s=None):
        def check():
            if fake.healthy_on(cfg.vllm_port) != unit:
                raise server.HealthError(f"{HOST}: {unit} not healthy on {cfg.vllm_port} "
                                         f"({fake.state.get(unit, 'inactive')})")  # fmt: skip
            return {"seconds_to_healthy": 1.0}

        return S(f"healthy {unit}", check)

    def restart(unit):
        S(f"restart {unit}", lambda: (fake.stop(unit), fake.start(unit)))

    def start_if_inactive(unit, *, stop_first=()):
        def do():
            if fake.state.get(unit) == "active":
                return False
            for other in stop_first:
                fake.stop(other)
            fake.start(unit)
            return True

        return S(f"start-if-inactive {unit}", do)

    def stop(units):
        S(f"stop {' '.join(units)}", lambda: [fake.stop(u) for u in units])

    def disable_and_stop(units):
        def do():
            for u in units:
                fake.stop(u)
                fake.enabled.discard(u)

        S(f"disable-and-stop {' '.join(units)}", do)

    def start_unit(unit):
        S(f"start {unit}", lambda: fake.start(unit))

    def enable(unit):
        S(f"enable {unit}", lambda: fake.enabled.add(unit))

    def read_text(path, missing_ok=False):
        return S(f"read {path}", lambda: fake.files.get(path))

    def start_enabled(units):
        def do():
            for unit in units:
                if unit in fake.enabled and fake.state.get(unit) != "active":
                    fake.start(unit)

        S(f"start enabled {' '.join(units)}", do)

    def put_back_record(cfg, text):
        def do():
            if text is None:
                fake.files.pop(cfg.record_path, None)
            else:
                fake.files[cfg.record_path] = text

        S(f"record back {cfg.service_name}", do)

    def swap_in_staged(cfg, name):
        def do():
            staged, live = fake.files.get(cfg.staged_unit_path(name)), cfg.unit_path(name)
            if staged is None or fake.files.get(live) == staged:
                return False
            fake.files[live] = staged
            return True

        return S(f"swap {name}", do)

    def restore_previous(cfg, name):
        def do():
            kept = fake.files.get(cfg.kept_unit_path(name))
            if not kept:
                return None
            fake.files[cfg.unit_path(name)] = kept
            fake.files[cfg.staged_unit_path(name)] = kept
            fake.enabled.add(name)
            fake.stop(name)
            fake.start(name)
            return kept

        return S(f"restore kept {name}", do)

    def restore_recorded(cfg, failed, serving):
        def do():
            text = fake.files.get(cfg.unit_path(serving))
            if not text:
                return None
            fake.stop(failed)
            fake.enabled.discard(failed)
            fake.enabled.add(serving)
            fake.stop(serving)
            fake.start(serving)
            return text

        return S(f"restore recorded {serving}", do)

    def enable_only(cfg, role):
        other = cfg.unit_names["baseline" if role == "speculative" else "speculative"]
        S(f"enable only {role}", lambda: fake.enabled.discard(other))

    def switch_enabled(cfg, *, disable, enable):
        def do():
            fake.files[cfg.staged_unit_path(enable)] = fake.files.get(cfg.unit_path(enable))
            fake.enabled.discard(disable)
            fake.enabled.add(enable)

        S(f"switch {disable} -> {enable}", do)

    def start_fresh(cfg, unit, *, speculative, install=True):
        def do():
            for u in cfg.service_units:
                fake.stop(u)
            if install:
                fake.files[unit.path] = unit.text
            fake.start(unit.name)

        S(f"start fresh {unit.name}", do)
        return wait_healthy(cfg, unit.name, speculative=speculative)

    def remove_measure_unit(cfg):
        def do():
            fake.stop(cfg.measure_unit)
            fake.files.pop(cfg.unit_path(cfg.measure_unit), None)

        S(f"remove {cfg.measure_unit}", do)

    def drain(cfg, name, *, timeout_s):
        S(f"drain {name}", lambda: fake.ready.__setitem__(name, "maint"))

    def undrain(cfg, name):
        S(f"undrain {name}", lambda: fake.ready.__setitem__(name, "ready"))

    def start_balancer(cfg, *, reload):
        unit = cfg.balancer_unit

        def do():
            fake.enabled.add(unit)
            fake.start(unit)
            if fake.healthy_on(cfg.vllm_port) != unit:
                raise server.HealthError(f"{HOST}: {unit} does not answer /health")

        S(f"start balancer {unit}", do)

    def sh(command, check=True, **kwargs):
        def do():
            if command.startswith("rm -f "):
                for path in command.split(" && ")[0].split()[2:]:
                    fake.files.pop(path, None)
            return ""

        return S(f"sh {command[:60]}", do)

    def is_active(unit):
        return S(f"is-active {unit}", lambda: fake.state.get(unit, "inactive"))

    def is_healthy(cfg):
        return S(f"is-healthy {cfg.vllm_port}", lambda: fake.healthy_on(cfg.vllm_port) is not None)

    for name, fn in {
        "wait_healthy": wait_healthy, "restart": restart, "start_if_inactive": start_if_inactive,
        "stop": stop, "disable_and_stop": disable_and_stop, "start_unit": start_unit,
        "enable": enable, "read_text": read_text, "put_back_record": put_back_record,
        "start_enabled": start_enabled,
        "swap_in_staged": swap_in_staged, "restore_previous": restore_previous,
        "restore_recorded": restore_recorded, "enable_only": enable_only,
        "switch_enabled": switch_enabled, "start_fresh": start_fresh,
        "remove_measure_unit": remove_measure_unit, "drain": drain, "undrain": undrain,
        "start_balancer": start_balancer, "sh": sh, "is_active": is_active,
        "is_healthy": is_healthy,
    }.items():  # fmt: skip
        monkeypatch.setattr(server, name, fn, raising=False)
    # the names the sampler imported from host/server.py
    for name in ("enable_only", "remove_measure_unit", "switch_enabled", "wait_healthy"):
        monkeypatch.setattr(sampling, name, locals()[name])
    monkeypatch.setattr(sampling, "start_fresh", start_fresh)
    monkeypatch.setattr(sampling, "warm_up", lambda cfg, workload: S("warm up"))
    monkeypatch.setattr(sampling, "PendingBench", _bench(fake))

    def health_and_smoke(sampler, rendered):
        cfg = sampler.cfg
        checked = wait_healthy(cfg, rendered.name, speculative=rendered.role == "speculative")
        S(f"smoke {rendered.name}")
        return checked, None, {}

    monkeypatch.setattr(smoke, "health_and_smoke", health_and_smoke)

    def write_record(cfg, rendered, **decisions):
        decision = decisions.get("gate")
        entry = {"role": rendered.role,
                 "unit": {"name": rendered.name, "sha256": rendered.sha256,
                          "argv": rendered.argv},
                 "gate": decision.as_json() if decision is not None else None}  # fmt: skip
        S(f"write record {cfg.service_name}",
          lambda: fake.files.__setitem__(cfg.record_path, json.dumps(entry)))  # fmt: skip
        return entry

    monkeypatch.setattr(record, "write_record", write_record)
    monkeypatch.setattr(install, "prune_venvs", lambda cfg: [])
    monkeypatch.setattr(verify, "validated_by", lambda *a: None)
    here = SimpleNamespace(name=HOST, print_prefix=f"[{HOST}] ", noop=lambda text: None,
                           get_fact=lambda *a, **k: "0.32.0")  # fmt: skip
    for module in (rollback, verify, gate, sampling, smoke, *([turn] if turn else [])):
        monkeypatch.setattr(module, "host", here)
    monkeypatch.setattr(lock, "renew_held", lambda seconds: S("renew lease"))
    monkeypatch.setattr(lock, "release_now", lambda cfg: None)
    monkeypatch.setattr(rollback, "GATE", rollback.RolloutGate())
    monkeypatch.setattr(gate, "host_reports_dir", lambda name: tmp_path)
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    # a fault inside a restore path is a second failure: the run may end unfinished (the next
    # run then must end on the invariant)
    restores = [(rollback, "_box_failed"), (rollback, "_balancer_failed")]
    if turn is not None:
        restores += [(turn.ServerTurn, "must_restore"), (turn.ServerTurn, "restore")]
    for owner, name in restores:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, _restoring(fake, getattr(owner, name)))


def _restoring(fake: FakeHost, function):
    def wrapped(*args, **kwargs):
        fake.restoring += 1
        try:
            return function(*args, **kwargs)
        finally:
            fake.restoring -= 1

    return wrapped


SPEEDUP = {"faster": 0.7, "slower": 1.3}


def _bench(fake: FakeHost):
    """bench.PendingBench on the stand-in: a recorded vLLM bench JSON whose median TPOT is the
    arm's (the speculative arm `fake.speed` times the baseline's), slightly varied per run."""
    base = json.loads(next(BENCH.glob("*-baseline.json")).read_text())

    class Bench:
        def __init__(self, cfg, *, tokenizer, name, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, *, local, meta):
            fake.step(f"bench {meta['arm']}")
            factor = 1.0 if meta["arm"].startswith("baseline") else SPEEDUP[fake.speed]
            data = dict(base)
            data["median_tpot_ms"] = 10.0 * factor * (1 + 0.001 * meta["index"])
            data["specdeploy"] = {**base["specdeploy"], **meta}  # the arm (at its load level)
            return BenchResult.model_validate(data)

    return Bench


# --- planning, as flows/serve.py plans a host --------------------------------------------------


def previous_record(fake: FakeHost, cfg: ServeConfig):
    data = fake.record(cfg)
    if data is None:
        return None
    text = fake.files[cfg.record_path]
    return SimpleNamespace(
        role=data["role"],
        unit=UnitRef(**data["unit"]),
        gate=GateDecision.model_validate(data["gate"]) if data["gate"] else None,
        validated_by=None,
        to_json=lambda: text,
    )


def plan_server(fake: FakeHost, member) -> ServerPlan:
    """steps/servers.plan_server and steps/unit.install_unit on the stand-in: the unit the server
    ends on, the current pair kept for rollback (never over the verified copy), the new unit
    staged; and verify_needed's verdict, from the host's state."""
    cfg = member.cfg
    previous = previous_record(fake, cfg)
    rendered = gate.gate_settled_unit(cfg, render_unit(cfg, "speculative"), previous)
    installed = fake.files.get(cfg.unit_path(rendered.name))
    differs = installed != rendered.text
    verified = previous.unit if previous else None
    never = (verified is not None and verified.name == rendered.name and installed is not None
             and sha256(installed) != verified.sha256)  # fmt: skip
    if differs and not never and installed is not None:
        fake.files[cfg.kept_unit_path(rendered.name)] = installed
    fake.files[cfg.staged_unit_path(rendered.name)] = rendered.text
    if installed is not None and rendered.name not in fake.enabled:
        fake.enabled.add(rendered.name)  # install_unit's "Enable" operation
    stage = SimpleNamespace(will_change=False, did_change=lambda: False)
    change = UnitChange(cfg, rendered, differs, False, stage_op=stage)
    settled = (
        previous is not None
        and previous.unit.sha256 == rendered.sha256
        and not gate.gate_pending(cfg, previous)
        and fake.state.get(rendered.name) == "active"
    )
    plan = ServerPlan(member, rendered, previous, gate.gate_input(cfg, rendered), change=change)
    plan.preflight = SimpleNamespace(tokenizer="tok", snapshots={},
                                     result=SimpleNamespace(hardware={}))  # fmt: skip
    plan.needed = lambda: change.pending() or not settled
    return plan


class Balancer:
    """steps/balancer.BalancerChange on the stand-in: the new members staged, swapped in at the
    turn, restored on failure."""

    def __init__(self, fake: FakeHost, members: list[tuple[str, int]]):
        self.fake, self.swapped = fake, False
        fake.staged_members = members

    def pending(self) -> bool:
        return self.needs_reload() or self.fake.state.get("specdeploy-vllm-balancer.service") != (
            "active"
        )

    def needs_reload(self) -> bool:
        return self.fake.live_members != self.fake.staged_members

    def swap_in(self) -> None:
        fake = self.fake

        def do():
            if fake.live_members != fake.staged_members:
                fake.kept_members = list(fake.live_members)
                fake.live_members = list(fake.staged_members)
                self.swapped = True
                for name, _ in fake.live_members:  # a new server of the config starts ready
                    fake.ready.setdefault(name, "ready")

        fake.step("balancer swap in", do)

    def restore(self) -> None:
        fake = self.fake

        def do():
            if self.swapped and fake.kept_members is not None:
                fake.live_members = list(fake.kept_members)

        fake.step("balancer restore", do)


def box_members(cfg: ServeConfig, count: int):
    box = cfg.model_copy(update={"instances": count})
    return list(instances.expand(box, list(range(8))).instances)


def plan_host(fake: FakeHost, cfg: ServeConfig, *, resplit: tuple[str, ...] = ()):
    """The host's servers and plans for `cfg` (a box when cfg.instances is set)."""
    if cfg.instances is None:
        member = the_one_server(cfg)
        return HostServers(cfg, (member,), balanced=False), [plan_server(fake, member)], None
    members = box_members(cfg, cfg.instances)
    single = tuple(u for u in cfg.unit_names.values()
                   if fake.state.get(u) in ("active", "failed"))  # fmt: skip
    recorded = fake.record(cfg)  # steps/servers.interrupted_conversion
    if not single and fake.state.get(cfg.balancer_unit) != "active" and recorded:
        if fake.files.get(cfg.unit_path(recorded["unit"]["name"])):
            single = (recorded["unit"]["name"],)
    names = {m.name for m in members}
    surplus = tuple(
        sorted(
            p.rsplit("/", 1)[1]
            for p in fake.files
            if p.startswith("/etc/systemd/system/specdeploy-vllm-")
            and instance_of_unit(p.rsplit("/", 1)[1]) not in names
            and not p.endswith(("-balancer.service", "-measure.service"))
            and instance_of_unit(p.rsplit("/", 1)[1]) != "specdeploy-vllm"
        )
    )
    resplit = tuple(u for u in resplit if fake.state.get(u) == "active")
    drained = ()  # steps/servers.left_drained
    if fake.state.get(cfg.balancer_unit) == "active":
        drained = tuple(sorted(n for n, state in fake.ready.items() if state == "maint"))
    more = {"drained": drained} if "drained" in HostServers.__dataclass_fields__ else {}
    servers = HostServers(cfg, tuple(members), True, single=single, surplus=surplus,
                          resplit=resplit, **more)  # fmt: skip
    plans = [plan_server(fake, m) for m in members]
    balancer = Balancer(fake, [(m.name, m.port) for m in members])
    return servers, plans, balancer


def turn_needed(servers, plans, balancer) -> bool:
    """flows/serve.py's `_if` for the host's turn."""
    return (
        bool(servers.single or servers.surplus or servers.resplit)
        or bool(getattr(servers, "drained", ()))
        or bool(balancer and balancer.pending())
        or any(plan.needed() for plan in plans)
    )


def run_turn(fake: FakeHost, cfg: ServeConfig, **kwargs) -> BaseException | None:
    """Plan and run the host's turn as a serve does; what it raised (None: it finished)."""
    servers, plans, balancer = plan_host(fake, cfg, **kwargs)
    rollback.GATE.failed.clear()
    if not turn_needed(servers, plans, balancer):
        return None
    try:
        rollback.roll_servers(servers, plans, balancer, started=0.0, pins={})
    except (Exception, Killed) as raised:
        return raised
    return None


# --- a host as a verified deploy leaves it ------------------------------------------------------


def deployed_plain(fake: FakeHost, cfg: ServeConfig, *, gate_record: dict | None = None) -> None:
    unit = render_unit(cfg, "speculative")
    fake.files[unit.path] = unit.text
    fake.files[cfg.staged_unit_path(unit.name)] = unit.text
    fake.files[cfg.kept_unit_path(unit.name)] = ANCIENT  # the pair an older change replaced
    fake.enabled.add(unit.name)
    fake.state[unit.name] = "active"
    fake.files[cfg.record_path] = json.dumps({
        "role": "speculative", "unit": {"name": unit.name, "sha256": unit.sha256,
                                        "argv": unit.argv},
        "gate": gate_record,
    })  # fmt: skip


def deployed_box(fake: FakeHost, cfg: ServeConfig) -> None:
    members = box_members(cfg, cfg.instances)
    for member in members:
        deployed_plain(fake, member.cfg)
        fake.ready[member.name] = "ready"
    fake.live_members = [(m.name, m.port) for m in members]
    fake.staged_members = list(fake.live_members)
    fake.enabled.add(cfg.balancer_unit)
    fake.state[cfg.balancer_unit] = "active"


ANCIENT = "[Service]\nExecStart=/opt/ancient/bin/python -m vllm serve m --port 8000\n"


# --- the invariant ------------------------------------------------------------------------------


def serves_its_record(fake: FakeHost, cfg: ServeConfig, port: int) -> list[str]:
    """One server: its record's unit installed as recorded, running alone on its port, healthy,
    enabled; its other units neither running nor enabled."""
    data = fake.record(cfg)
    if data is None:
        return [f"{cfg.service_name}: no record"]
    unit = data["unit"]["name"]
    problems = []
    installed = fake.files.get(cfg.unit_path(unit))
    if installed is None or sha256(installed) != data["unit"]["sha256"]:
        problems.append(f"{unit}: installed is not the recorded unit")
    if fake.state.get(unit) != "active" or fake.holder(port) != unit:
        problems.append(f"{unit}: not serving on {port} ({fake.state.get(unit, 'inactive')}, "
                        f"port held by {fake.holder(port)})")  # fmt: skip
    if unit not in fake.enabled:
        problems.append(f"{unit}: not enabled at boot")
    for other in cfg.service_units:
        if other != unit and (fake.state.get(other) == "active" or other in fake.enabled):
            problems.append(f"{other}: runs or is enabled beside the recorded {unit}")
    return problems


def invariant(fake: FakeHost, cfg: ServeConfig) -> list[str]:
    """What a turn leaves, whatever happened: the host serves what its records say (a box: its
    balancer over its live members, each serving its record, none drained; a plain host: its one
    server, no box unit running or enabled)."""
    plain = cfg.model_copy(update={"instances": None})
    balancer = cfg.balancer_unit
    if fake.state.get(balancer) == "active" or balancer in fake.enabled:
        problems = []
        if fake.state.get(balancer) != "active" or balancer not in fake.enabled:
            problems.append(f"{balancer}: {fake.state.get(balancer)}, enabled: "
                            f"{balancer in fake.enabled}")  # fmt: skip
        members = {m.name: m for m in box_members(cfg.model_copy(update={"instances": 1}), 4)}
        for name, port in fake.live_members:
            own = members[name].cfg if name in members else None
            problems += serves_its_record(fake, own, port)
            if fake.ready.get(name) != "ready":
                problems.append(f"{name}: left {fake.ready.get(name)} in the balancer")
        live = {n for n, _ in fake.live_members}
        for unit, state in fake.state.items():
            if state == "active" and unit != balancer and instance_of_unit(unit) not in live:
                problems.append(f"{unit}: runs outside the box")
        for unit in plain.unit_names.values():
            if unit in fake.enabled:
                problems.append(f"{unit}: the one-server unit is enabled beside the box")
        return problems
    problems = serves_its_record(fake, plain, plain.vllm_port)
    for unit, state in fake.state.items():
        if state == "active" and instance_of_unit(unit) != plain.service_name:
            problems.append(f"{unit}: a box's unit runs on a plain host")
    return problems

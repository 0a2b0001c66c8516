"""The rolling restart and its health-gated rollback: swap + restart + steps 6-8 (health, smoke,
record) of one host run through `verify_or_rollback`, in ONE `python.call` that pyinfra runs host by
host (`_serial`, or `max_unavailable` hosts at a time via `_parallel`; serve.py).

pyinfra runs an operation on every host before the next, so a planned restart operation would
restart the whole fleet before the first health check. Here the restart of a host happens inside
its own verify call, and the first host that fails (rolled back or not) stops the run for the hosts
after it: `RolloutGate` remembers, for this pyinfra process, who failed first; every later host is
failed with "not restarted: HOST failed first" before anything of it changes, and keeps serving its
old unit and env file (on disk too: the swap is part of the call).

When they fail on a host whose unit or env file this run changed, the previous pair (kept under
state_dir/rollback by steps/unit.py before anything changed) is put back, the service restarted and
checked healthy again; the failure is raised with the journal tail and a message that says what is
true: what was restored, whether the host is healthy, and what runs now. A note for
`specdeploy rollout` goes to the directory named by ROLLOUT_REPORT_ENV.
"""

from __future__ import annotations

import functools
import logging
import shlex
import sys
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import python

from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import ServeConfig
from specdeploy.host import server
from specdeploy.render.argv import flag_value, unit_exec_argv
from specdeploy.render.instances import instance_of_unit
from specdeploy.render.units import RenderedUnit
from specdeploy.report import notes
from specdeploy.steps import lock, turn
from specdeploy.steps.gate import BoxGate
from specdeploy.steps.servers import HostServers, ServerPlan, surplus_files
from specdeploy.steps.verify import verify_and_record


class RolledBack(RuntimeError):
    """The new config failed its health check on a host; the previous one was put back."""


class HeldBack(RuntimeError):
    """An earlier host of this run failed its restart: this one was not restarted at all."""


class TurnFailed(RuntimeError):
    """A host's turn that failed the way its message already said (rolled back, held back): it
    fails the host in pyinfra's state, and pyinfra says nothing more of it (QuietTold)."""


class QuietTold(logging.Filter):
    """pyinfra logs whatever a python.call lets out as a traceback and 'Unexpected error in Python
    callback'; for a TurnFailed the turn has said what happened and what runs now, in its own
    words, so both records would only bury that under a stack that says nothing to an operator."""

    def filter(self, record: logging.LogRecord) -> bool:
        return TurnFailed.__name__ not in str(record.msg)


QUIET_TOLD = QuietTold()


def _told(function):
    """`function` as a host's turn: a failure it has explained (RolledBack, HeldBack) is logged
    once, as an error with the host's prefix, and fails the host without a traceback."""

    @functools.wraps(function)
    def turn_of_host(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (RolledBack, HeldBack) as failure:
            logger.error(f"{host.print_prefix}{failure}")
            raise TurnFailed(type(failure).__name__) from None

    return turn_of_host


class RolloutGate:
    """'A host failed its restart in this run': the hosts that failed, in order (one pyinfra
    process is one run; `specdeploy rollout` starts one per batch)."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def failed_first(self) -> str | None:
        return self.failed[0] if self.failed else None

    def note_failure(self, name: str) -> None:
        if name not in self.failed:
            self.failed.append(name)

    def held_back_message(self, name: str, unit: str, state: str, *, restart: bool) -> str:
        first = self.failed_first()
        what = "not restarted" if restart else "not verified"
        return (
            f"{name}: {what}: {first} failed first, so this run stopped before {name}; "
            f"{unit} was left as it was ({state}) and keeps serving its current config"
        )


GATE = RolloutGate()


def _report(entry: dict) -> None:
    """Leave a machine-readable failure note for `specdeploy rollout` (report/notes.py)."""
    try:
        notes.note(entry)
    except OSError as error:  # a note lost must not hide the failure it was to describe
        logger.warning(f"{host.print_prefix}rollout note not written: {error}")


def fail_alone(refused: HostRefused) -> None:
    """Planning time: this host's own state refuses the deploy (config/problems.HostRefused). It is
    failed in pyinfra's state, so none of its operations runs and nothing on it changes; its cause
    is logged, and noted for `specdeploy rollout`; the other hosts go on (pyinfra still exits
    non-zero, naming it). Not a failed restart: the hosts after it are not held back."""
    cause = str(refused)
    logger.error(f"{host.print_prefix}refused, not touched: {cause}")
    _report({"host": host.name, "cause": cause, "rolled_back": False, "refused": True,
             "after": f"not touched, refused while planning: {notes.STILL_SERVING}"})  # fmt: skip
    host.state.fail_hosts({host.state.inventory.get_host(host.name)})  # the Host, not the proxy


def config_for_argv(cfg: ServeConfig, argv: list[str]) -> ServeConfig:
    """The new config with the address and served name the restored unit actually uses."""
    update = {}
    if (address := flag_value(argv, "--host")) is not None:
        update["vllm_host"] = address
    if (port := flag_value(argv, "--port")) is not None:
        update["vllm_port"] = int(port)
    if (name := flag_value(argv, "--served-model-name")) is not None:
        update["served_model_name"] = name
    return cfg.model_copy(update=update)


def verify_or_rollback(
    verify,
    cfg: ServeConfig,
    rendered: RenderedUnit,
    *,
    change=None,
    lock_cfg: ServeConfig | None = None,
    verified=None,
    release: bool = True,
    **kwargs,
):
    """python.call target, one host at a time: unless an earlier host of this run failed, swap in
    the new unit/env file and restart (`change`, a steps.unit.UnitChange; None: verify only), then
    `verify(cfg, rendered, **kwargs)`; on failure, the server's turn (steps/turn.py) goes back to
    its verified unit where it left it, the deploy lock is released (`lock_cfg`'s: a whole box's
    instances run under the host's lock; `release` false: the box's turn releases it after its
    own restore) and the failure raised with a true account of the host's state. `verified`: the
    record's unit (config/record.UnitRef), the last one verified: a failure on a host that does
    not run it (an earlier run interrupted after its swap, or a gate's fall-back to the other
    unit) puts it back, like a unit this run swapped in, and so does a failure after a gate
    stopped an unchanged unit for its baseline arm; only the restored unit stays enabled."""
    unit = rendered.name
    lock_cfg = lock_cfg or cfg
    if GATE.failed_first() is not None:
        state = server.is_active(unit)
        restart = change is not None and change.pending()
        message = GATE.held_back_message(host.name, unit, state, restart=restart)
        _report({"host": host.name, "cause": message, "rolled_back": False, "held_back": True,
                 "after": message.split(": ", 1)[1]})  # fmt: skip
        lock.release_now(lock_cfg)
        raise HeldBack(message)
    lock.renew_held(lock.lease_seconds(lock_cfg))  # this host's turn: LockLost before any change
    server_turn = turn.begin(cfg, unit, verified, change, kwargs.get("previous"))
    try:
        if change is not None:
            restart_for(change, unit, unverified=server.unverified_installed(cfg, unit, verified),
                        cfg=cfg)  # fmt: skip
        return verify(cfg, rendered, **kwargs)
    except Exception as error:  # any failure of the new config
        GATE.note_failure(host.name)
        cause = str(error)
        entry = {"host": host.name, "cause": cause, "rolled_back": False}
        try:
            if not server_turn.must_restore():
                state = server.is_active(unit)
                entry["after"] = (
                    "not rolled back (this run changed neither unit nor env file): "
                    f"{notes.STILL_SERVING}; {unit} is {state}"
                )
                raise
            # what failed: the new config, or (unit and env file unchanged) the gate's arm of it
            new = server_turn.replaced()
            failed = ("the new config failed its health check" if new else
                      "a measurement of the unchanged unit failed")  # fmt: skip
            said = "new config failed" if new else failed
            logger.warning(f"{host.print_prefix}{said}: {cause.splitlines()[0]}")
            restored = server_turn.restore()
            unit = restored.unit
            if restored.argv is None:
                entry["after"] = (
                    f"no previous unit was kept (first deploy of {unit} here), so nothing was "
                    f"restored; {unit} is stopped ({server.is_active(unit)}) "
                    "and the host serves nothing"
                )
                raise RolledBack(
                    f"{host.name}: {failed}; {entry['after']}.\ncause: {cause}"
                ) from error
            entry["rolled_back"] = True
            entry["after"] = _after_restore(cfg, unit, restored.argv)
            raise RolledBack(
                f"{host.name}: ROLLED BACK: {failed}; "
                + (
                    "the previous unit and env file were restored"
                    if new
                    else "its verified unit was started again"
                )
                + f" and the host is {entry['after']}.\ncause: {cause}"
            ) from error
        finally:
            _report(entry)
            if release:
                lock.release_now(lock_cfg)
    finally:
        turn.end(cfg)


def roll_servers(servers: HostServers, plans: list[ServerPlan], balancer=None, **kwargs) -> None:
    """python.call target, this host's turn: the servers that need it, `max_unavailable_instances`
    at a time (a plain host: its one server), each through `verify_or_rollback` with
    verify.verify_and_record (`kwargs`: started, pins). A whole box drains them on its balancer
    first and puts them back after; then the balancer itself is started, or reloaded when its
    config changed (`balancer`: steps/balancer.stage's BalancerChange). `servers.single`: the
    host's one-server units, stopped first when it becomes a whole box (they hold vllm_port);
    `servers.surplus`: instances the box no longer has, stopped once the reloaded balancer no
    longer sends them requests. The first server that fails is rolled back; any failure of a box's
    turn then puts the host back as the turn found it (`_box_failed`: the one-server unit of a
    host becoming a box, the old instances of a re-split, every drained instance undrained)."""
    cfg = servers.cfg
    notes.turn_began(host.name)  # from here on, a failure may have changed what it serves
    if servers.balanced and GATE.failed_first() is not None:
        # held back before anything stops: a host becoming a box keeps its one-server unit
        first = plans[0].member.cfg.unit_names["speculative"] if plans else cfg.balancer_unit
        unit = servers.single[0] if servers.single else first
        message = GATE.held_back_message(host.name, unit, server.is_active(unit), restart=True)
        _report({"host": host.name, "cause": message, "rolled_back": False, "held_back": True,
                 "after": message.split(": ", 1)[1]})  # fmt: skip
        lock.release_now(cfg)
        raise HeldBack(message)
    if not servers.balanced:
        for plan in plans:
            if plan.needed():
                verify_or_rollback(verify_and_record, plan.member.cfg, plan.rendered,
                                   change=plan.change, lock_cfg=cfg, preflight=plan.preflight,
                                   gate_input=plan.gate_input, box_gate=None, proof=plan.proof,
                                   previous=plan.previous, schedule_proof=plan.schedule_proof,
                                   draft_choice=plan.draft_choice,
                                   verified=plan.previous and plan.previous.unit,
                                   pinned_release=plan.release, **kwargs)  # fmt: skip
        return
    box = BoxTurn(servers, plans, balancer)
    try:
        _roll_box(box, **kwargs)
    except Exception as error:
        _box_failed(box, error)


@dataclass
class BoxTurn:
    """A whole box's turn (steps/turn.py says one server's), as far as it went: what a failure
    must put back."""

    servers: HostServers
    plans: list[ServerPlan]
    balancer: object
    drained: list[str] = field(default_factory=list)  # instances in maintenance on the balancer
    single_stopped: bool = False  # the one-server units stopped and disabled (becoming a box)
    resplit_stopped: bool = False  # the old instances of a re-split stopped
    swapped: list[ServerPlan] = field(default_factory=list)  # instances whose turn began
    verified: list[ServerPlan] = field(default_factory=list)  # ... verified and recorded
    at_balancer: bool = False  # its balancer is being swapped in and started
    balancer_done: bool = False  # ... and serves: the new layout stands, only surplus is left

    def drain(self, name: str) -> None:
        cfg = self.servers.cfg
        self.drained.append(name)
        server.drain(cfg, name, timeout_s=server.drain_timeout_s(cfg))

    def undrain(self, name: str) -> None:
        server.undrain(self.servers.cfg, name)
        self.drained.remove(name)


def _roll_box(box: BoxTurn, **kwargs) -> None:
    servers, plans, balancer = box.servers, box.plans, box.balancer
    cfg = servers.cfg
    if servers.single:
        logger.warning(
            f"{host.print_prefix}becoming a whole box: stopping {', '.join(servers.single)} (it "
            f"holds {cfg.vllm_port}); the host answers again once the balancer starts"
        )
        box.single_stopped = True
        server.disable_and_stop(list(servers.single))
    serving = server.is_active(cfg.balancer_unit) == "active"
    box.drained += [n for n in servers.drained if serving]  # an interrupted turn's: put back
    if servers.resplit:  # a re-split: the old instances give their GPUs up before any new starts
        logger.warning(f"{host.print_prefix}re-split: stopping {', '.join(servers.resplit)}")
        for name in sorted({instance_of_unit(u) for u in servers.resplit}) if serving else ():
            box.drain(name)
        box.resplit_stopped = True
        server.stop(list(servers.resplit))
    todo = [plan for plan in plans if plan.needed()]
    width = cfg.max_unavailable_instances
    box_gate = BoxGate()  # the first instance gated decides
    for start in range(0, len(todo), width):
        batch = todo[start : start + width]
        for plan in batch if serving else ():
            if plan.member.name not in box.drained:
                box.drain(plan.member.name)
        for plan in batch:
            box.swapped.append(plan)
            verify_or_rollback(verify_and_record, plan.member.cfg, plan.rendered,
                               change=plan.change, lock_cfg=cfg, preflight=plan.preflight,
                               gate_input=plan.gate_input, box_gate=box_gate,
                               proof=plan.proof, previous=plan.previous,
                               schedule_proof=plan.schedule_proof,
                               draft_choice=plan.draft_choice,
                               verified=plan.previous and plan.previous.unit, release=False,
                               pinned_release=plan.release, **kwargs)  # fmt: skip
            box.verified.append(plan)
        for plan in batch if serving else ():
            box.undrain(plan.member.name)
    for name in list(box.drained):  # a re-split's old instances the new layout keeps
        box.undrain(name)
    box.at_balancer = True
    balancer.swap_in()  # only now: a held-back host keeps its topology on disk too
    server.start_balancer(cfg, reload=balancer.needs_reload())
    box.at_balancer, box.balancer_done = False, True  # the box serves with its new layout
    if servers.surplus:
        logger.warning(
            f"{host.print_prefix}no longer in the box, stopped, disabled and removed: "
            f"{', '.join(servers.surplus)}"
        )
        server.disable_and_stop(list(servers.surplus))
        doomed = " ".join(shlex.quote(p) for p in surplus_files(cfg, servers.surplus))
        server.sh(f"rm -f {doomed} && systemctl daemon-reload")


def _box_failed(box: BoxTurn, error: Exception) -> None:
    """A whole box's turn failed (an instance rolled back or not, the balancer, a lost lease, a
    host command): the host failed its turn, so the hosts after it are held back (GATE), and it
    goes back to what it served when the turn began. A host that was becoming a box gets its
    one-server unit back: the box's instances and balancer stopped and disabled first (they hold
    its GPUs and port). A box: its previous balancer files back where they were swapped in; after
    a re-split, every instance this turn verified back on its kept unit and record, then the old
    instances started again; every instance the turn drained undrained. The note says what runs,
    each server checked."""
    servers, plans, balancer = box.servers, box.plans, box.balancer
    cfg = servers.cfg
    GATE.note_failure(host.name)
    cause = str(error)
    entry = {"host": host.name, "cause": cause, "rolled_back": False}
    try:
        if box.single_stopped:
            units = [cfg.balancer_unit]
            for plan in plans:
                units += list(plan.member.cfg.unit_names.values())
            server.disable_and_stop(units)
            if balancer is not None:
                balancer.restore()
            for plan in box.verified:  # the box's instances serve nothing now: no record says so
                server.put_back_record(plan.member.cfg, None)
            for unit in servers.single:
                server.enable(unit)
                server.start_unit(unit)
            # checked healthy, as a rollback is: the host answers on vllm_port again, or says not
            states = "; ".join(
                _after_restore(cfg, u, unit_exec_argv(server.read_text(cfg.unit_path(u),
                                                                       missing_ok=True)) or [])
                for u in servers.single
            )  # fmt: skip
            entry["rolled_back"], entry["restored"] = True, "its one-server unit"
            entry["after"] = f"the box was stopped and the one server started again: {states}"
        elif box.balancer_done:  # the new layout serves: the surplus instances go (again)
            server.disable_and_stop(list(servers.surplus))
            entry["after"] = (
                f"its new layout serves ({cfg.balancer_unit} is "
                f"{server.is_active(cfg.balancer_unit)}); the instances it no longer has "
                f"({', '.join(servers.surplus)}) stopped and disabled, their files left"
            )
        else:
            restored, checked = [], []
            if balancer is not None and balancer.swapped:  # its previous balancer files back
                balancer.restore()
                quoted = shlex.quote(cfg.balancer_unit)
                server.sh(f"systemctl reset-failed {quoted} 2>/dev/null; "
                          f"systemctl reload-or-restart {quoted}", check=False)  # fmt: skip
                restored.append("its previous balancer files")
            checked = _without_new_instances(box)
            if box.resplit_stopped:
                checked += _back_to_old_layout(box)
                restored.append("its instances as they were before the re-split")
            # what the box runs at boot runs now: an instance an interrupted turn stopped too
            server.start_enabled(_box_units(box))
            for name in list(box.drained):
                box.undrain(name)  # back in the balancer: its health check decides
            entry["rolled_back"] = bool(restored)
            if restored:
                entry["restored"] = ", ".join(restored)
            states = "; ".join(checked) or "its instances serve as they were left"
            # the instances whose turn never began: they serve what they served, on disk too
            untouched = [plan.member.name for plan in box.plans if plan not in box.swapped]
            if untouched:
                states += f"; not touched: {', '.join(untouched)}"
            entry["after"] = (
                f"{states}; no instance left drained; {cfg.balancer_unit} is "
                f"{server.is_active(cfg.balancer_unit)}"
            )
        what = "the balancer failed" if box.at_balancer else "the box's turn failed"
        raise RolledBack(f"{host.name}: {what}: {entry['after']}.\ncause: {cause}") from error
    finally:
        _report(entry)
        lock.release_now(cfg)


def _box_units(box: BoxTurn) -> list[str]:
    """Every unit of the box's instances, old and new: its members' and the surplus ones."""
    units = [u for p in box.plans for u in p.member.cfg.unit_names.values()]
    return units + [u for u in box.servers.surplus if u not in units]


def _without_new_instances(box: BoxTurn) -> list[str]:
    """The instances this turn started that the box did not have (no record before it): stopped,
    disabled and their records removed, since the balancer the box serves with does not know
    them. Returns what was done, per instance."""
    new = [p for p in box.swapped if p.previous is None]
    for plan in new:
        server.disable_and_stop(list(plan.member.cfg.unit_names.values()))
        server.put_back_record(plan.member.cfg, None)
    return [f"{p.member.name}: new in this layout, stopped and disabled" for p in new]


def _back_to_old_layout(box: BoxTurn) -> list[str]:
    """A failed re-split: the instances this turn verified give the old instances' GPUs back
    (their kept unit and record restored; an instance the old layout lacked stopped, disabled and
    its record removed), then every old instance starts again on its installed unit, each checked.
    Returns what runs, per instance."""
    servers, cfg = box.servers, box.servers.cfg
    back = [p for p in box.verified if p.change is not None and p.change.changed() and p.previous]
    if back:
        server.stop([p.rendered.name for p in back])
    for plan in back:
        own, name = plan.member.cfg, plan.rendered.name
        if server.restore_previous(own, name) is None:  # new in this layout: nothing to go back to
            server.disable_and_stop([name])
        server.put_back_record(own, plan.previous.to_json() if plan.previous else None)
    old = [u for u in servers.resplit if u not in {p.rendered.name for p in back}]
    for unit in old:
        server.enable(unit)
        server.start_unit(unit)
    checked = []
    for unit in [*(p.rendered.name for p in back if p.previous), *old]:
        argv = unit_exec_argv(server.read_text(cfg.unit_path(unit), missing_ok=True)) or []
        checked.append(f"{instance_of_unit(unit)}: {_after_restore(cfg, unit, argv)}")
    return checked


def restart_for(change, unit: str, *, unverified: bool = False, cfg: ServeConfig | None = None):
    """This host's turn: swap in what changed and restart; start the unit if it is not running;
    a change of the workload alone restarts nothing (the server keeps its MainPID).
    `unverified`: the installed unit is not the one the record verified (an earlier run was cut
    off between its swap and its health check): restarted too, since the running process may
    still be the old unit's and a health check of it would prove nothing about the new one.
    Before a start, the server's other units (`cfg`'s: the other role, a measurement's arm an
    interrupted run left running) are stopped: they would hold its port."""
    others = [u for u in cfg.service_units if u != unit] if cfg is not None else []
    if change.apply():
        logger.info(f"{host.print_prefix}restarting {unit} (unit or env file changed)")
        _restart(cfg, unit, others)
    elif unverified:
        logger.info(f"{host.print_prefix}restarting {unit} ({server.NEVER_VERIFIED})")
        _restart(cfg, unit, others)
    elif server.start_if_inactive(unit, stop_first=others):
        logger.info(f"{host.print_prefix}started {unit} (it was not running)")
    else:  # the no-change path: the server keeps its MainPID
        host.noop(f"{unit}: unit and env file unchanged and it runs: not restarted")


def _restart(cfg: ServeConfig | None, unit: str, others: list[str]) -> None:
    if cfg is not None:
        turn.enter(cfg, turn.Phase.SWAPPED_UNVERIFIED)
    if others:
        server.stop(others)
    server.restart(unit)


def _after_restore(cfg: ServeConfig, unit: str, argv: list[str]) -> str:
    """What runs after a restore, checked: healthy or not, and from which release venv."""
    runs = f"{unit} runs {argv[0] if argv else '?'}"
    try:
        old = config_for_argv(cfg, argv)
        checked = server.wait_healthy(old, unit, speculative="--speculative-config" in argv)
        return f"healthy again after {checked['seconds_to_healthy']}s; {runs}"
    except Exception as again:
        return f"NOT healthy after rollback either ({server.is_active(unit)}); {runs}: {again}"


class NoWaitRefused(PyinfraError):
    """pyinfra's `--no-wait` would run each host's operations on its own, restarts included."""


def pyinfra_cli_params(argv: list[str] | None = None) -> dict:
    """The options of the running pyinfra CLI, parsed by pyinfra's own click command (pyinfra
    keeps `--no-wait` in its CLI function's arguments only: not in State or Config, and the click
    context does not reach the greenlets deploy files run in). Empty outside pyinfra's CLI."""
    import pyinfra

    if not getattr(pyinfra, "is_cli", False) and argv is None:
        return {}
    from pyinfra_cli.cli import cli

    try:  # resilient: no callbacks (--version, --support), no errors, no prompts
        context = cli.make_context("pyinfra", list(sys.argv[1:] if argv is None else argv),
                                   resilient_parsing=True)  # fmt: skip
    except Exception:
        return {}
    return dict(context.params)


def refuse_no_wait(argv: list[str] | None = None) -> None:
    """Planning time, first thing in every deploy that takes servers out of service: refuse
    pyinfra's `--no-wait`. It runs every host's operations without waiting for the other hosts,
    which ignores `_serial`/`_parallel`, so every host would restart (or be measured) at once."""
    if pyinfra_cli_params(argv).get("no_wait"):
        raise NoWaitRefused(
            "pyinfra --no-wait: refused — this deploy restarts and measures servers "
            "one host at a time (max_unavailable) and --no-wait would run every host's "
            "restart at once; run it without --no-wait (--serial is fine)"
        )


_PARALLEL: dict[int, tuple[str, int | str]] = {}  # id(pyinfra state) -> (first host, its setting)


def hosts_at_once(max_unavailable: int | str, hosts_in_run: int) -> int:
    """`max_unavailable` as a number of hosts: N, or N % of the run's hosts rounded down and at
    least 1 (a budget of none would restart nothing)."""
    if isinstance(max_unavailable, int):
        return max_unavailable
    return max(1, hosts_in_run * int(max_unavailable.rstrip("%")) // 100)


def out_of_service_width(cfg: ServeConfig) -> dict:
    """How many hosts may be out of service at once (a rolling restart, a compare or tune taking a
    host off its deployed unit), as pyinfra execution arguments: `_serial` for one host at a time
    (the default), `_parallel=N` for N (`max_unavailable`, a percentage of the hosts this run
    connected to). pyinfra takes them from all hosts of one operation alike, so two hosts with
    different values stop the run here, before anything runs."""
    setting = cfg.max_unavailable
    first = _PARALLEL.setdefault(id(host.state), (host.name, setting))
    if first[1] != setting:
        raise PyinfraError(
            f"{host.name}: max_unavailable is {setting!r}, but {first[0]} of the same run has "
            f"{first[1]!r}: set one value for every host of a run (group_data/all.py)"
        )
    n = hosts_at_once(setting, len(host.state.activated_hosts) or 1)
    return {"_serial": True} if n == 1 else {"_parallel": n}


def host_turn(cfg: ServeConfig, what: str, function, /, **kwargs) -> None:
    """Schedule this host's turn: ONE `python.call` of `function` that pyinfra runs host by host
    (`_serial`), or `max_unavailable` hosts at a time (`_parallel`) — the rolling restart of a
    serve, the measurement of a compare or tune. Its name says the width."""
    logger.addFilter(QUIET_TOLD)  # once per logger: a filter is kept as a set member
    python.call(name=f"{what} ({width_text(cfg)})", function=_told(function), **kwargs,
                **out_of_service_width(cfg))  # fmt: skip


def width_text(cfg: ServeConfig) -> str:
    n = hosts_at_once(cfg.max_unavailable, len(host.state.activated_hosts) or 1)
    return "one host at a time" if n == 1 else f"{n} hosts at a time"

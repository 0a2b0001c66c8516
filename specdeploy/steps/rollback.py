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

import shlex
import sys

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
from specdeploy.steps import lock
from specdeploy.steps.gate import BoxGate
from specdeploy.steps.servers import HostServers, ServerPlan, surplus_files
from specdeploy.steps.verify import verify_and_record


class RolledBack(RuntimeError):
    """The new config failed its health check on a host; the previous one was put back."""


class HeldBack(RuntimeError):
    """An earlier host of this run failed its restart: this one was not restarted at all."""


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
    changed=None,
    lock_cfg: ServeConfig | None = None,
    verified=None,
    **kwargs,
):
    """python.call target, one host at a time: unless an earlier host of this run failed, swap in
    the new unit/env file and restart (`change`, a steps.unit.UnitChange; None: verify only), then
    `verify(cfg, rendered, **kwargs)`; on failure, roll back what this run changed, release the
    deploy lock (`lock_cfg`'s: a whole box's instances run under the host's lock) and raise with a
    true account of the host's state. `verified`: the record's unit (config/record.UnitRef), the
    last one verified: a failure on a host that does not run it (an earlier run interrupted after
    its swap, or a gate's fall-back to the other unit) puts it back, like a unit this run swapped
    in; only the restored unit stays enabled."""
    unit = rendered.name
    lock_cfg = lock_cfg or cfg
    if change is not None:
        changed = change.changed
    changed = changed or (lambda: False)
    if GATE.failed_first() is not None:
        state = server.is_active(unit)
        restart = change is not None and change.pending()
        message = GATE.held_back_message(host.name, unit, state, restart=restart)
        _report({"host": host.name, "cause": message, "rolled_back": False, "held_back": True,
                 "after": message.split(": ", 1)[1]})  # fmt: skip
        lock.release_now(lock_cfg)
        raise HeldBack(message)
    lock.renew_held(lock.lease_seconds(lock_cfg))  # this host's turn: LockLost before any change
    try:
        if change is not None:
            restart_for(change, unit, unverified=server.unverified_installed(cfg, unit, verified))
        return verify(cfg, rendered, **kwargs)
    except Exception as error:  # any failure of the new config
        GATE.note_failure(host.name)
        cause = str(error)
        entry = {"host": host.name, "cause": cause, "rolled_back": False}
        try:
            if not changed() and not server.unverified_installed(cfg, unit, verified):
                state = server.is_active(unit)
                entry["after"] = (
                    "not rolled back (this run changed neither unit nor env file): "
                    f"{notes.STILL_SERVING}; {unit} is {state}"
                )
                raise
            logger.warning(f"{host.print_prefix}new config failed: {cause.splitlines()[0]}")
            if verified is not None and verified.name != unit:  # the record serves with another
                previous = server.restore_recorded(cfg, unit, verified.name)
                unit = verified.name if previous is not None else unit
            else:
                previous = server.restore_previous(cfg, unit)
            if previous is None:
                server.stop([unit])
                entry["after"] = (
                    f"no previous unit was kept (first deploy of {unit} here), so nothing was "
                    f"restored; {unit} is stopped ({server.is_active(unit)}) "
                    "and the host serves nothing"
                )
                raise RolledBack(
                    f"{host.name}: the new config failed its health check; {entry['after']}.\n"
                    f"cause: {cause}"
                ) from error
            restored_argv = unit_exec_argv(previous) or []
            # only the restored unit starts at boot: a gate's fall-back may have left the other on
            server.enable_only(cfg, "speculative" if "--speculative-config" in restored_argv
                               else "baseline")  # fmt: skip
            entry["rolled_back"] = True
            entry["after"] = _after_restore(cfg, unit, restored_argv)
            raise RolledBack(
                f"{host.name}: ROLLED BACK: the new config failed its health check; the previous "
                f"unit and env file were restored and the host is {entry['after']}.\ncause: {cause}"
            ) from error
        finally:
            _report(entry)
            lock.release_now(lock_cfg)


def roll_servers(servers: HostServers, plans: list[ServerPlan], balancer=None, **kwargs) -> None:
    """python.call target, this host's turn: the servers that need it, `max_unavailable_instances`
    at a time (a plain host: its one server), each through `verify_or_rollback` with
    verify.verify_and_record (`kwargs`: started, pins). A whole box drains them on its balancer
    first and puts them back after; then the balancer itself is started, or reloaded when its
    config changed (`balancer`: steps/balancer.stage's BalancerChange). `servers.single`: the
    host's one-server units, stopped first when it becomes a whole box (they hold vllm_port);
    `servers.surplus`: instances the box no longer has, stopped once the reloaded balancer no
    longer sends them requests. The first server that fails is rolled back and put back if
    healthy; the host's other servers are not touched, so it keeps answering on vllm_port."""
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
    if servers.single:
        logger.warning(
            f"{host.print_prefix}becoming a whole box: stopping {', '.join(servers.single)} (it "
            f"holds {cfg.vllm_port}); the host answers again once the balancer starts"
        )
        _stop_and_disable(list(servers.single))
    serving = servers.balanced and server.is_active(cfg.balancer_unit) == "active"
    if servers.resplit:  # a re-split: the old instances give their GPUs up before any new starts
        logger.warning(f"{host.print_prefix}re-split: stopping {', '.join(servers.resplit)}")
        for name in sorted({instance_of_unit(u) for u in servers.resplit}) if serving else ():
            server.drain(cfg, name, timeout_s=server.drain_timeout_s(cfg))
        server.stop(list(servers.resplit))
    todo = [plan for plan in plans if plan.needed()]
    width = cfg.max_unavailable_instances
    box_gate = BoxGate() if servers.balanced else None  # the first instance gated decides
    for start in range(0, len(todo), width):
        batch = todo[start : start + width]
        for plan in batch if serving else ():
            server.drain(cfg, plan.member.name, timeout_s=server.drain_timeout_s(cfg))
        for plan in batch:
            try:
                verify_or_rollback(verify_and_record, plan.member.cfg, plan.rendered,
                                   change=plan.change, lock_cfg=cfg, preflight=plan.preflight,
                                   gate_input=plan.gate_input, box_gate=box_gate,
                                   proof=plan.proof, previous=plan.previous,
                                   schedule_proof=plan.schedule_proof,
                                   verified=plan.previous and plan.previous.unit,
                                   **kwargs)  # fmt: skip
            except RolledBack:
                # the batch back into the balancer where it serves: the rolled-back instance on
                # its old config, the rest of the batch as they were or verified
                for other in batch if serving else ():
                    if server.is_healthy(other.member.cfg):
                        server.undrain(cfg, other.member.name)
                if servers.balanced:
                    untouched = [p.member.name for p in todo[start:] if p is not plan]
                    logger.warning(
                        f"{host.print_prefix}{plan.member.name} rolled back; not touched: "
                        f"{', '.join(untouched) or 'none'}"
                    )
                raise
        for plan in batch if serving else ():
            server.undrain(cfg, plan.member.name)
    if servers.balanced:
        try:
            balancer.swap_in()  # only now: a held-back host keeps its topology on disk too
            server.start_balancer(cfg, reload=balancer.needs_reload())
        except Exception as error:  # a balancer that cannot serve is a host failure, like a unit's
            _balancer_failed(servers, plans, balancer, error)
    if servers.surplus:
        logger.warning(
            f"{host.print_prefix}no longer in the box, stopped, disabled and removed: "
            f"{', '.join(servers.surplus)}"
        )
        _stop_and_disable(list(servers.surplus))
        doomed = " ".join(shlex.quote(p) for p in surplus_files(cfg, servers.surplus))
        server.sh(f"rm -f {doomed} && systemctl daemon-reload")


def _balancer_failed(servers: HostServers, plans: list[ServerPlan], balancer,
                     error: Exception) -> None:  # fmt: skip
    """The box's balancer did not start or answer: the host failed its turn, so the hosts after it
    are held back (GATE). A host that was becoming a box gets its one-server unit back: the box's
    instances and balancer are stopped and disabled first (they hold its GPUs and port); a box
    gets its previous balancer files back."""
    cfg = servers.cfg
    GATE.note_failure(host.name)
    cause = str(error)
    entry = {"host": host.name, "cause": f"balancer: {cause}", "rolled_back": False}
    try:
        if servers.single:
            box = [cfg.balancer_unit, *(p.member.cfg.unit_names["speculative"] for p in plans)]
            _stop_and_disable(box)
            for unit in servers.single:
                server.enable(unit)
                server.sh(f"systemctl reset-failed {shlex.quote(unit)} 2>/dev/null; "
                          f"systemctl start {shlex.quote(unit)}", check=False)  # fmt: skip
            # checked healthy, as a rollback is: the host answers on vllm_port again, or says not
            states = "; ".join(
                _after_restore(cfg, u, unit_exec_argv(server.read_text(cfg.unit_path(u),
                                                                       missing_ok=True)) or [])
                for u in servers.single
            )  # fmt: skip
            entry["rolled_back"], entry["restored"] = True, "its one-server unit"
            entry["after"] = f"the box was stopped and the one server started again: {states}"
        else:  # a box before: its previous balancer files back, reloaded (or started)
            balancer.restore()
            if balancer.swapped:
                unit = shlex.quote(cfg.balancer_unit)
                server.sh(f"systemctl reset-failed {unit} 2>/dev/null; "
                          f"systemctl reload-or-restart {unit}", check=False)  # fmt: skip
            entry["rolled_back"], entry["restored"] = (
                balancer.swapped,
                "its previous balancer files",
            )
            entry["after"] = (
                f"its instances serve the new config (each verified); {cfg.balancer_unit} is "
                f"{server.is_active(cfg.balancer_unit)}"
            )
        raise RolledBack(
            f"{host.name}: the balancer failed: {entry['after']}.\ncause: {cause}"
        ) from error
    finally:
        _report(entry)
        lock.release_now(cfg)


def _stop_and_disable(units: list[str]) -> None:
    server.stop(units)
    names = " ".join(shlex.quote(u) for u in units)
    # reset-failed: a stopped crashed unit would still read "failed" and be found again next run
    server.sh(f"systemctl disable -q {names} 2>/dev/null; systemctl reset-failed {names} "
              "2>/dev/null; true", check=False)  # fmt: skip


def restart_for(change, unit: str, *, unverified: bool = False) -> None:
    """This host's turn: swap in what changed and restart; start the unit if it is not running;
    a change of the workload alone restarts nothing (the server keeps its MainPID).
    `unverified`: the installed unit is not the one the record verified (an earlier run was cut
    off between its swap and its health check): restarted too, since the running process may
    still be the old unit's and a health check of it would prove nothing about the new one."""
    if change.apply():
        logger.info(f"{host.print_prefix}restarting {unit} (unit or env file changed)")
        server.restart(unit)
    elif unverified:
        logger.info(f"{host.print_prefix}restarting {unit} ({server.NEVER_VERIFIED})")
        server.restart(unit)
    elif server.start_if_inactive(unit):
        logger.info(f"{host.print_prefix}started {unit} (it was not running)")
    else:  # the no-change path: the server keeps its MainPID
        host.noop(f"{unit}: unit and env file unchanged and it runs: not restarted")


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
    python.call(name=f"{what} ({width_text(cfg)})", function=function, **kwargs,
                **out_of_service_width(cfg))  # fmt: skip


def width_text(cfg: ServeConfig) -> str:
    n = hosts_at_once(cfg.max_unavailable, len(host.state.activated_hosts) or 1)
    return "one host at a time" if n == 1 else f"{n} hosts at a time"

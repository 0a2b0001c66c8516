"""A server's turn as a state machine, and its one restore path.

A serve's turn on one server (a plain host's, or one instance of a whole box) goes through these
phases; the rolling restart (steps/rollback.py) and the steps it runs say where it stands:

    serving-verified    the unit the record verified runs (where a turn starts and ends)
    staged              the new unit and env file wait beside the live ones; nothing stopped
    drained             a box's instance taken out of its balancer (no new requests)
    swapped-unverified  the new unit or env file is in place and (re)started, not yet verified
    measuring an arm    the speculation gate runs its arms on fresh servers: production stopped
    recording           the record is being written (it may name the new unit from here on)
    stopped             the server was stopped for the box's layout (a re-split, a conversion)

The invariant at the end of every path (success, an exception at any step, the control node
killed at any point and the next run): the server runs its recorded verified unit (or the restored
previous one, recorded as such), enabled at boot, alone on its port, undrained; the record says
exactly what runs. A turn that left serving-verified and fails goes back through `restore`, the
one way back for a plain host and a box's instance: the record's other unit (a gate's fall-back),
the kept copy of what this run replaced, or the verified unit itself started again (a gate that
measured an unchanged unit stopped it for its baseline arm).

The steps that cannot see the turn (the gate's measuring, inside its own call) tell it through
`enter(cfg, phase)`; the turn is found by host and service, so a gate run outside a turn (its own
tests) changes nothing here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pyinfra import host

from specdeploy.config.schema import ServeConfig
from specdeploy.host import server
from specdeploy.render.argv import unit_exec_argv


class Phase(StrEnum):
    SERVING_VERIFIED = "serving-verified"
    STAGED = "staged"
    DRAINED = "drained"
    SWAPPED_UNVERIFIED = "swapped-unverified"
    MEASURING = "measuring an arm"
    RECORDING = "recording"
    STOPPED = "stopped"


# the phases in which the server no longer runs its verified unit: a failure must restore it
LEFT_SERVING = frozenset({Phase.SWAPPED_UNVERIFIED, Phase.MEASURING, Phase.STOPPED})


@dataclass
class Restored:
    """What `ServerTurn.restore` put back: the unit that runs now and its argv (None: nothing was
    kept to restore, the server is stopped)."""

    unit: str
    argv: list[str] | None


@dataclass
class ServerTurn:
    """One server's turn: its config, the unit it verifies, the record's unit as the turn found it
    (config/record.UnitRef; None: no record), the planned unit change, the record as the turn
    found it (config/record.DeploymentRecord), and where it stands."""

    cfg: ServeConfig
    unit: str
    verified: object | None = None
    change: object | None = None
    previous: object | None = None
    phase: Phase = Phase.STAGED
    left_serving: bool = False  # it has been in a phase of LEFT_SERVING since the turn began
    history: tuple[Phase, ...] = ()
    _replaced: bool | None = None

    def enter(self, phase: Phase) -> None:
        self.history = (*self.history, phase)
        self.phase = phase
        if phase in LEFT_SERVING:
            self.left_serving = True
        elif phase is Phase.SERVING_VERIFIED:
            self.left_serving = False  # verified and recorded: settled

    def changed(self) -> bool:
        """This run swapped a unit or env file in."""
        return self.change is not None and self.change.changed()

    def must_restore(self) -> bool:
        """A failure now leaves the server off its verified unit: this run swapped something in,
        the installed unit is not the record's (an earlier run cut off after its swap, or the
        record serves with the other unit), or a step ran another server on its port."""
        if self.phase is Phase.SERVING_VERIFIED:
            return False
        return self.replaced() or self.left_serving

    def replaced(self) -> bool:
        """The installed unit or env file is not the verified pair: this run swapped one in, or
        the installed unit is not the record's (read once a turn)."""
        if self._replaced is None:
            try:
                self._replaced = self.changed() or server.unverified_installed(
                    self.cfg, self.unit, self.verified
                )
            except Exception:  # not known: this run swapped nothing, so the kept copy is older
                return False  # than what is installed (asked again on the next question)
        return self._replaced

    def restore(self) -> Restored:
        """THE way back (see the module): only the restored unit runs and starts at boot."""
        cfg, unit, verified = self.cfg, self.unit, self.verified
        text = None
        if verified is not None and verified.name != unit:  # the record serves with the other
            server.stop_others(cfg, verified.name)
            text = server.restore_recorded(cfg, unit, verified.name)
            unit = verified.name if text is not None else unit
        elif self.replaced():
            server.stop_others(cfg, unit)
            text = server.restore_previous(cfg, unit)
        else:  # the verified unit is installed: an arm stopped it; it starts again
            server.stop_others(cfg, unit)
            text = server.read_text(cfg.unit_path(unit), missing_ok=True)
            if text:
                server.enable(unit)
                server.restart(unit)
        if Phase.RECORDING in self.history:  # the record says what runs: the one it verified
            server.put_back_record(cfg, self.previous.to_json() if self.previous else None)
        if not text:
            server.stop([unit])
            return Restored(unit, None)
        argv = unit_exec_argv(text) or []
        # only the restored unit starts at boot: a gate's fall-back may have left the other on
        server.enable_only(cfg, "speculative" if "--speculative-config" in argv else "baseline")
        self.enter(Phase.SERVING_VERIFIED)
        return Restored(unit, argv)


_TURNS: dict[tuple[str | None, str], ServerTurn] = {}  # (host, service) -> its turn in progress


def _key(cfg: ServeConfig) -> tuple[str | None, str]:
    try:
        where = host.name
    except AttributeError:  # no pyinfra host in context (a step's own tests)
        where = None
    return where, cfg.service_name


def begin(cfg: ServeConfig, unit: str, verified=None, change=None, previous=None) -> ServerTurn:
    turn = ServerTurn(cfg, unit, verified, change, previous)
    _TURNS[_key(cfg)] = turn
    return turn


def end(cfg: ServeConfig) -> None:
    _TURNS.pop(_key(cfg), None)


def current(cfg: ServeConfig) -> ServerTurn | None:
    return _TURNS.get(_key(cfg))


def enter(cfg: ServeConfig, phase: Phase) -> None:
    """A step inside the turn says where the server stands (no turn: nothing to say)."""
    turn = current(cfg)
    if turn is not None:
        turn.enter(phase)

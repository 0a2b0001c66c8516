"""The fake host behind tests/operations/<step>/<case>.json: pyinfra's operation fixtures
(pyinfra's tests/test_operations.py and tests/util.py), for specdeploy's deploy steps.

A step runs against a real pyinfra `State` and `Host` (as tests/unit/host/test_fact_defaults.py
builds them), whose facts come from the fixture and whose execution-time commands (`on_host`) answer
from it; nothing is connected to. What comes out is compared with the fixture:

* planning time (a step that is a pyinfra `@deploy` or `@operation`): every operation it scheduled,
  in order, with the commands pyinfra would run for it on this host, or the `noop` it said; and the
  `noops` said outside any operation (a `@deploy` that schedules nothing).
* execution time (inside `python.call`): every call of `on_host` (`sh`, `read`, `write`), in order;
  each entry also holds the host's answer.

A fixture's keys (all but `call` optional):

    call        the step's function in specdeploy/steps/<dir>.py, or specdeploy/sampling/<dir>.py
                (dotted for a method; a generator is run to its end)
    host_data   merged over tests/unit/conftest.py's VALID (dicts merged key by key)
    args, kwargs
                the call's arguments; "$cfg" is the host data's config, and a one-key object
                {"$builder": value} builds an argument (BUILDERS below: a rendered unit, a secret,
                a whole box's members, its layout or a host's servers, a planned unit change, a
                server's plan, an operation's result, a record, a server's preflight, a gate
                input, a sampler (its samples' host calls stood in for: SampleStandIns), a plan's
                samples, a schedule's proof or a draft choice kept on the control node, a
                server's turn...); a step's `release`/`pinned_release` and `flags` not given are
                the host data's (HANDED: what the deploy's start reads once and hands down)
    executing   run as pyinfra does at execution time (`state.is_executing`); default false
    facts       {"FactClass": value} for a fact without arguments, else
                {"FactClass": {"arg=value, other=value": value}} (pyinfra's get_kwargs_str: sorted;
                "" where a fact with arguments is read without any); a value
                {"$output": "tests/facts/<FactClassName>/<case>.json"} is what the fact's parser
                makes of that recorded output; a fact the step reads and the fixture lacks fails
                the test, as in pyinfra
    control_node
                who the control node is: {"host", "user", "pid", "machine", "started",
                "running_pids", "starts"} (machine: its key; started: this process's start;
                starts: {pid: start} of the other processes running there, where the lock
                compares a holder's start; none given: not known)
    held_locks  {lock path: line}: the deploy locks this process holds on the host (steps/lock.py)
    failed_first
                hosts of this run that failed their restart before this one (steps/rollback.py)
    stand_ins   ["module:function", ...]: the parts a composite step calls, each replaced at its
                own boundary by a recorded stand-in (StandIns: a "called" host entry, compared in
                order with the host's other calls, answered with "returns" or "raises"), so the
                composite's fixture proves the composition and each part is proven by its own
                fixtures; "module" is a folder here (steps/, sampling/) or a dotted room.module
    operations  out: [{"name", "commands"} or {"name", "noop"}] (+ "arguments": the non-default
                global arguments such as _if, _timeout, _serial)
    noops       out: what the step said with host.noop outside any operation
    host        in and out: [{"sh": command, "stdin", "timeout", answers "out", "stderr", "ok"},
                {"read": path, answer "text" (null: no such file) or "file" (repo-relative)},
                {"write": path, "mode", "text" or "json"}, {"called": a stand-in, "args",
                "kwargs", answer "returns" or "raises"}]
    warnings    out: what the step logged as warnings (without the host prefix)
    returns     out: the step's return value as JSON ("$op:N": the Nth operation's OperationMeta;
                {"$called": value}: a function it returns for execution time, called then;
                {"$written": path}: a record equal, field for field, to what the step wrote there)
    exception   out: {"name", "message"} when the step raised

"$name" in facts and arguments is a derived value (DERIVED: the rendered unit's sha1, the gate's
fingerprint, ...), and an output equal to a derived text, sha256 or fingerprint is shown as "$name",
so a template change does not rewrite every fixture. In outputs, a host script's source is
"{script:name}" and the control node's reports folder "{reports}"; "{fixtures}" (in host data
too) is this folder. Every clock reads NOW; the control node is CONTROL_NODE.

What a stand-in returned, and the parts of a built argument a step hands on, show by name where
they are handed on ("$health_and_smoke[1]", "$preflight.snapshots", "$sampler"), so a fixture
shows what goes from one part to the next; a record built on what a stand-in returned shows as
{"$extends": its name, the fields the step added}. {"$data": name} anywhere in a fixture is
tests/operations/data/<name>.json, data several fixtures share (a model's snapshot, a smoke run, a
record, a measured gate decision): one part's output is the next part's input, written once.

SPECDEPLOY_WRITE_FIXTURES=1 rewrites the outputs of every fixture from what the steps did (the
inputs and the host's answers stay): for writing a new case; review the diff like code.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import pkgutil
import re
import shlex
import time as real_time
import types
from contextlib import ExitStack
from datetime import datetime
from inspect import getfullargspec
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pyinfra.api import (
    Config,
    FileDownloadCommand,
    FileUploadCommand,
    FunctionCommand,
    Inventory,
    State,
    StringCommand,
)
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.operation import OperationMeta
from pyinfra.api.util import get_kwargs_str
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state

from specdeploy.config.schema import ServeConfig, config_from_data
from specdeploy.render.argv import engine_flags
from tests.unit.conftest import VALID

FIXTURES = Path(__file__).parent
WRITE = os.environ.get("SPECDEPLOY_WRITE_FIXTURES") == "1"
HOST = "h1"
NOW = 1796144400.0  # 2026-12-01T17:00:00Z: every clock a step reads
CONTROL_NODE = {"host": "ctl", "user": "tester", "pid": 4242, "machine": "c0ffee00c0ffee00",
                "started": "5150", "running_pids": [4242], "starts": {}}  # fmt: skip
INPUTS = ("description", "call", "host_data", "executing", "control_node", "held_locks",
          "failed_first", "stand_ins", "args", "kwargs", "facts")  # fmt: skip
OUTPUTS = ("operations", "noops", "host", "warnings", "returns", "exception")
# a host entry's answer fields (and "text" or "file" of a read; "tpot_ms", "itl_ms", "raw",
# "counters" and "checked" of a sample's stand-in, SampleStandIns)
ANSWERS = {"out", "stderr", "ok", "tpot_ms", "itl_ms", "raw", "counters", "checked", "returns",
           "raises"}  # fmt: skip
REPO = FIXTURES.parents[1]
DATA = FIXTURES / "data"  # what fixtures share, by name: {"$data": name} (not a fixture itself)


def cases() -> list[Path]:
    """Every operation fixture: tests/operations/<step>/<case>.json, but the shared data."""
    return sorted(p for p in FIXTURES.glob("*/*.json") if p.parent != DATA)


class FixtureError(BaseException):
    """The fixture and the step disagree about the host (a fact or a host call it lacks). A
    BaseException, so a step's `except Exception` (the rollback) cannot take it for a failure of
    the host."""


# --- inputs -------------------------------------------------------------------------------------


def merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def expand_fixtures_dir(value):
    if isinstance(value, str):
        return value.replace("{fixtures}", str(FIXTURES))
    if isinstance(value, list):
        return [expand_fixtures_dir(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_fixtures_dir(v) for k, v in value.items()}
    return value


class Case:
    """One fixture while it runs: its config, the objects its arguments built, derived values."""

    def __init__(self, data: dict):
        self.data = data
        self.host_data = expand_fixtures_dir(merged(VALID, data.get("host_data", {})))
        self.cfg = config_from_data(self.host_data)
        self.unit = None  # the rendered unit an argument named ($unit)
        self.members = None  # a whole box's instances ($members)
        self.gate_input = None  # the gate's units and fingerprint ($gate_input)
        self.reports: str | None = None  # where reports land on the control node ({reports})
        self.shell: Shell | None = None  # the fixture's host (run_case sets it)
        self.samples_stand_in = False  # a $sampler with "samples": "stand-in" (SampleStandIns)
        self.samples: list = []  # the samples a $samples argument built
        # what the deploy's start reads once and hands down (checks/host_data.host_inputs)
        self.release = _release_of(self.cfg)
        self.flags = engine_flags(self.cfg)
        self._derived: dict[str, str] = {}
        # objects shown by name where a step hands them on: what a stand-in returned
        # ("$health_and_smoke[1]") and parts of a built argument ("$preflight.snapshots")
        self.named: list[tuple[Any, str]] = []
        # what each stand-in returned, as shown when it returned (a step may change it after)
        self.returned: list[tuple[str, Any]] = []

    def name(self, value, name: str) -> None:
        if not (value is None or isinstance(value, bool | int | float | str)):
            self.named.append((value, name))

    def name_of(self, value) -> str | None:
        return next((name for obj, name in self.named if obj is value), None)

    def object_named(self, name: str):
        return next((obj for obj, known in self.named if known == name), None)

    def derived(self, name: str) -> str:
        if name not in DERIVED:
            raise FixtureError(f"unknown derived value ${name} (known: {', '.join(DERIVED)})")
        return DERIVED[name](self)

    def derived_or_none(self, name: str) -> str | None:
        """A derived value where this case has what it derives from (cached: outputs ask often)."""
        if name not in self._derived:
            try:
                self._derived[name] = self.derived(name)
            except FixtureError:
                return None  # not cached: a $unit argument may still come
        return self._derived[name]


def _release_of(cfg: ServeConfig):
    from specdeploy.releases import capabilities

    try:
        return capabilities.release_of(cfg.vllm_version, cfg.allow_unknown_release)
    except capabilities.UnknownRelease:
        return None


# A step's parameters that a deploy's start fills (flows/serve.py, flows/measure.py: the pin's
# Release and the engine flags, read once): given from the host data where the fixture does not
# give them, as the flow hands them down.
HANDED = {"release": "release", "pinned_release": "release", "flags": "flags"}


def handed_in(case: Case, function, args: list, kwargs: dict) -> dict:
    """`kwargs` with what the deploy's start hands the step (HANDED) and the fixture left out."""
    params = list(inspect.signature(function).parameters)
    given = set(params[: len(args)]) | set(kwargs)
    extra = {name: getattr(case, attr) for name, attr in HANDED.items()
             if name in params and name not in given}  # fmt: skip
    return {**kwargs, **extra}


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _env_text(case: Case) -> str:
    from specdeploy.render.units import render_env_file
    from specdeploy.steps.secrets import as_written

    return as_written(render_env_file(case.cfg))


def _unit(case: Case):
    if case.unit is None:
        raise FixtureError("a $unit_* value needs a {'$unit': role} argument")
    return case.unit


def _balancer(case: Case):
    from specdeploy.render.units import render_balancer

    if case.members is None:
        raise FixtureError("a $balancer_* value needs a {'$members': ...} argument")
    return render_balancer(case.cfg, case.members)


def _render(case: Case, role: str):
    from specdeploy.render.units import render_unit

    return render_unit(case.cfg, role)


def _gate_fingerprint(case: Case) -> dict:
    """What the gate's decision on this host depends on (steps/gate.fingerprint)."""
    from specdeploy.steps import gate

    if case.cfg.speculation_gate is None:
        raise FixtureError("$gate_fingerprint needs speculation_gate in the host data")
    return gate.fingerprint(case.cfg, _render(case, "speculative"), _render(case, "baseline"))


DERIVED = {
    "unit_text": lambda case: _unit(case).text,
    "unit_sha1": lambda case: _sha1(_unit(case).text),
    "unit_sha256": lambda case: _unit(case).sha256,
    "env_text": _env_text,
    "env_sha1": lambda case: _sha1(_env_text(case)),
    "balancer_config_text": lambda case: _balancer(case)[0].text,
    "balancer_config_sha1": lambda case: _sha1(_balancer(case)[0].text),
    "balancer_unit_text": lambda case: _balancer(case)[1].text,
    "balancer_unit_sha1": lambda case: _sha1(_balancer(case)[1].text),
    "baseline_unit_text": lambda case: _render(case, "baseline").text,
    "baseline_unit_sha256": lambda case: _render(case, "baseline").sha256,
    "gate_fingerprint": _gate_fingerprint,
}
SHOWN = [n for n in DERIVED if n.endswith(("_text", "_sha256", "_fingerprint"))]  # in outputs


def _build_unit(case: Case, role: str):
    """The unit of `role` as plan_server renders it: from the CudaBoot fact the step reads."""
    from specdeploy.render.units import render_unit
    from specdeploy.steps.unit import cuda_boot

    case.unit = render_unit(case.cfg, role, cuda_boot=cuda_boot(case.cfg))
    return case.unit


def _build_members(case: Case, _value):
    from specdeploy.render.units import instances

    case.members = instances.expand(case.cfg).instances
    return case.members


def _build_layout(case: Case, available: list[int] | None):
    """A whole box's split of the host's GPUs or cores `available` (render/instances.expand)."""
    from specdeploy.render import instances

    layout = instances.expand(case.cfg, available, flags=case.flags)
    case.members = layout.instances
    return layout


def _build_servers(case: Case, available: list[int] | None):
    """steps/servers.HostServers as host_servers plans them: a whole box split over `available`,
    or (instances unset) the host's one server."""
    from specdeploy.steps.servers import HostServers, the_one_server

    handed = {"release": case.release, "flags": case.flags}
    if case.cfg.instances is None:
        return HostServers(case.cfg, (the_one_server(case.cfg),), balanced=False, **handed)
    members = tuple(_build_layout(case, available).instances)
    return HostServers(case.cfg, members, balanced=True, **handed)


def _build_secret(case: Case, value: str):
    from specdeploy.steps.secrets import Secret

    return Secret(value)


def _build_change(case: Case, spec: dict):
    """A steps.unit.UnitChange as install_unit planned it (its staging upload: `staged`)."""
    from specdeploy.steps.unit import UnitChange

    staged = bool(spec.get("staged"))
    stage = types.SimpleNamespace(will_change=staged, did_change=lambda: staged)
    unit = _build_unit(case, spec.get("role", "speculative"))
    return UnitChange(case.cfg, unit, spec.get("unit_differs", False),
                      spec.get("env_differs", False), enable=spec.get("enable", True),
                      stage_op=stage)  # fmt: skip


def _build_verify(case: Case, spec):
    """What serve.py's verify does, as the step sees it: returns `returns`, or raises `raises`."""

    def verify(cfg, rendered, **kwargs):
        if isinstance(spec, dict) and "raises" in spec:
            raise RuntimeError(spec["raises"])
        return spec.get("returns") if isinstance(spec, dict) else spec

    return verify


def _build_record(case: Case, spec: dict):
    """A deployment record: `spec`, over the record in `file` (repo-relative) when it names one."""
    from specdeploy.config.record import DeploymentRecord

    spec = dict(spec)
    base = json.loads((REPO / spec.pop("file")).read_text()) if "file" in spec else {}
    return DeploymentRecord.model_validate(merged(base, substitute(case, spec)))


def _build_gate_input(case: Case, role: str):
    """steps/gate.gate_input for the rendered unit of `role` (planning time)."""
    from specdeploy.steps import gate

    case.gate_input = gate.gate_input(case.cfg, _build_unit(case, role))
    case.name(case.gate_input, "$gate_input")
    return case.gate_input


def _build_box_gate(case: Case, spec: dict | None):
    """A whole box's gate in one rolling restart; `decision`: another instance's, for this one."""
    from specdeploy.config.record import GateDecision
    from specdeploy.steps import gate

    box = gate.BoxGate()
    if spec and "decision" in spec:
        decision = GateDecision.model_validate(substitute(case, spec["decision"]))
        box.decisions[gate.BoxGate.key(case.gate_input)] = decision
    case.name(box, "$box_gate")
    return box


def _build_sampler(case: Case, spec: dict):
    """sampling/sampler.Sampler for the case's config, renewing the deploy lock as the gate and the
    harness hand it in (steps/lock.renewal): `tokenizer`, and for a measurement that stopped
    production the unit its watchdog `restores` (and `readmit`)."""
    from specdeploy.sampling.sampler import Sampler
    from specdeploy.steps import lock

    readmit = tuple(spec["readmit"]) if spec.get("readmit") else None
    case.samples_stand_in = spec.get("samples") == "stand-in"
    tokenizer = spec.get("tokenizer", "/var/lib/specdeploy/hf/tok")
    sampler = Sampler(case.cfg, tokenizer=tokenizer, renew_lease=lock.renewal(case.cfg),
                      restores=spec.get("restores"), readmit=readmit)  # fmt: skip
    case.name(sampler, "$sampler")
    return sampler


# A stand-in benchmark's vLLM result where the entry gives no "raw": what a 16-prompt run of the
# fixtures' workload prints, its median TPOT the entry's "tpot_ms" (its ITL "itl_ms", else twice
# the TPOT)
STAND_IN_RAW = {"completed": 16, "failed": 0, "total_output_tokens": 4096, "median_ttft_ms": 40.0,
                "median_e2el_ms": 2000.0, "output_lens": [256] * 16}  # fmt: skip


def stand_in_raw(tpot_ms: float, itl_ms: float | None = None) -> dict:
    """STAND_IN_RAW at a median TPOT of `tpot_ms` (vLLM's keys in the order it writes them)."""
    raw = dict(STAND_IN_RAW)
    itl_ms = round(2 * tpot_ms, 6) if itl_ms is None else itl_ms
    return {**{k: raw.pop(k) for k in ("completed", "failed", "total_output_tokens",
                                       "median_ttft_ms")},
            "median_tpot_ms": tpot_ms, "median_itl_ms": itl_ms, **raw}  # fmt: skip


class SampleStandIns:
    """A `$sampler` with "samples": "stand-in": what one sample runs on the host (its fresh
    server, its warm-up, its benchmark: sampling/sampler.py's start_fresh, warm_up, PendingBench)
    is a stand-in, so a measuring step's fixture (the gate) pins its own operations: the samples it
    asks for, in order, each a host entry {"sampled": what}, answered by the entry ("tpot_ms": the
    benchmark's median TPOT, "itl_ms" its ITL where not twice that; "raw": its whole vLLM result;
    "counters": the server's spec-decode counts over the run, else none counted; "checked": a fresh
    server's health check, else {"healthy": unit}). The sampler itself runs as it does on a host:
    the lease renewed before every fresh server, the visit's same server reused, the unit the gate
    ends on started through it. What the stand-ins stand for is pinned once by
    tests/operations/runs/ (one sample's commands, on a fresh server and on the same server)."""

    def __init__(self, case: Case):
        self.case = case

    def sampled(self, what: str) -> dict:
        return self.case.shell._next({"sampled": what})

    def patch(self, monkeypatch) -> None:
        from specdeploy.sampling import sampler

        monkeypatch.setattr(sampler, "start_fresh", self.start_fresh)
        monkeypatch.setattr(sampler, "warm_up", self.warm_up)
        monkeypatch.setattr(sampler, "PendingBench", self.bench)

    def start_fresh(self, cfg, unit, *, speculative: bool, install: bool = True) -> dict:
        entry = self.sampled(f"start {unit.name}" + (", its unit written" if install else ""))
        return entry.get("checked", {"healthy": unit.name})

    def warm_up(self, cfg, workload) -> None:
        self.sampled("warm up")

    def bench(self, cfg, *, tokenizer: str, name: str, workload=None, extra=()):
        return StandInBench(self, cfg, name, workload)


class StandInBench:
    """host/bench.PendingBench as SampleStandIns answers it: started with its server, run on ask."""

    def __init__(self, stand_ins: SampleStandIns, cfg, name: str, workload):
        self.stand_ins, self.cfg, self.name = stand_ins, cfg, name
        self.concurrency = (workload or cfg.workload).max_concurrency

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def run(self, *, local: Path, meta: dict | None = None):
        from specdeploy.config.record import BenchResult
        from specdeploy.config.timestamps import utc_iso
        from specdeploy.decide.metrics import acceptance

        entry = self.stand_ins.sampled(f"bench {self.name} at concurrency {self.concurrency}")
        raw = entry.get("raw") or stand_in_raw(entry["tpot_ms"], entry.get("itl_ms"))
        counters = entry.get("counters") or acceptance({}, {})
        run = {**(meta or {}), "host": HOST, "server_counters": counters, "bench_seconds": 0.0,
               "finished_at": utc_iso()}  # fmt: skip
        result = BenchResult.model_validate(raw | {"specdeploy": run})
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(result.to_json())
        return result


class StandIns:
    """`stand_ins`: ["module:function", ...], steps (or sampling) functions a composite step calls,
    each replaced at its own boundary by a recorded stand-in, so the composite's fixture proves
    only the composition (which parts, in which order, what each is handed, what a failure does)
    and each part is proven by its own fixtures (tests/operations/<module>/). A call is a host
    entry {"called": "module:function", "args", "kwargs"} (compared, in order, with the host's
    other calls), answered by the entry: "returns" (built as an argument is: "$unit", "$record",
    ...), or "raises" {"name", "message"} (an exception class of specdeploy by its name). What a
    stand-in returned is shown by name where the step hands it on: "$function", and "$function[i]"
    for the i-th of a tuple."""

    def __init__(self, case: Case, host):
        self.case, self.host = case, host

    def patch(self, monkeypatch) -> None:
        for spec in self.case.data.get("stand_ins", []):
            module_name, _, attr = spec.partition(":")
            # a step's or sampling's module by its folder's name, else a dotted room.module
            module = (importlib.import_module(f"specdeploy.{module_name}") if "." in module_name
                      else step_module(module_name))  # fmt: skip
            original = getattr(module, attr)
            replacement = self.stand_in(spec, original)
            _patch_everywhere(monkeypatch, original, replacement)

    def stand_in(self, spec: str, original):
        case, host, short = self.case, self.host, spec.partition(":")[2]

        def called(*args, **kwargs):
            call: dict[str, Any] = {"called": spec}
            if args:
                call["args"] = jsonable(case, list(args), host)
            if kwargs:
                call["kwargs"] = jsonable(case, kwargs, host)
            entry = case.shell._next(call)
            if "raises" in entry:
                raised = entry["raises"]
                raise exception_named(raised["name"])(raised["message"])
            result = build(case, entry.get("returns"))
            parts = list(enumerate(result)) if isinstance(result, list) else [(None, result)]
            for i, value in parts:  # as it was returned, before the step adds to it
                if isinstance(value, dict) and case.name_of(value) is None:
                    name = f"${short}" if i is None else f"${short}[{i}]"
                    case.returned.append((name, copy.deepcopy(jsonable(case, value, host))))
            if isinstance(result, list):
                for i, value in parts:
                    case.name(value, f"${short}[{i}]")
                result = tuple(result)
            case.name(result, f"${short}")
            return result

        called.__wrapped__ = original
        return called


def exception_named(name: str) -> type[BaseException]:
    """The exception class `name` of a specdeploy module (or a builtin one)."""
    import builtins
    import sys

    for module_name, module in list(sys.modules.items()):
        value = getattr(module, name, None) if module_name.startswith("specdeploy") else None
        if isinstance(value, type) and issubclass(value, Exception):
            return value
    value = getattr(builtins, name, None)
    if isinstance(value, type) and issubclass(value, Exception):
        return value
    raise FixtureError(f"no exception class {name} in specdeploy")


def _build_samples(case: Case, spec: list[dict]):
    """sampling/sampler.Sample each, as a plan asks for them: its server's unit (`unit`: a role,
    rendered as $unit renders it), its raw file's `name`, the workload at load level `concurrency`
    (else the host's), `meta`, `renew_s`, `install`, `same_server`."""
    from specdeploy.sampling.sampler import Sample

    levels = {lv.concurrency: lv for lv in case.cfg.workload.effective_load_levels}
    samples = []
    for item in spec:
        level = levels.get(item.get("concurrency"))
        workload = case.cfg.workload.at_level(level) if level else case.cfg.workload
        samples.append(Sample(_build_unit(case, item["unit"]), item["name"], workload,
                              item.get("meta", {}), item.get("renew_s"),
                              install=item.get("install", True),
                              same_server=item.get("same_server", False)))  # fmt: skip
    case.samples += samples
    return samples


def _build_reports_dir(case: Case, under: str):
    """A folder `under` the control node's reports folder ({reports})."""
    return Path(case.reports) / under


def _build_smoke(case: Case, spec: dict):
    """A smoke run's result (config/record.BenchResult), as steps/smoke.health_and_smoke returns."""
    from specdeploy.config.record import BenchResult

    return BenchResult.model_validate(substitute(case, spec))


def _build_fleet_class(case: Case, spec: dict):
    """The host's hardware (checks/preflight.hardware), its class's decision (`decision`, measured
    on `measured_on`) already kept on the control node when given, as an earlier batch leaves it."""
    from specdeploy.config.record import GateDecision
    from specdeploy.steps import gate

    hardware = spec["hardware"]
    if "decision" in spec:
        decision = GateDecision.model_validate(substitute(case, spec["decision"]))
        key = gate.class_key(case.gate_input, hardware)
        gate.FleetClasses().keep(key, decision, spec["measured_on"])
    return hardware


def _build_kept_proof(case: Case, spec: dict):
    """A schedule's proof kept on the control node as deploys/compare.py leaves it
    (report/load_summary.keep_proofs), for the case's config on `hardware` with `changes` made to
    its fingerprint (another release, ...), holding `proof`; the argument is `role`."""
    from specdeploy.report.load_summary import PROOFS, proof_fingerprint, proof_key
    from specdeploy.report.paths import reports_root

    fingerprint = proof_fingerprint(case.cfg, spec["hardware"]) | spec.get("changes", {})
    entry = {"key": proof_key(fingerprint), "fingerprint": fingerprint, **spec["proof"]}
    path = reports_root() / PROOFS / f"{entry['key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry))
    return spec["role"]


def _build_kept_choice(case: Case, spec: dict):
    """A draft choice kept on the control node as deploys/choose_draft.py leaves it
    (report/draft_summary.keep_choices), for the case's config on `hardware` with `changes` made
    to its fingerprint, holding `choice`; the argument is `role`."""
    from specdeploy.report.draft_summary import CHOICES, choice_fingerprint
    from specdeploy.report.load_summary import proof_key
    from specdeploy.report.paths import reports_root

    fingerprint = choice_fingerprint(case.cfg, spec["hardware"]) | spec.get("changes", {})
    entry = {"key": proof_key(fingerprint), "fingerprint": fingerprint, **spec["choice"]}
    path = reports_root() / CHOICES / f"{entry['key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry))
    return spec["role"]


def _build_operation(case: Case, changes: bool):
    """An operation's result (OperationMeta) as a later step reads it: `will_change` while
    planning, `did_change()` once it ran — both `changes`."""
    return types.SimpleNamespace(will_change=bool(changes), did_change=lambda: bool(changes))


def _build_preflight(case: Case, spec: dict):
    """steps/preflight.ServerPreflight: the snapshots, and the rules' Preflight (`result`)."""
    from specdeploy.checks.gpus import Preflight
    from specdeploy.steps.preflight import ServerPreflight

    preflight = ServerPreflight(substitute(case, spec["snapshots"]),
                                Preflight(**spec.get("result", {})))  # fmt: skip
    case.name(preflight, "$preflight")
    case.name(preflight.snapshots, "$preflight.snapshots")
    case.name(preflight.result, "$preflight.result")
    case.name(preflight.result.hardware, "$preflight.result.hardware")
    return preflight


def _build_preflight_result(case: Case, spec: dict):
    """checks/gpus.Preflight: what the preflight's rules found (steps/preflight.run_preflight)."""
    from specdeploy.checks.gpus import Preflight

    return Preflight(**spec)


def _build_plan(case: Case, spec: dict):
    """steps/servers.ServerPlan of the host's one server: its unit of `role`, the UnitChange
    `change` planned for it ($change's spec), and `previous`, its record ($record's spec)."""
    from specdeploy.steps.servers import ServerPlan, the_one_server

    change = _build_change(case, {"role": spec.get("role", "speculative"), **spec["change"]})
    previous = _build_record(case, spec["previous"]) if "previous" in spec else None
    return ServerPlan(the_one_server(case.cfg), change.unit, previous, None, change=change,
                      release=case.release, flags=case.flags)  # fmt: skip


def _build_turn(case: Case, spec: dict):
    """steps/turn.ServerTurn of the host's one server (its unit of `role`), where it stands: the
    record's unit `verified` ({name, sha256}), the UnitChange `change` ($change's spec, `applied`
    once swapped in) and the `phases` it went through."""
    from specdeploy.steps.turn import Phase, ServerTurn

    unit = _build_unit(case, spec.get("role", "speculative"))
    change = None
    if "change" in spec:
        change = _build_change(case, spec["change"])
        change.applied = bool(spec["change"].get("applied"))
    verified = types.SimpleNamespace(**spec["verified"]) if "verified" in spec else None
    turn = ServerTurn(case.cfg, unit.name, verified, change)
    for phase in spec.get("phases", []):
        turn.enter(Phase(phase))
    return turn


def _build_namespace(case: Case, spec: dict):
    return types.SimpleNamespace(**spec)


BUILDERS = {
    "$unit": _build_unit,
    "$members": _build_members,
    "$layout": _build_layout,
    "$servers": _build_servers,
    "$secret": _build_secret,
    "$change": _build_change,
    "$verify": _build_verify,
    "$record": _build_record,
    "$namespace": _build_namespace,
    "$turn": _build_turn,
    "$plan": _build_plan,
    "$operation": _build_operation,
    "$preflight": _build_preflight,
    "$preflight_result": _build_preflight_result,
    "$gate_input": _build_gate_input,
    "$box_gate": _build_box_gate,
    "$smoke": _build_smoke,
    "$sampler": _build_sampler,
    "$fleet_class": _build_fleet_class,
    "$kept_proof": _build_kept_proof,
    "$kept_choice": _build_kept_choice,
    "$samples": _build_samples,
    "$reports_dir": _build_reports_dir,
}


def shared_data(value):
    """`value` with every {"$data": name} replaced by tests/operations/data/<name>.json."""
    if isinstance(value, dict) and set(value) == {"$data"}:
        return shared_data(json.loads((DATA / f"{value['$data']}.json").read_text()))
    if isinstance(value, list):
        return [shared_data(v) for v in value]
    if isinstance(value, dict):
        return {k: shared_data(v) for k, v in value.items()}
    return value


def build(case: Case, value):
    value = shared_data(value)
    if value == "$cfg":
        return case.cfg
    if isinstance(value, str) and case.object_named(value) is not None:  # handed on, by name
        return case.object_named(value)
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in BUILDERS:
        ((name, spec),) = value.items()
        return BUILDERS[name](case, spec)
    if isinstance(value, list):
        return [build(case, v) for v in value]
    if isinstance(value, dict):
        return {k: build(case, v) for k, v in value.items()}
    return substitute(case, expand_fixtures_dir(value))


def substitute(case: Case, value):
    """Derived values ("$unit_sha1", "$gate_fingerprint", ...) in an input."""
    if isinstance(value, str) and value.startswith("$") and value[1:] in DERIVED:
        return case.derived(value[1:])
    if isinstance(value, list):
        return [substitute(case, v) for v in value]
    if isinstance(value, dict):
        return {k: substitute(case, v) for k, v in value.items()}
    return value


# --- the host: facts ----------------------------------------------------------------------------


def typed(fact_cls, value):
    """A fact's JSON value as the fact returns it (a pydantic model where the fact gives one)."""
    if value is None:
        return None
    try:
        default = fact_cls().default()
    except Exception:
        default = None
    if isinstance(default, BaseModel):
        return type(default).model_validate(value)
    return value


class Facts:
    """pyinfra's FakeHost.get_fact: the fixture's value for the fact and its arguments."""

    def __init__(self, case: Case):
        self.case, self.facts = case, shared_data(case.data.get("facts", {}))
        self.read: set[tuple[str, str | None]] = set()

    def unread(self) -> list[str]:
        """The fixture's facts the step never read (a fixture says only what matters)."""
        out = []
        for name, value in self.facts.items():
            if (name, None) in self.read:
                continue
            if any(fact == name for fact, _ in self.read):  # read with arguments: which ones
                out += [f"{name} {key!r}" for key in value if (name, key) not in self.read]
            else:
                out.append(name)
        return out

    def get_fact(self, fact_cls, *args, **kwargs):
        if args:
            raise FixtureError(f"{fact_cls.__name__}: positional fact arguments {args}")
        name = fact_cls.__name__
        if name not in self.facts:
            raise FixtureError(f"missing test fact data: {name} ({get_kwargs_str(kwargs)})")
        value = self.facts[name]
        real = getfullargspec(fact_cls.command).args
        # a fact with arguments read without any: pyinfra's key for no arguments, ""
        keyed = bool(kwargs) or (len(real) > 1 and isinstance(value, dict) and "" in value)
        if not keyed:
            self.read.add((name, None))
        else:
            unknown = [key for key in kwargs if key not in real]
            if unknown:
                raise FixtureError(f"{name}: {unknown} are not arguments of its command")
            key = get_kwargs_str(kwargs)
            if not isinstance(value, dict) or key not in value:
                raise FixtureError(f"missing test fact data: {name} {key!r}")
            self.read.add((name, key))
            value = value[key]
        if isinstance(value, dict) and set(value) == {"$output"}:
            return recorded(fact_cls, value["$output"])
        return typed(fact_cls, substitute(self.case, copy.deepcopy(value)))


def recorded(fact_cls, path: str):
    """The fact's value for a recorded output: its parser over the "output" of a fact fixture
    (tests/facts/<FactClassName>/<case>.json, repo-relative), as that fact's own test reads it."""
    data = json.loads((REPO / path).read_text())
    return fact_cls().process(data["output"])


# --- the host: what runs on it at execution time (specdeploy.host.on_host) -----------------------


class Shell:
    """on_host's `sh_status`, `read_text` and `write_text`, answered in order from the fixture's
    `host` entries; every call is recorded (on_host.sh runs on sh_status, as it does for real)."""

    def __init__(self, case: Case):
        self.case, self.script = case, shared_data(case.data.get("host", []))
        self.calls: list[dict] = []

    def _next(self, call: dict) -> dict:
        i = len(self.calls)
        self.calls.append(call)
        entry = self.script[i] if i < len(self.script) else None
        if entry is not None and _call_part(entry) == shown(self.case, call):
            call.update({k: v for k, v in entry.items() if k not in call})
            return entry
        if WRITE and entry is not None and entry.get("called", False) == call.get("called"):
            # a writer: a stand-in's answer kept, its arguments rewritten from what the step made
            call.update({k: v for k, v in entry.items() if k in ANSWERS})
            return entry
        if WRITE and i < len(self.script) + 5:  # recorded, answered with nothing, for a writer
            return {}
        raise FixtureError(
            f"host call {i}: the fixture has\n  {json.dumps(entry)}\nthe step made\n"
            f"  {json.dumps(call)}"
        )

    def sh_status(self, command: str, *, stdin: str | None = None, timeout: int | None = None):
        call = {"sh": str(command)}
        if stdin is not None:
            call["stdin"] = stdin
        if timeout is not None:
            call["timeout"] = timeout
        entry = self._next(call)
        out, err = entry.get("out", ""), entry.get("stderr", "")
        lines = [OutputLine("stdout", line) for line in out.splitlines()]
        lines += [OutputLine("stderr", line) for line in err.splitlines()]
        return entry.get("ok", True), CommandOutput(lines).stdout, CommandOutput(lines)

    def read_text(self, path: str, *, missing_ok: bool = False):
        from specdeploy.host.on_host import HostCommandError

        entry = self._next({"read": path})
        text = (REPO / entry["file"]).read_text() if "file" in entry else entry.get("text")
        if text is None and not missing_ok:
            raise HostCommandError(f"{HOST}: cannot read {path}: specdeploy: no such file")
        return text

    def write_text(self, path, text, *, mode="644", owner="root", group="root"):
        from specdeploy.host.on_host import HostCommandError

        call = {"write": path, "mode": mode}
        if (owner, group) != ("root", "root"):
            call["owner"] = f"{owner}:{group}"
        call |= written(text)
        entry = self._next(call)
        if not entry.get("ok", True):
            raise HostCommandError(f"{HOST}: `write {path}` failed:\n{entry.get('stderr', '')}")


def written(text: str) -> dict:
    """A written file as the fixture shows it: JSON parsed (a record), else its text."""
    try:
        return {"json": json.loads(text)} if text.lstrip().startswith("{") else {"text": text}
    except ValueError:
        return {"text": text}


def _call_part(entry: dict) -> dict:
    if "read" in entry:
        return {"read": entry["read"]}
    return {k: v for k, v in entry.items() if k not in ANSWERS}


# --- the clock, the control node ----------------------------------------------------------------


class FrozenTime:
    """The `time` module as every specdeploy module sees it here: NOW, and no sleeping."""

    def __getattr__(self, name):
        return getattr(real_time, name)

    @staticmethod
    def time() -> float:
        return NOW

    @staticmethod
    def monotonic() -> float:
        return 1000.0

    @staticmethod
    def time_ns() -> int:
        return int(NOW) * 10**9

    @staticmethod
    def sleep(_seconds) -> None:
        pass

    @staticmethod
    def gmtime(seconds=None):
        return real_time.gmtime(NOW if seconds is None else seconds)


class FrozenDatetime(datetime):
    """datetime with `now()` at NOW."""

    @classmethod
    def now(cls, tz=None):
        return datetime.fromtimestamp(NOW, tz)


class Namespace:
    """A module with some of its names replaced."""

    def __init__(self, module, **replaced):
        self._module, self._replaced = module, replaced

    def __getattr__(self, name):
        return self._replaced[name] if name in self._replaced else getattr(self._module, name)


def _patch_everywhere(monkeypatch, original, replacement) -> None:
    """Replace `original` wherever a specdeploy module bound it (`from x import f` copies it)."""
    import sys

    for name, module in list(sys.modules.items()):
        if not name.startswith("specdeploy") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                monkeypatch.setattr(module, attr, replacement)


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# --- running one fixture ------------------------------------------------------------------------


def pyinfra_host():
    """A host of a real pyinfra State (test_fact_defaults.pyinfra_host, with no connector: a
    command that reaches pyinfra's connector is a step that bypassed on_host)."""
    inventory = Inventory(([HOST], {}))
    state = State(inventory, Config(TEMP_DIR="/tmp"), check_for_changes=False)
    host = inventory.get_host(HOST)
    return state, host


# the rooms whose functions a fixture calls: the deploy's steps, and the sampling room below them
# (tests/operations/<module>/ names a module of either)
STEP_ROOMS = ("steps", "sampling")


def import_steps() -> None:
    """Every step module and what it imports, before anything is replaced: a module imported
    while a fake is in place would keep it (`from on_host import sh`) after the test."""
    for room in STEP_ROOMS:
        package = importlib.import_module(f"specdeploy.{room}")
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"specdeploy.{room}.{info.name}")


def step_module(name: str):
    """The module `tests/operations/<name>/` calls into: specdeploy/steps/<name>.py, else
    specdeploy/sampling/<name>.py."""
    for room in STEP_ROOMS:
        if importlib.util.find_spec(f"specdeploy.{room}.{name}") is not None:
            return importlib.import_module(f"specdeploy.{room}.{name}")
    raise FixtureError(f"no module {name} in specdeploy/{' or specdeploy/'.join(STEP_ROOMS)}")


def run_case(data: dict, monkeypatch, tmp_path) -> dict:
    """Run the fixture's step; what it did, in the fixture's output keys."""
    import secrets as stdlib_secrets
    import time as time_module

    from specdeploy.host import on_host

    import_steps()
    from specdeploy.steps import lock, rollback

    case = Case(data)
    state, host = pyinfra_host()
    facts, shell = Facts(case), Shell(case)
    case.shell = shell
    noops: list[tuple[str | None, str]] = []
    host.get_fact = facts.get_fact
    host.noop = lambda description: noops.append((host.current_op_hash, description))

    def no_connector(*args, **kwargs):
        raise FixtureError("a command reached pyinfra's connector, not on_host")

    host.run_shell_command = no_connector
    for name in ("sh_status", "read_text", "write_text"):
        _patch_everywhere(monkeypatch, getattr(on_host, name), getattr(shell, name))
    _patch_everywhere(monkeypatch, time_module, FrozenTime())
    _patch_everywhere(monkeypatch, datetime, FrozenDatetime)
    fake_secrets = types.SimpleNamespace(token_hex=lambda n=16: "5eed" * (n // 2))
    _patch_everywhere(monkeypatch, stdlib_secrets, fake_secrets)
    node = CONTROL_NODE | data.get("control_node", {})
    monkeypatch.setattr(lock, "control_host", lambda: node["host"])
    monkeypatch.setattr(lock, "getpass", types.SimpleNamespace(getuser=lambda: node["user"]))
    monkeypatch.setattr(lock, "os", Namespace(os, getpid=lambda: node["pid"]))
    monkeypatch.setattr(lock, "pid_alive", lambda pid: pid in node["running_pids"])
    monkeypatch.setattr(lock, "machine_key", lambda: node["machine"])
    monkeypatch.setattr(lock, "own_start", lambda: node["started"])
    starts = {int(pid): start for pid, start in node["starts"].items()}
    monkeypatch.setattr(lock, "process_start", lambda pid="self": starts.get(pid))
    monkeypatch.setattr(lock, "_HELD", {HOST: dict(data["held_locks"])} if "held_locks" in data
                        else {})  # fmt: skip
    monkeypatch.setattr(lock, "_LEASES", {})  # the leases and losses this process saw: none yet
    monkeypatch.setattr(lock, "_LOST", {})
    gate = rollback.RolloutGate()  # this pyinfra run's failed hosts (steps/rollback.py)
    gate.failed = list(data.get("failed_first", []))
    monkeypatch.setattr(rollback, "GATE", gate)
    case.reports = str(tmp_path / "reports")
    monkeypatch.setenv("SPECDEPLOY_REPORTS", case.reports)
    monkeypatch.delenv("SPECDEPLOY_ROLLOUT_REPORT", raising=False)
    recorder = Recorder()
    logging.getLogger("pyinfra").addHandler(recorder)

    module_name, _, attr = data["call"].partition(":")
    got: dict[str, Any] = {}
    executing = bool(data.get("executing"))
    with ExitStack() as stack:
        stack.callback(logging.getLogger("pyinfra").removeHandler, recorder)
        stack.enter_context(ctx_state.use(state))
        stack.enter_context(ctx_host.use(host))
        function = step_module(module_name)
        for part in attr.split("."):
            function = getattr(function, part)
        planned = hasattr(function, "_inner")  # a @deploy or @operation: it schedules
        result, error = None, None
        try:
            args = build(case, data.get("args", []))
            kwargs = handed_in(case, function, args, build(case, data.get("kwargs", {})))
            if case.samples_stand_in:
                SampleStandIns(case).patch(monkeypatch)
            StandIns(case, host).patch(monkeypatch)
            state.is_executing = executing and not planned
            result = function(*args, **kwargs)
            if isinstance(result, types.GeneratorType):  # a loop over samples: run to its end
                result = list(result)
        except Exception as raised:  # what a step raises is an output (a FixtureError is not)
            error = raised
        except FixtureError as stopped:  # a writer gets what was recorded up to here
            if not WRITE:
                raise
            error = stopped
        finally:
            state.is_executing = False
        # the operations it scheduled (up to the first that raises, where pyinfra stops the host)
        got["operations"], failed = collect(case, state, host, noops, executing)
        error = error or failed
        if error is None and isinstance(result, types.FunctionType):
            # a decision the step leaves to execution time (verify_needed's `needed`): what it
            # says once the operations ran, as the python.call that reads it would see it
            state.is_executing = True
            try:
                result = {"$called": result()}
            except Exception as raised:
                error = raised
            finally:
                state.is_executing = False
        if error is not None:
            got["exception"] = {"name": type(error).__name__, "message": str(error)}
        got["noops"] = [text for op, text in noops if op is None]
        got["unread_facts"] = facts.unread()
        got["host"] = shown(case, shell.calls)
        got["warnings"] = [strip_prefix(m) for m in recorder.messages]
        if "exception" not in got:
            got["returns"] = written_back(shell.calls, result) or shown(
                case, jsonable(case, result, host)
            )
    return got


def written_back(calls: list[dict], result) -> dict | None:
    """A returned record that is exactly what the step wrote to the host (its JSON, every field):
    shown as {"$written": path}, the write entry holding it once."""
    if not isinstance(result, BaseModel) or not hasattr(result, "to_json"):
        return None
    text = json.loads(result.to_json())
    return next(({"$written": c["write"]} for c in calls if c.get("json") == text), None)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_prefix(message: str) -> str:
    return re.sub(rf"^\[{HOST}\]\s*", "", ANSI.sub("", message))


def collect(case: Case, state, host, noops, executing: bool):
    """Each scheduled operation: its name, the commands pyinfra would run (its generator, as
    pyinfra runs it on this host), or its noop; and its non-default global arguments. Stops at an
    operation whose generator raises ("raised": true), as pyinfra stops the host; returns
    (operations, that error or None)."""
    defaults, _ = pop_global_arguments(state, host, {})
    operations = []
    for op_hash in list(host.op_hash_order):
        meta, data = state.get_op_meta(op_hash), state.get_op_data_for_host(host, op_hash)
        entry: dict[str, Any] = {"op": operation_of(data), "name": sorted(meta.names)[0]}
        arguments = {}
        for key, value in {**data.global_arguments, **meta.global_arguments}.items():
            if key != "name" and key in defaults and value != defaults[key]:
                arguments[key] = jsonable(case, value, host)
        state.is_executing = executing
        commands, error = [], None
        try:
            for command in data.command_generator():
                commands.append(command_json(case, command, host))
        except Exception as raised:
            error = raised
        finally:
            state.is_executing = False
        said = [text for op, text in noops if op == op_hash]
        if commands or not said:
            entry["commands"] = commands
        if said:
            entry["noop"] = said[-1]
        if arguments:
            entry["arguments"] = arguments
        if error is not None:
            entry["raised"] = True
        operations.append(shown(case, entry))
        if error is not None:
            return operations, error
    return operations, None


def operation_function(op_data):
    """The function behind a scheduled operation (the `func` its command generator closes over)."""
    generator = op_data.command_generator
    cells = dict(zip(generator.__code__.co_freevars, generator.__closure__ or (), strict=True))
    return cells["func"].cell_contents


def operation_of(op_data) -> str:
    """pyinfra's name for an operation: `files.put`, `server.shell`, `lock.acquire`."""
    func = operation_function(op_data)
    return f"{func.__module__.rsplit('.', 1)[-1]}.{func.__name__}"


def command_json(case: Case, command, host):
    """pyinfra's tests/test_operations.py parse_commands, for specdeploy's commands."""
    if isinstance(command, str):
        command = StringCommand(command.strip())
    if isinstance(command, StringCommand):
        raw, masked = command.get_raw_value(), command.get_masked_value()
        out = raw if raw == masked else [raw, masked]
    elif isinstance(command, FunctionCommand):
        name = getattr(command.function, "__qualname__", str(command.function))
        out = ["function", name, jsonable(case, list(command.args), host),
               jsonable(case, command.kwargs, host)]  # fmt: skip
    elif isinstance(command, FileUploadCommand):
        if hasattr(command.src, "read"):
            command.src.seek(0)
            data = command.src.read()
            out = ["upload", data.decode() if isinstance(data, bytes) else data, str(command.dest)]
        else:
            out = ["upload", str(command.src), str(command.dest)]
    elif isinstance(command, FileDownloadCommand):
        out = ["download", str(command.src), str(command.dest)]
    else:
        raise FixtureError(f"{command!r} is not a command pyinfra runs")
    if command.connector_arguments:
        return {**jsonable(case, command.connector_arguments, host), "command": out}
    return out


def jsonable(case: Case, value, host):
    """A value as the fixture shows it."""
    from specdeploy.render.units import RenderedUnit

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if case.name_of(value) is not None:  # handed on from a stand-in or a built argument
        return case.name_of(value)
    if isinstance(value, ServeConfig):
        return "$cfg" if value is case.cfg else {"$cfg": value.service_name}
    if type(value).__name__ == "Sampler":  # sampling/sampler.Sampler: as $sampler builds it
        renews = jsonable(case, value.renew_lease, host)
        shown = {"tokenizer": value.tokenizer, "renew_lease": renews}
        shown |= {k: v for k in ("restores", "readmit") if (v := getattr(value, k)) is not None}
        if value.cfg is not case.cfg:
            shown["cfg"] = jsonable(case, value.cfg, host)
        case.name(value, "$sampler")  # shown whole once, then by name: the same one handed on
        return {"$sampler": shown}
    if isinstance(value, OperationMeta):
        return f"$op:{host.op_hash_order.index(value._hash)}"
    if isinstance(value, RenderedUnit):
        return {"$unit": value.role, "name": value.name}
    if any(value is sample for sample in case.samples):  # a $samples argument: by its name
        return {"$sample": value.name}
    if value is case.release:  # the deploy's start's, handed down
        return "$release"
    if value is case.flags:
        return "$flags"
    if isinstance(value, BaseModel):
        return extending(case, value.model_dump(mode="json", by_alias=True, exclude_none=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(case, getattr(value, f.name), host)
                for f in dataclasses.fields(value)}  # fmt: skip
    if isinstance(value, list | tuple):
        return [jsonable(case, v, host) for v in value]
    if isinstance(value, types.SimpleNamespace):  # a builder's stand-in ($operation, $change)
        return {k: jsonable(case, v, host) for k, v in vars(value).items()}
    if isinstance(value, set | frozenset):
        return sorted(jsonable(case, v, host) for v in value)
    if isinstance(value, dict):
        return {str(k): jsonable(case, v, host) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, StringIO):
        return value.getvalue()
    if isinstance(getattr(value, "__self__", None), OperationMeta):  # _if=op.did_change
        return f"{jsonable(case, value.__self__, host)}.{value.__name__}"
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return repr(value)


def extending(case: Case, dumped: dict) -> dict:
    """A record that holds every field of a dict a stand-in returned (a gate decision the step
    records with what it adds): {"$extends": that stand-in's name, the fields it adds}."""
    for name, said in case.returned:
        if not isinstance(said, dict) or len(said) < 3:
            continue
        if all(dumped.get(k) == v for k, v in said.items()):  # None: a field left unset
            return {"$extends": name} | {k: v for k, v in dumped.items() if k not in said}
    return dumped


@functools.cache
def host_scripts() -> dict[str, str]:
    """specdeploy/host/scripts/*.py as commands carry them (`python -c SOURCE`), by name."""
    from specdeploy.host import scripts

    folder = Path(scripts.__file__).parent
    return {p.stem: shlex.quote(scripts.source(p.stem)) for p in sorted(folder.glob("[a-z]*.py"))}


def shown(case: Case, value):
    """Output with this checkout's fixtures folder as "{fixtures}", the control node's reports
    folder as "{reports}", a host script's source as "{script:name}" and derived values by name."""
    if isinstance(value, str | dict):
        for name in SHOWN:
            if value == case.derived_or_none(name):
                return f"${name}"
    if isinstance(value, str):
        for name, quoted in host_scripts().items():
            value = value.replace(quoted, f"{{script:{name}}}")
        if case.reports:
            value = value.replace(case.reports, "{reports}")
        return value.replace(str(FIXTURES), "{fixtures}")
    if isinstance(value, list):
        return [shown(case, v) for v in value]
    if isinstance(value, dict):
        return {k: shown(case, v) for k, v in value.items()}
    return value


def default(key: str):
    """An output the fixture leaves out: nothing of it."""
    return None if key in ("returns", "exception") else []


def compared(got: dict, data: dict) -> tuple[dict, dict]:
    """(what the step did, what the fixture says) for every output key."""
    want = {key: shared_data(data.get(key, default(key))) for key in OUTPUTS}
    have = {key: got.get(key, default(key)) for key in OUTPUTS}
    return have, want


def write_back(path: Path, data: dict, got: dict) -> None:
    """SPECDEPLOY_WRITE_FIXTURES=1: the fixture's outputs as the step made them."""
    first = [k for k in INPUTS if k in data] + [k for k in data if k not in INPUTS]
    out = {k: data[k] for k in first if k not in OUTPUTS}
    for key in OUTPUTS:
        value = kept(data.get(key), got.get(key, default(key)))
        if value != default(key):
            out[key] = value
    path.write_text(dumps(out) + "\n")


def kept(said, made):
    """What the step `made`, in the fixture's words where it says the same (its {"$data": ...})."""
    if shared_data(said) == made:
        return said
    if isinstance(said, list) and isinstance(made, list):
        return [kept(a, b) for a, b in zip(said, made, strict=False)] + made[len(said) :]
    if isinstance(said, dict) and isinstance(made, dict):
        return {k: kept(said.get(k), v) for k, v in made.items()}
    return made


def dumps(value, indent: int = 0, width: int = 100) -> str:
    """JSON with what fits on one line on one line (fixtures read like pyinfra's)."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(flat) + indent <= width or not isinstance(value, dict | list) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, list) and not any(isinstance(v, dict | list) for v in value):
        # scalars (an argv, a run's latencies) packed as words on a line, as a command reads
        lines, line = [], ""
        for word in (json.dumps(v, ensure_ascii=False) + "," for v in value):
            if line and len(pad) + len(line) + 1 + len(word) > width:
                lines.append(pad + line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(pad + line[:-1])
        return "[\n" + "\n".join(lines) + "\n" + " " * indent + "]"
    if isinstance(value, list):
        items = [pad + dumps(v, indent + 2, width) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [
        f"{pad}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 2, width)}"
        for k, v in value.items()
    ]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"

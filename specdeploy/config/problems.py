"""What a check reports: one problem with one host's data, and the error that carries them all;
and what a host's own state refuses, which fails that host alone."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from specdeploy.config import schema

# The generated host-data reference (specdeploy/docs/reference.py writes it): a check message
# links the section of the key it names, so what the key means is one click away.
REFERENCE_PAGE = "docs/reference/host-data.md"


def nested_model(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a key whose value is an object of its own keys (workload, speculation_gate;
    a list of them: workload.load_levels); None for a plain value."""
    annotation = field.annotation
    for candidate in [annotation, *typing.get_args(annotation)]:
        candidates = [candidate, *typing.get_args(candidate)]  # list[LoadLevel] | None
        for model in candidates:
            if isinstance(model, type) and issubclass(model, BaseModel):
                return model
    return None


def reference_anchor(field: str) -> str | None:
    """The reference page's anchor for a problem's field: the longest host-data key it starts
    with (`workload.temperature`; `speculative_config.method` -> `speculative_config`), which the
    page writes as the id of that key's section; None when the field names no host-data key (a
    typo'd key, pyinfra's own)."""
    # vllm_extra_args[0], gpu_memory_utilization/kv_cache_memory_bytes: the first key named
    top, *rest = re.split(r"[./\[]", field)
    if top not in schema.FIELDS:
        return None
    model = nested_model(schema.ServeConfig.model_fields[top])
    if model is not None and rest and rest[0] in model.model_fields:
        return f"{top}.{rest[0]}"
    return top


@dataclass(frozen=True)
class Problem:
    host: str
    field: str
    what: str
    todo: str

    def __str__(self) -> str:
        return f"{self.host}: {self.field}: {self.what} — {self.todo}"

    @property
    def reference(self) -> str:
        """Where the key this problem names is explained: its section of the reference page."""
        anchor = reference_anchor(self.field)
        return f"{REFERENCE_PAGE}#{anchor}" if anchor else REFERENCE_PAGE


def name_list(names: list[str], shown: int = 5) -> str:
    """`a, b, c`, or the first few and how many more: a 500-host fleet in one line."""
    if not names:
        return "none"
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def grouped(problems: list[Problem]) -> list[tuple[list[str], Problem]]:
    """Problems that say the same (field, what, what to do) of several hosts, once: [(the hosts,
    the first of them)], in the order first seen. A group_data setting shared by a fleet is one
    line, not one per host."""
    groups: dict[tuple[str, str, str], tuple[list[str], Problem]] = {}
    for problem in problems:
        hosts, _ = groups.setdefault((problem.field, problem.what, problem.todo), ([], problem))
        if problem.host not in hosts:
            hosts.append(problem.host)
    return list(groups.values())


def shared_line(kind: str, hosts: list[str], problem: Problem) -> str:
    """One line for a problem of one host (`h1: field: ...`, after `kind: ` where there is one) or
    of several (`kind (3 hosts: h1, h2, h3): field: ...`)."""
    if len(hosts) == 1:
        return f"{kind}: {problem}" if kind else str(problem)
    return (
        f"{kind or 'error'} ({len(hosts)} hosts: {name_list(hosts)}): {problem.field}: "
        f"{problem.what} — {problem.todo}"
    )


class ConfigError(Exception):
    """Raised by deploys when host data is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class HostRefused(RuntimeError):
    """What a host's own state refuses while planning — its GPUs or driver, its free disk or
    memory, a whole box's split of its devices, weights that are not complete. That host fails
    alone, before anything on it changes; the run goes on for the others (flows/serve.py). Invalid
    host data is a ConfigError instead, and stops the run before any host is touched."""

"""What a check reports: one problem with one host's data, and the error that carries them all;
and what a host's own state refuses, which fails that host alone."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    host: str
    field: str
    what: str
    todo: str

    def __str__(self) -> str:
        return f"{self.host}: {self.field}: {self.what} — {self.todo}"


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

"""What a check reports: one problem with one host's data, and the error that carries them all."""

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

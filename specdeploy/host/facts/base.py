"""What every custom fact shares: the `Fact` base (its typed default) and the helpers of the
parsers. The facts themselves live one module per tool beside this one."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

NO_ANSWER = "the command did not run or printed nothing"


class Fact(FactBase):
    """A fact whose value where pyinfra calls no `process()` (the command printed nothing, or failed
    on a host it does not fail) is `process([])`, a value of the type it returns, never None."""

    def default(self):
        return self.process([])


def json_or_none(output: list[str]):
    """The JSON document the lines hold, or None where they hold nothing."""
    text = "\n".join(output).strip()
    return json.loads(text) if text else None

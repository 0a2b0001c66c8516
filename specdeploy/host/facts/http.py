"""An HTTP GET made on the host with curl (`specdeploy status` reads /health and /metrics this way,
so what it sees is what the host sees)."""

from __future__ import annotations

import shlex

from specdeploy.host.facts.base import NO_ANSWER, Fact

_CURL_MARK = "specdeploy-status-curl"


class HttpGet(Fact):
    """GET a URL with curl on the host: {'exit': curl's exit code, 'http': status, 'body': text}.
    Pass the curl config (e.g. the Authorization header) as `_stdin`: curl reads it with `-K -`."""

    def command(self, url: str, timeout: int = 10) -> str:
        return (
            f"curl -sS -m {int(timeout)} -K - -w '\\n{_CURL_MARK} %{{http_code}}\\n' "
            f'{shlex.quote(url)} 2>&1; echo "{_CURL_MARK}-exit $?"'
        )

    def process(self, output):
        lines = list(output)
        result = {"exit": None, "http": None, "body": ""}
        if lines and lines[-1].startswith(f"{_CURL_MARK}-exit "):
            result["exit"] = int(lines.pop().split()[-1])
        if lines and lines[-1].startswith(f"{_CURL_MARK} "):
            code = lines.pop().split()[-1]
            result["http"] = int(code) if code.isdigit() else None
        result["body"] = "\n".join(lines).rstrip("\n") if output else NO_ANSWER
        return result

"""The rendered ExecStart reaches the process as exactly the intended argv, by systemd's own rules:
a probe unit with the same quoting runs on a real sandbox host (systemd as PID 1) and dumps argv."""

from __future__ import annotations

import json
import shlex

import pytest

from specdeploy.checks.host_data import check_config
from specdeploy.render.argv import serve_args
from specdeploy.render.units import exec_start

pytestmark = pytest.mark.sandbox

DUMP = "import json,sys; json.dump(sys.argv[1:], open('/run/argv-probe.json', 'w'))"


def test_exec_start_survives_systemd_quoting_and_specifiers(sandbox_fleet, sandbox_ssh):
    host = sandbox_fleet["hosts"][0]["name"]
    data = {
        "vllm_version": "0.32.0",
        "target_model": "org/target",  # names are plain (issue 36): the awkward words are args
        "served_model_name": "my-model",
        "speculative_config": {
            "method": "draft_model",
            "model": "org/draft",
            "num_speculative_tokens": 5,
            # a free-form value (a revision is a plain ref since issue 36)
            "quantization": "50%-$HOME-${USER}-%n-back\\slash 'q' ; x",
        },
        "vllm_extra_args": [
            "--override-generation-config",
            '{"temperature": 0.5}',
            ";",
            "org/target 100%",
            'my "model"',
            "é-ünicode #x $$ %%",
        ],
    }
    args = serve_args(check_config("quoting", data))
    unit = (
        "[Service]\nType=oneshot\n"
        f"ExecStart={exec_start(['/usr/bin/python3', '-c', DUMP, *args])}\n"
    )
    script = (
        f"cat > /etc/systemd/system/argv-probe.service <<'EOF'\n{unit}EOF\n"
        "systemctl daemon-reload && systemctl start argv-probe.service "
        "&& cat /run/argv-probe.json; "
        "rm -f /etc/systemd/system/argv-probe.service /run/argv-probe.json; systemctl daemon-reload"
    )
    result = sandbox_ssh(host, f"bash -c {shlex.quote(script)}")
    assert result.returncode == 0, result.stderr
    received = json.loads(result.stdout)
    assert received == args
    spec = received[received.index("--speculative-config") + 1]
    assert json.loads(spec) == data["speculative_config"]  # one argv element, byte for byte

"""pyinfra inventory for the local sandbox fleet (``specdeploy sandbox up``).

Reads the sandbox state file (``$SPECDEPLOY_STATE_DIR``, default
``/run/specdeploy/sandbox``, ``/state.json``) and defines the group
``sandbox``: one host per container, reached over ssh as root with the sandbox
key and a pinned known_hosts file (strict host key checking).

Host data also carries:

* ``sandbox_services`` -- whatever ``specdeploy.sandbox.services.start``
  recorded (e.g. wheelhouse / pip index URLs, ``hf_endpoint``); ``{}`` when
  no services run,
* ``sandbox_bridge_ip``, ``sandbox_prefix``, ``sandbox_index``.

Usage::

    pyinfra -y inventories/sandbox.py exec -- uname -a
"""

import json
import os
from pathlib import Path

_STATE_DIR = Path(os.environ.get("SPECDEPLOY_STATE_DIR", "/run/specdeploy/sandbox"))
_STATE_FILE = _STATE_DIR / "state.json"


def _load_state() -> dict:
    try:
        return json.loads(_STATE_FILE.read_text())
    except FileNotFoundError:
        raise RuntimeError(
            f"no sandbox state file at {_STATE_FILE}: the sandbox fleet is not up. "
            "Run `specdeploy sandbox up` first (or set SPECDEPLOY_STATE_DIR)."
        ) from None
    except ValueError as e:
        raise RuntimeError(
            f"sandbox state file {_STATE_FILE} is unreadable ({e}); "
            "run `specdeploy sandbox down && specdeploy sandbox up`."
        ) from None


_state = _load_state()
if not _state.get("hosts"):
    raise RuntimeError(f"sandbox state {_STATE_FILE} lists no hosts; run `specdeploy sandbox up`.")

_services = dict(_state.get("services") or {})

sandbox = [
    (
        _h["name"],
        {
            "ssh_hostname": _h["address"],
            "ssh_user": "root",
            "ssh_key": _state["ssh_key"],
            "ssh_known_hosts_file": _state["known_hosts"],
            "ssh_strict_host_key_checking": "yes",
            "ssh_allow_agent": False,
            "ssh_look_for_keys": False,
            "ssh_connect_retries": 2,
            "sandbox_index": _h.get("index"),
            "sandbox_prefix": _state["prefix"],
            "sandbox_bridge_ip": _state["bridge_ip"],
            "sandbox_services": _services,
        },
    )
    for _h in _state["hosts"]
]

# The first host is the canary: `specdeploy rollout inventories/sandbox.py deploys/serve.py
# --canary-group canary` deploys it alone first (its data comes from the `sandbox` group above).
canary = [sandbox[0][0]]

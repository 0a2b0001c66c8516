"""pyinfra inventory for the local sandbox fleet (`specdeploy-sandbox up`).

The hosts are reached the way inventories/prod.py reaches production: as the non-root `deploy`
user with password-less sudo (`_sudo=True`), over SSH with the sandbox key and a pinned
known_hosts file. The sandbox state comes from `specdeploy_sandbox.load_state()`
(`$SPECDEPLOY_STATE_DIR`, default `/run/specdeploy/sandbox`).

Host data also carries `sandbox_services` (what the sandbox's services recorded: wheelhouse and
pip index URLs, `hf_endpoint`, the gated repo and its token), `sandbox_bridge_ip`,
`sandbox_prefix` and `sandbox_index`.

Usage::

    pyinfra -y inventories/sandbox.py exec -- uname -a
"""

from specdeploy_sandbox import load_state, state_path
from specdeploy_sandbox.rootfs import DEPLOY_USER

_state = load_state()
if not _state or not _state.get("hosts"):
    raise RuntimeError(
        f"no sandbox fleet in {state_path()}: run `specdeploy-sandbox up` first "
        "(or set SPECDEPLOY_STATE_DIR)."
    )

sandbox = [
    (
        _h["name"],
        {
            "ssh_hostname": _h["address"],
            "ssh_user": DEPLOY_USER,
            "_sudo": True,
            "ssh_key": _state["ssh_key"],
            "ssh_known_hosts_file": _state["known_hosts"],
            "ssh_strict_host_key_checking": "yes",
            "ssh_allow_agent": False,
            "ssh_look_for_keys": False,
            "ssh_connect_retries": 2,
            "sandbox_index": _h.get("index"),
            "sandbox_prefix": _state["prefix"],
            "sandbox_bridge_ip": _state["bridge_ip"],
            "sandbox_services": dict(_state.get("services") or {}),
        },
    )
    for _h in _state["hosts"]
]

# The first host is the canary: `specdeploy rollout inventories/sandbox.py deploys/serve.py
# --canary-group canary` deploys it alone first (its data comes from the `sandbox` group above).
canary = [sandbox[0][0]]

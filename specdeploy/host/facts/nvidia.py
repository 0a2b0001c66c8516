"""What `nvidia-smi` and the NVIDIA driver's helpers say about a host's GPUs: the `Accelerators`
fact (its command, its one parser and the models of its value), `GpuMemory` on the same command,
and `CudaBoot` (the driver's boot units and nvidia-modprobe)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pydantic import BaseModel

from specdeploy.config.schema import MIB
from specdeploy.host.facts.base import NO_ANSWER, Fact
from specdeploy.host.facts.cuda_boot import CUDA_BOOT_COMMAND, parse_cuda_boot

# uuid last, so the name (which may hold a comma) stays between the index and the fixed fields,
# and a line recorded before the uuid was asked for still parses (its uuid: `nvidia-smi -L`'s).
_QUERY = "index,name,memory.total,memory.used,driver_version,compute_cap,mig.mode.current,uuid"
_APPS = "pid,gpu_uuid,used_memory"
# Always exits 0 and tags each part, so a missing or failing nvidia-smi becomes a fact value that
# preflight can explain, not a failed fact at planning time.
ACCELERATOR_COMMAND = (
    "if ! command -v nvidia-smi >/dev/null 2>&1; then echo '@@missing'; exit 0; fi; "
    f"echo '@@query'; nvidia-smi --query-gpu={_QUERY} --format=csv,noheader,nounits 2>&1; "
    "echo \"@@rc $?\"; echo '@@list'; nvidia-smi -L 2>&1; "
    "echo '@@header'; nvidia-smi 2>&1 | grep -m1 'CUDA Version' || true; "
    f"echo '@@apps'; nvidia-smi --query-compute-apps={_APPS} --format=csv,noheader,nounits 2>&1; "
    'echo "@@apps-rc $?"'
)
# The PIDs in a unit's cgroup and below it (a server's engine and worker processes are its
# children, so they are there too). cgroup v2 first, then v1's hierarchies; nothing where the unit
# is not running or the host has no systemd.
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")


def _unit_pids() -> str:
    """Shell that prints the PIDs of unit "$u" (empty where it is not running)."""
    roots = " ".join(shlex.quote(r) for r in CGROUP_ROOTS)
    return (
        'cg=$(systemctl show -p ControlGroup --value "$u" 2>/dev/null); '
        f'if [ -n "$cg" ] && [ "$cg" != / ]; then for d in {roots}; do if [ -d "$d$cg" ]; then '
        'find "$d$cg" -name cgroup.procs -exec cat {} + 2>/dev/null; break; fi; done; fi'
    )


def accelerator_command(units: Sequence[str] = ()) -> str:
    """ACCELERATOR_COMMAND, then for each of `units` a `@@unit NAME` part listing its PIDs: the
    processes whose GPU memory a restart of this service frees."""
    if not units:
        return ACCELERATOR_COMMAND
    names = " ".join(shlex.quote(u) for u in units)
    return f'{ACCELERATOR_COMMAND}; for u in {names}; do echo "@@unit $u"; {_unit_pids()}; done'


class MigDevice(BaseModel):
    profile: str  # e.g. "3g.71gb"
    memory_bytes: int  # from the profile name (decimal GB, as NVIDIA names them)


class GpuProcess(BaseModel):
    """One process holding memory on a GPU (`nvidia-smi --query-compute-apps`)."""

    pid: int
    used_bytes: int | None  # None where nvidia-smi says [N/A]
    unit: str | None = None  # the service unit whose cgroup holds it; None: another process


class Gpu(BaseModel):
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None  # None where nvidia-smi says [N/A] (MIG)
    driver_version: str
    compute_capability: str | None
    mig_mode: str | None  # "Enabled" / "Disabled"; None where the GPU has no MIG
    mig_devices: list[MigDevice] = []
    uuid: str | None = None
    processes: list[GpuProcess] = []

    @property
    def own_bytes_by_unit(self) -> dict[str, int]:
        """Memory held by the processes of the units the fact was asked about, per unit."""
        own: dict[str, int] = {}
        for proc in self.processes:
            if proc.unit is not None:
                own[proc.unit] = own.get(proc.unit, 0) + (proc.used_bytes or 0)
        return own


class AcceleratorInfo(BaseModel):
    """What `nvidia-smi` says. status: "ok", "missing" (no nvidia-smi on PATH) or "failed" (it
    ran and could not report, e.g. a driver/library mismatch or no device found; `error` quotes it).
    `processes_error` says why the per-process list could not be read (then no memory is known to
    be the service's own); `own_pids` lists, per unit asked about, the PIDs in its cgroup."""

    status: str
    gpus: list[Gpu] = []
    driver_version: str | None = None
    cuda_version: str | None = None  # the newest CUDA the driver supports (nvidia-smi's header)
    error: str | None = None
    processes_error: str | None = None
    own_pids: dict[str, list[int]] = {}


def _na(value: str) -> str | None:
    value = value.strip()
    return None if not value or value.startswith("[") or value == "N/A" else value


def _mib(value: str) -> int | None:
    value = _na(value)
    return int(float(value)) * MIB if value else None


def _sections(output: list[str]) -> tuple[dict[str, list[str]], dict[str, int], dict[str, list]]:
    """The tagged parts of the command's output: lines per tag, exit codes (`@@rc N`,
    `@@apps-rc N`) and the lines of each `@@unit NAME` part."""
    parts: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    units: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output:
        if line.startswith("@@"):
            tag, _, rest = line[2:].rstrip().partition(" ")
            if tag == "rc" or tag.endswith("-rc"):
                codes[tag] = int(rest) if rest.strip().lstrip("-").isdigit() else -1
                current = None
            elif tag == "unit":
                current = units.setdefault(rest.strip(), [])
            else:
                current = parts.setdefault(tag, [])
        elif current is not None:
            current.append(line.rstrip())
    return parts, codes, units


def parse_accelerators(output: list[str]) -> AcceleratorInfo:
    """Parse the output of `accelerator_command` (pure, so recorded outputs test it). The one
    nvidia-smi parser: the `Accelerators` and `GpuMemory` facts both use it."""
    parts, codes, units = _sections(output)
    rc = codes.get("rc")
    if "missing" in parts:
        return AcceleratorInfo(status="missing", error="nvidia-smi is not installed (not on PATH)")
    query = [ln for ln in parts.get("query", []) if ln.strip()]
    if rc != 0 or not query:
        text = " ".join(ln.strip() for ln in query) or "nvidia-smi printed no GPU"
        error = f"nvidia-smi exited {rc}: {text}" if output else f"nvidia-smi: {NO_ANSWER}"
        return AcceleratorInfo(status="failed", error=error)
    gpus = []
    for line in query:
        fields = [f.strip() for f in line.split(",")]
        uuid = fields.pop() if len(fields) >= 8 and fields[-1].startswith("GPU-") else None
        if len(fields) < 7:
            return AcceleratorInfo(status="failed", error=f"unexpected nvidia-smi line: {line}")
        # a name with a comma in it: everything between the index and the last five fields
        index, name, rest = fields[0], ", ".join(fields[1:-5]), fields[-5:]
        total, used, driver, cap, mig = rest
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                memory_total_bytes=int(float(total)) * MIB,
                memory_used_bytes=_mib(used),
                driver_version=driver,
                compute_capability=_na(cap),
                mig_mode=_na(mig),
                uuid=uuid,
            )
        )
    current = None
    for line in parts.get("list", []):
        gpu = re.match(r"GPU (\d+):.*\(UUID: (GPU-[^)\s]+)\)|GPU (\d+):", line.strip())
        mig = re.search(r"MIG (\S+?)\.(\d+)gb\s+Device", line)
        if gpu:
            index = int(gpu.group(1) or gpu.group(3))
            current = next((g for g in gpus if g.index == index), None)
            if current is not None and current.uuid is None and gpu.group(2):
                current.uuid = gpu.group(2)  # a recording from before the query asked for it
        elif mig and current is not None:
            profile = f"{mig.group(1)}.{mig.group(2)}gb"
            current.mig_devices.append(
                MigDevice(profile=profile, memory_bytes=int(mig.group(2)) * 10**9)
            )
    own_pids = {
        unit: sorted({int(p) for p in lines if p.strip().isdigit()})
        for unit, lines in units.items()
    }
    unit_of = {pid: unit for unit, pids in own_pids.items() for pid in pids}
    processes_error = None
    apps = [ln for ln in parts.get("apps", []) if ln.strip()]
    if "apps" in parts and codes.get("apps-rc") != 0:
        text = " ".join(ln.strip() for ln in apps) or "no output"
        processes_error = f"nvidia-smi --query-compute-apps exited {codes.get('apps-rc')}: {text}"
    elif "apps" not in parts:
        processes_error = "the per-process GPU memory was not read"
    else:
        by_uuid = {g.uuid: g for g in gpus if g.uuid}
        for line in apps:
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != 3 or not fields[0].isdigit():
                continue  # e.g. "No running processes found" from older drivers
            gpu = by_uuid.get(fields[1])
            if gpu is None:
                continue  # a MIG instance's or a hidden GPU's uuid
            pid = int(fields[0])
            gpu.processes.append(
                GpuProcess(pid=pid, used_bytes=_mib(fields[2]), unit=unit_of.get(pid))
            )
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", " ".join(parts.get("header", [])))
    return AcceleratorInfo(
        status="ok",
        gpus=gpus,
        driver_version=gpus[0].driver_version,
        cuda_version=cuda.group(1) if cuda else None,
        processes_error=processes_error,
        own_pids=own_pids,
    )


class Accelerators(Fact):
    """Every NVIDIA GPU on the host (name, uuid, memory total and used, driver, supported CUDA,
    compute capability, MIG, the processes holding memory on it), or why there is none: an
    `AcceleratorInfo`. `units`: this service's units; memory their processes hold is marked as
    theirs (a restart frees it), so the preflight does not count it as taken."""

    def command(self, units: Sequence[str] = ()) -> str:
        return accelerator_command(units)

    def process(self, output):
        return parse_accelerators(output)


class CudaBoot(Fact):
    """What the CUDA build's unit orders after and runs first on this host: a `CudaBootInfo`
    (cuda_boot.py)."""

    def command(self) -> str:
        return CUDA_BOOT_COMMAND

    def process(self, output):
        return parse_cuda_boot(output)


class GpuMemory(Fact):
    """Memory used/total per NVIDIA GPU (the `Accelerators` fact's command and parser); [] on hosts
    without one, where nvidia-smi fails, and for GPUs whose used memory is unknown (MIG)."""

    def command(self) -> str:
        return ACCELERATOR_COMMAND

    def process(self, output):
        return [
            {
                "index": g.index,
                "name": g.name,
                "used_bytes": g.memory_used_bytes,
                "total_bytes": g.memory_total_bytes,
            }
            for g in parse_accelerators(output).gpus
            if g.memory_used_bytes is not None
        ]

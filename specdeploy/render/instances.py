"""A whole box: one host's config expanded into the configs of its instances (pure, no host).

`instances = N` splits the host's GPUs evenly by tensor x pipeline parallel (vLLM's data-parallel
ranks are independent servers for dense models, and its external-LB DP mode refuses them, so a
whole box is N plain servers behind a local balancer); vllm-cpu splits the host's cores instead,
through vLLM's CPU thread binding `VLLM_CPU_OMP_THREADS_BIND` (vllm/envs.py, 0.32: core ids per
rank, ranks separated by "|"). `instances = [{gpus, port}, ...]` names them by hand. Each instance
is a ServeConfig of its own, named `<service_name>-<i>` (its units, env file, record, rollback
copies, bench output and cache follow from that name); the venv and the weights stay shared.
The balancer owns `vllm_port`; instance i listens on `vllm_port + 1 + i` unless listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.config.schema import InstanceSpec, ServeConfig, parse_int_list
from specdeploy.render.argv import EngineFlags, engine_flags

# the cores this host lets processes run on (a container's cpuset too), as the kernel lists them:
# what vllm-cpu instances split (steps/servers.py at deploy time, status and the measurements too)
CPU_IDS_COMMAND = "grep -m1 '^Cpus_allowed_list:' /proc/self/status | cut -f2"
GPU_ENV = "CUDA_VISIBLE_DEVICES"
CPU_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vllm/envs.py: "0-3", ranks "0-3|4-7"


@dataclass(frozen=True)
class Instance:
    """One server of a whole box: `cfg` is its own config (service_name, port, environment)."""

    index: int
    name: str
    port: int
    devices: tuple[int, ...]  # GPU indices (CUDA build) or core ids (vllm-cpu)
    cfg: ServeConfig

    @property
    def device_kind(self) -> str:
        return "cpus" if self.cfg.vllm_package == "vllm-cpu" else "gpus"

    @property
    def devices_text(self) -> str:
        word = "cores" if self.device_kind == "cpus" else "GPUs"
        return f"{word} {','.join(map(str, self.devices))}"


@dataclass
class Layout:
    """The expansion of one host's config: its instances, the devices none of them uses, and
    what is wrong with the split (`problems`: the host cannot be deployed like this)."""

    instances: list[Instance] = field(default_factory=list)
    idle: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    per_instance: int = 1  # GPUs one instance needs (devices_per_instance)

    @property
    def whole_box(self) -> bool:
        return bool(self.instances)


def parse_cpu_ids(text: str | None) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8] (the Cpus_allowed_list format)."""
    return parse_int_list((text or "").strip())


def devices_per_instance(cfg: ServeConfig, flags: EngineFlags | None = None) -> int:
    """GPUs one instance needs: tensor x pipeline parallel (data parallel stays inside it).
    `flags`: the engine flags a deploy's start parsed; a caller without them has them parsed."""
    return (flags or engine_flags(cfg)).gpus


def instance_name(cfg: ServeConfig, index: int) -> str:
    return f"{cfg.service_name}-{index}"


def _environment(cfg: ServeConfig, devices: tuple[int, ...], per: int) -> dict[str, str]:
    if cfg.vllm_package == "vllm-cpu":
        # one core list per rank (tensor x pipeline), contiguous, as vLLM maps ranks
        ranks = max(per, 1)
        size = max(len(devices) // ranks, 1)
        lists = [devices[r * size : (r + 1) * size] or devices[-1:] for r in range(ranks)]
        return {**cfg.vllm_env, CPU_ENV: "|".join(_ranges(chunk) for chunk in lists)}
    return {**cfg.vllm_env, GPU_ENV: ",".join(map(str, devices))}


def _ranges(ids: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> "0-2,5" (vLLM's parse_id_list reads either)."""
    out, ids = [], sorted(ids)
    start = prev = None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(out)


def _instance(
    cfg: ServeConfig, index: int, port: int, devices: tuple[int, ...], per: int
) -> Instance:
    name = instance_name(cfg, index)
    own = cfg.model_copy(
        update={
            "service_name": name,
            "vllm_port": port,
            "vllm_env": _environment(cfg, devices, per),
            "instances": None,
            "instance_name": name,
        }
    )
    return Instance(index=index, name=name, port=port, devices=devices, cfg=own)


def expand(
    cfg: ServeConfig, available: list[int] | None = None, *, flags: EngineFlags | None = None
) -> Layout:
    """The instances of `cfg` (empty when `instances` is unset). `available`: the host's GPU
    indices (CUDA build) or core ids (vllm-cpu), from the facts at planning time; None (no host:
    `specdeploy check`) checks only what the host data alone decides. `flags`: the engine flags
    the caller holds (a deploy: its start's); else parsed here."""
    per = devices_per_instance(cfg, flags)
    layout = Layout(per_instance=per)
    if cfg.instances is None:
        return layout
    cpu = cfg.vllm_package == "vllm-cpu"
    word = "cores" if cpu else "GPUs"
    if isinstance(cfg.instances, int):
        n = cfg.instances
        if available is None:
            # without the host's devices only the ports are known; the split waits for the facts
            layout.instances = [_instance(cfg, i, cfg.vllm_port + 1 + i, (), per) for i in range(n)]
            return _check(cfg, layout, available, word)
        size = len(available) // n if cpu else per
        if size < (1 if cpu else per) or n * size > len(available):
            layout.problems.append(
                f"instances = {n} x {size or per} {word} each needs {n * (size or per)} {word} "
                f"but the host has {len(available)} ({_ranges(tuple(available)) or 'none'})"
                + ("" if cpu else f" (tensor x pipeline parallel = {per} per instance)")
            )
            return layout
        layout.instances = [
            _instance(
                cfg, i, cfg.vllm_port + 1 + i, tuple(available[i * size : (i + 1) * size]), per
            )
            for i in range(n)
        ]
    else:
        layout.instances = [
            _instance(cfg, i, spec.port, tuple(_listed(spec, cpu)), per)
            for i, spec in enumerate(cfg.instances)
        ]
    return _check(cfg, layout, available, word)


def instance_of_unit(unit: str) -> str:
    """The instance a unit serves: `specdeploy-vllm-1` for its speculative, baseline and
    measurement units."""
    name = unit.removesuffix(".service")
    for suffix in ("-baseline", "-measure"):
        name = name.removesuffix(suffix)
    return name


def resplit_units(layout: Layout, held: dict[int, list[str]]) -> list[str]:
    """A re-split (8 x TP1 -> 4 x TP2): the running instance units that hold a GPU the new layout
    gives to another instance (`held`: GPU index -> the units whose processes hold memory there,
    from the Accelerators fact asked about every instance unit). They cannot keep serving while
    the new instances start, so the host's turn stops them first, and every instance's preflight
    counts their memory as freed. Empty when each GPU stays with its instance."""
    owner = {device: member.name for member in layout.instances for device in member.devices}
    return sorted(
        {u for gpu, units in held.items() for u in units if instance_of_unit(u) != owner.get(gpu)}
    )


def _listed(spec: InstanceSpec, cpu: bool) -> list[int]:
    return (spec.cpus if cpu else spec.gpus) or []


def _check(cfg: ServeConfig, layout: Layout, available: list[int] | None, word: str) -> Layout:
    """Overlapping devices or ports, a listed instance with the wrong device count, devices the
    host does not have; then the idle ones."""
    per = layout.per_instance
    cpu = cfg.vllm_package == "vllm-cpu"
    ports: dict[int, str] = {
        cfg.vllm_port: "the balancer (vllm_port)",
        cfg.balancer_metrics_port: "the balancer's metrics (balancer_metrics_port)",
    }
    owner: dict[int, str] = {}
    for inst in layout.instances:
        if inst.port in ports:
            layout.problems.append(f"{inst.name} port {inst.port} is also {ports[inst.port]}'s")
        ports.setdefault(inst.port, inst.name)
        for device in inst.devices:
            if device in owner:
                layout.problems.append(
                    f"{inst.name} and {owner[device]} both use {word[:-1]} {device}"
                )
            owner.setdefault(device, inst.name)
        listed = isinstance(cfg.instances, list)
        if listed and not inst.devices:
            key = "cpus" if cpu else "gpus"
            layout.problems.append(f"{inst.name} lists no {key}")
        elif listed and not cpu and len(inst.devices) != per:
            layout.problems.append(
                f"{inst.name} lists {len(inst.devices)} GPUs but tensor x pipeline parallel "
                f"needs {per}"
            )
    if available is not None:
        missing = sorted(set(owner) - set(available))
        if missing:
            layout.problems.append(
                f"{word} {_ranges(tuple(missing))} are not on the host (it has "
                f"{_ranges(tuple(available)) or 'none'})"
            )
        layout.idle = sorted(set(available) - set(owner))
    return layout


def idle_without_instances(
    cfg: ServeConfig, gpus: list[int], flags: EngineFlags | None = None
) -> list[int]:
    """`instances` unset: the host's GPUs the one server does not use (CUDA_VISIBLE_DEVICES or the
    first tensor x pipeline GPUs) — what `instances` would put to work."""
    wanted = cfg.vllm_env.get(GPU_ENV)
    if wanted:
        used = {int(i) for i in wanted.split(",") if i.strip().isdigit()}
    else:
        used = set(gpus[: devices_per_instance(cfg, flags)])
    return [g for g in gpus if g not in used]


def instances_hint(cfg: ServeConfig, gpus: list[int], flags: EngineFlags | None = None) -> str:
    """The warning for a host whose GPUs `instances` unset leaves idle."""
    per = devices_per_instance(cfg, flags)
    idle = idle_without_instances(cfg, gpus, flags)
    n = len(gpus) // per
    use = (
        f"set instances = {n} to run {n} servers behind a local balancer on vllm_port"
        if n > 1
        else f"instances cannot use them at tensor x pipeline parallel = {per}"
    )
    return (
        f"{len(idle)} of {len(gpus)} GPUs stay idle (GPU {_ranges(tuple(idle))}): one server uses "
        f"tensor x pipeline parallel = {per}; {use}"
    )


def uneven_note(cfg: ServeConfig, layout: Layout) -> str | None:
    """What an uneven split leaves idle (a warning, not a refusal)."""
    if not layout.idle or cfg.vllm_package == "vllm-cpu":
        return None
    return (
        f"{len(layout.idle)} GPUs stay idle (GPU {_ranges(tuple(layout.idle))}): "
        f"{len(layout.instances)} instances x {layout.per_instance} GPUs do not use them"
    )

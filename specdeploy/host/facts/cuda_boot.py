"""The `CudaBoot` fact's value, command and parser, without pyinfra: the steps read the fact
(nvidia.py's `CudaBoot`) and hand its value to render/units.py, which reads no fact and imports
nothing of pyinfra."""

from __future__ import annotations

from pydantic import BaseModel

# What a CUDA server needs at boot, read while planning so the unit renders from it
# (render/units.py): the unit files systemd knows among these, and whether nvidia-modprobe (creates
# /dev/nvidia-uvm and /dev/nvidia0...) is installed where the driver packages put it.
CUDA_BOOT_UNITS = ("nvidia-persistenced.service", "nvidia-fabricmanager.service")
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"
CUDA_BOOT_COMMAND = (
    f"for u in {' '.join(CUDA_BOOT_UNITS)}; do "
    'if systemctl cat -- "$u" >/dev/null 2>&1; then echo "@@unit $u"; fi; done; '
    f"if [ -x {NVIDIA_MODPROBE} ]; then echo '@@modprobe'; fi; true"
)


class CudaBootInfo(BaseModel):
    """`units`: which of CUDA_BOOT_UNITS have a unit file on the host; `nvidia_modprobe`: whether
    NVIDIA_MODPROBE is there and executable."""

    units: list[str] = []
    nvidia_modprobe: bool = False

    @property
    def fabricmanager(self) -> bool:
        return "nvidia-fabricmanager.service" in self.units


def parse_cuda_boot(output: list[str]) -> CudaBootInfo:
    """Parse CUDA_BOOT_COMMAND's output (pure: the host tests and the fact share it)."""
    lines = [line.strip() for line in output]
    units = [line.split(" ", 1)[1] for line in lines if line.startswith("@@unit ")]
    return CudaBootInfo(units=units, nvidia_modprobe="@@modprobe" in lines)

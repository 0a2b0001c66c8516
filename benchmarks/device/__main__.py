"""The one runner of every GPU plan (benchmarks/device/plans.py): packs vLLM, fills the carried
folder on the control node, and on the GPU machine gathers the carried parts, unpacks vLLM, writes
the plan's checkpoints, starts its runner in a session of its own, waits and hands its files back.

The GPU machine runs the image's bare python3 (torch, no venv, no network) over a copy of the
checkout the device call sends; a call carries 64 MiB in all, so vLLM travels in parts, one a call,
gathered in /tmp (which lasts while the machine stays warm between calls). The code the device
runs travels in the carried folder too (benchmarks/, specdeploy/ and a pyinfra stand-in, the
device having no pyinfra): the checkout sent may be another than the one the plan was made in.

On the control node, from the checkout's root:
    python -m benchmarks.device pack PACKDIR --requirements REQ   # vLLM, trimmed: one .tar.xz
    python -m benchmarks.device prepare PLAN DIR --pack PACKDIR [--checkout CHECKOUT]
prepare prints the device calls to make: one `recv` a part, then `run`, each carrying DIR/pN and
DIR/code. On the GPU machine (what those calls run), in the carried code tree (so that its
benchmarks/, not the sent checkout's, is imported):
    cd DIR/code && python3 -m benchmarks.device recv
    cd DIR/code && python3 -m benchmarks.device run PLAN --budget S [--wait S] [-- ARGS]
    cd DIR/code && python3 -m benchmarks.device wait PLAN [--wait S]
`run` and `wait` copy the runner's listed outputs, its log (run.log) and gpu.txt to $OUT, the
rest of its output folder as out.tar.gz; a runner still running when the wait ends keeps running
(until the machine goes back) and a later `wait` collects it. ARGS after `--` go to the runner
after the plan's own (its options, e.g. `--rounds 2`, override the plan's).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.device.plans import PLANS

CALL_MIB = 64  # what one device call carries: the checkout sent plus the carried folders
PACK = "vllm026.tar.xz"
WORK = Path("/tmp/specdeploy-device")
SITE = Path("/tmp/site")
CODE = Path(__file__).resolve().parents[2]  # on the device: DIR/code
# Kept on in every process the runner starts (the device's rule: never NVLink multicast).
DEVICE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}
# What a dense bf16 Qwen3 run on Hopper never loads, dropped so the pack travels in fewer calls:
# the FA2 kernel (Hopper runs FA3), the Rust helper, the fused-MoE kernels (optional import),
# DeepGEMM (fp8) and the Blackwell attention kernels, Mistral's Tekken vocabularies, pycountry's
# translations, packages' own tests.
TRIMS = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/third_party/deep_gemm",
    "vllm/third_party/fmha_sm100",
    "mistral_common/data/tekken_240718.json",
    "mistral_common/data/tekken_240911.json",
    "pycountry/locales",
    "supervisor/tests",
    "dill/tests",
    "jsonschema/tests",
)
# The product imports pyinfra at module level; the device has none. This stand-in answers every
# `pyinfra.*` / `pyinfra_cli.*` import with modules whose every name is a placeholder class, so the
# product's code loads; a plan that runs a host command replaces the function that would send it.
PYINFRA_STUB = '''"""pyinfra's stand-in on the GPU machine (benchmarks/device): placeholder names.
"""
import importlib.abc
import importlib.machinery
import sys
import types


def _module(name):
    module = types.ModuleType(name)
    module.__path__ = []
    module.__getattr__ = lambda attr: _placeholder(module, attr)
    return module


def _placeholder(module, attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    value = type(attr, (), {"__init__": lambda self, *a, **k: None})
    setattr(module, attr, value)
    return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyinfra", "pyinfra_cli") and name != "pyinfra":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _module(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = []
logger = __import__("logging").getLogger("pyinfra")
host = None


def __getattr__(attr):
    return _placeholder(sys.modules[__name__], attr)
'''


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- control node ------------------------------------------------------------------------------


def pack(out: Path, requirements: Path) -> Path:
    """vLLM and the requirements the device image lacks, as one xz tarball with TRIMS dropped."""
    work = out / "work"
    wheels, site = work / "wheels", work / "site"
    platforms = [f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 24, 17)]
    platforms += ["manylinux2014_x86_64", "manylinux1_x86_64"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp",
         *[a for p in platforms for a in ("--platform", p)],
         "-r", str(requirements), "-d", str(wheels)],
        check=True, env=os.environ | {"PIP_CONSTRAINT": ""},
    )  # fmt: skip
    for wheel in sorted(wheels.glob("*.whl")):
        shutil.unpack_archive(wheel, site, "zip")
    for trim in TRIMS:
        path = site / trim
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    tarball = out / PACK
    with open(tarball, "wb") as f:
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-6", "-T0"], stdin=tar.stdout, stdout=f, check=True)
        tar.wait()
    shutil.rmtree(work)
    log(f"{tarball}: {tarball.stat().st_size / 2**20:.1f} MiB")
    return tarball


def sent_mib(checkout: Path) -> float:
    """What the device call sends of the checkout: tracked files and untracked, unignored ones."""
    names = subprocess.run(
        ["git", "-C", str(checkout), "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"], capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    paths = (checkout / os.fsdecode(n) for n in names if n)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink()) / 2**20


def copy_code(repo: Path, code: Path) -> None:
    """benchmarks/ (its code and the queue files, not the recordings), specdeploy/, the stub."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(repo / "specdeploy", code / "specdeploy", ignore=skip)
    for path in sorted((repo / "benchmarks").rglob("*")):
        if path.suffix in (".py", ".txt") and path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(repo)
            if path.suffix == ".txt" and path.parent.name not in PLANS:
                continue  # recordings' text files stay home
            (code / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, code / rel)
    (code / "pyinfra").mkdir()
    (code / "pyinfra" / "__init__.py").write_text(PYINFRA_STUB)


def resolve(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def prepare(name: str, carry: Path, pack_dir: Path, checkout: Path, repo: Path) -> list[str]:
    """Fill `carry` (an ignored folder of the checkout the device call sends) for plan `name`;
    return the device calls to make, in order."""
    plan = PLANS[name]
    carry = carry.resolve()
    rel = carry.relative_to(checkout.resolve())
    ignored = subprocess.run(["git", "-C", str(checkout), "check-ignore", "-q", str(rel)])
    if ignored.returncode:
        sys.exit(f"{carry}: not ignored by git in {checkout}; the call would send it whole")
    shutil.rmtree(carry, ignore_errors=True)
    code = carry / "code"
    copy_code(repo, code)
    (code / "plan.json").write_text(json.dumps(resolve(plan.build)(), indent=1) + "\n")
    for file, ref in plan.files.items():
        (code / file).write_text(resolve(ref) + "\n")
    tarball = pack_dir / PACK
    data = tarball.read_bytes()
    (code / "pack.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    code_mib = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file()) / 2**20
    room = CALL_MIB - sent_mib(checkout) - code_mib - 1.0  # a MiB to spare
    if room < 8:
        sys.exit(f"only {room:.1f} MiB of a call is left for the pack: send a smaller checkout")
    size = math.ceil(len(data) / math.ceil(len(data) / (room * 2**20)))
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    for n, part in enumerate(parts):
        (carry / f"p{n}").mkdir()
        (carry / f"p{n}" / f"{PACK}.part-{n:02d}").write_bytes(part)
    runner = f"cd {rel}/code && python3 -m benchmarks.device"
    calls = [f"carry [{rel}/p{n}, {rel}/code]: {runner} recv" for n in range(len(parts) - 1)]
    last = f"carry [{rel}/p{len(parts) - 1}, {rel}/code]"
    calls.append(f"{last}: {runner} run {name} --budget 480 --wait 520")
    log(f"{name}: {len(parts)} parts of {size / 2**20:.1f} MiB, code {code_mib:.1f} MiB")
    return calls


# --- GPU machine -------------------------------------------------------------------------------


def sh(command: str) -> str:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def recv() -> None:
    carry = CODE.parent
    parts = WORK / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for part in sorted(carry.glob(f"p*/{PACK}.part-*")):
        if not (parts / part.name).exists():
            shutil.copy(part, parts / part.name)
    log("parts here: " + ", ".join(sorted(p.name for p in parts.iterdir())))
    log(sh("nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader"))


def unpack() -> None:
    if (SITE / "vllm").is_dir():
        return
    parts = sorted((WORK / "parts").glob(f"{PACK}.part-*"))
    digest = hashlib.sha256()
    tarball = WORK / PACK
    with open(tarball, "wb") as f:
        for part in parts:
            data = part.read_bytes()
            digest.update(data)
            f.write(data)
    want = (CODE / "pack.sha256").read_text().split()[0]
    if digest.hexdigest() != want:
        sys.exit(f"the pack's parts ({len(parts)}) do not add up: sha256 {digest.hexdigest()}")
    started = time.time()
    SITE.mkdir(parents=True, exist_ok=True)
    if shutil.which("xz"):
        subprocess.run(["tar", "-C", str(SITE), "-xf", str(tarball), "-I", "xz -T0"], check=True)
    else:
        with tarfile.open(tarball, "r:xz") as tar:
            tar.extractall(SITE, filter="fully_trusted")
    tarball.unlink()
    log(f"unpacked vLLM in {time.time() - started:.0f} s")


def fill(words: tuple[str, ...], values: dict) -> list[str]:
    return [w.format(**values) for w in words]


def run(name: str, budget: float, wait_s: float, extra: list[str]) -> None:
    plan = PLANS[name]
    recv()
    unpack()
    home = WORK / name
    out = home / "out"
    shutil.rmtree(home, ignore_errors=True)
    out.mkdir(parents=True)
    values = {
        "plan": CODE / "plan.json",
        "out": out,
        "budget": budget,
        "code": CODE,
        "site": SITE,
    }
    env = os.environ | DEVICE_ENV | {"PYTHONPATH": f"{SITE}:{CODE}"}
    (out / "gpu.txt").write_text(
        sh("nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader") + "\n"
    )
    with open(out / "setup.log", "w") as setup_log:
        for module, *args in plan.setup:
            log(f"setup: {module} {' '.join(fill(tuple(args), values))}")
            done = subprocess.run(
                [sys.executable, "-m", module, *fill(tuple(args), values)],
                env=env, cwd=CODE, stdout=setup_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            if done.returncode:
                sys.exit(f"setup {module} failed ({done.returncode}): {out / 'setup.log'}")
    argv = [sys.executable, "-u", "-m", plan.runner, *fill(plan.args, values), *extra]
    log("runner: " + " ".join(argv))
    with open(home / "run.log", "w") as run_log:
        runner = subprocess.Popen(
            argv, env=env, cwd=CODE, stdout=run_log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this call, while the machine stays warm
        )  # fmt: skip
    (home / "pid").write_text(f"{runner.pid}\n")
    collect(name, wait_s)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a finished child of this process is a zombie until reaped
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def collect(name: str, wait_s: float) -> None:
    home = WORK / name
    pid = int((home / "pid").read_text())
    deadline = time.time() + wait_s
    while alive(pid) and time.time() < deadline:
        time.sleep(2)
    dest = Path(os.environ.get("OUT", home / "collected"))
    dest.mkdir(parents=True, exist_ok=True)
    out = home / "out"
    kept = [*PLANS[name].outputs, "gpu.txt"]
    for file in kept:
        if (out / file).is_file():
            shutil.copy(out / file, dest / file)
    shutil.copy(home / "run.log", dest / "run.log")
    rest = [p for p in sorted(out.rglob("*")) if p.is_file() and p.name not in kept]
    if rest:
        with tarfile.open(dest / "out.tar.gz", "w:gz") as tar:
            for path in rest:
                tar.add(path, arcname=str(path.relative_to(out)))
    still = alive(pid)
    log(f"{name}: RUNNER {'STILL RUNNING' if still else 'FINISHED'}; files in {dest}")
    print("".join((home / "run.log").read_text(errors="replace").splitlines(True)[-45:]))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device", description=__doc__)
    verbs = ap.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="vLLM for the device, trimmed, one .tar.xz (needs PyPI)")
    p.add_argument("out", type=Path)
    p.add_argument("--requirements", type=Path, required=True)
    p = verbs.add_parser("prepare", help="fill the carried folder for a plan")
    p.add_argument("plan", choices=sorted(PLANS))
    p.add_argument("carry", type=Path)
    p.add_argument("--pack", type=Path, required=True, help=f"the folder holding {PACK}")
    p.add_argument("--checkout", type=Path, default=Path("."), help="the checkout the call sends")
    verbs.add_parser("recv", help="(device) keep the carried part of the pack")
    p = verbs.add_parser("run", help="(device) unpack, set up, start the plan's runner, wait")
    p.add_argument("plan", choices=sorted(PLANS))
    p.add_argument("--budget", type=float, default=480, help="seconds the runner may take")
    p.add_argument("--wait", type=float, default=520, help="seconds this call waits for it")
    p = verbs.add_parser("wait", help="(device) wait for the plan's runner, collect its files")
    p.add_argument("plan", choices=sorted(PLANS))
    p.add_argument("--wait", type=float, default=520)
    words = sys.argv[1:]
    cut = words.index("--") if "--" in words else len(words)
    args, extra = ap.parse_args(words[:cut]), words[cut + 1 :]  # after --: the runner's own
    if args.verb == "pack":
        pack(args.out, args.requirements)
    elif args.verb == "prepare":
        repo = Path(__file__).resolve().parents[2]
        for call in prepare(args.plan, args.carry, args.pack, args.checkout, repo):
            print(call)
    elif args.verb == "recv":
        recv()
    elif args.verb == "run":
        run(args.plan, args.budget, args.wait, extra)
    else:
        collect(args.plan, args.wait)


if __name__ == "__main__":
    main()

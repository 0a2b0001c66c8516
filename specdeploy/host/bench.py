"""`vllm bench serve`: its command lines and the one way it runs on a host (its result's summary:
bench_summary.py).

Every arm of every comparison takes its request set from `bench_args`, so the dataset, seed,
lengths, request rate, concurrency and prompt count are identical by construction."""

from __future__ import annotations

import json
import math
import secrets
import shlex
import time
from pathlib import Path

from pyinfra import host, logger

from specdeploy.config import datasets
from specdeploy.config.record import BenchResult, BenchRun
from specdeploy.config.schema import ServeConfig, Workload
from specdeploy.config.timestamps import utc_iso
from specdeploy.decide.metrics import acceptance, prefix_cache_counters, spec_decode_counters
from specdeploy.host import server
from specdeploy.host.on_host import (
    KILL_AFTER_S,
    TIME_LIMIT_GRACE_S,
    TIMED_OUT,
    HostCommandError,
    read_text,
    sh,
)
from specdeploy.host.scripts import source

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"


METRIC_PERCENTILES = "50,90,99"


def bench_args(
    cfg: ServeConfig,
    *,
    base_url: str,
    tokenizer: str,
    result_dir: str,
    result_filename: str,
    workload: Workload | None = None,
    label: str | None = None,
) -> list[str]:
    w = workload or cfg.workload
    args = [
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        cfg.effective_served_name,
        "--served-model-name",
        cfg.effective_served_name,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        w.dataset,
        "--num-prompts",
        str(w.num_prompts),
        "--request-rate",
        str(w.request_rate),
        "--max-concurrency",
        str(w.max_concurrency),
        "--seed",
        str(w.seed),
        "--temperature",
        str(w.temperature),
        "--top-p",
        str(w.top_p),
        "--ignore-eos",  # every request produces output_len tokens, so arms do equal work
        "--percentile-metrics",
        PERCENTILE_METRICS,
        "--metric-percentiles",
        METRIC_PERCENTILES,
        "--disable-tqdm",
        # every caller starts the benchmark on a server it health-checked (and warmed): bench's own
        # "initial test run" would add one unmeasured request inside the counters' window
        "--ready-check-timeout-sec",
        "0",
        "--save-result",
        "--save-detailed",  # keep per-request latencies: noise bands need the samples
        "--result-dir",
        result_dir,
        "--result-filename",
        result_filename,
    ]
    if w.dataset == "random":
        args += ["--random-input-len", str(w.prompt_len), "--random-output-len", str(w.output_len)]
    elif w.dataset in datasets.SHIPPED and w.dataset_path:  # the copy the deploy shipped
        args += datasets.bench_dataset_args(w.dataset, w.dataset_path, w.output_len)
    if label:
        args += ["--label", label]
    return args


def bench_time_limit(cfg: ServeConfig, workload: Workload | None = None) -> int:
    """Seconds one `vllm bench serve` may take: every output token of the request set at the floor
    rate `smoke_min_tokens_per_s`, plus `health_timeout_s` (what a server may take to get going:
    first requests compile kernels and warm caches). A run past it is a wedged GPU or server."""
    w = workload or cfg.workload
    return math.ceil(w.num_prompts * w.output_len / cfg.smoke_min_tokens_per_s) + (
        cfg.health_timeout_s
    )


class BenchTimeout(RuntimeError):
    pass


def bench_timeout_message(cfg: ServeConfig, name: str, workload: Workload | None = None) -> str:
    w = workload or cfg.workload
    return (
        f"{host.name}: benchmark {name}: `vllm bench serve` ran past "
        f"{bench_time_limit(cfg, workload)} s = {w.num_prompts} prompts x {w.output_len} output "
        f"tokens / smoke_min_tokens_per_s {cfg.smoke_min_tokens_per_s} + health_timeout_s "
        f"{cfg.health_timeout_s} (stopped); lower smoke_min_tokens_per_s in the host's data if "
        "the host is this slow, else the server is wedged (see its journal)"
    )


def end_stale_command(cfg: ServeConfig) -> str:
    """Shell text that ends every benchmark still waiting in this service's bench_dir: one whose
    control node died before its go (the deploy lock lets one deploy or measurement of a service
    run at a time, so none of them is anyone's now). Its process group is ended only while that
    PID still runs the launcher of that very directory."""
    b = shlex.quote(cfg.bench_dir)
    return (
        f'for d in {b}/*.run; do [ -d "$d" ] || continue; p=$(cat "$d/pid" 2>/dev/null); '
        'if [ -n "$p" ] && tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | grep -qF "$d/go"; '
        'then kill -TERM -$p; echo "ended a benchmark an earlier run left waiting: $d"; fi; '
        'rm -rf "$d"; done; '
    )


class PendingBench:
    """One `vllm bench serve` on the host, started before its server is up: vLLM's CLI imports take
    seconds of CPU (about 5 s on a 2-core host), which now overlap the server's start instead of
    following it. It waits for the go file (host_scripts/bench_launcher.py); `run()` reads the
    server's counters, starts it and waits; leaving the `with` block unrun ends it (its own process
    group, by PID). Every benchmark (smoke, compare, tune, gate) runs this way."""

    def __init__(
        self,
        cfg: ServeConfig,
        *,
        tokenizer: str,
        name: str,
        workload: Workload | None = None,
        extra: list[str] | tuple[str, ...] = (),
    ):
        self.cfg, self.name = cfg, name
        self.limit = bench_time_limit(cfg, workload)
        self.message = bench_timeout_message(cfg, name, workload)
        args = bench_args(
            cfg,
            base_url=cfg.base_url,
            tokenizer=tokenizer,
            result_dir=cfg.bench_dir,
            result_filename=f"{name}.json",
            workload=workload,
            label=name,
        ) + list(extra)
        self.args = args
        self.argv = cfg.vllm_cli + args  # what vLLM's CLI runs (recorded as the command)
        # root-only: go file, exit status, output, PID; its own name, never another run's
        self.dir = f"{cfg.bench_dir}/{name}.{secrets.token_hex(4)}.run"
        self.pid: str | None = None
        self.done = False

    def start(self) -> PendingBench:
        env = {"HF_HOME": self.cfg.hf_home, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        env |= self.cfg.vllm_env
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        d = shlex.quote(self.dir)
        launcher = [self.argv[0], "-c", source("bench_launcher"), f"{self.dir}/go"]
        # the host's `timeout` covers the wait for the server too: it can never outlive its run
        waits = self.cfg.health_timeout_s + server.WARM_UP_TIMEOUT_S
        inner = (
            # --foreground: timeout stays in the group setsid made, so ending that group ends it all
            f"timeout --foreground -k {KILL_AFTER_S} {self.limit + waits} "
            f"{shlex.join(launcher + self.args)}; echo $? > {d}/rc"
        )
        # An --api-key server needs the key on the benchmark's requests: `vllm bench` reads
        # OPENAI_API_KEY, which the shell reads from stdin (never argv, never a file).
        out = sh(
            f"{end_stale_command(self.cfg)}mkdir -m 700 {d} && IFS= read -r OPENAI_API_KEY && "
            f"export OPENAI_API_KEY {assignments} && "
            f"{{ nohup setsid sh -c {shlex.quote(inner)} </dev/null >{d}/log 2>&1 & "
            f"echo $! > {d}/pid; echo $!; }}",
            stdin=(self.cfg.vllm_api_key or "") + "\n",
        ).splitlines()
        for line in out[:-1]:
            logger.warning(f"{host.print_prefix}{line}")
        self.pid = out[-1].strip() if out else None
        return self

    def __enter__(self) -> PendingBench:
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self.done:
            self.cancel()

    def cancel(self) -> None:
        """End it unrun (its process group: the session setsid gave it; and the PID itself, in case
        setsid has not made that group yet), and its files."""
        self.done = True
        if self.pid and self.pid.isdigit():
            d = shlex.quote(self.dir)
            sh(f"kill -TERM -{self.pid} {self.pid} 2>/dev/null; rm -rf {d}", check=False)

    def run(self, *, local: Path, meta: dict | None = None) -> BenchResult:
        """The benchmark against the running server; its JSON fetched to `local` with specdeploy's
        part (BenchRun: server counters, prefix cache, command, ...meta) added."""
        cfg, result_path = self.cfg, f"{self.cfg.bench_dir}/{self.name}.json"
        before = server.request(cfg, "/metrics")
        started = time.monotonic()
        d = shlex.quote(self.dir)
        try:  # go, then wait on the host for its exit status, at most the time limit (then ended)
            rc = sh(
                f"touch {d}/go; if timeout {self.limit} sh -c 'until [ -s {d}/rc ]; do sleep 0.1; "
                f"done'; then cat {d}/rc; else kill -TERM -{self.pid} 2>/dev/null; "
                f"echo {TIMED_OUT}; fi",
                timeout=self.limit + TIME_LIMIT_GRACE_S,
            ).strip()
            if rc == str(TIMED_OUT):
                raise BenchTimeout(self.message)
            if rc != "0":  # a failure comes back with its output's last lines
                log = sh(f"tail -n 60 {d}/log", check=False)
                raise HostCommandError(
                    f"{host.name}: benchmark {self.name}: `vllm bench serve` failed (exit {rc}):"
                    f"\n{log}"
                )
        except TimeoutError:  # pyinfra's backstop, for a connection that hangs
            raise BenchTimeout(self.message) from None
        finally:
            self.done = True
            sh(f"rm -rf {d}", check=False)
        seconds = time.monotonic() - started
        after = server.request(cfg, "/metrics")
        text = read_text(result_path)
        sh(f"rm -f {shlex.quote(result_path)}", check=False)
        local.parent.mkdir(parents=True, exist_ok=True)
        pc_before, pc_after = prefix_cache_counters(before), prefix_cache_counters(after)
        prefix = {k: pc_after.get(k, 0.0) - pc_before.get(k, 0.0) for k in pc_after}
        run = BenchRun.model_validate(
            {
                **(meta or {}),
                "host": host.name,
                "server_counters": acceptance(
                    spec_decode_counters(before), spec_decode_counters(after)
                ),
                "prefix_cache": prefix
                | {
                    "hit_rate": prefix["hits"] / prefix["queries"]
                    if prefix.get("queries")
                    else None
                },
                "bench_seconds": round(seconds, 1),
                "command": self.argv,
                "finished_at": utc_iso(),
            }
        )
        result = BenchResult.model_validate(json.loads(text) | {"specdeploy": run})
        local.write_text(result.to_json())
        return result

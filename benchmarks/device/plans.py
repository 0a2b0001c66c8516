"""Every GPU plan the device runner (`python -m benchmarks.device`) runs, as data.

A plan names what the control node renders (`build`: a function of the benchmark's plan module,
run here with the product's own code; its value is written to the carried plan.json), what the GPU
machine writes before the run (`setup`: checkpoint writers, each a module and its arguments), the
runner module it starts there and with which arguments, and the files of its output folder that
come back. The runner modules are each experiment's own (benchmarks/<plan>/device_run.py); what
they share is benchmarks/device/common.py, and the carrying, unpacking, starting, waiting and
collecting is the runner's alone.

Placeholders in `setup`, `args` and `files`' values: {plan} (the carried plan.json), {out} (the
runner's output folder on the device), {budget} (seconds the runner may take), {code} (the carried
code tree: benchmarks/, specdeploy/, a pyinfra stand-in, `files`), {site} (the unpacked vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# benchmarks.gpu_truth.make_weights: real-shape sparse checkpoints, as the weights step leaves them
HF = "/tmp/hf"
HOST_HF = "/var/lib/specdeploy/hf"  # the product's own hf_home: a plan running its command
MODELS = "/tmp/models"  # benchmarks.gpu_payoff.make_models: config.json + a small tokenizer


@dataclass(frozen=True)
class Plan:
    what: str
    build: str  # "module:function" -> the JSON the runner reads as {plan}
    runner: str  # the module started on the device
    args: tuple[str, ...]
    setup: tuple[tuple[str, ...], ...] = ()  # (module, *args) run on the device first, in order
    files: dict[str, str] = field(default_factory=dict)  # carried name -> "module:attribute" text
    outputs: tuple[str, ...] = ("summary.json", "logs.tar.gz")


WEIGHTS = (("benchmarks.gpu_truth.make_weights", HF),)
PLANS: dict[str, Plan] = {
    "gpu_payoff": Plan(
        "the payoff map: each arm's server once, warmed, `vllm bench serve` at each concurrency",
        "benchmarks.gpu_payoff.plan:build",
        "benchmarks.gpu_payoff.device_run",
        (
            "--plan",
            "{plan}",
            "--arms",
            "@{code}/benchmarks/gpu_payoff/queue.txt",
            "--budget",
            "{budget}",
            "--out",
            "{out}",
        ),
        setup=(("benchmarks.gpu_payoff.make_models", MODELS),),
    ),  # fmt: skip
    "gpu_truth": Plan(
        "the preflight against vLLM's own verdict and memory lines; payoff rows on fresh servers",
        "benchmarks.gpu_truth.plan:build",
        "benchmarks.gpu_truth.device_run",
        (
            "--plan",
            "{plan}",
            "--budget",
            "{budget}",
            "--phase1",
            "{budget}",
            "--command",
            "{code}/accel_command.sh",
            "--model-facts",
            "{code}/specdeploy/host/scripts/model_facts.py",
            "--out",
            "{out}",
        ),
        setup=WEIGHTS,
        files={"accel_command.sh": "specdeploy.host.facts.nvidia:ACCELERATOR_COMMAND"},
        outputs=("summary.json", "model_facts.json", "logs.tar.gz"),
    ),  # fmt: skip
    "gpu_truth_swing": Plan(
        "what makes the speculative path swing, then repeated TP=2 payoff starts",
        "benchmarks.gpu_truth.plan:build_second",
        "benchmarks.gpu_truth.swing_run",
        ("--plan", "{plan}", "--budget", "{budget}", "--swing-cap", "{budget}", "--out", "{out}"),
        setup=WEIGHTS,
    ),  # fmt: skip
    "gpu_preflight": Plan(
        "a host's own running server and the preflight of its re-deploy (the product's code)",
        "benchmarks.gpu_preflight.plan:build",
        "benchmarks.gpu_preflight.device_run",
        ("--plan", "{plan}", "--out", "{out}", "--budget", "{budget}"),
        setup=WEIGHTS,
    ),
    "bench_early": Plan(
        "bench.PendingBench started ahead of its server, at once, cancelled, stale",
        "benchmarks.gpu_preflight.plan:build",
        "benchmarks.bench_early.device_run",
        ("--plan", "{plan}", "--out", "{out}"),
        setup=WEIGHTS,
    ),
    "gpu_snapshot_path": Plan(
        "the rendered unit's argv word for word, the pinned draft by snapshot path vs repo id",
        "benchmarks.gpu_snapshot_path.plan:build",
        "benchmarks.gpu_snapshot_path.device_run",
        ("--plan", "{plan}", "--out", "{out}", "--site", "{site}", "--budget", "{budget}"),
        setup=(("benchmarks.gpu_snapshot_path.make_cache", "{plan}"),),
        outputs=("summary.json",),
    ),
    "gpu_load": Plan(
        "rounds of fresh servers per arm, `vllm bench serve` per load level (the load proof)",
        "benchmarks.gpu_load.render:build",
        "benchmarks.gpu_load.device_run",
        ("--plan", "{plan}", "--budget", "{budget}", "--rounds", "5", "--out", "{out}"),
        setup=(("benchmarks.gpu_payoff.make_models", MODELS),),
        outputs=("rounds.json", "results.tar.gz", "logs.tar.gz"),
    ),
    "host_proof": Plan(
        "the product's proof command with its rendered requests, on a host as a deploy leaves it",
        "benchmarks.host_proof.render:build",
        "benchmarks.host_proof.device_run",
        ("--plan", "{plan}", "--out", "{out}", "--site", "{site}", "--hf", HOST_HF),
        setup=(("benchmarks.gpu_truth.make_weights", HOST_HF),),
        outputs=("good.out", "good.err", "bad.out", "bad.err", "exit.txt"),
    ),
}
# the same runner over a whole box's plan (box_plan.py): each layout decided by instances.expand on
# the GPU list the fact read at idle
PLANS["gpu_box"] = replace(
    PLANS["gpu_preflight"],
    what="a whole box's layouts decided by instances.expand on the GPU list the fact read",
    build="benchmarks.gpu_preflight.box_plan:build",
)

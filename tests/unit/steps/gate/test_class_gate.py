"""One gate verdict per class of identical hosts (issue 37): the class key, the canary's runs
(power_runs, checked against an independent simulation of the exact rank test), the band a sharing
host's smoke run is held to, and the class decisions kept on the control node, expiring as a
host's do."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from specdeploy.config.record import GateDecision
from specdeploy.config.schema import SpeculationGate, Workload
from specdeploy.decide.gate_rule import gate_fingerprint, power_runs, smoke_outside_band
from specdeploy.render.units import RenderedUnit
from specdeploy.steps.gate import FleetClasses, GateInput, class_key

CPU = {"device": "cpu", "memory_gib": 16}
H200 = {"device": "gpu", "gpus": ["NVIDIA H200 143771 MiB"], "driver": "570.1", "cuda": "12.8"}


def units(*, port="8000", host="10.0.0.1", venv="vllm-0.32.0", request_set="sha-a", ratio=1.0):
    def unit(role, extra):
        argv = [f"/opt/specdeploy/venvs/{venv}/bin/python", "-m", "vllm", "serve", "m",
                "--host", host, "--port", port, *extra]  # fmt: skip
        text = f"[Service]\nExecStart={' '.join(argv)}\n"
        return RenderedUnit(role, f"vllm-{role}", argv, text, f"/etc/{role}")

    spec, base = unit("speculative", ["--speculative-config", "{}"]), unit("baseline", [])
    fp = gate_fingerprint(
        speculative_unit_sha256=spec.sha256,
        baseline_unit_sha256=base.sha256,
        workload={"request_set": request_set, "gate_runs": 3},
        max_tpot_ratio=ratio,
        on_fail="baseline",
    )
    return GateInput(spec, base, SpeculationGate(share=True), 0.05, fp, Workload())


def test_identical_hosts_but_their_addresses_are_one_class():
    one, other = units(), units(host="10.0.0.2", port="8001")
    assert one.fingerprint != other.fingerprint  # the units differ by their addresses...
    assert class_key(one, CPU) == class_key(other, CPU)  # ...which the class does not see


@pytest.mark.parametrize(
    "differs",
    [
        {"venv": "vllm-0.33.0"},  # the release
        {"request_set": "sha-b"},  # the request set
        {"ratio": 0.9},  # the gate's settings
    ],
)
def test_any_other_difference_is_another_class(differs):
    assert class_key(units(), CPU) != class_key(units(**differs), CPU)


@pytest.mark.parametrize(
    "hardware",
    [
        H200,
        {**H200, "gpus": H200["gpus"] * 2},  # GPU count
        {**H200, "driver": "575.0"},  # driver
        {**H200, "gpus": ["NVIDIA H100 80GB HBM3 81559 MiB"]},  # model
        {"device": "cpu", "memory_gib": 32},
    ],
)
def test_other_hardware_is_another_class(hardware):
    assert class_key(units(), CPU) != class_key(units(), hardware)


def real_units(valid_data, **changes) -> GateInput:
    """The gate's input as plan_server builds it, for host data `valid_data` with `changes`."""
    from specdeploy.config.schema import config_from_data
    from specdeploy.render.units import render_unit
    from specdeploy.steps.gate import gate_input

    cfg = config_from_data({**valid_data, "speculation_gate": {"share": True}, **changes})
    return gate_input(cfg, render_unit(cfg))


def test_rendered_units_of_hosts_that_differ_by_their_address_alone_are_one_class(valid_data):
    one = real_units(valid_data, vllm_host="10.0.0.1")
    other = real_units(valid_data, vllm_host="10.0.0.2", vllm_port=8001)
    assert one.speculative.text != other.speculative.text
    assert class_key(one, CPU) == class_key(other, CPU)


@pytest.mark.parametrize(
    "changes",
    [
        {"vllm_env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}},  # an Environment= line
        {"vllm_env": {"VLLM_CPU_KVCACHE_SPACE": "8"}},
        {"vllm_api_key": "k" * 32},  # the env file sets another name
    ],
)
def test_a_unit_environment_or_env_file_difference_is_another_class(valid_data, changes):
    """The argv alone is the same: the class still tells them apart (on main it did not)."""
    one, other = real_units(valid_data), real_units(valid_data, **changes)
    assert one.speculative.argv == other.speculative.argv
    assert class_key(one, CPU) != class_key(other, CPU)


def test_the_env_files_secret_values_stay_out_of_the_class(valid_data):
    """Two API keys: one class (a secret does not make a host slower), and no secret in the key's
    input."""
    one = real_units(valid_data, vllm_api_key="a" * 32)
    other = real_units(valid_data, vllm_api_key="b" * 32)
    assert class_key(one, CPU) == class_key(other, CPU)
    assert one.env_file == {"VLLM_API_KEY": None}


def test_a_box_instance_on_other_cores_is_another_class(valid_data):
    """vllm-cpu whole boxes: the same instance on other cores (CPUAffinity=, the thread binding) is
    another class; on the same cores of another host, the same one."""
    from specdeploy.config.schema import config_from_data
    from specdeploy.render import instances
    from specdeploy.render.units import render_unit
    from specdeploy.steps.gate import gate_input

    data = {**valid_data, "vllm_package": "vllm-cpu", "instances": 2,
            "speculation_gate": {"share": True}}  # fmt: skip
    cfg = config_from_data(data)

    def first(cores):
        member = instances.expand(cfg, cores).instances[0].cfg
        return gate_input(member, render_unit(member))

    low, same, high = first([0, 1, 2, 3]), first([0, 1, 2, 3]), first([4, 5, 6, 7])
    assert "CPUAffinity=" in low.speculative.text and low.speculative.argv == high.speculative.argv
    assert class_key(low, CPU) == class_key(same, CPU) != class_key(high, CPU)


def test_a_vllm_cpu_hosts_hardware_is_its_cpu_model_cpus_and_memory():
    """checks/preflight.hardware from the facts: two hosts with the same memory but another CPU
    model, or as many GiB on fewer cores, are other classes (on main: memory alone)."""
    from specdeploy.checks.preflight import hardware
    from specdeploy.host.facts.nvidia import AcceleratorInfo
    from specdeploy.host.facts.system import CpuInfo
    from tests.facts import fixture

    def cpu_host(case, gib=16):
        facts = fixture("CpuInfo", case)
        return hardware(
            AcceleratorInfo(status="missing"),
            {"total": gib * 2**30},
            CpuInfo().process(facts["output"]),
        )

    epyc = cpu_host("sandbox_epyc_2")
    assert epyc == {"device": "cpu", "cpu_model": "AMD EPYC", "cpus": 2, "memory_gib": 16}
    keys = {
        class_key(units(), h) for h in (epyc, cpu_host("xeon_4"), cpu_host("arm_no_model_name"))
    }
    assert len(keys) == 3
    assert class_key(units(), cpu_host("sandbox_epyc_2", 32)) != class_key(units(), epyc)


def _critical_rank_sum(n: int, alpha: float) -> int:
    """The largest rank sum of the speculative arm the one-sided exact test rejects at `alpha`,
    by enumerating all C(2n, n) splits (no ties)."""
    sums = sorted(sum(c) for c in itertools.combinations(range(1, 2 * n + 1), n))
    total = len(sums)
    return max((s for i, s in enumerate(sums) if (i + 1) / total <= alpha), default=-1)


def _simulated_power(n: int, cv: float, effect: float, alpha: float, trials: int = 4000) -> float:
    rng = random.Random(7)  # another seed than power_runs'
    critical = _critical_rank_sum(n, alpha)
    hits = 0
    for _ in range(trials):
        spec = [(1 - effect) * rng.lognormvariate(0, cv) for _ in range(n)]
        base = [rng.lognormvariate(0, cv) for _ in range(n)]
        ranked = sorted([(v, "s") for v in spec] + [(v, "b") for v in base])
        hits += sum(i + 1 for i, (_, arm) in enumerate(ranked) if arm == "s") <= critical
    return hits / trials


@pytest.mark.parametrize("cv", [0.03, 0.05, 0.07])
def test_the_canarys_runs_give_90_percent_power_and_one_fewer_does_not(cv):
    sized = power_runs(cv, alpha=0.05)
    n = sized["runs"]
    assert _simulated_power(n, cv, 0.10, 0.05) >= 0.88  # 4000 trials: +-0.01
    if n > 3:  # 3 is the floor: the fewest runs at which the one-sided test can reach 0.05
        assert _simulated_power(n - 1, cv, 0.10, 0.05) < 0.92
    assert sized["cv"] == cv and sized["effect"] == 0.10 and sized["target_power"] == 0.9


def test_more_spread_or_a_stricter_alpha_needs_more_runs():
    assert power_runs(0.05)["runs"] > power_runs(0.03)["runs"]
    assert power_runs(0.05, alpha=0.01)["runs"] > power_runs(0.05, alpha=0.05)["runs"]


BAND = {"smoke_tpot_ms": 10.0, "acceptance_rate": 0.6, "tolerance": 0.25,
        "acceptance_tolerance": 0.15}  # fmt: skip


def test_a_smoke_run_like_the_canarys_is_inside_the_band():
    assert smoke_outside_band({"median_tpot_ms": 12.0, "acceptance_rate": 0.5}, BAND) == []


@pytest.mark.parametrize(
    "smoke, why",
    [
        ({"median_tpot_ms": 13.0, "acceptance_rate": 0.6}, "smoke TPOT 13.000 ms"),
        ({"median_tpot_ms": 10.0, "acceptance_rate": 0.4}, "acceptance 0.400"),
        ({"acceptance_rate": 0.6}, "no smoke TPOT"),
    ],
)
def test_a_smoke_run_unlike_the_canarys_is_outside(smoke, why):
    assert any(why in line for line in smoke_outside_band(smoke, BAND))


def _decision(passed: bool, days_ago: float, fp: dict) -> GateDecision:
    decided = (datetime.now(UTC) - timedelta(days=days_ago)).isoformat()
    return GateDecision.model_validate(
        {"passed": passed, "fingerprint": fp, "decided_at": decided, "band": BAND}
    )


def test_a_class_decision_outlives_the_process_and_expires_as_a_hosts_does(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    fp = units().fingerprint
    FleetClasses().keep("k-fallback", _decision(False, 3, fp), "canary-1")
    FleetClasses().keep("k-passed", _decision(True, 30, fp), "canary-2")
    later = FleetClasses()  # the next batch's pyinfra: knows only what is on disk
    assert later.find("k-fallback", recheck_days=7)["measured_on"] == "canary-1"
    assert later.find("k-fallback", recheck_days=2) is None  # a 3-day-old fall-back expired
    assert later.find("k-passed", recheck_days=2)["measured_on"] == "canary-2"  # a pass does not
    assert later.find("k-unknown", recheck_days=None) is None
    kept = json.loads(FleetClasses.path("k-fallback").read_text())
    assert kept["class_key"] == "k-fallback" and not list(tmp_path.glob("classes/.*"))


def test_hosts_of_one_class_take_turns_and_other_classes_do_not_wait():
    classes = FleetClasses()
    with classes.turn("k1"):
        assert not classes.turn("k1").acquire(blocking=False)  # a second host of k1 waits
        with classes.turn("k2"):  # another class goes on
            pass
    with classes.turn(None):  # share off: no turn
        pass
    assert classes.turn("k1").acquire(blocking=False)

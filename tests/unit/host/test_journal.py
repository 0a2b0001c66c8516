"""Failure messages quote vLLM's own refusal: the journal summary on lines recorded on an H200
(benchmarks/gpu_truth, a server refused for free memory below gpu_memory_utilization)."""

from types import SimpleNamespace

import pytest

from specdeploy.host import on_host
from specdeploy.host.on_host import ERROR_LINE, journal_command, root_cause, summarize_journal
from tests.unit import DATA

RECORDED = (DATA / "journal-h200-free-memory-refusal.txt").read_text()
REFUSAL = (
    "ValueError: Free memory on device cuda:0 (118.69/139.8 GiB) on startup is less than desired "
    "GPU memory utilization (0.92, 128.62 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)


def test_recorded_refusal_is_quoted_first():
    lines = RECORDED.splitlines()
    assert lines[-1].endswith("RuntimeError: Engine core initialization failed. See root cause "
                              "above. Failed core proc(s): {}")  # fmt: skip
    summary = summarize_journal(lines)
    assert summary.splitlines()[0] == f"[root cause] {REFUSAL}"
    assert "[last lines]" in summary and summary.endswith(lines[-1])


def test_exception_lines_match_without_a_word_boundary():
    for line in [
        "(EngineCore pid=3820) ValueError: Free memory on device cuda:0 (78.69/139.8 GiB)",
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ]:
        assert ERROR_LINE.search(line)
    assert root_cause(["x", "torch.OutOfMemoryError: CUDA out of memory."]) == (
        "torch.OutOfMemoryError: CUDA out of memory."
    )


def test_wrapper_only_when_nothing_else_and_warnings_mentioning_errors_do_not_count():
    warning = RECORDED.splitlines()[0]
    assert "OSError: [Errno 24]" in warning  # a WARNING that names an exception in its text
    wrapper = (
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above."
    )
    assert root_cause([warning, wrapper]) == wrapper.split(") ", 1)[1]
    assert root_cause([warning]) is None
    assert summarize_journal(["a", "b"]) == "a\nb"


def test_journal_is_limited_to_the_last_invocation():
    command = journal_command("specdeploy-vllm.service")
    assert "systemctl show -p InvocationID --value specdeploy-vllm.service" in command
    assert 'journalctl _SYSTEMD_INVOCATION_ID="$id" -n 600' in command
    assert "else journalctl -u specdeploy-vllm.service -n 600" in command  # no invocation id
    assert journal_command("u.service", whole_unit=True).startswith("journalctl -u u.service")


@pytest.fixture
def journal_reads(monkeypatch) -> list[str]:
    """The journal commands journal_tail runs: the last invocation holds a healthy start, the
    unit's whole journal the recorded refusal of an earlier run."""
    calls: list[str] = []

    def fake(command):
        calls.append(command)
        whole = command.startswith("journalctl -u")
        return True, RECORDED if whole else "INFO starting vLLM API server\n", None

    monkeypatch.setattr(on_host, "sh_status", fake)
    return calls


def test_a_restart_that_has_not_failed_yet_falls_back_to_the_unit(journal_reads):
    assert on_host.journal_tail("u.service", restarted=True).startswith(f"[root cause] {REFUSAL}")
    assert len(journal_reads) == 2


def test_a_unit_that_did_not_restart_is_its_last_invocation_alone(journal_reads):
    """A server that is up but fails a check (or never restarted): an exception an earlier run of
    the unit logged is not named as the root cause (the fault wing's gate test saw an earlier
    run's EngineDeadError named the cause of a 401)."""
    summary = on_host.journal_tail("u.service", restarted=False)
    assert summary == "INFO starting vLLM API server" and len(journal_reads) == 1
    assert "[root cause]" not in summary


@pytest.mark.parametrize(("state", "restarted"), [("active", False), ("activating", True)])
def test_a_balancer_that_does_not_answer_says_which_journal_it_read(monkeypatch, state, restarted):
    """An active HAProxy that does not answer /health never restarted: its earlier runs' errors are
    not this failure's; one that is not active may be a restart that has not failed yet."""
    from specdeploy.host import server

    asked: list[bool] = []
    clock = iter([0.0, 61.0])
    monkeypatch.setattr(server, "host", SimpleNamespace(name="gpu-1", print_prefix=""))
    monkeypatch.setattr(server, "sh", lambda command: "")
    monkeypatch.setattr(server, "enable", lambda unit: None)
    monkeypatch.setattr(server, "start_if_inactive", lambda unit: False)
    monkeypatch.setattr(server, "is_healthy", lambda cfg: False)
    monkeypatch.setattr(server, "is_active", lambda unit: state)
    monkeypatch.setattr(server.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(
        server, "journal_tail", lambda unit, *, restarted: asked.append(restarted) or "lines"
    )
    cfg = SimpleNamespace(balancer_unit="specdeploy-balancer.service", base_url="http://x:8000")
    with pytest.raises(server.HealthError, match=f"does not answer /health .*\\({state}\\)"):
        server.start_balancer(cfg, reload=False)
    assert asked == [restarted]

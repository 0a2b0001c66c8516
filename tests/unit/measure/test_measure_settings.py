"""Measurement settings live in the one config schema; the environment overrides them per run."""

import pytest
from pydantic import ValidationError

from specdeploy.config.schema import config_from_data
from specdeploy.measure.plans import setting


def test_defaults_come_from_the_schema(valid_data):
    cfg = config_from_data(valid_data)
    assert setting(cfg, "tune_k") == [1, 2, 3, 4, 5, 6, 7]
    assert setting(cfg, "compare_repeats") is None and setting(cfg, "compare_max_repeats") == 8
    assert setting(cfg, "compare_apc_profile") is True


def test_host_data_and_environment(valid_data, monkeypatch):
    cfg = config_from_data({**valid_data, "tune_k": "1-3,5", "compare_repeats": 5})
    assert setting(cfg, "tune_k") == [1, 2, 3, 5] and setting(cfg, "compare_repeats") == 5
    monkeypatch.setenv("SPECDEPLOY_COMPARE_REPEATS", "2")
    monkeypatch.setenv("SPECDEPLOY_COMPARE_APC_PROFILE", "false")
    assert setting(cfg, "compare_repeats") == 2 and setting(cfg, "compare_apc_profile") is False


def test_bad_values_are_refused(valid_data, monkeypatch):
    with pytest.raises(ValidationError):
        config_from_data({**valid_data, "tune_k": [0, 2]})
    monkeypatch.setenv("SPECDEPLOY_COMPARE_REPEATS", "0")
    with pytest.raises(ValidationError):
        setting(config_from_data(valid_data), "compare_repeats")

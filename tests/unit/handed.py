"""What a deploy's start reads once and hands down (checks/host_data.host_inputs), for tests that
call a step or a measurement plan without a deploy: the pin's Release and the engine flags."""

from __future__ import annotations

from specdeploy.config.schema import ServeConfig
from specdeploy.releases.capabilities import release_of
from specdeploy.render.argv import engine_flags


def handed(cfg: ServeConfig) -> dict:
    """{"release": the pin's Release, "flags": its engine flags}, as keyword arguments."""
    return {
        "release": release_of(cfg.vllm_version, cfg.allow_unknown_release),
        "flags": engine_flags(cfg),
    }

"""Ship the workload's request set (a file on the control node, see datasets.py) to the host, and
the packages vLLM's loader for it needs in the venv (datasets.BENCH_PACKAGES).

It lands under a root-owned directory, named by its sha256 (datasets.host_path), and its sha256 is
checked on the host after every upload; an unchanged file is neither re-sent nor re-checked (pyinfra
compares checksums first), so a re-run with nothing changed schedules no operation.

A new request set (or rate, concurrency, prompt count...) must be measured, not only shipped:
`workload_changes` compares the deployment record's workload with the host data's, and serve.py
runs health, smoke and record again (without a restart) when it names anything, or when the upload
changed the file on the host, so the record's request set sha256 always equals the host data's."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server

from specdeploy.config import datasets
from specdeploy.config.record import DeploymentRecord
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.vllm import VllmVersion

# The record's workload fields (steps/record.py) that the host data decides.
WORKLOAD_FIELDS = (
    "prompt_len",
    "output_len",
    "dataset",
    "dataset_path",
    "num_prompts",
    "seed",
    "request_rate",
    "max_concurrency",
    "temperature",  # a record from before sampling was recorded has None: measured again once
    "top_p",
)


def workload_changes(previous: DeploymentRecord | None, cfg: ServeConfig) -> list[str]:
    """Planning time, pure: the workload fields (and "request_set sha256") where the record differs
    from the host data, so the smoke benchmark must run again. No record: nothing to compare (the
    unit step decides)."""
    if previous is None:
        return []
    w, recorded = cfg.workload, previous.workload
    changes = [f for f in WORKLOAD_FIELDS if getattr(recorded, f, None) != getattr(w, f)]
    wanted = datasets.describe(w.dataset_path, w.dataset)
    had = recorded.request_set or None
    if (wanted or {}).get("sha256") != (had or {}).get("sha256"):
        changes.append("request_set sha256")
    return changes


@deploy("Request set")
def ship_request_set(cfg: ServeConfig):
    """Returns the upload operation (its `did_change()`: the host got a new file), or None."""
    w = cfg.workload
    if w.dataset not in datasets.SHIPPED or not w.dataset_path:
        return None
    info = datasets.describe(w.dataset_path, w.dataset)
    files.directory(
        name="Request set dir", path=datasets.HOST_DIR, user="root", group="root", mode="755"
    )
    put = files.put(
        name=f"Request set {w.dataset_path} ({info['rows']} rows, sha256 {info['sha256'][:12]})",
        src=w.dataset_path,
        dest=info["host_path"],
        user="root",
        group="root",
        mode="644",
    )
    server.shell(
        name="Request set: verify sha256 on the host",
        commands=[
            f"echo {info['sha256']}  {shlex.quote(info['host_path'])} | sha256sum -c --strict"
        ],
        _if=put.did_change,
    )
    missing = [
        package
        for package in datasets.BENCH_PACKAGES.get(w.dataset, ())
        if host.get_fact(VllmVersion, venv=cfg.venv, package=package) is None
    ]
    if missing:
        server.shell(
            name=f"Benchmark loader for {w.dataset}: pip install {' '.join(missing)}",
            # into root's release venv, which stays root's: the benchmark runs as root, so a venv
            # the service user could write would let it run code as root
            commands=[
                f"{cfg.venv}/bin/python -m pip install --disable-pip-version-check -q "
                f"{shlex.join(cfg.pip_install_args)} {shlex.join(missing)}",
            ],
        )
    return put

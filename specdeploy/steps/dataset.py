"""Ship the workload's request set (a file on the control node, see datasets.py) to the host, and
the packages vLLM's loader for it needs in the venv (datasets.BENCH_PACKAGES).

It lands under a root-owned directory, named by its sha256 (datasets.host_path), and its sha256 is
checked on the host after every upload; an unchanged file is neither re-sent nor re-checked (pyinfra
compares checksums first), so a re-run with nothing changed schedules no operation."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server

from .. import datasets
from ..config import ServeConfig
from ..facts import VllmVersion


@deploy("Request set")
def ship_request_set(cfg: ServeConfig):
    w = cfg.workload
    if w.dataset not in datasets.SHIPPED or not w.dataset_path:
        return
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
            commands=[
                f"{cfg.venv}/bin/python -m pip install --disable-pip-version-check -q "
                f"{shlex.join(cfg.pip_install_args)} {shlex.join(missing)}",
                f"chown -R {cfg.service_user}:{cfg.service_user} {cfg.venv}",
            ],
        )

"""deploys/compare.py and deploys/tune.py: measure every host under its deploy lock, then write the
fleet report."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from ..checks import host_config_as_deployed
from ..config import DATA_DEFAULTS, ServeConfig
from ..reports import raw_dir, run_dir
from ..steps import dataset, lock
from ..steps.rollback import out_of_service_width, refuse_no_wait, width_text
from . import report
from .arms import Arm
from .harness import measure_plan
from .plans import compare_measurement, tune_measurement

_REPORTED_HOSTS: dict[str, int] = {}  # report dir -> hosts finished when the report was written


def _measure(cfg: ServeConfig, *, kind: str, plan: list[tuple[Arm, bool]], cond: dict) -> None:
    out = raw_dir(kind, host.name)
    try:
        measure_plan(cfg, plan, out_dir=out, conditions={"kind": kind, **cond})
    except Exception:
        lock.release_now(cfg)  # the host is back on its deployed unit (measure_plan's finally)
        raise


def _write_report(kind: str) -> None:
    """Runs on every host after all hosts measured; the first one writes the fleet report."""
    directory = run_dir(kind)
    finished = len(list((directory / "raw").glob("*/conditions.json")))
    if _REPORTED_HOSTS.get(str(directory)) == finished:
        return
    _REPORTED_HOSTS[str(directory)] = finished
    summary = report.write(directory, kind)
    logger.info(
        f"{host.print_prefix}report: {directory}/summary.md ({', '.join(summary['charts'])})"
    )
    if kind == "tune":
        for name, h in summary["hosts"].items():
            c = h["choice"]
            if c["recommended_k"] is None:
                print(f"{name}: {c['verdict']} (currently k = {h['current_k']})")
            else:
                print(
                    f"{name}: recommended num_speculative_tokens = {c['recommended_k']} (best "
                    f"{c['best_k']}, currently {h['current_k']})"
                )
            print(f"  {h['host_data_change'] or 'no change needed'}")


MEASUREMENTS = {
    "compare": ("specdeploy: baseline vs speculative A/B", compare_measurement),
    "tune": ("specdeploy: num_speculative_tokens sweep", tune_measurement),
}


def measurement_deploy(kind: str):
    """deploys/compare.py and deploys/tune.py: measure every host under the deploy lock, then the
    fleet report."""
    title, make_plan = MEASUREMENTS[kind]

    @deploy(title, data_defaults=DATA_DEFAULTS)
    def _measure_fleet():
        refuse_no_wait()  # --no-wait would take every host off its unit at once
        cfg = host_config_as_deployed()  # the record's pins: what the host really serves
        plan, cond, what = make_plan(cfg)
        lock.acquire(name="Take the host's deploy lock", cfg=cfg)  # no serve deploy meanwhile
        dataset.ship_request_set(cfg)  # the request set every arm replays
        # a measured host is off its deployed unit: at most rollout_max_parallel hosts at once
        python.call(
            name=f"{what}, {width_text(cfg)}",
            function=_measure,
            cfg=cfg,
            kind=kind,
            plan=plan,
            cond=cond,
            **out_of_service_width(cfg),
        )
        lock.release(name="Release the host's deploy lock", cfg=cfg)
        python.call(name=f"Report {run_dir(kind)}", function=_write_report, kind=kind)

    _measure_fleet()

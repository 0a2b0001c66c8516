"""`specdeploy status`'s table: one row per host, the problems under it (pure formatting of what
status.py read)."""

from __future__ import annotations

from specdeploy.observe.rows import HostStatus, InstanceStatus, ServerStatus


def _fmt(value, spec: str, scale: float = 1.0, none: str = "-") -> str:
    return none if value is None else format(value * scale, spec)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


def _live(server: ServerStatus | None) -> tuple[dict, str]:
    """The window's figures when requests finished in it, else the server's since-start figures
    (marked `*`): an idle host still shows what its traffic looked like."""
    live = server.live if server else None
    window = live.window if live else None
    if window and (window.get("drafts") or window.get("requests_finished")):
        return window, ""
    return (live.since_start if live else None) or {}, "*"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


COLUMNS = (
    "HOST",
    "OK",
    "SERVICE",
    "VLLM",
    "UNIT",
    "REQ/S",
    "ACCEPT",
    "LEN",
    "TPOT p50",
    "ITL p50",
    "KV",
    "GPU MEM",
)


def _server_row(
    label: str, server: ServerStatus | None, ok: bool, installed: str | None, gpus: list | None
) -> list[str]:
    """One server's cells: the host's own (a single server) or one instance of a whole box."""
    service, unit = server and server.service, server and server.unit
    live = server.live if server else None
    figures, mark = _live(server)
    memory = (f"{g['used_bytes'] / 2**30:.1f}/{g['total_bytes'] / 2**30:.0f}G" for g in gpus or [])
    if service:
        state = f"{service.active} {_duration(service.seconds)} r{service.restarts}"
    else:
        state = "- - r-"
    return [
        label,
        "yes" if ok else "NO",
        state,
        installed or "none",
        ("drift" if unit.drift or unit.env_file else "ok") if unit else "-",
        _fmt((live.window or {}).get("request_rate") if live else None, ".2f"),
        _fmt(figures.get("acceptance_rate"), ".0%") + mark,
        _fmt(figures.get("mean_acceptance_length"), ".2f") + mark,
        _ms(figures.get("tpot_median_s")) + mark,
        _ms(figures.get("itl_median_s")) + mark,
        _fmt(figures.get("kv_cache_usage"), ".0%"),
        ", ".join(memory) or "-",
    ]


def _balancer_row(row: HostStatus) -> list[str]:
    """A whole box's balancer: its unit, and backends up of all (the SERVICE column)."""
    b = row.balancer
    if b is None:
        return [f"{row.host}/balancer", "NO", "- r-, 0/0 up", "haproxy", "-"]
    ok = b.healthy and not b.config_drift
    service = f"{b.active} r{b.restarts}, {b.up}/{b.total} up"
    unit = "drift" if b.config_drift else "ok"
    return [f"{row.host}/balancer", "yes" if ok else "NO", service, "haproxy", unit]


def table_rows(results: list[HostStatus]) -> list[list[str]]:
    """One row per host; a whole box: one per instance (HOST/INSTANCE) and its balancer."""
    rows = []
    for row in results:
        if not row.reachable:
            rows.append([row.host, "NO", "unreachable"] + ["-"] * (len(COLUMNS) - 3))
            continue
        installed = row.vllm.installed if row.vllm else None
        if row.instances is None:
            rows.append(_server_row(row.host, row.server, row.ok, installed, row.gpu))
            continue
        for inst in row.instances:
            label = f"{row.host}/{inst.name}"
            rows.append(_server_row(label, inst.server, not inst.problems, installed, inst.gpu))
        cells = _balancer_row(row)
        rows.append(cells + ["-"] * (len(COLUMNS) - len(cells)))
    return rows


def _details(
    label: str, server: ServerStatus | None, problems: list[str], where: str | None = None
) -> list[str]:
    """The lines under a row: where an instance serves (`where`), the deployment record, exact
    means, acceptance by position, the problems, the argv diff."""
    figures, mark = _live(server)
    record = server.record if server else None
    details = []
    if where:
        details.append(where)
    if record:
        details.append(
            f"deployed {record.finished_at} as {record.role}, "
            f"k={record.k}, "
            f"smoke TPOT {_fmt(record.smoke_tpot_ms, '.2f')} ms"
        )
    if record and record.validated_by:
        details.append(f"argv validated by {record.validated_by}")
    if record and record.schedule:
        details.append(record.schedule)
    if figures.get("tpot_mean_s") is not None:
        details.append(
            f"TPOT mean {_ms(figures.get('tpot_mean_s'))}, ITL mean "
            f"{_ms(figures.get('itl_mean_s'))} (exact; the p50 columns are bucket estimates)"
            + (" since start" if mark else "")
        )
    positions = figures.get("per_position_acceptance") or []
    if positions:
        details.append(
            "acceptance by position"
            + (" (since start)" if mark else "")
            + ": "
            + " ".join(_fmt(p, ".0%") for p in positions)
        )
    details += [f"! {problem}" for problem in problems]
    diff = server.unit.argv_diff if server and server.unit else None
    if diff:
        details += ["  " + line for line in diff.splitlines()]
    return [f"{label}:", *(f"  {d}" for d in details)] if details else []


def _where(inst: InstanceStatus) -> str | None:
    return f"port {inst.port}, {inst.devices}" if inst.devices else None


def _marked(row: HostStatus) -> bool:
    members = row.instances
    return any(_live(e.server)[1] for e in members) if members else bool(_live(row.server)[1])


def format_table(results: list[HostStatus]) -> str:
    rows = [list(COLUMNS), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for row in results:
        members = row.instances
        if members is None:
            lines += _details(row.host, row.server, row.problems)
            continue
        for inst in members:  # its problems are the host's too, said once: here
            lines += _details(f"{row.host}/{inst.name}", inst.server, inst.problems, _where(inst))
        prefixes = tuple(f"{inst.name}: " for inst in members)
        own = [p for p in row.problems if not p.startswith(prefixes)]
        lines += _details(row.host, None, own)
    if any(_marked(row) for row in results if row.reachable):
        lines.append("* no request finished between the scrapes: figures since the server started")
    bad = [row.host for row in results if not row.ok]
    lines.append(
        f"{len(results) - len(bad)} of {len(results)} host(s) reachable, healthy and as deployed"
        + (f"; not: {', '.join(bad)}" if bad else "")
    )
    return "\n".join(lines)

"""`specdeploy status`'s table: one row per host, the problems under it (pure formatting of what
status.py read)."""

from __future__ import annotations


def _fmt(value, spec: str, scale: float = 1.0, none: str = "-") -> str:
    return none if value is None else format(value * scale, spec)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


def _live(entry: dict) -> tuple[dict, str]:
    """The window's figures when requests finished in it, else the server's since-start figures
    (marked `*`): an idle host still shows what its traffic looked like."""
    live = entry.get("live") or {}
    window = live.get("window")
    if window and (window.get("drafts") or window.get("requests_finished")):
        return window, ""
    return live.get("since_start") or {}, "*"


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


def _server_row(label: str, entry: dict, ok: bool, vllm: dict) -> list[str]:
    """One server's cells: the host's own (a single server) or one instance of a whole box."""
    service = entry.get("service") or {}
    unit = entry.get("unit") or {}
    figures, mark = _live(entry)
    gpus = entry.get("gpu") or []
    return [
        label,
        "yes" if ok else "NO",
        f"{service.get('active', '-')} {_duration(service.get('seconds'))} "
        f"r{service.get('restarts', '-')}",
        vllm.get("installed") or "none",
        ("drift" if unit.get("drift") or unit.get("env_file") else "ok") if unit else "-",
        _fmt(((entry.get("live") or {}).get("window") or {}).get("request_rate"), ".2f"),
        _fmt(figures.get("acceptance_rate"), ".0%") + mark,
        _fmt(figures.get("mean_acceptance_length"), ".2f") + mark,
        _ms(figures.get("tpot_median_s")) + mark,
        _ms(figures.get("itl_median_s")) + mark,
        _fmt(figures.get("kv_cache_usage"), ".0%"),
        ", ".join(f"{g['used_bytes'] / 2**30:.1f}/{g['total_bytes'] / 2**30:.0f}G" for g in gpus)
        or "-",
    ]


def _balancer_row(entry: dict) -> list[str]:
    """A whole box's balancer: its unit, and backends up of all (the SERVICE column)."""
    b = entry.get("balancer") or {}
    ok = b.get("healthy") and not b.get("config_drift")
    service = f"{b.get('active', '-')} r{b.get('restarts', '-')}, {b.get('up', 0)}/"
    service += f"{b.get('total', 0)} up"
    unit = "-" if not b else ("drift" if b.get("config_drift") else "ok")
    return [f"{entry['host']}/balancer", "yes" if ok else "NO", service, "haproxy", unit]


def table_rows(results: list[dict]) -> list[list[str]]:
    """One row per host; a whole box: one per instance (HOST/INSTANCE) and its balancer."""
    rows = []
    for entry in results:
        if not entry.get("reachable"):
            rows.append([entry["host"], "NO", "unreachable"] + ["-"] * (len(COLUMNS) - 3))
            continue
        vllm = entry.get("vllm") or {}
        if "instances" not in entry:
            rows.append(_server_row(entry["host"], entry, bool(entry.get("ok")), vllm))
            continue
        for inst in entry["instances"]:
            label = f"{entry['host']}/{inst['name']}"
            rows.append(_server_row(label, inst, not inst["problems"], vllm))
        row = _balancer_row(entry)
        rows.append(row + ["-"] * (len(COLUMNS) - len(row)))
    return rows


def _details(label: str, entry: dict, problems: list[str]) -> list[str]:
    figures, mark = _live(entry)
    record = entry.get("record") or {}
    details = []
    if entry.get("devices"):
        details.append(f"port {entry.get('port')}, {entry['devices']}")
    if record:
        details.append(
            f"deployed {record.get('finished_at')} as {record.get('role')}, "
            f"k={record.get('k')}, "
            f"smoke TPOT {_fmt(record.get('smoke_tpot_ms'), '.2f')} ms"
        )
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
    diff = (entry.get("unit") or {}).get("argv_diff")
    if diff:
        details += ["  " + line for line in diff.splitlines()]
    return [f"{label}:", *(f"  {d}" for d in details)] if details else []


def _marked(entry: dict) -> bool:
    members = entry.get("instances")
    return any(_live(e)[1] for e in members) if members else bool(_live(entry)[1])


def format_table(results: list[dict]) -> str:
    rows = [list(COLUMNS), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for entry in results:
        members = entry.get("instances")
        if members is None:
            lines += _details(entry["host"], entry, entry.get("problems", []))
            continue
        for inst in members:  # its problems are the host's too, said once: here
            lines += _details(f"{entry['host']}/{inst['name']}", inst, inst["problems"])
        prefixes = tuple(f"{inst['name']}: " for inst in members)
        own = [p for p in entry.get("problems", []) if not p.startswith(prefixes)]
        lines += _details(entry["host"], {}, own)
    if any(_marked(e) for e in results if e.get("reachable")):
        lines.append("* no request finished between the scrapes: figures since the server started")
    bad = [e["host"] for e in results if not e.get("ok")]
    lines.append(
        f"{len(results) - len(bad)} of {len(results)} host(s) reachable, healthy and as deployed"
        + (f"; not: {', '.join(bad)}" if bad else "")
    )
    return "\n".join(lines)

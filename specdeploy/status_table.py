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


def table_rows(results: list[dict]) -> list[list[str]]:
    rows = []
    for entry in results:
        if not entry.get("reachable"):
            rows.append([entry["host"], "NO", "unreachable"] + ["-"] * (len(COLUMNS) - 3))
            continue
        service = entry.get("service") or {}
        unit = entry.get("unit") or {}
        vllm = entry.get("vllm") or {}
        figures, mark = _live(entry)
        gpus = entry.get("gpu") or []
        rows.append(
            [
                entry["host"],
                "yes" if entry.get("ok") else "NO",
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
                ", ".join(
                    f"{g['used_bytes'] / 2**30:.1f}/{g['total_bytes'] / 2**30:.0f}G" for g in gpus
                )
                or "-",
            ]
        )
    return rows


def format_table(results: list[dict]) -> str:
    rows = [list(COLUMNS), *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    for entry in results:
        figures, mark = _live(entry)
        record = entry.get("record") or {}
        details = []
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
        details += [f"! {problem}" for problem in entry.get("problems", [])]
        diff = (entry.get("unit") or {}).get("argv_diff")
        if diff:
            details += ["  " + line for line in diff.splitlines()]
        if details:
            lines.append(f"{entry['host']}:")
            lines += [f"  {d}" for d in details]
    if any(_live(e)[1] for e in results if e.get("reachable")):
        lines.append("* no request finished between the scrapes: figures since the server started")
    bad = [e["host"] for e in results if not e.get("ok")]
    lines.append(
        f"{len(results) - len(bad)} of {len(results)} host(s) reachable, healthy and as deployed"
        + (f"; not: {', '.join(bad)}" if bad else "")
    )
    return "\n".join(lines)

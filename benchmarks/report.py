"""The table (Markdown, so it can be pasted into a README) and the JSON file."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ._common import LIMIT, Cell, Row

__all__ = ["format_cell", "render", "save_json"]


def _time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return ""
    return f"{x:.2f}" if x < 10 else f"{x:.3g}"


def format_value(row: Row, value: float) -> str:
    """A measured value in the unit that suits the row."""
    if row.kind == "time":
        text = _time(value)
        if row.nbytes:
            return f"{row.nbytes / value / 1e9:.2f} GB/s ({text})"
        if row.per:
            return f"{text} ({_time(value / row.per)} each)"
        return text
    if row.kind == "bytes":
        return f"{value:,.0f} B"
    if row.kind == "mib":
        return f"{value:,.0f} MiB"
    return f"{value:,.0f}/s"


def format_cell(row: Row, name: str) -> str:
    cell = row.cells.get(name, Cell())
    if cell.error is not None:
        return cell.error
    value = cell.value
    return "" if value is None else format_value(row, value)


def render(rows: Sequence[Row], libraries: Sequence[str] = ("tdshare", "tensordict")) -> str:
    """One Markdown table: workload, each library, ratio, raw limit and tdshare / limit."""
    a, b = [*libraries, "tensordict"][:2]
    head = ["workload", a, b, f"ratio ({b} / {a})", "raw limit", f"{a} vs limit"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    group = None
    for row in rows:
        if row.group != group:
            group = row.group
            lines.append(f"| **{group}** |" + " |" * (len(head) - 1))
        limit = format_cell(row, LIMIT)
        if limit and row.limit_name:
            limit = f"{row.limit_name}: {limit}"
        cells = [
            row.name,
            format_cell(row, a),
            format_cell(row, b),
            _ratio(row.ratio(a, b)),
            limit,
            _ratio(row.ratio(a, LIMIT)),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    notes = [f"- {row.name}: {row.note}" for row in rows if row.note]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


def save_json(path: str, header: dict[str, Any], rows: Sequence[Row]) -> None:
    with open(path, "w") as f:
        json.dump({"run": header, "rows": [r.to_json() for r in rows]}, f, indent=1)
        f.write("\n")

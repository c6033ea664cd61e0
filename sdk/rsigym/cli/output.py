"""How the agent CLI prints: dollars, scores, errors, JSON and plain tables."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..errors import RSIGymError


def format_usd(value: float | None) -> str:
    """Dollars with at least cents and at most micro-dollars: $5.00, $0.000123, -."""
    if value is None:
        return "-"
    whole, _, frac = f"{value:.6f}".partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"-${whole.lstrip('-')}.{frac}" if value < 0 else f"${whole}.{frac}"


def format_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def format_error(err: RSIGymError) -> str:
    text = f"error: {err.type}: {err.message}"
    if err.request_id:
        text += f" (request_id {err.request_id})"
    return text


def echo(text: str = "") -> None:
    print(text, file=sys.stdout)


def echo_err(text: str) -> None:
    print(text, file=sys.stderr)


def print_json(data: Any, *, compact: bool = False) -> None:
    echo(json.dumps(data, indent=None if compact else 2, ensure_ascii=False))


def dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(mode="json")


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

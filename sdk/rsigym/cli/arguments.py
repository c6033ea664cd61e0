"""Argument types and flags shared by the command groups."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def json_object_file(path: str) -> dict[str, Any]:
    """argparse ``type=``: a JSON object read from a file (a bad file is a usage error)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{path} must hold a JSON object")
    return data


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")

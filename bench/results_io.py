"""Writing a benchmark's JSON result: the file (its folder made), and with `write_json` the same JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_json(out: str | Path, data: dict[str, Any], *, indent: int = 2) -> Path:
    """Write ``data`` as JSON to ``out``, making its folder; returns the path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n")
    return path


def write_json(out: str | Path, data: dict[str, Any]) -> None:
    save_json(out, data)
    print(json.dumps(data, indent=2))

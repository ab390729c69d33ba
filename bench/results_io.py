"""Writing a benchmark's JSON result: the file (its folder made) and the same JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(out: str | Path, data: dict[str, Any]) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2)
    path.write_text(text + "\n")
    print(text)

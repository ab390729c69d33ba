#!/usr/bin/env python3
"""Rewrite kv-guardian's old module paths to their places in the wings (the table is `kvguardian._moved.MOVED`).

Rewrites dotted paths (``kvguardian.ledger.records`` -> ``kvguardian.core.ledger.records``) and file paths
(``src/kvguardian/hf/observers.py`` -> ``src/kvguardian/runtime/hf/observers.py``) in the named files, or in
every
``.py``, ``.md``, ``.toml``, ``.yml``/``.yaml``, ``.cfg``, ``.in``, ``.sh`` and ``.txt`` file under the named
folders. Logger names (lines calling ``getLogger``) are left alone: they are configuration users may have
written down; so are lines marked ``kvg: old path`` and the files that name the old paths on purpose (`SELF`).
Running it twice changes nothing the second time.

    python3 scripts/rewrite_imports.py PATH [PATH ...]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kvguardian._moved import MOVED

SUFFIXES = {".py", ".pyi", ".md", ".toml", ".yml", ".yaml", ".cfg", ".in", ".sh", ".txt", ".json", ".ini"}
KEEP = "kvg: old path"
SELF = {"_moved.py", "rewrite_imports.py", "test_moved.py"}
_NAMES = "|".join(sorted((re.escape(k) for k in MOVED), key=len, reverse=True))
_DOTTED = re.compile(rf"\bkvguardian\.({_NAMES})\b")
_PATH = re.compile(rf"\bkvguardian/({_NAMES})\b")
#: test folders mirror the package: tests/unit/hf -> tests/unit/runtime/hf
_TEST_DIRS = {old: new.replace(".", "/") for old, new in MOVED.items() if "." in new or old == "audit"}
_TESTS = re.compile(r"\btests/(unit|integration)/(" + "|".join(sorted(_TEST_DIRS, key=len, reverse=True)) + r")\b")
_FROM = re.compile(rf"^(\s*)from kvguardian import ({_NAMES})\b( as \w+)?")


def _from_line(m: re.Match[str]) -> str:
    """``from kvguardian import _faults`` -> ``from kvguardian.core import faults as _faults``."""
    parent, _, leaf = MOVED[m.group(2)].rpartition(".")
    alias = m.group(3) or ("" if leaf == m.group(2) else f" as {m.group(2)}")
    return f"{m.group(1)}from kvguardian.{parent} import {leaf}{alias}"


def rewrite_text(text: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        if "getLogger" not in line and KEEP not in line:
            line = _FROM.sub(_from_line, line)
            line = _TESTS.sub(lambda m: f"tests/{m.group(1)}/{_TEST_DIRS[m.group(2)]}", line)
            line = _DOTTED.sub(lambda m: "kvguardian." + MOVED[m.group(1)], line)
            line = _PATH.sub(lambda m: "kvguardian/" + MOVED[m.group(1)].replace(".", "/"), line)
        out.append(line)
    return "".join(out)


def files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                      and not any(part.startswith(".") for part in p.relative_to(path).parts)]
        elif path.is_file():
            found.append(path)
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    changed = 0
    for path in files(argv):
        if path.name in SELF:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite_text(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed += 1
    print(f"rewrote {changed} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

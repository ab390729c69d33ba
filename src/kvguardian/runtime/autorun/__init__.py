"""`kv-guardian run`: audit an unmodified Python program. `child` runs inside the program (loaded by the
``boot/sitecustomize.py`` that the parent puts on PYTHONPATH); `merge` turns the child reports into one."""

from __future__ import annotations

from pathlib import Path

__all__ = ["BOOT_DIR", "ENV_DIR", "ENV_OPTIONS"]

BOOT_DIR = Path(__file__).resolve().parent / "boot"
ENV_DIR = "KVG_RUN_DIR"  # where each audited process writes report-<pid>.json
ENV_OPTIONS = "KVG_RUN_OPTIONS"  # JSON: guard options

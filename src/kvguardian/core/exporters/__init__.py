"""Exporters: the Prometheus collector, the ways to serve it, and the catalog of every metric kv-guardian exports.

`catalog` is pure data (importable without prometheus_client); `prometheus` and `server` import
prometheus_client when used (the ``prometheus`` extra).
"""

from __future__ import annotations

__all__: list[str] = []

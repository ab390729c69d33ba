"""Black-box probes of servers we cannot look inside: does a deployment share its prefix cache across
tenants (`cache_sharing`), decided by an anytime-valid sequential test (`sequential`) over an
OpenAI-compatible client (`client`). Probe only systems you are authorised to test."""

from __future__ import annotations

__all__: list[str] = []

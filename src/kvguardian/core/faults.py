"""Fail-open plumbing: every hook site is named here, and tests can inject a fault at any of them.

An exception inside instrumentation never reaches the model: `FailOpen.handle` counts it in the ledger,
logs one warning line once per site (the traceback at debug level) to the ``kvguardian`` logger, and
returns. ``Guard(strict=True)`` raises `InstrumentationError` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvguardian.core.errors import InstrumentationError

__all__ = ["FAULTS", "SITES", "FailOpen", "InjectedFault", "maybe_fail"]

log = logging.getLogger("kvguardian")

#: Every place where kv-guardian code runs inside the user's model or program.
SITES = (
    "cache.update",  # after transformers' Cache.update: observe the layer's K/V storages
    "forward.pre",  # model forward pre-hook: mark the guard active
    "forward.post",  # model forward hook: unmark it
    "generate.enter",  # generate() wrapper: open an implicit request
    "generate.exit",  # generate() wrapper: close it
    "request.enter",  # guard.request() context: begin
    "request.exit",  # guard.request() context: end
    "track",  # guard.track() for custom models
    "release",  # the weakref callback when a storage is freed
)

#: Sites where tests inject a fault. Empty in production: the check is one falsy-set test.
FAULTS: set[str] = set()


class InjectedFault(RuntimeError):
    """Raised by `maybe_fail` at a site named in `FAULTS` (tests only)."""


def maybe_fail(site: str) -> None:
    if FAULTS and site in FAULTS:
        raise InjectedFault(f"injected fault at {site}")


class FailOpen:
    """Counts, logs once, and swallows instrumentation errors (or raises them in strict mode)."""

    def __init__(self, count: Callable[[str], int], *, strict: bool) -> None:
        self._count = count
        self.strict = strict
        self._logged: set[str] = set()

    def handle(self, site: str, exc: BaseException) -> None:
        self._count(site)
        if self.strict:
            raise InstrumentationError(f"kv-guardian hook {site!r} failed: {exc!r}") from exc
        if site not in self._logged:
            self._logged.add(site)
            log.warning(
                "kv-guardian: instrumentation error at %s (%s: %s); the model is unaffected, this site fails open "
                "and further errors here are only counted",
                site, type(exc).__name__, exc,
            )
            log.debug("kv-guardian: traceback of the instrumentation error at %s", site, exc_info=exc)

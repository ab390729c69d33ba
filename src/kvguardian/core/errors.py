"""The one errors module: a base exception, errors split by fault, and a CLI error with an exit code.

Caller mistakes are `UsageError` (a ``ValueError``): the message names the object, the numbers and the fix.
Internal corruption is `InternalError` (a ``RuntimeError``): it says it is a bug and where.
The CLI prints ``str(error)`` as one line and returns ``error.exit_code``; it never shows a traceback for these.
"""

from __future__ import annotations

__all__ = [
    "EXIT_ENVIRONMENT",
    "EXIT_FINDINGS",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_USAGE",
    "DependencyMissing",
    "InstrumentationError",
    "InternalError",
    "KVGuardianError",
    "UsageError",
]

#: Exit codes shared by every command.
EXIT_OK = 0  # nothing at or above the --fail-on severity
EXIT_FINDINGS = 1  # findings reached the --fail-on severity
EXIT_USAGE = 2  # a user mistake: bad flag, bad file, bad URL
EXIT_ENVIRONMENT = 3  # something the command needs is missing: a package, a service, a port
EXIT_INTERNAL = 70  # a bug in kv-guardian (EX_SOFTWARE)


class KVGuardianError(Exception):
    """Base class of every error kv-guardian raises on purpose."""

    exit_code: int = EXIT_INTERNAL


class UsageError(KVGuardianError, ValueError):
    """The caller asked for something that cannot work; the message says what, where, and the fix."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class DependencyMissing(KVGuardianError, ImportError):
    """An optional dependency (an extra) is not installed."""

    exit_code = EXIT_ENVIRONMENT

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"this needs the Python package {module!r}, which is not installed; "
            f"fix: pip install 'kv-guardian[{extra}]'"
        )
        self.module = module
        self.extra = extra


class InternalError(KVGuardianError, RuntimeError):
    """kv-guardian's own state is inconsistent: this is a bug in kv-guardian, and the message says where."""

    exit_code = EXIT_INTERNAL


class InstrumentationError(KVGuardianError, RuntimeError):
    """Raised only by ``Guard(strict=True)`` when a hook failed; a normal guard counts and logs instead."""

    exit_code = EXIT_INTERNAL


def require(module: str, extra: str) -> object:
    """Import an optional dependency or raise `DependencyMissing` naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyMissing(module, extra) from exc

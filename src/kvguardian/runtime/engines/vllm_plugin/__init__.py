"""The in-process audit of vLLM's own KV cache manager, as a vLLM general plugin.

vLLM loads `register` from the ``vllm.general_plugins`` entry point in each of its processes; it does nothing
unless ``KVG_VLLM_AUDIT=1`` (``kv-guardian run`` sets it). Enabled, it hooks the engine core's scheduler
(`hooks`), checks it (`audit`) and reports (`sink`); ``KVG_VLLM_AUDIT_REPORT``/``_PORT``/``_HOST``/``_INTERVAL``
configure it. It knows vLLM 0.32's v1 core; elsewhere it refuses with one line and vLLM runs unchanged
(fail-open). Settings table: docs/design/engines.md.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENV", "KNOWN_VERSIONS", "register"]

ENV = "KVG_VLLM_AUDIT"
_REFUSED = "KVG_VLLM_AUDIT_REFUSED"  # set once the refusal line is printed, so child processes stay quiet
KNOWN_VERSIONS = ("0.32.",)  # version prefixes whose v1 core internals the hooks were written against

_state: dict[str, Any] = {"patched": False, "audits": []}


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def say(line: str) -> None:
    from kvguardian.runtime.engines.vllm_plugin.hooks import say as _print

    _print(line)


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Never raises: a failure is one line and vLLM runs as usual."""
    if not enabled() or _state["patched"]:
        return
    try:
        _register()
    except Exception as exc:
        _refuse(f"could not hook vLLM ({type(exc).__name__}: {exc})")


def _register() -> None:
    import vllm

    version = str(getattr(vllm, "__version__", "?"))
    if not version.startswith(KNOWN_VERSIONS):
        _refuse(f"vLLM {version} is not a version whose KV cache manager kv-guardian knows "
                f"(known: {', '.join(v + 'x' for v in KNOWN_VERSIONS)})")
        return
    from vllm.config.scheduler import SchedulerConfig

    orig = SchedulerConfig.get_scheduler_cls
    if getattr(orig, "__kvguardian_wrapped__", False):
        return

    def get_scheduler_cls(self: Any) -> Any:
        cls = orig(self)
        try:
            _patch_scheduler_class(cls, version)
        except Exception as exc:
            _refuse(f"could not hook the scheduler class {getattr(cls, '__name__', cls)!r} ({exc})")
        return cls

    get_scheduler_cls.__kvguardian_wrapped__ = True  # type: ignore[attr-defined]
    SchedulerConfig.get_scheduler_cls = get_scheduler_cls  # type: ignore[method-assign]
    _state["patched"] = True


def _patch_scheduler_class(cls: Any, version: str) -> None:
    if cls.__dict__.get("_kvg_audited_init"):
        return
    init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self) is cls:  # a subclass's own __init__ chain attaches once, at the end
            attach(self, version)

    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    cls.__init__ = __init__
    cls._kvg_audited_init = True


def attach(scheduler: Any, version: str = "?") -> Any:
    """Audit this scheduler (vLLM has built it). Returns the `AuditedScheduler`, or None when refused."""
    try:
        from kvguardian.runtime.engines.vllm_plugin.hooks import install, missing_internals

        missing = missing_internals(scheduler)
        if missing:
            _refuse(f"vLLM {version}'s scheduler lacks what the audit reads ({', '.join(missing[:6])})")
            return None
        interval = _float_env("KVG_VLLM_AUDIT_INTERVAL", 1.0)
        owner = install(scheduler, min_interval=interval)
        _start_sink(owner, scheduler, version)
        _state["audits"].append(owner)
        return owner
    except Exception as exc:
        _refuse(f"could not attach to vLLM's scheduler ({type(exc).__name__}: {exc})")
        return None


def _start_sink(owner: Any, scheduler: Any, version: str) -> None:
    from kvguardian.runtime.autorun import ENV_DIR
    from kvguardian.runtime.engines.vllm_plugin.sink import AuditSink

    rank = 0
    try:
        rank = int(scheduler.vllm_config.parallel_config.data_parallel_index or 0)
    except (AttributeError, TypeError, ValueError):
        pass
    port_text = os.environ.get("KVG_VLLM_AUDIT_PORT", "").strip()
    port = int(port_text) + rank if port_text.isdigit() else None
    sink = AuditSink(owner, report_path=os.environ.get("KVG_VLLM_AUDIT_REPORT") or None,
                     run_dir=os.environ.get(ENV_DIR) or None, port=port,
                     host=os.environ.get("KVG_VLLM_AUDIT_HOST", "127.0.0.1"),
                     label={"vllm_version": version, "data_parallel_rank": rank})
    owner.sink = sink
    where = [w for w in (sink.report_path and f"report {sink.report_path}",
                         sink.exporter is not None and f"metrics {sink.exporter.url}") if w]
    say(f"auditing vLLM {version}'s KV cache manager in pid {os.getpid()}"
         + (f" ({', '.join(where)})" if where else ""))


def _float_env(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def _refuse(why: str) -> None:
    if os.environ.get(_REFUSED):
        return
    os.environ[_REFUSED] = "1"
    say(f"the in-process audit is off: {why}; vLLM runs unaudited (kv-guardian watch vllm still works)")


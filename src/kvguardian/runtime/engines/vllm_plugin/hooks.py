"""Where the audit hooks into vLLM 0.32's engine core, and the fail-open wrappers that do it.

Wrapping ``SchedulerConfig.get_scheduler_cls`` attaches a `VllmPoolAudit` to the scheduler the engine core
builds; that instance's methods (and its block pool's) are then wrapped, so nothing else in the process
changes. The entry points that change KV state run under the audit's lock. vLLM's call always runs with its
own arguments and result; errors in our part are counted, logged once, and switch the audit off after
``_MAX_ERRORS``. The wrapped methods: docs/design/engines.md.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kvguardian.core.findings import Finding, Severity
from kvguardian.runtime.engines.vllm_plugin.audit import VllmPoolAudit

__all__ = ["ENTRY_POINTS", "REQUIRED", "AuditedScheduler", "install", "missing_internals", "say"]

log = logging.getLogger("kvguardian")

_MAX_ERRORS = 20

#: The internals the hooks and checks read, as (path from the scheduler, attribute); any missing one means a
#: vLLM whose KV cache manager this kv-guardian does not know, and the audit refuses to enable itself.
REQUIRED: tuple[tuple[str, str], ...] = (
    ("", "_free_blocks"), ("", "update_from_output"), ("", "requests"), ("", "kv_cache_manager"),
    ("kv_cache_manager", "get_computed_blocks"), ("kv_cache_manager", "block_pool"),
    ("kv_cache_manager", "coordinator"), ("kv_cache_manager.coordinator", "single_type_managers"),
    ("kv_cache_manager.block_pool", "blocks"), ("kv_cache_manager.block_pool", "free_blocks"),
    ("kv_cache_manager.block_pool", "cache_full_blocks"), ("kv_cache_manager.block_pool", "free_block_queue"),
    ("kv_cache_manager.block_pool", "get_new_blocks"), ("kv_cache_manager.block_pool", "enable_caching"),
    ("kv_cache_manager.block_pool", "reset_prefix_cache"),
    ("kv_cache_manager.block_pool.free_block_queue", "num_free_blocks"),
    ("kv_cache_manager.block_pool.free_block_queue", "fake_free_list_head"),
    ("kv_cache_manager.block_pool.free_block_queue", "fake_free_list_tail"),
)
_BLOCK_FIELDS = ("block_id", "ref_cnt", "block_hash", "_block_hash", "is_null", "pool", "next_free_block")


def _resolve(root: object, path: str) -> Any:
    obj = root
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def missing_internals(scheduler: Any) -> list[str]:
    """The vLLM internals the audit needs that this scheduler lacks (empty: the audit can run)."""
    missing = []
    for path, name in REQUIRED:
        try:
            if not hasattr(_resolve(scheduler, path), name):
                missing.append(f"{path + '.' if path else ''}{name}")
        except AttributeError:
            missing.append(path)
    try:
        block = scheduler.kv_cache_manager.block_pool.blocks[0]
        missing += [f"KVCacheBlock.{f}" for f in _BLOCK_FIELDS if not hasattr(block, f)]
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        missing += [f"{type(m).__name__}.req_to_blocks" for m in managers if not hasattr(m, "req_to_blocks")]
    except (AttributeError, IndexError, TypeError):
        missing.append("block_pool.blocks[0]")
    return sorted(set(missing))


class AuditedScheduler:
    """The audit of one scheduler plus the fail-open plumbing its wrappers share."""

    def __init__(self, scheduler: Any, *, min_interval: float = 1.0, duty: float = 0.005) -> None:
        self.audit = VllmPoolAudit(scheduler, min_interval=min_interval, duty=duty)
        self.enabled = True
        self.wrapper_errors = 0
        self.first_error: str | None = None
        self.changes = 0  # bumped when findings may have changed (the report writer watches it)
        self.lock = threading.RLock()  # held by the scheduler's entry points, and by an audit from another thread
        self.last_activity = time.monotonic()  # the last time the engine thread entered the scheduler

    def guarded(self, site: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)``; an exception is contained (fail-open), never raised into vLLM."""
        if not self.enabled:
            return
        try:
            fn(*args)
        except Exception as exc:
            self._contain(site, exc)

    def quiet_audit(self, quiet: float = 0.5) -> bool:
        """From another thread: audit if something changed and the engine has not entered the scheduler for
        ``quiet`` seconds (it waits for work). Never blocks: if the engine holds the lock, try again later."""
        if not self.enabled or not self.audit.dirty or time.monotonic() - self.last_activity < quiet:
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            self.audit.audit(time.monotonic())
        except Exception as exc:
            self._contain("quiet audit", exc)
            return False
        finally:
            self.lock.release()
        self.changes += 1
        return True

    def _contain(self, site: str, exc: BaseException) -> None:
        self.wrapper_errors += 1
        if self.first_error is None:
            self.first_error = f"{site}: {type(exc).__name__}: {exc}"
            log.warning("kv-guardian vLLM audit: a check failed at %s (%s); vLLM is unaffected", site, exc)
            log.debug("kv-guardian vLLM audit failure", exc_info=exc)
            self.audit.board.raise_(("KVG100", "vllm-audit"), Finding(
                id="KVG100", severity=Severity.WARNING,
                message=f"the vLLM audit's check at {site} failed ({type(exc).__name__}); counts may be incomplete",
                evidence={"site": site, "error": f"{type(exc).__name__}: {exc}"[:300]},
            ), time.monotonic())
        if self.wrapper_errors >= _MAX_ERRORS:
            self.enabled = False
        self.changes += 1


Check = Callable[[Any, "_Args"], None]


class _Args:
    """A call's arguments, read by position or by name (vLLM passes some by keyword)."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs

    def get(self, index: int, name: str) -> Any:
        return self.args[index] if index < len(self.args) else self.kwargs[name]


def _after(owner: AuditedScheduler, site: str, target: object, name: str, check: Check) -> None:
    """Wrap ``target.name`` (on the instance): vLLM's call, then ``check(result, args)`` guarded."""
    orig = getattr(target, name)

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = orig(*args, **kwargs)
        if owner.enabled:
            owner.guarded(site, check, result, _Args(args, kwargs))
        return result

    setattr(target, name, wrapper)


#: The scheduler's entry points that change KV state; each runs holding the audit's lock (uncontended: cheap).
ENTRY_POINTS = ("schedule", "update_from_output", "add_request", "finish_requests", "reset_prefix_cache")


def _locked(owner: AuditedScheduler, target: object, name: str) -> None:
    orig = getattr(target, name)
    lock = owner.lock

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with lock:
            owner.last_activity = time.monotonic()
            return orig(*args, **kwargs)

    setattr(target, name, wrapper)


def install(scheduler: Any, *, min_interval: float = 1.0, duty: float = 0.005) -> AuditedScheduler:
    """Attach an audit to a constructed vLLM 0.32 scheduler (call `missing_internals` first)."""
    owner = AuditedScheduler(scheduler, min_interval=min_interval, duty=duty)
    audit = owner.audit
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    now = time.monotonic

    def freed(_result: object, a: _Args) -> None:
        audit.after_free_request(a.get(0, "request"), now())
        owner.changes += 1

    def stepped(_result: object, _a: _Args) -> None:
        if audit.maybe_audit(now()):
            owner.changes += 1

    def looked_up(result: object, a: _Args) -> None:
        audit.after_lookup(a.get(0, "request"), result, now())

    def cached(_result: object, a: _Args) -> None:
        audit.after_cache_blocks(a.get(0, "request"), a.get(1, "blocks"), a.get(2, "num_cached_blocks"),
                                 a.get(3, "num_full_blocks"))

    def reset(result: object, _a: _Args) -> None:
        if result:
            audit.after_reset()

    _after(owner, "scheduler._free_blocks", scheduler, "_free_blocks", freed)
    _after(owner, "scheduler.update_from_output", scheduler, "update_from_output", stepped)
    _after(owner, "kv_cache_manager.get_computed_blocks", kvm, "get_computed_blocks", looked_up)
    _after(owner, "block_pool.cache_full_blocks", pool, "cache_full_blocks", cached)
    _after(owner, "block_pool.reset_prefix_cache", pool, "reset_prefix_cache", reset)
    _wrap_free_blocks(owner, pool)
    _wrap_new_blocks(owner, pool)
    for name in ENTRY_POINTS:
        if hasattr(scheduler, name):
            _locked(owner, scheduler, name)
    return owner


def _wrap_new_blocks(owner: AuditedScheduler, pool: Any) -> None:
    orig = pool.get_new_blocks
    audit = owner.audit

    @functools.wraps(orig)
    def get_new_blocks(num_blocks: int, *args: Any, **kwargs: Any) -> Any:
        if owner.enabled and pool.enable_caching:
            owner.guarded("block_pool.get_new_blocks", audit.before_new_blocks, pool, num_blocks)
        return orig(num_blocks, *args, **kwargs)

    pool.get_new_blocks = get_new_blocks


def _wrap_free_blocks(owner: AuditedScheduler, pool: Any) -> None:
    orig = pool.free_blocks
    audit = owner.audit

    @functools.wraps(orig)
    def free_blocks(ordered_blocks: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
        if not owner.enabled:
            return orig(ordered_blocks, *args, **kwargs)
        blocks = list(ordered_blocks)  # what vLLM would iterate, once
        owner.guarded("block_pool.free_blocks", audit.before_free_blocks, pool, blocks, time.monotonic())
        return orig(blocks, *args, **kwargs)

    pool.free_blocks = free_blocks


def say(line: str) -> None:
    """One line on stderr, prefixed; never raises (a closed stderr loses the line, not the server)."""
    try:
        sys.stderr.write(f"kv-guardian vLLM audit: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass

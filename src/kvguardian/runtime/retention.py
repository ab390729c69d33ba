"""Is KV that outlived its request a leak, or retention that stays bounded? Decided from evidence.

For each orphaned entry's holder chain, the collections on it (containers, linked structures, per-request
threads) that hold two or more ended requests' KV are judged bounded when they declare a bound, were seen
evicting without growing, or stopped growing; otherwise unbounded. Evidence comes from sampling at
geometrically spaced counts of ended requests (``kv-guardian run``, the pytest plugin), and each verdict
states it. The rules and their reasons: docs/design/retention.md.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvguardian.core.ledger import EntryState, LedgerSnapshot, Record, RequestInfo
from kvguardian.runtime.sources.host import chain_hints

if TYPE_CHECKING:
    from kvguardian.core.tensors.holders import HolderChain
    from kvguardian.runtime.sources.host import SourceHost

__all__ = ["RetentionMonitor", "Verdict", "group_owners", "representative_chains"]

_MIN_PLATEAU = 8  # ended requests over which a size must stay flat to count as "stopped growing"
_SAMPLE_SEEDS = 24  # orphaned requests whose chains one sample searches
_SAMPLE_OBJECTS = 5_000  # the object budget of one sample's search
_SAMPLE_SECONDS = 5.0  # and its wall-clock cap: a sample is evidence, not the exit audit's search
_MAX_MEMBERS = 4_096  # members remembered over all collections
_MAX_COLLECTIONS = 256
_MAX_SIZES = 48  # size samples kept per collection


@dataclass(frozen=True)
class Verdict:
    """How the KV of one ended request is held, and the evidence."""

    bounded: bool
    why: str  # single-reference, declared-bound, observed-eviction, stopped-growing, unbounded-collection,
    # held-from-c, search-stopped
    collection: str | None  # label of the deciding collection, when there is one
    owners_in_collection: int
    detail: str
    severity: str = "info"  # "info" (bounded), "warning" (no root found), "error" (unbounded)
    evidence: Mapping[str, Any] = field(default_factory=dict)  # sizes over time, evictions, bound

    def to_dict(self) -> dict[str, Any]:
        return {"bounded": self.bounded, "why": self.why, "collection": self.collection,
                "owners_in_collection": self.owners_in_collection, "detail": self.detail,
                "severity": self.severity, "evidence": dict(self.evidence)}


@dataclass
class _History:
    """What samples saw of one collection (known by id and type only: no reference is kept)."""

    type_name: str
    sizes: list[tuple[int, int, int]] = field(default_factory=list)  # (ended requests then, size, members)
    members: dict[str, Any] = field(default_factory=dict)  # owner -> weak ref to its cache (or None)
    evictions: int = 0
    size_at_first_eviction: int | None = None
    first_eviction_after: int | None = None  # ended requests when the first eviction was seen

    def add_size(self, ended: int, size: int, members: int) -> None:
        if self.sizes and self.sizes[-1][0] == ended:
            _, s, m = self.sizes[-1]
            self.sizes[-1] = (ended, max(size, s), max(members, m))
        else:
            self.sizes.append((ended, size, members))
        if len(self.sizes) > _MAX_SIZES:
            del self.sizes[1]  # keep the first and the latest ones

    def max_size(self) -> int:
        return max((s for _, s, _ in self.sizes), default=0)

    def max_members(self) -> int:
        return max((m for _, _, m in self.sizes), default=0)

    def max_size_evicting(self) -> int:
        """The largest size sampled since it was first seen evicting (0 when no sample was taken since)."""
        since = self.first_eviction_after
        return max((s for e, s, _ in self.sizes if since is not None and e >= since), default=0)


def representative_chains(records: list[Record], chains: Mapping[Any, HolderChain]) -> dict[str, HolderChain]:
    """Per ended owner, the chain the KVG102 detector shows (its first complete one, else its first)."""
    by_owner: dict[str, list[Record]] = {}
    for r in records:
        if r.state is EntryState.ORPHANED and r.request_id is not None:
            by_owner.setdefault(r.request_id, []).append(r)
    out = {}
    for rid, recs in by_owner.items():
        recs.sort(key=lambda r: (r.layer if r.layer is not None else -1, r.kind, r.entry_id))
        best = None
        for r in recs:
            c = chains.get(r.key)
            if c is not None and (best is None or (c.complete and not best.complete)):
                best = c
                if c.complete:
                    break
        if best is not None:
            out[rid] = best
    return out


def _collections_of(chains: Mapping[Any, HolderChain]) -> dict[Any, list[int]]:
    """Owner -> the collection nodes on its chain, root-most first. A linked structure's head found on any
    chain is a collection on every chain through it (its newest member's chain has no run of its own)."""
    linked = {n for ch in chains.values() for n in ch.linked}
    return {rid: [n for n in ch.nodes if n in linked or n in ch.containers] for rid, ch in chains.items()}


def group_owners(chains: Mapping[Any, HolderChain]) -> dict[Any, int | None]:
    """Owner -> id of its collection: the deepest collection on its chain shared with another owner."""
    cols = _collections_of(chains)
    count = Counter(n for ns in cols.values() for n in set(ns))
    return {rid: next((n for n in reversed(ns) if count[n] >= 2), None) for rid, ns in cols.items()}


def _identity(ch: HolderChain, nid: int) -> tuple[Any, ...]:
    """How samples and the final check recognise one collection without holding it: its id and type, and the
    module or class global it is under (so a dead collection's id reused by a new one does not inherit its
    history). A linked structure's head moves as it grows: it is known by its global and its link."""
    idx = ch.nodes.index(nid)
    anchor = ch.steps[0] if ch.root in ("module", "class") else ""
    how = ch.linked.get(nid)
    if how and anchor:
        return ("linked", anchor, how, idx)
    return (nid, ch.node_steps[idx], anchor)


def _size_of(ch: HolderChain, nid: int, members: int) -> int:
    return ch.sizes.get(nid, members)


def _label(ch: HolderChain, nid: int, linked: Mapping[int, str]) -> str:
    idx = ch.nodes.index(nid)
    how = linked.get(nid)
    kind = f"linked {how}" if how else ch.node_steps[idx]
    return f"{kind} under {ch.steps[0]}"


@dataclass(frozen=True)
class _Judgement:
    bounded: bool
    growing: bool
    why: str
    detail: str
    evidence: dict[str, Any]


class RetentionMonitor:
    """Judges orphaned KV bounded or not; optionally samples holder chains at request ends (it reaches the
    ledger and the sources' caches through ``host``)."""

    def __init__(self, host: SourceHost, *, sampling: bool = False, max_owners: int = _SAMPLE_SEEDS,
                 max_seconds: float = _SAMPLE_SECONDS) -> None:
        self._host = weakref.ref(host)
        self.sampling = sampling
        self.max_seconds = min(max_seconds, _SAMPLE_SECONDS)  # one sample's search, wall clock
        self._sampling_now = threading.Lock()  # requests ending in several threads: one samples, the others go on
        self.max_owners = max_owners
        self._ended = 0  # requests ended so far
        self._next_threshold = 2
        self._evicting_unsampled = False  # a collection was first seen evicting since the last sample
        self._extra_allowed = True
        self._history: OrderedDict[tuple[Any, ...], _History] = OrderedDict()
        # per sample: (ended requests then, function -> how many threads had it on their stack)
        self._threads_seen: list[tuple[int, Counter[str]]] = []
        self.samples = 0
        self.sample_seconds = 0.0
        self.sample_cpu_seconds = 0.0  # process CPU time meanwhile (steadier than wall time on a busy machine)

    # ------------------------------------------------------------------ sampling
    def after_request_end(self, info: RequestInfo) -> None:
        self._ended += 1
        if not self.sampling:
            return
        host = self._host()
        if host is None:
            return
        if not self._sampling_now.acquire(blocking=False):  # another thread samples: it sees this request too
            return
        try:
            self._after_request_end(host)
        finally:
            self._sampling_now.release()

    def _after_request_end(self, host: SourceHost) -> None:
        self.note_evictions()
        due = self._ended >= self._next_threshold
        if not due and not (self._evicting_unsampled and self._extra_allowed):
            return
        if due:
            self._next_threshold = self._ended * 2
        self._extra_allowed = due  # at most one extra sample between two scheduled ones
        self._evicting_unsampled = False
        t0, c0 = time.monotonic(), time.process_time()
        try:
            self._sample(host)
        finally:
            self.samples += 1
            self.sample_seconds += time.monotonic() - t0
            self.sample_cpu_seconds += time.process_time() - c0

    def _orphan_seeds(self, host: SourceHost) -> tuple[dict[Any, Any], dict[Any, str], dict[str, Any], list[Any]]:
        """Search starts for the orphaned requests: storage key -> its cache (or None for KV without a known
        cache), key -> owner, owner -> weak ref to its cache, and the search hints (what they returned)."""
        snap = host.ledger.snapshot()
        first: dict[str, Record] = {}
        for rec in snap.records:
            rid = rec.request_id
            if rec.state is EntryState.ORPHANED and rid is not None and rid not in first:
                first[rid] = rec
        chosen = list(first.values())
        if len(chosen) > self.max_owners:  # the latest ones, and some spread over the older ones
            older, recent = chosen[: -self.max_owners * 2 // 3], chosen[-self.max_owners * 2 // 3:]
            step = max(1, len(older) // (self.max_owners - len(recent)))
            chosen = older[::step][: self.max_owners - len(recent)] + recent
        caches: dict[Any, Any] = {}
        for source in host.sources():  # the live caches the sources know (the transformers source's)
            found, _ = source.chain_seeds(chosen)
            caches.update(found)
        hints = chain_hints(host.sources(), chosen)
        seeds = {r.key: caches.get(r.key) for r in chosen}
        refs = {r.request_id: _weak(caches.get(r.key)) for r in chosen if r.request_id is not None}
        return seeds, {r.key: str(r.request_id) for r in chosen}, refs, hints

    def _sample(self, host: SourceHost) -> None:
        if "torch" not in sys.modules:
            return
        from kvguardian.core.tensors.holders import find_holder_chains

        self._threads_seen.append((self._ended, _thread_functions()))
        if len(self._threads_seen) > _MAX_SIZES:
            del self._threads_seen[1]  # keep the first and the latest ones

        seeds, owner_of, refs, hints = self._orphan_seeds(host)
        if len(seeds) < 2:
            return
        cached = {k: o for k, o in seeds.items() if o is not None}
        loose = [k for k, o in seeds.items() if o is None]
        seeds.clear()
        chains = find_holder_chains(loose, seeds=cached, exclude=host.auditor_objects(), hints=hints, collect=False,
                                    all_threads=False, light=True, max_objects=_SAMPLE_OBJECTS, redact=True,
                                    max_seconds=self.max_seconds)
        cached.clear()
        hints.clear()
        by_owner = {owner_of[k]: ch for k, ch in chains.items() if k in owner_of}
        cols = _collections_of(by_owner)
        count = Counter(n for ns in cols.values() for n in set(ns))
        for rid, nodes in cols.items():
            ch = by_owner[rid]
            for nid in nodes:
                self._see(_identity(ch, nid), (_size_of(ch, nid, count[nid]), count[nid]), rid, refs.get(rid))

    def _see(self, key: tuple[Any, ...], size: tuple[int, int], rid: str, ref: weakref.ref[Any] | None) -> None:
        h = self._history.get(key)
        if h is None:
            h = self._history[key] = _History(str(key[1]))
            while len(self._history) > _MAX_COLLECTIONS:
                self._history.popitem(last=False)
        self._history.move_to_end(key)
        h.add_size(self._ended, *size)
        if rid not in h.members and sum(len(x.members) for x in self._history.values()) < _MAX_MEMBERS:
            h.members[rid] = ref

    def note_evictions(self) -> None:
        """Members sampled into a collection whose KV has since been freed: the collection evicts."""
        host = self._host()
        if host is None:
            return
        for h in self._history.values():
            for rid, ref in list(h.members.items()):
                info = host.ledger.request(rid)
                if ref is not None:  # its cache freed, or the cache lives on with newer KV (a conversation
                    # continued by a later request: the storages this request owned were replaced)
                    gone = ref() is None or (info is not None and not info.entry_ids)
                else:
                    gone = info is None or not info.entry_ids
                if gone:
                    del h.members[rid]
                    if h.size_at_first_eviction is None:
                        h.size_at_first_eviction = h.max_size()
                        h.first_eviction_after = self._ended
                        # measure its size now it evicts (one extra sample) - when it is a collection of
                        # requests: an object holding one request's KV (its output) says nothing by evicting
                        self._evicting_unsampled |= h.max_members() > 1
                    h.evictions += 1

    # ------------------------------------------------------------------ verdicts
    def classify(self, snapshot: LedgerSnapshot, chains: Mapping[Any, HolderChain]) -> dict[str, Verdict]:
        """A verdict per ended owner whose orphaned KV has a holder chain."""
        self.note_evictions()
        reps = representative_chains(list(snapshot.records), chains)
        cols = _collections_of(reps)
        linked = {n: how for ch in reps.values() for n, how in ch.linked.items()}
        count = Counter(n for ns in cols.values() for n in set(ns))
        ended = max(self._ended, sum(1 for r in snapshot.requests.values() if r.ended is not None))
        latest = set(cols.get(_latest_owner(reps, snapshot), ()))
        judged: dict[int, _Judgement] = {}
        out: dict[str, Verdict] = {}
        for rid, ch in reps.items():
            shared = [n for n in cols[rid] if count[n] >= 2]
            if not shared:
                out[rid] = _unshared(ch)
                continue
            for n in shared:
                if n not in judged:
                    judged[n] = self._judge(ch, n, count[n], ended, in_flight=int(n in latest))
            out[rid] = _decide(ch, shared, judged, count, linked)
        self._judge_thread_groups(reps, out, ended)
        return out

    def _judge_thread_groups(self, reps: Mapping[str, HolderChain], out: dict[str, Verdict], ended: int) -> None:
        """Owners held only by a frame of one function, each in another thread (a thread started per request
        - a ``threading.Timer``, a streaming thread that never finishes - keeping that request's output) are one
        collection: the threads running that function. Its size over time is how many threads had the function
        on their stack at each sample; a fixed pool of workers each keeping its last output stays bounded."""
        groups: dict[str, dict[str, str]] = {}
        for rid, ch in reps.items():
            v = out.get(rid)
            where = _thread_root(ch) if v is not None and v.why == "single-reference" else None
            if where is not None:
                groups.setdefault(where[0], {})[rid] = where[1]
        if not groups:
            return
        now = _thread_functions()
        for fn, owners in groups.items():
            threads = set(owners.values())
            if len(owners) < 2 or len(threads) < 2:
                continue
            size = max(now.get(fn, 0), len(threads))
            sizes = [*((e, c.get(fn, 0), c.get(fn, 0)) for e, c in self._threads_seen), (ended, size, len(owners))]
            ev: dict[str, Any] = {"size": size, "sizes_over_time": [list(p) for p in sizes], "members": len(owners),
                                  "evictions_seen": 0, "ended_requests": ended}
            j = _from_sizes(None, sizes, len(owners), ev)
            label = f"threads running {fn}"
            detail = j.detail.replace("in one collection", f"in {size} threads running {fn}", 1)
            verdict = Verdict(j.bounded, j.why, label, len(owners), detail, "info" if j.bounded else "error",
                              j.evidence)
            for rid in owners:
                out[rid] = verdict

    def _judge(self, ch: HolderChain, nid: int, members: int, ended: int, *, in_flight: int = 0) -> _Judgement:
        """``in_flight``: 1 when the latest request's KV is in the collection. Every sample ran as a request
        ended, before the program could store what it returned; the final size counts that last store, so it
        is compared with the samples without it."""
        idx = ch.nodes.index(nid)
        size = _size_of(ch, nid, members)
        h = self._history.get(_identity(ch, nid))
        sizes = [*(h.sizes if h else []), (ended, size, members)]
        ev: dict[str, Any] = {"size": size, "sizes_over_time": [list(p) for p in sizes], "members": members,
                              "evictions_seen": h.evictions if h else 0, "ended_requests": ended}
        bound = next((ch.bounds[n] for n in ch.nodes[: idx + 1] if n in ch.bounds), None)
        if bound is not None:
            ev["declared_bound"] = bound
            limit = _bound_limit(bound)
            if limit is None or size <= limit:
                return _Judgement(True, False, "declared-bound", f"the collection declares {bound}", ev)
            # a hand-written LRU that declares a bound it does not keep: judged by its sizes, like any other
            ev["declared_bound_exceeded"] = True
        return _from_sizes(h, sizes, members, ev, in_flight)

    def summary(self) -> dict[str, Any]:
        return {"sampling": self.sampling, "samples": self.samples,
                "sample_seconds": round(self.sample_seconds, 3),
                "sample_cpu_seconds": round(self.sample_cpu_seconds, 3),
                "collections_seen": len(self._history),
                "collections_seen_evicting": sum(1 for h in self._history.values() if h.evictions)}


def _bound_limit(bound: str) -> int | None:
    """The number of a declared bound (``PrefixLRU.maxsize=4`` -> 4)."""
    tail = bound.rpartition("=")[2]
    return int(tail) if tail.isdigit() else None


def _thread_root(ch: HolderChain) -> tuple[str, str] | None:
    """(function, thread) of a chain rooted in a frame of a thread other than the main one."""
    if ch.root != "frame" or not ch.steps:
        return None
    from kvguardian.core.tensors.holders.roots import thread_frame_root

    return thread_frame_root(ch.steps[0])


def _thread_functions() -> Counter[str]:
    """Function -> how many threads have it on their stack now (this thread too: a sample runs in the thread
    whose request just ended)."""
    from kvguardian.core.tensors.holders.roots import functions_on_stacks

    return functions_on_stacks()


def _weak(obj: object) -> weakref.ref[Any] | None:
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _from_sizes(h: _History | None, sizes: list[tuple[int, int, int]], members: int, ev: dict[str, Any],
                in_flight: int = 0) -> _Judgement:
    """Bounded or growing, from what was seen over time (the last entry is now): the collection's length and
    how many ended requests' KV it held, and evictions. An evicting collection is bounded when it is no larger
    now than it was when it began to evict (or at any sample since, or early in the run)."""
    ended, size, _ = sizes[-1]
    early = [p for p in sizes[:-1] if ended - p[0] >= max(_MIN_PLATEAU, ended / 4)]
    early_size = max((p[1] for p in early), default=None)
    early_members = max((p[2] for p in early), default=None)
    was_size, was_members = size - in_flight, members - in_flight  # like for like with the samples
    if h is not None and h.evictions and was_size <= max(h.size_at_first_eviction or 0, early_size or 0,
                                                         h.max_size_evicting()):
        return _Judgement(True, False, "observed-eviction",
                          f"an evicting cache: {h.evictions} earlier request(s)' KV freed while the program ran, "
                          f"size {size} at the end; {_trend(sizes)}", ev)
    growing = early_size is not None and (was_size > early_size or was_members > (early_members or 0))
    if early and not growing:
        return _Judgement(True, False, "stopped-growing", f"its size stopped growing, none evicted; {_trend(sizes)}",
                          ev)
    evicted = f"{h.evictions} evicted but it kept growing" if h is not None and h.evictions else "none seen evicted"
    what = f"it only grew; {_trend(sizes)}" if growing else "no earlier sample saw it stay bounded"
    return _Judgement(False, growing, "unbounded-collection",
                      f"{members} ended requests' KV in one collection, {evicted}; {what}", ev)


def _latest_owner(reps: Mapping[str, HolderChain], snapshot: LedgerSnapshot) -> str | None:
    """The owner among ``reps`` that ended last."""
    def ended(rid: str) -> float:
        info = snapshot.requests.get(rid)
        return info.ended if info is not None and info.ended is not None else float("-inf")
    return max(reps, key=ended, default=None)


def _trend(sizes: list[tuple[int, int, int]]) -> str:
    pts = ", ".join(f"{s} ({m} ended requests' KV) after {e}" for e, s, m in sizes[-5:])
    return f"size after N ended requests: {pts}"


def _unshared(ch: HolderChain) -> Verdict:
    if ch.complete:
        return Verdict(True, "single-reference", None, 1,
                       f"held by single references from {ch.steps[0]}, not by a collection that grows with "
                       "requests")
    why = "search-stopped" if ch.stopped else "held-from-c"
    return Verdict(False, why, None, 1, f"no Python root found ({ch.notes[0] if ch.notes else why})",
                   severity="warning")


def _decide(ch: HolderChain, shared: list[int], judged: dict[int, _Judgement], count: Counter[int],
            linked: Mapping[int, str]) -> Verdict:
    """The innermost shared collection decides, unless one further out keeps growing."""
    inner = shared[-1]
    j = judged[inner]
    if j.bounded:
        outer = next((n for n in reversed(shared[:-1]) if judged[n].growing), None)
        if outer is not None:
            o = judged[outer]
            return Verdict(False, "unbounded-collection", _label(ch, outer, linked), count[outer],
                           f"bounded collections inside one that grows: {o.detail}", "error", o.evidence)
    severity = "info" if j.bounded else "error"
    return Verdict(j.bounded, j.why, _label(ch, inner, linked), count[inner], j.detail, severity, j.evidence)

"""Is KV that outlived its request a leak, or retention that stays bounded?

`Guard.check` finds, for every orphaned entry (owner ended, not declared retained), its holder chain. Here
the chains of all orphaned owners are compared: the *collection* of an owner is the deepest collection on
its chain (dict, list, set, deque, lru_cache, ...) that also holds the KV of another ended request. Then:

* no shared collection: the KV is held by single references (a variable keeping the last request's output,
  a model attribute): retained but bounded, severity ``info``;
* the collection declares a bound (``lru_cache(maxsize=N)``, ``deque(maxlen=N)``, a ``maxsize``/``capacity``
  attribute): ``info``;
* the collection was *seen evicting*: with sampling on (``kv-guardian run``, the pytest plugin), holder chains
  are sampled at request ends - rate-limited, at geometrically spaced counts of ended owners, within a time
  budget - and a collection whose earlier members' caches were freed while the program ran is an LRU:
  ``info``;
* otherwise the collection keeps growing with requests: an unbounded memo, a session dict, a hook list, a
  list of tracebacks - ``error`` (KVG102), with the holder chain.
"""

from __future__ import annotations

import math
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvguardian.ledger import EntryState, LedgerSnapshot, Record

if TYPE_CHECKING:
    from kvguardian.guard import Guard
    from kvguardian.tensors.holders import HolderChain

__all__ = ["RetentionMonitor", "Verdict", "group_owners", "representative_chains"]


@dataclass(frozen=True)
class Verdict:
    """How the KV of one ended request is held."""

    bounded: bool
    why: str  # "single-reference", "declared-bound", "observed-eviction", "unbounded-collection"
    collection: str | None  # label of the shared collection, when there is one
    owners_in_collection: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"bounded": self.bounded, "why": self.why, "collection": self.collection,
                "owners_in_collection": self.owners_in_collection, "detail": self.detail}


def representative_chains(records: list[Record], chains: Mapping[Any, HolderChain]) -> dict[str, HolderChain]:
    """Per ended owner, the chain the KVG102 detector shows (its first complete one)."""
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
        if best is not None and best.complete:
            out[rid] = best
    return out


def group_owners(chains: Mapping[Any, HolderChain]) -> dict[Any, int | None]:
    """Owner -> id of its collection: the deepest collection on its chain shared with another owner."""
    count: Counter[int] = Counter()
    for ch in chains.values():
        for nid in set(ch.containers):
            count[nid] += 1
    out: dict[Any, int | None] = {}
    for rid, ch in chains.items():
        gid = None
        for nid in reversed(ch.containers):
            if count[nid] >= 2:
                gid = nid
                break
        out[rid] = gid
    return out


class RetentionMonitor:
    """Judges orphaned KV bounded or not; optionally samples holder chains at request ends."""

    def __init__(self, guard: Guard, *, sampling: bool = False, max_owners: int = 64,
                 budget_fraction: float = 0.1, min_budget_s: float = 1.0) -> None:
        self._guard = weakref.ref(guard)
        self.sampling = sampling
        self.max_owners = max_owners
        self.budget_fraction = budget_fraction
        self.min_budget_s = min_budget_s
        self._next_threshold = 2
        self._sampled: OrderedDict[str, tuple[int, Any]] = OrderedDict()  # owner -> (collection id, cache ref)
        self._evicting: dict[int, int] = {}  # collection id -> evictions seen
        self.samples = 0
        self.sample_seconds = 0.0
        self._started = time.monotonic()

    # ------------------------------------------------------------------ sampling
    def after_request_end(self, info: Any) -> None:
        if not self.sampling:
            return
        guard = self._guard()
        if guard is None:
            return
        self.note_evictions()
        led = guard.ledger
        owners = sum(1 for r in list(led._requests.values()) if r.ended is not None and r.entry_ids)
        if owners < self._next_threshold:
            return
        budget = max(self.min_budget_s, self.budget_fraction * (time.monotonic() - self._started))
        if self.sample_seconds >= budget:
            return
        self._next_threshold = max(owners + 1, math.ceil(owners * 1.5))
        t0 = time.monotonic()
        try:
            self._sample(guard, min(1.0, budget - self.sample_seconds))
        finally:
            self.samples += 1
            self.sample_seconds += time.monotonic() - t0

    def _sample(self, guard: Guard, seconds: float) -> None:
        import sys

        if "torch" not in sys.modules:
            return
        from kvguardian.tensors.holders import find_holder_chains

        led = guard.ledger
        hf = guard._hf
        if hf is None:
            return
        refs: dict[str, Any] = {}
        with led._lock:
            led._settle()
            for rec in led._by_id.values():
                rid = rec.request_id
                if rec.state is EntryState.ORPHANED and rid is not None and rid not in refs:
                    slot = rec.slot
                    if isinstance(slot, tuple) and slot and isinstance(slot[0], int):
                        st = hf.caches.get(slot[0])
                        if st is not None:
                            refs[rid] = st.ref
        recent = list(refs.items())[-self.max_owners:]
        seeds = {rid: obj for rid, ref in recent if (obj := ref()) is not None}
        if len(seeds) < 2:
            return
        chains = find_holder_chains((), seeds=seeds, exclude=(guard, led, self, hf), max_seconds=seconds,
                                    redact=True, collect=False)
        seeds.clear()
        by_owner = {rid: ch for rid, ch in chains.items() if ch.complete}
        groups = group_owners(by_owner)
        for rid, gid in groups.items():
            if gid is None:
                continue
            self._sampled[rid] = (gid, refs[rid])
            self._sampled.move_to_end(rid)
        while len(self._sampled) > 4_096:
            self._sampled.popitem(last=False)

    def note_evictions(self) -> None:
        """Members sampled into a collection whose cache has since been freed: the collection evicts."""
        guard = self._guard()
        if guard is None or not self._sampled:
            return
        led = guard.ledger
        for rid, (gid, cref) in list(self._sampled.items()):
            if cref is not None:
                gone = cref() is None
            else:
                info = led.request(rid)
                gone = info is None or not info.entry_ids
            if gone:
                self._evicting[gid] = self._evicting.get(gid, 0) + 1
                del self._sampled[rid]

    # ------------------------------------------------------------------ verdicts
    def classify(self, snapshot: LedgerSnapshot, chains: Mapping[Any, HolderChain]) -> dict[str, Verdict]:
        """A verdict per ended owner whose orphaned KV has a complete holder chain."""
        self.note_evictions()
        reps = representative_chains(list(snapshot.records), chains)
        groups = group_owners(reps)
        members: Counter[int] = Counter(g for g in groups.values() if g is not None)
        out: dict[str, Verdict] = {}
        for rid, ch in reps.items():
            gid = groups[rid]
            if gid is None:
                out[rid] = Verdict(True, "single-reference", None, 1,
                                   f"held by single references from {ch.steps[0]}, not by a collection that "
                                   "grows with requests")
                continue
            idx = ch.nodes.index(gid)
            label = f"{ch.node_steps[idx]} under {ch.steps[0]}"
            bound = next((ch.bounds[n] for n in ch.nodes[: idx + 1] if n in ch.bounds), None)
            k = members[gid]
            if bound is not None:
                out[rid] = Verdict(True, "declared-bound", label, k, f"the collection declares {bound}")
            elif gid in self._evicting:
                out[rid] = Verdict(True, "observed-eviction", label, k,
                                   f"the collection freed {self._evicting[gid]} earlier request(s)' KV while "
                                   "the program ran (it evicts)")
            else:
                out[rid] = Verdict(False, "unbounded-collection", label, k,
                                   f"{k} ended requests' KV in one collection, none seen evicted")
        return out

    def summary(self) -> dict[str, Any]:
        return {"sampling": self.sampling, "samples": self.samples,
                "sample_seconds": round(self.sample_seconds, 3), "collections_seen_evicting": len(self._evicting)}

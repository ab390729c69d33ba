"""Tensor entries: each observed tensor's storage is one entry, and a slot's entry goes on with the next storage.

Called by `Ledger.observe` / `Ledger.observe_kv` with the lock held, once per tensor per cache update (per
layer per decode step): the common cases - the same storage written in place (static caches), or the slot's
previous storage freed and replaced (DynamicLayer's ``torch.cat``) - are dictionary hits and attribute writes
on the slot's entry (`TensorEntries._continue`), never a new record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvguardian.core.ledger.records import EntrySite, EntryState, EntryView, Record, RequestInfo, Update
from kvguardian.core.ledger.releases import StorageRef
from kvguardian.core.ledger.table import EntryTable

if TYPE_CHECKING:
    import torch

__all__ = ["TensorEntries"]


class TensorEntries:
    """Observes tensors into the entry table (lock held)."""

    def __init__(self, table: EntryTable) -> None:
        self.table = table
        # bound once (the table never replaces them): attribute chains cost as much as the rest of a step here
        self._slots = table.slots
        self._by_key = table.by_key
        self._totals = table.totals
        self._events = table.events
        self._on_freed = table.releases.on_freed
        self._names: dict[Any, str] = {}  # torch dtype/device -> its name (str() is slow on the hot path)

    def observe(self, tensor: torch.Tensor, site: EntrySite, request: RequestInfo | None, update: Update,
                now: float) -> Record | None:
        """Record one observation of ``tensor`` (a KV tensor or a view of one) at ``site``. Returns its entry, or
        None for an empty tensor (no storage to track)."""
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if not ptr:
            return None
        slot = site.slot
        rec = self._slots.get(slot) if slot is not None else None
        if rec is None or not self._continue(rec, tensor, storage, ptr, update):
            rec = self._existing(tensor, storage, ptr, site, update)
            if rec is None:
                return self._create(tensor, site, request, update)
        rec.last_access = now
        if rec.appends and (request is None or rec.request_id == request.request_id):
            rec.appends += 1  # EntryTable.touch's per-step case, inlined: an append by the owner, only counted
            self._events.appends += 1
        else:
            self.table.touch(rec, request, now)
        return rec

    def touch(self, sites: tuple[EntrySite, EntrySite], request: RequestInfo | None, update: Update,
              now: float) -> bool:
        """The next observation of both sites' entries where the source knows their tensors are the very objects
        it observed last (a static cache's preallocated keys and values, written in place, with grad mode off):
        the fill, the time and the append, without reading the tensors again. False, changing nothing, when
        either slot has no entry whose storage is alive: the caller observes the tensors instead."""
        slots = self._slots
        rk = slots.get(sites[0].slot)
        rv = slots.get(sites[1].slot)
        if rk is None or rv is None:
            return False
        wk, wv = rk.wref, rv.wref
        if wk is None or wv is None or wk() is None or wv() is None:
            return False
        filled = update.filled_tokens
        owner = request.request_id if request is not None else None
        for rec in (rk, rv):
            if filled is not None and filled != rec.filled_tokens:
                self._fill(rec, filled)
            rec.last_access = now
            if rec.appends and (owner is None or rec.request_id == owner):
                rec.appends += 1  # as in observe: an append by the owner, only counted
                self._events.appends += 1
            else:
                self.table.touch(rec, request, now)
        return True

    def _fill(self, rec: Record, filled: int) -> None:
        """``rec``'s storage holds ``filled`` tokens now (not None, and not what it held); its view's size did not
        change."""
        old, cap = rec.filled_tokens, rec.capacity_tokens
        if cap and old is not None:
            # a static cache's next tokens, every step: StateTotals.refill inlined (a call costs more)
            size = rec.storage_bytes
            self._totals.unused += size * (old if old < cap else cap) // cap - size * (
                filled if filled < cap else cap) // cap
            rec.filled_tokens = filled
        else:
            self._totals.refill(rec, rec.storage_bytes, rec.logical_bytes, filled)

    def _continue(self, rec: Record, tensor: torch.Tensor, storage: torch.UntypedStorage, ptr: int,
                  update: Update) -> bool:
        """The fast path of a slot's next observation: the slot's entry ``rec`` goes on with this tensor. False
        when it cannot (a storage already tracked elsewhere, or the slot's previous storage still alive - a new
        entry supersedes it)."""
        wref = rec.wref
        if wref is None:
            return False
        if rec.key == ptr and wref() is not None:
            # the same storage (written in place, as static caches do, or a new view of it)
            rec.shape = tensor.shape  # a torch.Size (a tuple); copies convert it
            nb = tensor.nbytes
            filled = update.filled_tokens
            if nb != rec.logical_bytes:
                self._totals.refill(rec, rec.storage_bytes, nb, filled)  # the unused bytes follow
            elif filled is not None and filled != rec.filled_tokens:
                self._fill(rec, filled)
            if update.grad_enabled and tensor.requires_grad:
                rec.grad = True
            return True
        if wref() is not None:
            return False
        other = self._by_key.get(ptr)
        if other is not None and other is not rec:
            return False
        self._recycle(rec, tensor, storage, ptr, update.grad_enabled)
        return True

    def _existing(self, tensor: torch.Tensor, storage: torch.UntypedStorage, ptr: int, site: EntrySite,
                  update: Update) -> Record | None:
        """The entry this storage belongs to, brought up to date: the one already tracking it, or the slot's
        entry whose storage was just freed. None: a new entry."""
        table = self.table
        rec = table.by_key.get(ptr)
        if rec is not None and rec.wref is not None and rec.wref() is None:
            # the entry's storage was freed and this new storage got its address (release not applied yet)
            if site.slot is not None and rec.slot == site.slot:
                self._recycle(rec, tensor, storage, ptr, True)
                return rec
            table.drain()
            rec = table.by_key.get(ptr)
        if rec is not None:
            rec.shape = tuple(tensor.shape)
            table.totals.refill(rec, rec.storage_bytes, tensor.nbytes, update.filled_tokens)
            if tensor.requires_grad:
                rec.grad = True
            return rec
        if site.slot is not None:
            prev = table.slots.get(site.slot)
            if prev is not None and prev.wref is not None and prev.wref() is None:
                # DynamicLayer's torch.cat: the slot's previous storage has just been freed and this one takes
                # its place. The entry continues with the new storage: no new record.
                self._recycle(prev, tensor, storage, ptr, True)
                return prev
        return None

    def _recycle(self, rec: Record, tensor: torch.Tensor, storage: torch.UntypedStorage, ptr: int,
                 check_grad: bool) -> None:
        """The entry of a slot whose storage was freed continues with the storage that replaced it.

        Equivalent to releasing the old storage and recording the new one in the same slot - the same counters
        (released entries and bytes), the same "append" (or "hit") event, which the caller records - without
        creating and dropping a record every decode step. The old storage's queued release is skipped because
        the entry's ``wref`` is no longer the one queued. This is the one place an entry's key and storage size
        change, so the table's index and totals are updated here, inline (once per tensor per decode step).
        """
        totals = self._totals
        eid = rec.entry_id
        old_bytes = rec.storage_bytes
        totals.released_entries += 1
        totals.released_bytes += old_bytes
        by_key = self._by_key
        old = by_key.pop(rec.key, None)
        if old is not None and old is not rec:  # the old address already belongs to another entry
            by_key[rec.key] = old
        by_key[ptr] = rec
        rec.key = ptr
        rec.incarnation += 1
        wref = rec.wref = StorageRef(storage, self._on_freed)
        wref.eid = eid
        new_bytes = storage.nbytes()
        # the totals by state, and the ended-owner bytes, follow the storage's size
        if rec.state is not EntryState.LIVE and rec.request_id is not None:
            info = self.table.requests.get(rec.request_id)
            if info is not None and info.ended is not None:
                totals.ended_bytes += new_bytes - old_bytes
        totals.bytes[rec.state] += new_bytes - old_bytes
        rec.shape = tensor.shape  # a torch.Size (a tuple); copies convert it
        nb = tensor.nbytes
        if rec.capacity_tokens or nb < new_bytes or rec.logical_bytes < old_bytes:
            totals.refill(rec, new_bytes, nb, None)  # the unused bytes follow
        else:  # none before, none after (DynamicLayer's cat)
            rec.storage_bytes = new_bytes
            rec.logical_bytes = nb
        rec.superseded = False
        rec.grad = check_grad and tensor.requires_grad

    def _create(self, tensor: torch.Tensor, site: EntrySite, request: RequestInfo | None, update: Update) -> Record:
        """A new entry for ``tensor``'s storage."""
        storage = tensor.untyped_storage()
        names = self._names
        dtype, device = tensor.dtype, tensor.device
        # EntryView(shape, dtype, device, logical_bytes, storage_bytes, grad)
        view = EntryView(tuple(tensor.shape), names.get(dtype) or self._name(dtype),
                         names.get(device) or self._name(device), tensor.nbytes, storage.nbytes(),
                         bool(tensor.requires_grad))
        rec = self.table.create(storage.data_ptr(), site, request, view, update)
        wref = rec.wref = StorageRef(storage, self._on_freed)
        wref.eid = rec.entry_id
        return rec

    def _name(self, obj: object) -> str:
        """The name of a torch dtype or device, cached."""
        name = self._names.get(obj)
        if name is None:
            name = self._names[obj] = str(obj)
        return name

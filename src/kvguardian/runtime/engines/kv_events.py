"""Decode vLLM's KV-event wire format into privacy-safe records, refusing nothing silently.

A ZMQ multipart ``(topic, sequence, payload)``, the payload msgpack of an ``EventBatch``; both encodings
(array-like up to vLLM 0.23, tagged maps later) are accepted. Token ids and salts are not kept, only digests.
Malformed input raises or yields `DecodeError` with a reason from `REASONS`; one bad event does not lose its
batch. The wire format in detail: docs/design/engines.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, TypeGuard

__all__ = [
    "REASONS",
    "AllBlocksCleared",
    "Batch",
    "BlockRemoved",
    "BlockStored",
    "DecodeError",
    "KVEvent",
    "decode_batch",
    "decode_sequence",
    "salt_digest",
    "split_frames",
    "split_replay_frames",
]

Hash = int | bytes

#: Why a frame, batch or event was refused (the label values of kvguardian_watch_kv_event_errors_total).
REASONS = ("frames", "sequence", "payload", "batch", "event", "field", "unknown_type")

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class DecodeError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[Hash, ...]
    parent_block_hash: Hash | None
    block_size: int
    medium: str  # "GPU" when the publisher does not say (older vLLM)
    group_idx: int  # 0 when the publisher does not say
    lora_name: str | None
    salt_digest: str | None  # "salt:<12 hex>" of the cache_salt in the first block's extra keys, if any
    root_token_digest: bytes | None  # digest of the first block's tokens, when it starts a prompt (no parent)
    has_extra_keys: bool  # False for publishers that predate extra_keys (namespaces then unknown)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[Hash, ...]
    medium: str
    group_idx: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[KVEvent | DecodeError, ...]
    dp_rank: int | None


def split_frames(frames: list[bytes]) -> tuple[int, bytes]:
    """``(topic, sequence, payload)`` -> ``(sequence, payload)``; raises `DecodeError` (frames, sequence)."""
    if len(frames) != 3:
        raise DecodeError("frames", f"expected 3 frames (topic, sequence, payload), got {len(frames)}")
    return decode_sequence(frames[1]), frames[2]


def split_replay_frames(frames: list[bytes]) -> tuple[int, bytes]:
    """One reply of the replay ROUTER, as a DEALER receives it -> ``(sequence, payload)``.

    Two shapes exist, both after the empty delimiter frame the ROUTER puts first: vLLM 0.32 sends
    ``(b"", topic, sequence, payload)`` and ends with ``(b"", b"", -1, b"")``; older vLLM and SGLang send
    ``(b"", sequence, payload)`` and end with ``(b"", -1, b"")``. The end marker comes back as sequence -1.

    Raises:
        DecodeError: (frames, sequence) for any other shape.
    """
    body = frames[1:] if frames and frames[0] == b"" else frames
    if len(body) == 3:
        return decode_sequence(body[1]), body[2]
    if len(body) == 2:
        return decode_sequence(body[0]), body[1]
    raise DecodeError("frames", f"a replay reply has 2 or 3 frames after the delimiter, got {len(body)}")


def decode_sequence(raw: bytes) -> int:
    """An 8-byte big-endian sequence number (signed: the replay end marker is -1)."""
    if len(raw) != 8:
        raise DecodeError("sequence", f"sequence frame has {len(raw)} bytes, expected 8")
    return int.from_bytes(raw, "big", signed=True)


def decode_batch(payload: bytes) -> Batch:
    """Decode one msgpack ``EventBatch``; raises `DecodeError` (payload, batch); bad events are kept as errors."""
    import msgpack

    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises ExtraData, FormatError, StackError, ValueError, UnicodeDecodeError...
        raise DecodeError("payload", f"not msgpack ({type(exc).__name__})") from None
    if isinstance(obj, dict):
        ts, events, rank = obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")
    elif isinstance(obj, list) and len(obj) in (2, 3):
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) == 3 else None
    else:
        raise DecodeError("batch", f"expected [ts, events, dp_rank] or a map, got {type(obj).__name__}")
    if not _is_number(ts) or not isinstance(events, list) or not (rank is None or _is_int(rank)):
        raise DecodeError("batch", "ts must be a number, events a list, dp_rank an int or nil")
    return Batch(float(ts), tuple(_decode_event(e) for e in events), rank)


def _decode_event(raw: Any) -> KVEvent | DecodeError:
    try:
        if isinstance(raw, dict):
            tag, fields = raw.get("type"), raw
        elif isinstance(raw, list) and raw:
            tag = raw[0]
            names = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS if tag == "BlockRemoved" else ()
            fields = dict(zip(names, raw[1:]))
        else:
            return DecodeError("event", f"an event must be a tagged map or array, got {type(raw).__name__}")
        if not isinstance(tag, str):
            return DecodeError("event", "event has no string type tag")
        if tag == "BlockStored":
            return _stored(fields)
        if tag == "BlockRemoved":
            return BlockRemoved(_hashes(fields.get("block_hashes")), _medium(fields), _group(fields))
        if tag == "AllBlocksCleared":
            return AllBlocksCleared()
        return DecodeError("unknown_type", f"unknown event type {tag[:40]!r}")
    except _FieldError as exc:
        return DecodeError("field", str(exc))


class _FieldError(Exception):
    pass


def _stored(f: dict[Any, Any]) -> BlockStored:
    hashes = _hashes(f.get("block_hashes"))
    parent = f.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise _FieldError("parent_block_hash must be an int, bytes or nil")
    size, tokens = f.get("block_size"), f.get("token_ids")
    if not _is_int(size) or size <= 0:
        raise _FieldError("block_size must be a positive int")
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        raise _FieldError("token_ids must be a list of ints")
    lora = f.get("lora_name")
    lora = lora if isinstance(lora, str) else None
    extra = f.get("extra_keys")
    if extra is not None and not isinstance(extra, list):
        raise _FieldError("extra_keys must be a list or nil")
    salt = None
    root = None
    if parent is None and hashes:
        if len(tokens) >= size:
            root = hashlib.blake2b(repr(tokens[:size]).encode(), digest_size=8).digest()
        first = extra[0] if extra else None
        if isinstance(first, list):
            # cache_salt enters the first block's extra keys as a plain string; LoRA names are strings too
            salts = [k for k in first if isinstance(k, str) and k != lora]
            if salts:
                salt = salt_digest(salts[-1])
    return BlockStored(hashes, parent, size, _medium(f), _group(f), lora, salt, root, "extra_keys" in f)


def salt_digest(salt: str) -> str:
    """``salt:<12 hex>``: how a cache salt appears in reports (a digest, never the salt itself)."""
    return "salt:" + hashlib.blake2b(salt.encode("utf-8", "replace"), digest_size=6).hexdigest()


def _hashes(raw: Any) -> tuple[Hash, ...]:
    if not isinstance(raw, list) or not all(_is_hash(h) for h in raw):
        raise _FieldError("block_hashes must be a list of ints or bytes")
    return tuple(raw)


def _medium(f: dict[Any, Any]) -> str:
    m = f.get("medium")
    if m is None:
        return "GPU"
    if not isinstance(m, str):
        raise _FieldError("medium must be a string or nil")
    return m[:32]


def _group(f: dict[Any, Any]) -> int:
    g = f.get("group_idx")
    if g is None:
        return 0
    if not _is_int(g):
        raise _FieldError("group_idx must be an int or nil")
    return int(g)


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_hash(x: object) -> bool:
    return _is_int(x) or isinstance(x, bytes)

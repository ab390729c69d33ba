import functools

import torch

from kvguardian.runtime.guard import Guard


class PrefixService:
    """A service whose prefix cache is an lru_cache on a method: the cache keeps `self` alive."""

    def __init__(self, guard):
        self.guard = guard

    @functools.lru_cache(maxsize=16)  # noqa: B019 - the leak under test
    def prefix(self, name):
        with self.guard.request(f"prefix-{name}-{id(self)}"):
            kv = {"k": torch.zeros(1, 2, 6, 4), "v": torch.zeros(1, 2, 6, 4)}
            self.guard.track(kv["k"], kv["v"], layer=0)
        self.guard.retain(kv["k"], reason="prefix cache")
        self.guard.retain(kv["v"], reason="prefix cache")
        return kv


def test_reload_without_dropping_the_lru_cache_is_stale_generation_with_class_root():
    guard = Guard()
    PrefixService(guard).prefix("sys")  # generation 0; the instance is dropped, the lru_cache keeps it
    assert not guard.check().by_id("KVG105")
    guard.new_generation()
    report = guard.check()
    (f,) = report.by_id("KVG105")
    assert f.evidence["generation"] == 0 and f.evidence["current_generation"] == 1
    assert f.evidence["bytes"] == 2 * 2 * 6 * 4 * 4 and f.evidence["retained_bytes"] == f.evidence["bytes"]
    assert f.holder_chain[0] == f"class {__name__}.PrefixService: prefix"
    assert f.holder_chain[1] == "lru_cache PrefixService.prefix() cached result"
    assert "declared retained: prefix cache" in f.message
    assert not report.by_id("KVG102")  # declared: only the generation check can see it
    PrefixService.prefix.cache_clear()
    assert not guard.check().by_id("KVG105")


def test_old_generation_kv_of_an_active_request_is_not_stale():
    guard = Guard()
    with guard.request("in-flight"):
        k = torch.zeros(1, 1, 4, 4)
        guard.track(k, layer=0)
        guard.new_generation()
        assert not guard.check().by_id("KVG105")
    report = guard.check()
    assert [f.evidence["owners"] for f in report.by_id("KVG105")] == [["in-flight"]]
    holder = report.by_id("KVG105")[0].holder_chain
    assert holder and "local k" in holder[0]


def test_released_kv_of_an_old_generation_is_not_reported():
    guard = Guard()
    with guard.request("r"):
        k = torch.zeros(3, 3)
        guard.track(k, layer=0)
    del k
    guard.new_generation()
    assert guard.check().findings == []


_HELD = []


def test_holder_chain_starts_from_the_view_when_only_a_view_holds_the_storage():
    guard = Guard()
    with guard.request("r"):
        k = torch.zeros(1, 2, 10, 4)
        guard.track(k, layer=0)
        _HELD.append((k[:, :, :3],))  # the base tensor stays alive only through the view's C++ link
    del k
    try:
        (f,) = guard.check().by_id("KVG102")
        assert f.holder_chain[:3] == [f"module {__name__}: _HELD", "list[0]", "tuple[0]"]
    finally:
        _HELD.clear()

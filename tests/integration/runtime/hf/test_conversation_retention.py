"""Bounded or unbounded with a real model (issue 12, part 4): conversations that continue their own caches."""

import pytest
import torch

from kvg_testing import fake_module
from kvguardian.runtime.guard import Guard


@pytest.fixture
def app():
    with fake_module("retention_app") as mod:
        yield mod


def verdicts(guard):
    found = guard.check().by_id("KVG102")
    return {f.evidence["request_id"]: (f.severity.value, f.evidence["retention"]) for f in found}


class Conversation:
    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()
        self.history = torch.zeros((1, 0), dtype=torch.long)

    def turn(self, i):
        ids = torch.cat([self.history, torch.full((1, 3), 5 + i)], 1)
        self.history = self.model.generate(ids, past_key_values=self.cache, max_new_tokens=2, do_sample=False)


def test_a_fixed_set_of_conversations_each_continuing_its_cache_is_bounded(app, tiny_model):
    # three users, each turn continues the user's own DynamicCache (the earlier turn's storages are replaced,
    # the cache object lives on); while a turn ends, its cache is reached through the running method's frame
    guard = Guard(retention_sampling=True).attach(tiny_model)
    try:
        app.SESSIONS = {u: Conversation(tiny_model) for u in "abc"}
        for i in range(18):
            app.SESSIONS["abc"[i % 3]].turn(i)
        out = verdicts(guard)
    finally:
        guard.detach()  # tiny_model is shared by the session
    assert len(out) == 3 and {sev for sev, _ in out.values()} == {"info"}, out
    assert {v["collection"] for _, v in out.values()} == {"dict under module retention_app: SESSIONS"}

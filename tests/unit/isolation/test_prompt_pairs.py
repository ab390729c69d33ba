"""The probe's hit/miss prompts: a server's tokenizer word cache must not look like a prefix cache.

A fake endpoint stands in for the server (no HTTP): its time to first token is a cost per word the
tokenizer has not seen (a BPE word cache, as Hugging Face ``tokenizers`` keeps) plus, when it has a prefix
cache, a cost per prompt block not cached, plus seeded noise. With fresh words for the miss prompt, a
server with no prefix cache at all was judged "caching" (the victim's request warms the hit prompt's words).
"""

from __future__ import annotations

import random

import pytest

from kvguardian.isolation.cache_sharing import CacheSharingProbe, ProbeOptions, prompt_pair, random_words
from kvguardian.isolation.client import Timing

BLOCK = 64  # characters per prefix-cache block of the fake server


class FakeServer:
    """Word cache always; prefix cache (global, block-chained from the first character) when asked."""

    def __init__(self, *, prefix_cache: bool, seed: int) -> None:
        self.prefix_cache = prefix_cache
        self.rng = random.Random(seed)
        self.words: set[str] = set()
        self.blocks: set[str] = set()
        self.requests = self.throttled = 0

    def request_json(self, slot, method, path, key, body=None, *, who):
        self.requests += 1
        if path == "/v1/models":
            return {"data": [{"id": "tiny", "max_model_len": 4096}]}
        return {"usage": {"prompt_tokens": len(body["prompt"]) // 4}}

    def stream_completion(self, slot, key, body, *, who):
        self.requests += 1
        prompt = body["prompt"]
        words = prompt.split(" ")
        cost = 0.2e-3 * sum(w not in self.words for w in words)
        self.words.update(words)
        if self.prefix_cache:
            prefixes = [prompt[:i + BLOCK] for i in range(0, len(prompt), BLOCK)]
            cost += 2e-3 * sum(b not in self.blocks for b in prefixes)
            self.blocks.update(prefixes)
        else:
            cost += 2e-3 * -(-len(prompt) // BLOCK)
        ttft = 5e-3 + cost + self.rng.expovariate(1 / 2e-3)
        return Timing(ttft=ttft, total=ttft, prompt_tokens=None)

    def close(self) -> None:
        pass


def probe(server: FakeServer, seed: int) -> dict:
    options = ProbeOptions(url="http://127.0.0.1:1", model="tiny", keys=["a", "b"], seed=seed, warmup=1)
    return CacheSharingProbe(options, endpoint=server).run().to_dict()  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(5))
def test_a_word_cache_alone_is_not_caching(seed):
    data = probe(FakeServer(prefix_cache=False, seed=seed), seed)
    assert (data["caching"], data["shared_across_tenants"]) == (False, False), data["levels"]


@pytest.mark.parametrize("seed", range(3))
def test_a_prefix_cache_behind_a_word_cache_is_still_found(seed):
    data = probe(FakeServer(prefix_cache=True, seed=seed), seed)
    assert (data["caching"], data["shared_across_tenants"]) == (True, True), data["levels"]


@pytest.mark.parametrize("chars", [32, 33, 100, 3073])
def test_the_pair_has_one_length_the_same_words_and_no_common_first_block(chars):
    rng = random.Random(chars)
    for _ in range(50):
        p, q = prompt_pair(chars, rng)
        assert len(p) == len(q) == chars
        assert sorted(p.split(" ")) == sorted(q.split(" ")) and p != q
        assert p.split(" ")[1] != q.split(" ")[1]  # another first word: no prefix block in common
        assert " " not in random_words(chars, rng)[1:]  # never a bare space as a word

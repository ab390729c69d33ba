"""Decode-step sampling under ``kv-guardian run`` (its default, ``--decode-stride 8``) gives the same findings as
observing every forward (``--decode-stride 1``): each finding's id, severity and holder chain, and the exit
code. Run on the programs where sampling could matter most - a forward hook keeping every step's cache, beam
search (the cache reordered after every step), a chat whose cache grows over turns, sessions driving their
caches through generate - and checked on the whole corpus once (docs/benchmarks.md)."""

import pytest

from corpus import HERE, run

pytestmark = pytest.mark.slow

SENSITIVE = ["leak_forward_hook_capture", "leak_beam_search_results", "clean_one_long_chat",
             "leak_sessions_never_closed"]


@pytest.mark.parametrize("name", SENSITIVE)
def test_sampled_and_every_step_give_the_same_findings(name):
    path = HERE / f"{name}.py"
    every = run(path, options=("--decode-stride", "1"))
    sampled = run(path)
    assert (sampled.rc, sampled.signature()) == (every.rc, every.signature())
    assert sampled.findings or name.startswith("clean_")

"""Every corpus program under real ``kv-guardian run --fail-on warning``: each leak flagged (KVG101/102/103
at warning or above) with its holder named in every KVG102 warning or error, no clean program with a
warning or an error, no KVG102 chain without a named holder. One parametrised test; the programs not in
FAST run in CI (and with KVG_CORPUS=all)."""

import pytest

from corpus import expectation, problems, programs, run

pytestmark = pytest.mark.slow

FAST = {
    "leak_linked_turns", "leak_asyncio_done_tasks", "leak_atexit_closures", "leak_dict_of_deques",
    "leak_session_dict", "clean_lru_busy_sessions", "clean_fixed_prompt_memo", "clean_cachetools_lru",
}
PROGRAMS = programs()


def test_the_corpus_is_as_large_as_promised():
    exps = [expectation(p) for p in PROGRAMS]
    assert sum(e.leak for e in exps) >= 30 and sum(not e.leak for e in exps) >= 15
    assert all(e.holders for e in exps if e.leak), "every leak program names its holder"


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=() if p.stem in FAST else pytest.mark.corpus_full) for p in PROGRAMS]
)
def test_program(path):
    out = run(path)
    assert problems(expectation(path), out) == []

"""KVG406 on Go and Java closures, and KVG405's Redis-client requirement on Go and Java.

The fixtures (tests/fixtures/lint/kvg406_*.go/.java, kvg405_not_redis.*) pin every finding line; here each clean
near miss of those fixtures is shown to be near: take away the one thing that makes it clean (the removal, the
bound, the value-only capture, the start-up function, the Redis import) and the finding appears.
"""

from pathlib import Path

import pytest

from kvguardian.lint import LintConfig, lint_paths

pytest.importorskip("tree_sitter", reason="Go/Java need kv-guardian[lint]")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"


def _findings(tmp_path: Path, name: str, text: str, rule: str = "KVG406") -> list[tuple[int, str]]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = lint_paths([str(path)], LintConfig(select=(rule,)))
    assert not result.skipped, result.skipped
    return [(d.line, d.message) for d in result.diagnostics]


def _line_of(text: str, needle: str) -> int:
    return next((i for i, line in enumerate(text.splitlines(), 1) if needle in line), 0)


def _mutated(fixture: str, old: str | tuple[str, ...], new: str | tuple[str, ...]) -> str:
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    for o, n in zip(*((old, new) if isinstance(old, tuple) else ((old,), (new,))), strict=True):
        assert o in text, o
        text = text.replace(o, n, 1)
    return text


# (fixture, what makes the line clean, the same line without it, a line that then gets KVG406)
NEAR_MISSES = [
    ("kvg406_closures.go", "n := kv.Len()", "n := kv", "onToken = append(onToken, func(tok int) { _ = n + tok })"),
    ("kvg406_closures.go", "var slots [64]func()", "var slots = map[int]func(){}", "slots[3] = func()"),
    ("kvg406_closures.go", ("var ring = ", "local := []func(){}"), ("var local []func()\nvar ring = ", ""),
     "local = append(local, func() { kv.Compact() })"),
    ("kvg406_closures.go", "case <-ctx.Done():\n\t\t\t\treturn\n", "", "go func(ctx context.Context) {"),
    ("kvg406_closures.go", "\tdefer unsub()\n", "\t_ = unsub\n", "unsub := s.bus.Subscribe"),
    ("kvg406_clean.go", "\tdefer delete(done, r.URL.Path) // removed when the request ends\n", "",
     "done[r.URL.Path] = func() { kv.Compact() }"),
    ("kvg406_clean.go", "func main() {", "func handleMain(w http.ResponseWriter, r *http.Request) {",
     "hooks = append(hooks, func() { cache.Compact() })"),
    ("kvg406_closures.java", "int size = kv.size();", "KvCache size = kv;", "System.out.println(size + tok)"),
    ("kvg406_closures.java", "ArrayBlockingQueue<Runnable> RECENT = new ArrayBlockingQueue<>(16);",
     "java.util.Queue<Runnable> RECENT = new java.util.ArrayDeque<>();", "RECENT.offer(() -> kv.compact());"),
    ("kvg406_closures.java", "bus.removeListener(cb); // removed when the request ends", "cb.hashCode();",
     "bus.addListener(cb);"),
    ("kvg406_closures.java", "ON_TOKEN.add(kvTok -> System.out.println(kvTok));",
     "ON_TOKEN.add(tok -> System.out.println(kv));", "ON_TOKEN.add(tok -> System.out.println(kv));"),
    ("kvg406_clean.java", "PER_REQUEST.remove(cb); // removed when the request ends", "cb.run();",
     "PER_REQUEST.add(cb);"),
    ("kvg406_clean.java", "void init(KvCache cache) {", "void handleInit(KvCache cache) {",
     "HOOKS.add(() -> cache.compact());"),
    ("kvg406_clean.java", "String id = request.id();", "KvCache id = kv;", "HOOKS.add(() -> System.out.println(id));"),
]


@pytest.mark.parametrize(("fixture", "old", "new", "line"), NEAR_MISSES,
                         ids=[f"{f}:{str(o).strip()[:30]}" for f, o, _, _ in NEAR_MISSES])
def test_each_near_miss_is_near(tmp_path, fixture, old, new, line):
    clean = (FIXTURES / fixture).read_text(encoding="utf-8")
    before = [n for n, _ in _findings(tmp_path, "a" + Path(fixture).suffix, clean)]
    text = _mutated(fixture, old, new)
    after = [n for n, _ in _findings(tmp_path, "b" + Path(fixture).suffix, text)]
    assert _line_of(text, line) in after
    assert _line_of(clean, line) not in before


def test_the_message_names_the_handler_the_capture_and_the_place(tmp_path):
    text = (FIXTURES / "kvg406_closures.go").read_text(encoding="utf-8")
    by_line = dict(_findings(tmp_path, "a.go", text))
    message = by_line[_line_of(text, "onToken = append(onToken, func(tok int) { kv.Append")]
    assert "handleGenerate()" in message and "'kv'" in message and "'onToken'" in message
    assert "goroutine that never ends" in by_line[_line_of(text, "go func() { // expect")]
    java = (FIXTURES / "kvg406_closures.java").read_text(encoding="utf-8")
    by_line = dict(_findings(tmp_path, "a.java", java))
    assert "'tensors'" in by_line[_line_of(java, "BY_REQUEST.put")]
    assert "scheduleAtFixedRate()" in by_line[_line_of(java, "scheduler.scheduleAtFixedRate")]


def test_a_closure_that_holds_a_capturing_closure_captures_too(tmp_path):
    text = (FIXTURES / "kvg406_closures.java").read_text(encoding="utf-8")
    mutated = text.replace("Runnable keep = () -> tensors.size();", "Runnable keep = () -> System.gc();")
    lines = [n for n, _ in _findings(tmp_path, "a.java", mutated)]
    assert _line_of(mutated, "ON_TOKEN.add(tok -> keep.run())") not in lines


@pytest.mark.parametrize(("fixture", "old", "new", "line"), [
    ("kvg405_not_redis.go", '"github.com/google/uuid"', '"github.com/google/uuid"\n\t"github.com/redis/go-redis/v9"',
     'q.Set("ts", now)'),
    ("kvg405_not_redis.java", "import java.util.UUID;", "import java.util.UUID;\nimport redis.clients.jedis.Jedis;",
     'headers.set("X-Ts-" + System.currentTimeMillis(), "1");'),
])
def test_a_redis_import_makes_the_same_calls_redis_writes(tmp_path, fixture, old, new, line):
    clean = (FIXTURES / fixture).read_text(encoding="utf-8")
    text = _mutated(fixture, old, new)
    before = [n for n, _ in _findings(tmp_path, "a" + Path(fixture).suffix, clean, "KVG405")]
    after = [n for n, _ in _findings(tmp_path, "b" + Path(fixture).suffix, text, "KVG405")]
    assert _line_of(text, line) in after and _line_of(clean, line) not in before


def test_kotlin_is_read_for_kvg405_only(tmp_path):
    kt = ("fun handleGenerate(request: Request, kv: KvCache) {\n"
          "    LISTENERS.add { kv.compact() }\n"
          "}\n")
    assert _findings(tmp_path, "a.kt", kt) == []

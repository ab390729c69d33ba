import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvguardian.keyspace.patterns import OVERFLOW, OVERFLOW_ID, PatternMiner


def _names(miner, keys):
    """Mine every key, then ask again: the second answer reflects any collapse the first pass caused."""
    for k in keys:
        miner.pattern_id(k)
    return {miner.name(miner.pattern_id(k)) for k in keys}


def test_variable_tokens_are_placeholders_at_once():
    m = PatternMiner()
    keys = [f"session:{uuid.uuid4()}", "tmp_1712345678123456789", "ev:2024-01-05:x", "c:deadbeef00112233"]
    assert _names(m, keys) == {"session:{uuid}", "tmp_{ts_ns}", "ev:{date}:x", "c:{hex}"}


def test_literals_stay_until_a_position_is_high_cardinality():
    m = PatternMiner(collapse_after=5)
    low = [f"cfg:{w}" for w in ("a", "b", "c")]
    assert _names(m, low) == {"cfg:a", "cfg:b", "cfg:c"}
    users = [f"user:{i}:profile" for i in range(6)]
    assert _names(m, users) == {"user:{int}:profile"}
    assert _names(m, low) == {"cfg:a", "cfg:b", "cfg:c"}  # another prefix is not affected
    names = [f"name:{w}:x" for w in ("alice", "bob", "carol", "dave", "eve", "frank")]
    assert _names(m, names) == {"name:{str}:x"}
    m.check_invariants()


def test_collapse_merges_pattern_ids_and_reports_them():
    merges = []
    m = PatternMiner(collapse_after=3, on_merge=lambda s, d: merges.append((s, d)))
    first = [m.pattern_id(f"u:{i}:p") for i in range(3)]
    assert len(set(first)) == 3
    after = m.pattern_id("u:99:p")
    assert m.name(after) == "u:{int}:p" and after in first
    assert sorted(s for s, _ in merges) == sorted(set(first) - {after}) and all(d == after for _, d in merges)
    assert all(m.name(pid) == "" for pid in set(first) - {after})
    m.check_invariants()


def test_pattern_cap_sends_the_rest_to_overflow():
    m = PatternMiner(max_patterns=3, collapse_after=1000)
    pids = [m.pattern_id(f"k{i}") for i in range(10)]
    assert pids[3:] == [OVERFLOW_ID] * 7 and m.name(OVERFLOW_ID) == OVERFLOW
    assert m.live == 3


def _key(draw_parts):
    return ":".join(draw_parts)


_part = st.one_of(
    st.sampled_from(["user", "session", "profile", "cache", "cfg", "x", "deadbeef", "fed", "bad"]),
    st.integers(0, 10**20).map(str),
    st.uuids().map(str),
    st.sampled_from(["2024-01-05", "2024-13-45", "10.0.0.1", "{tag1}", "aZ3kd9Qx7LmN2pR8sT4vW6yB", "a9Xk2Pq0Zz"]),
    st.text("abcdefXYZ0123456789_-", min_size=1, max_size=30),
    st.integers(0, 2**32 - 1).map(lambda v: f"{v:08x}"),  # short hashes: some all digits, some all letters
    st.sampled_from(["12345678", "20240105", "abcdefab", "1712000000123456"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_part, min_size=1, max_size=5).map(_key), min_size=1, max_size=300),
       st.integers(2, 8))
def test_shape_cache_gives_the_same_patterns_as_the_full_path(keys, collapse_after):
    a = PatternMiner(collapse_after=collapse_after)
    b = PatternMiner(collapse_after=collapse_after)
    for k in keys:  # the same sequence through both paths: ids and names must agree key by key
        assert a.pattern_id_bytes(k.encode()) == b.pattern_id(k), k
    assert a.patterns() == b.patterns()
    a.check_invariants()


def test_shape_cache_on_a_realistic_mix():
    rnd = random.Random(3)
    keys = []
    for i in range(5000):
        keys += [f"session:{uuid.UUID(int=rnd.getrandbits(128))}", f"user:{i}:profile", f"tmp_{1_712_000_000_000 + i}",
                 f"cache:{rnd.getrandbits(128):032x}", f"role:{rnd.choice(['bad', 'fed', 'cab', 'dad'])}"]
    a, b, c = PatternMiner(), PatternMiner(), PatternMiner()
    full = [b.pattern_id(k) for k in keys]
    assert [a.pattern_id_bytes(k.encode()) for k in keys] == full
    raws = [k.encode() for k in keys]
    assert [pid for i in range(0, len(raws), 200) for pid in c.pattern_ids_bytes(raws[i:i + 200])] == full
    assert set(a.patterns().values()) == {OVERFLOW, "session:{uuid}", "user:{int}:profile", "tmp_{ts_ms}",
                                          "cache:{hex}", "role:bad", "role:fed", "role:cab", "role:dad"}


@pytest.mark.parametrize("width", [8, 16])
def test_hex_values_that_happen_to_be_all_digits_or_letters_stay_in_their_hex_pattern(width):
    # a random 8-digit hex value is all digits 2.3 % of the time (often a date or a timestamp by its digits), a
    # 16-digit one 0.05 %: they belong to k:{hex}, not to k:{int}, k:{date}, k:{ts_us} or a literal of their own
    rnd = random.Random(width)
    # before any other hex value: literals (merged in when the first hex value comes); a value that classifies
    # as a date or timestamp first keeps that pattern for the keys it got (a 1-in-10^5 order, not handled)
    values = ["9" * width, "abcdefab" * (width // 8)]
    values += [f"{rnd.getrandbits(4 * width):0{width}x}" for _ in range(3000)]
    values += ["20240105" + "1" * (width - 8), "1712000000123456"[:width], "deadbeef" * (width // 8)]
    keys = [f"k:{v}:v" for v in values]
    a, b, c = PatternMiner(), PatternMiner(), PatternMiner()
    full = [b.pattern_id(k) for k in keys]
    assert [a.pattern_id_bytes(k.encode()) for k in keys] == full
    raws = [k.encode() for k in keys]
    assert [pid for i in range(0, len(raws), 200) for pid in c.pattern_ids_bytes(raws[i:i + 200])] == full
    for m in (a, b, c):
        assert set(m.patterns().values()) == {OVERFLOW, "k:{hex}:v"}
        m.check_invariants()


def test_integers_beside_hex_values_of_another_width_stay_integers():
    m = PatternMiner(collapse_after=4)
    keys = [f"o:{v:08x}" for v in range(0xA0000000, 0xA0000000 + 50)] + [f"o:{i}" for i in range(100, 150)]
    assert _names(m, keys) == {"o:{hex}", "o:{int}"}


def test_hash_tags_collapse_into_tag_placeholders():
    m = PatternMiner(collapse_after=4)
    assert _names(m, [f"{{shard{i}}}:queue" for i in range(3)]) == {"{shard0}:queue", "{shard1}:queue",
                                                                    "{shard2}:queue"}
    assert _names(m, [f"{{user{i}}}:queue" for i in range(10)]) == {"{tag}:queue"}


def test_separator_after_an_ip_placeholder_is_kept():
    """Issue 18 item 6: ``rate:{ip}:{int}`` keys rendered ``rate:{ip}{int}`` (a 5-digit "port" was cut out of
    the digit run after the IP, swallowing the ``:``)."""
    from kvguardian.keyspace.patterns import PatternMiner

    m = PatternMiner()
    for i in range(300):
        m.pattern_id(f"rate:10.{i % 7}.{i % 250}.{i % 13}:{28_333_000 + i * 37}")  # minute windows, 8 digits
        m.pattern_id(f"conn:192.168.{i % 5}.{i % 200}:{6000 + i}")  # a real port stays part of the address
    names = set(m.patterns().values())
    assert "rate:{ip}:{int}" in names, names
    assert "conn:{ip}" in names, names
    assert not any("{ip}{" in n for n in names), names


def test_coarse_cache_serves_names_whose_hex_characters_fall_differently():
    # job:{int}:{rand}: every name has its own hex mask; the coarse mask (letters and digits -> x) is shared
    rnd = random.Random(5)
    keys = [f"job:{i}:{''.join(rnd.choices('abcdefXYZ0123456789', k=14))}" for i in range(3000)]
    keys += [f"tmp_{1_712_345_678_000_000_000 + i * 1_000_003}" for i in range(500)]
    keys += [f"rate:{rnd.choice(['api', 'web', 'cli'])}:{i}" for i in range(500)]
    rnd.shuffle(keys)
    a, b = PatternMiner(), PatternMiner()
    raws = [k.encode() for k in keys]
    got = [pid for i in range(0, len(raws), 256) for pid in a.pattern_ids_bytes(raws[i:i + 256])]
    assert got == [b.pattern_id(k) for k in keys]
    assert a.patterns() == b.patterns()
    assert 0 < len(a._coarse) < 50  # a few shapes, not one per name
    a.check_invariants()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.one_of(st.sampled_from(["job", "Job", "x1", "ab12cd34", "ABCDEF12", "q"]),
                                   st.integers(0, 10**20).map(str),
                                   st.text("abcdefghXYZQ0123456789", min_size=1, max_size=21)),
                         min_size=1, max_size=4).map(lambda p: ":".join(p)), min_size=1, max_size=300),
       st.integers(2, 8))
def test_coarse_cache_gives_the_same_patterns_as_the_full_path(keys, collapse_after):
    a = PatternMiner(collapse_after=collapse_after)
    b = PatternMiner(collapse_after=collapse_after)
    got = a.pattern_ids_bytes([k.encode() for k in keys])
    assert got == [b.pattern_id(k) for k in keys]
    assert a.patterns() == b.patterns()
    a.check_invariants()


def test_namespaces_stay_apart_past_the_collapse_threshold():
    """An application has dozens of key namespaces: the first word stays literal (up to NAMESPACES), so a
    namespace without a TTL is not merged with 24 others that have one."""
    from kvguardian.keyspace.patterns import NAMESPACES

    spaces = [f"ns{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(25)]
    m = PatternMiner()
    keys = [f"{ns}:{uuid.uuid4()}" for ns in spaces for _ in range(5)]
    assert _names(m, keys) == {f"{ns}:{{uuid}}" for ns in spaces}
    many = [f"w{i:03d}x:{uuid.uuid4()}" for i in range(NAMESPACES + 1)]  # past NAMESPACES: a variable first word
    assert _names(PatternMiner(), many) == {"{str}:{uuid}"}
    m.check_invariants()


def test_patterns_do_not_depend_on_the_order_names_come_in():
    """SCAN order is arbitrary: a collapse learnt in one subtree reaches the literals of the subtree it is
    merged into, whichever of the two saw its names first."""
    few = [f"ns:w0:{j}:profile" for j in range(3)]  # w0's ints stay literal ...
    many = [f"ns:w1:{j}:profile" for j in range(25)]  # ... w1's collapse into {int}
    words = [f"ns:w{i}:0:profile" for i in range(2, 25)]  # then the word position collapses: w0 and w1 merge
    orders = [few + many + words, many + few + words]
    for seed in range(4):
        shuffled = few + many + words
        random.Random(seed).shuffle(shuffled)
        orders.append(shuffled)
    for order in orders:
        m = PatternMiner(collapse_after=20)
        assert _names(m, order) == {"ns:{str}:{int}:profile"}, order[:5]
        m.check_invariants()


@pytest.mark.parametrize("make", [
    lambda r: "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") for _ in range(21)),
    lambda r: __import__("base64").b64encode(r.randbytes(16)).decode(),
    lambda r: __import__("base64").urlsafe_b64encode(r.randbytes(24)).decode(),
], ids=["nanoid", "base64", "base64url"])
def test_random_ids_of_the_base64_alphabets_make_one_pattern(make):
    """nanoids (21 characters, ``_`` and ``-`` inside) and base64 with ``/``, ``+`` or no digit are one token,
    not hundreds of shapes split at their ``_ - /``; a few unlucky values may fall out, not a pattern each."""
    r = random.Random(11)
    m = PatternMiner()
    keys = [f"short:{make(r)}" for _ in range(2000)]
    for k in keys:
        m.pattern_id(k)
    ids = [m.pattern_id(k) for k in keys]
    top = max(set(ids), key=ids.count)
    assert m.name(top) in ("short:{b64}", "short:{rand}") and ids.count(top) >= 0.95 * len(keys)
    assert len(set(ids)) <= 30


def test_camel_and_snake_case_words_are_not_random_ids():
    from kvguardian.keyspace.tokens import classify, tokenize

    for w in ("GetUserProfileSettingsHandler", "thisIsAVeryLongCamelCaseIdentifier", "CustomerSubscriptionUpdated_v2",
              "X-Forwarded-For-Original-Host", "AbstractSingletonProxyFactoryBean"):
        assert all(classify(t) is None for t in tokenize(f"k:{w}")[2:] if t not in "_-"), w


def test_a_byte_and_its_escape_text_are_two_names():
    """Byte 0xff is ``\\xff``; the four characters ``\\xff`` are ``\\\\xff``: not merged, printed apart."""
    from kvguardian.keyspace.result import key_text

    m = PatternMiner()
    raw = [b"dup:\xff:0", b"dup:\\xff:0"]
    assert m.pattern_id_bytes(raw[0]) != m.pattern_id_bytes(raw[1])
    assert {m.name(m.pattern_id_bytes(k)) for k in raw} == {"dup:\\xff:0", "dup:\\\\xff:0"}
    assert [key_text(k) for k in raw] == ["dup:\\xff:0", "dup:\\\\xff:0"]


def test_digit_dates_with_hours_are_dates_through_the_shape_cache_too():
    """``yyyymmddhh`` is in a 10-digit timestamp's range; it is a date, on the cached path as on the full one."""
    m = PatternMiner()
    assert m.name(m.pattern_id_bytes(b"hits:1764547200")) == "hits:{ts_s}"
    assert m.name(m.pattern_id_bytes(b"hits:2026112619")) == "hits:{date}"  # same mask as the cached ts_s name
    assert m.name(m.pattern_id_bytes(b"hits:1764547201")) == "hits:{ts_s}"
    assert m.name(m.pattern_id_bytes(b"day:20261126")) == "day:{date}"
    assert m.name(m.pattern_id_bytes(b"at:20261126193059")) == "at:{date}"

import pytest

from kvguardian.keyspace.tokens import MAX_KEY_CHARS, classify, tokenize


@pytest.mark.parametrize(("token", "cls"), [
    ("3f2a9c1e-1234-4abc-8def-0123456789ab", "uuid"),
    ("1712345678", "ts_s"),
    ("1712345678123", "ts_ms"),
    ("1712345678123456", "ts_us"),
    ("1712345678123456789", "ts_ns"),
    ("9999999999", None),  # 10 digits after 2100: an integer
    ("20240105", "date"),
    ("2024-01-05", "date"),
    ("2024-01-05T10:00:00Z", "date"),
    ("2024-13-45", None),  # date-shaped, not a date
    ("10.0.0.1", "ip"),
    ("10.0.0.1:6379", "ip"),
    ("deadbeef00112233", "hex"),
    ("deadbeef", None),  # hex letters only: a word
    ("aZ3kd9Qx7LmN2pR8sT4vW6yB", "b64"),
    ("a9Xk2Pq0Zz", "rand"),
    ("42", None), ("profile", None), ("page10", None), ("v2", None), ("{user1000}", None),
])
def test_classify(token, cls):
    assert classify(token) == cls


@pytest.mark.parametrize(("name", "tokens"), [
    ("session:3f2a9c1e-1234-4abc-8def-0123456789ab", ["session", ":", "3f2a9c1e-1234-4abc-8def-0123456789ab"]),
    ("tmp_1712345678123456789", ["tmp", "_", "1712345678123456789"]),
    ("ev:2024-01-05T10:00:00Z:x", ["ev", ":", "2024-01-05T10:00:00Z", ":", "x"]),
    ("x:10.0.0.1:6379", ["x", ":", "10.0.0.1:6379"]),
    ("{user1000}.following", ["{user1000}", ".", "following"]),
    ("tok:aZ3kd9Qx7LmN2pR8_T4vW6y-B", ["tok", ":", "aZ3kd9Qx7LmN2pR8_T4vW6y-B"]),  # base64url stays whole
    ("user_profile_settings_page", ["user", "_", "profile", "_", "settings", "_", "page"]),
])
def test_tokenize_keeps_composites_whole(name, tokens):
    assert tokenize(name) == tokens
    assert "".join(tokenize(name)) == name


def test_tokenize_bounds_work_on_pathological_names():
    toks = tokenize("a:" * 10_000)
    assert toks[-1] == "…" and len("".join(toks[:-1])) <= MAX_KEY_CHARS

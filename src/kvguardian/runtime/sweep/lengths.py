"""Sequence-length sets for the sweep: the neighbourhood of every power of two, ranges, or every length."""

from __future__ import annotations

from kvguardian.core.errors import UsageError

__all__ = ["DEFAULT_MAX", "around_powers_of_two", "length_kind", "parse_lengths"]

DEFAULT_MAX = 2048
#: The longest length the sweep accepts (a guard against typos that would run for hours).
HARD_MAX = 1 << 20


def around_powers_of_two(max_length: int = DEFAULT_MAX) -> list[int]:
    """Every 2^k - 1, 2^k and 2^k + 1 from 1 up to ``max_length`` (its 2^k + 1 included)."""
    out: set[int] = set()
    k = 0
    while (1 << k) <= max_length:
        p = 1 << k
        out.update(x for x in (p - 1, p, p + 1) if x >= 1)
        k += 1
    return sorted(out)


def length_kind(n: int) -> str:
    """``2^k``, ``2^k-1``, ``2^k+1`` or ``other``."""
    if n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    if (n + 1) & n == 0:
        return f"2^{(n + 1).bit_length() - 1}-1"
    if (n - 1) & (n - 2) == 0:
        return f"2^{(n - 1).bit_length() - 1}+1"
    return "other"


def parse_lengths(text: str, *, max_length: int = DEFAULT_MAX) -> list[int]:
    """``pow2`` (default set), ``all`` (1..max), or a comma list of lengths and ranges ``a-b``.

    Raises:
        UsageError: unparsable text, or a length outside 1..1,048,576.
    """
    text = text.strip().lower()
    if not 1 <= max_length <= HARD_MAX:
        raise UsageError(f"--max-length {max_length} is out of range; fix: use 1..{HARD_MAX}")
    if text in ("", "pow2"):
        return around_powers_of_two(max_length)
    if text == "all":
        return list(range(1, max_length + 1))
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            a, b = (int(x) for x in part.split("-", 1)) if "-" in part else (int(part), int(part))
            if b < a:
                raise ValueError
        except ValueError:
            raise UsageError(
                f"--lengths: {part!r} is not a length or a range a-b; fix: e.g. --lengths 1000-1030,2047,2048 "
                "(or 'pow2', or 'all')"
            ) from None
        _check_range(a, b)  # before the set is filled: 1-99999999999999 took every byte of memory
        out.update(range(a, b + 1))
    if not out:
        raise UsageError("--lengths is empty; fix: e.g. --lengths pow2")
    _check_range(min(out), max(out))
    return sorted(out)


def _check_range(low: int, high: int) -> None:
    for n in (low, high):
        if not 1 <= n <= HARD_MAX:
            raise UsageError(f"--lengths: {n} is out of range; fix: lengths must be 1..{HARD_MAX}")

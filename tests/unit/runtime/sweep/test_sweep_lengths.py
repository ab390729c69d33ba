import subprocess
import sys

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.runtime.sweep.lengths import around_powers_of_two, length_kind, parse_lengths


def test_default_set_is_every_power_of_two_and_its_neighbours_up_to_2048():
    got = around_powers_of_two(2048)
    assert got[:9] == [1, 2, 3, 4, 5, 7, 8, 9, 15]
    assert got[-6:] == [1023, 1024, 1025, 2047, 2048, 2049]
    for k in range(1, 12):
        p = 1 << k
        assert {p - 1, p, p + 1} <= set(got)
    assert len(got) == len(set(got)) == 32
    assert parse_lengths("pow2") == got


@pytest.mark.parametrize(
    ("n", "kind"),
    [(1, "2^0"), (2, "2^1"), (3, "2^2-1"), (1023, "2^10-1"), (1024, "2^10"), (1025, "2^10+1"), (1000, "other"),
     (5, "2^2+1"), (6, "other")],
)
def test_length_kind(n, kind):
    assert length_kind(n) == kind


def test_ranges_lists_and_all():
    assert parse_lengths("1000-1003, 7,7") == [7, 1000, 1001, 1002, 1003]
    assert parse_lengths("all", max_length=10) == list(range(1, 11))


@pytest.mark.parametrize(
    ("text", "needle"),
    [("5-3", "'5-3' is not a length or a range"), ("abc", "'abc' is not a length"), ("0", "0 is out of range"),
     (",", "--lengths is empty")],
)
def test_bad_lengths_name_the_part_and_the_fix(text, needle):
    with pytest.raises(UsageError) as exc:
        parse_lengths(text)
    assert needle in str(exc.value) and "fix:" in str(exc.value)


@pytest.mark.parametrize("text", ["1-99999999999999", "5,0-3", "2000000-2000001"])
def test_a_range_out_of_bounds_is_refused_before_it_is_expanded(text):
    """``--lengths 1-99999999999999`` built the set of 10^14 lengths before checking them: the OOM killer
    ended it (rc 137). Checked in a child held to 512 MiB of address space, so the old code fails here."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))\n"
            "from kvguardian.runtime.sweep.lengths import parse_lengths\n"
            "try:\n    parse_lengths(sys.argv[1])\nexcept ValueError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "is out of range; fix: lengths must be 1..1048576" in proc.stdout, proc.stderr

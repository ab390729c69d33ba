"""§2.3's reproduction at a small size, and the three demo rows of this issue through the real CLI."""

import json

import pytest

from kvg_testing import rendered
from kvguardian.apps.repro import ARTICLE_SECTIONS, REPROS, DemoRow, nonpow2, not_built_rows, section_order


def test_nonpow2_measures_sdpa_and_catches_the_control():
    data = nonpow2.measure(max_length=1024, heads=1, repeats=2)
    assert data["sdpa"]["ok"] and data["sdpa"]["max_alive_bytes"] == 0
    assert set(data["sdpa"]["targets"]) >= {"sdpa-math", "sdpa-flash"}
    assert data["control_floor"]["exact"] and 1023 in data["control_floor"]["caught_lengths"]
    assert 1024 not in data["control_floor"]["caught_lengths"]
    assert data["control_floor"]["alive_bytes_per_call_at_1023"] == 2 * 1 * 1023 * 64 * 4
    assert data["control_ceil"]["clean"] and data["ok"] and not data["claim_reproduced"]
    text = rendered(nonpow2.render, data)
    assert "the article's claim does not reproduce on this machine's SDPA" in text
    assert not nonpow2._STAGED


def test_article_sections_without_a_reproduction_get_a_not_built_row():
    missing = [name for name, _ in ARTICLE_SECTIONS.values() if name not in REPROS]
    rows = not_built_rows()
    assert [r.name for r in rows] == missing
    assert all(r.measured == "not built yet" and r.fix_verified is None for r in rows)
    order = sorted([*rows, DemoRow("orphaned", "ours", "", "", "", None)], key=section_order)
    assert order[-1].name == "orphaned"


@pytest.mark.slow
def test_demo_rows_of_this_issue(kv_cli):
    code, out, err = kv_cli("demo", "--only", "nonpow2", "--only", "multimodal-ranks", "--only", "hot-reload", "--json")
    rows = {r["name"]: r for r in json.loads(out)["rows"]} if out.strip() else {}
    failed = {name: r for name, r in rows.items() if not (r["ok"] and r["fix_verified"])}
    assert code == 0 and not failed, (code, err, json.dumps(failed, indent=1)[:20000])
    assert list(rows) == ["nonpow2", "multimodal-ranks", "hot-reload"]
    assert "claim does not reproduce" in rows["nonpow2"]["measured"]
    assert rows["multimodal-ranks"]["verdict"].startswith("KVG106 ×4")
    assert rows["hot-reload"]["verdict"].startswith("KVG105 ×5 held by class kvguardian.apps.repro.reload_server")

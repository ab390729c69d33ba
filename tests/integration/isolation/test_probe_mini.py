"""The cache-sharing probe over real HTTP on loopback against the mini server (a subprocess) in each mode.

Each verdict is anytime-valid at alpha = beta = 1e-3, so a wrong verdict here is a real failure, not noise:
under load the test may only get slower or say undecided (which fails the test, loudly, with the numbers).
"""

from __future__ import annotations

import json

import pytest

from kvg_tenancy import KEYS
from kvguardian.apps.mini_server.app import MiniConfig, create_app
from kvguardian.core.exporters.webconfig import serve_asgi

pytestmark = pytest.mark.slow

PROBE = ["isolation", "cache-sharing", "--model", "kvg-mini", "--key", KEYS["acme"], "--key", KEYS["globex"],
         "--same-tenant-key", KEYS["acme2"], "--max-rps", "60", "--json"]


#: mode -> [(send a cache_salt, (caching, within a tenant, across tenants), exit code)]
CASES = {
    "global": [(False, (True, True, True), 1)],
    "per-tenant": [(False, (True, True, False), 0)],
    "off": [(False, (False, False, False), 0)],
    # no salt sent: every request shares one namespace (vLLM's semantics); a distinct salt per tenant: none
    "per-salt": [(False, (True, True, True), 1), (True, (True, True, False), 0)],
}


@pytest.fixture(scope="module", params=list(CASES))
def server(request):
    """The mini server in this process (its threads have the cores while the probe, a subprocess, runs)."""
    keys = tuple(f"{t}={k}" for t, k in (("acme", KEYS["acme"]), ("globex", KEYS["globex"]),
                                         ("acme", KEYS["acme2"])))
    app = create_app(MiniConfig(cache_mode=request.param, api_keys=keys))
    with serve_asgi(app, lifespan="on") as url:
        yield request.param, url


def test_probe_verdict_per_mode(kv_cli, server, tmp_path):
    mode, url = server
    for salt, expected, code in CASES[mode]:
        rc, out, err = kv_cli(*PROBE, "--url", url, *(["--salt-field", "cache_salt"] if salt else []))
        data = json.loads(out)
        got = (data["caching"], data["shared_within_tenant"], data["shared_across_tenants"])
        assert got == expected, (mode, salt, json.dumps(data["levels"], indent=1), err)
        assert rc == code
        for name in ("caching", "shared_within_tenant", "shared_across_tenants"):
            level = data["levels"][name]
            assert 1 <= level["samples"] <= 60
            assert level["p_value"] <= 1e-3 if level["verdict"] else level["p_value_effect"] <= 1e-3
        for key in KEYS.values():  # keys are named by position, never printed
            assert key not in out and key not in err
        assert [f["id"] for f in data["findings"]] == (["KVG212"] if code == 1 else [])
        report = tmp_path / "probe.json"
        report.write_text(out)  # the JSON is a kv-guardian report too: the exporter serves its finding
        rc, text, err = kv_cli("exporter", "--once", "--report", str(report))
        line = next(ln for ln in text.splitlines() if 'id="KVG212"' in ln and not ln.startswith("#"))
        assert rc == 0 and line.endswith(" 1.0" if code == 1 else " 0.0"), (line, err)

"""API keys -> tenants and cache modes -> prefix-cache namespaces (the mini server's isolation rules)."""

from __future__ import annotations

import pytest

from kvguardian.apps.mini_server.tenancy import KeyRing, namespace_of
from kvguardian.core.errors import UsageError


def test_keys_map_to_tenants_and_are_kept_as_digests(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# comment\nglobex sk=b==\n")
    ring = KeyRing.from_pairs(["acme=sk-a"], [str(f)])
    assert ring.tenant_of("Bearer sk-a") == "acme" and ring.tenant_of("bearer sk=b==") == "globex"
    assert ring.tenant_of("Bearer nope") is None and ring.tenant_of(None) is None
    assert ring.tenant_of("Basic c2stYQ==") is None
    assert "sk-a" not in repr(ring)  # digests only
    j = tmp_path / "keys.json"
    j.write_text('{"sk-c": "initech"}')
    assert KeyRing.from_pairs([], [str(j)]).tenant_of("Bearer sk-c") == "initech"
    assert KeyRing.from_pairs([]).tenant_of(None) == "default"  # no keys: one anonymous tenant


@pytest.mark.parametrize(("pairs", "message"), [
    (["acme"], "expected TENANT=KEY"),
    (["bad!=k"], "tenant name"),
    (["acme=k", "globex=k"], "also given"),
])
def test_bad_keys_never_print_the_key(pairs, message):
    with pytest.raises(UsageError, match=message) as info:
        KeyRing.from_pairs(pairs)
    assert "=k" not in str(info.value) or message == "tenant name"


def test_namespaces_per_mode():
    assert namespace_of("global", "acme", "s") == namespace_of("global", "globex", None) == "all"
    assert namespace_of("per-salt", "acme", "s") == namespace_of("per-salt", "globex", "s")  # vLLM: salt only
    assert namespace_of("per-salt", "acme", None) == namespace_of("per-salt", "globex", None)
    assert namespace_of("per-salt", "acme", "s") != namespace_of("per-salt", "acme", "t")
    assert namespace_of("per-tenant", "acme", None) is None  # the tenant's own namespace
    assert namespace_of("per-tenant", "acme", "s") != namespace_of("per-tenant", "globex", "s")
    assert "s3cr3t" not in (namespace_of("per-salt", "a", "s3cr3t") or "")

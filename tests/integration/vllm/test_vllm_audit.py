"""The cache-sharing audit against a real vLLM server on CPU (the real-vLLM test job).

It needs that job's server fixtures (helper branch ``vllm``): ``vllm_server`` (prefix caching on, the
default) and ``vllm_server_no_prefix_caching`` (started with ``--no-enable-prefix-caching``), each an object
with ``.url`` (base URL) and ``.model`` (model id). Without them these tests skip, saying so; once the
fixtures land they run as they are.

- no salt: vLLM's prefix cache is global, so two "tenants" share it -> sharing detected (exit 1);
- a distinct ``cache_salt`` per tenant -> no sharing across tenants (exit 0), while the same salt shares;
- ``--no-enable-prefix-caching`` -> no caching at all.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def server(request: pytest.FixtureRequest, name: str):
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.skip(f"the real-vLLM fixture {name!r} is not here (tests/integration/vllm/conftest.py of the "
                    "vLLM test job); these audit tests run once it lands")


def audit(kv_cli, srv, *extra):
    rc, out, err = kv_cli("audit", "cache-sharing", "--url", srv.url, "--model", srv.model, "--key", "tenant-a",
                          "--key", "tenant-b", "--max-rps", "30", "--json", *extra, timeout=900)
    assert out, err
    return rc, json.loads(out), err


def test_vllm_without_salt_shares_across_tenants(kv_cli, request):
    rc, data, err = audit(kv_cli, server(request, "vllm_server"))
    assert data["caching"] is True and data["shared_across_tenants"] is True, (data["levels"], err)
    assert rc == 1


def test_vllm_with_a_cache_salt_per_tenant_does_not(kv_cli, request):
    rc, data, err = audit(kv_cli, server(request, "vllm_server"), "--salt-field", "cache_salt")
    assert data["shared_within_tenant"] is True  # same salt, other key: vLLM shares (the salt is the tenant)
    assert data["shared_across_tenants"] is False, (data["levels"], err)
    assert rc == 0


def test_vllm_without_prefix_caching_caches_nothing(kv_cli, request):
    rc, data, err = audit(kv_cli, server(request, "vllm_server_no_prefix_caching"))
    assert (data["caching"], data["shared_across_tenants"]) == (False, False), (data["levels"], err)
    assert rc == 0

"""The Redis exporter over TLS with basic auth (the same web config as every kv-guardian endpoint)."""

from __future__ import annotations

import pytest
from kvg_redis import RedisProc

from kvg_tenancy import USERS, assert_guarded, client_ctx, web_config_file
from kvguardian.core.exporters.webconfig import load_web_config


@pytest.mark.services
def test_redis_exporter_over_tls_with_basic_auth(tmp_path):
    from kvguardian.keyspace.exporter import Exporter
    from kvguardian.keyspace.scan import ScanOptions

    cfg = load_web_config(web_config_file(tmp_path, USERS))
    redis = RedisProc(tmp_path / "redis")  # a real redis-server
    exp = Exporter(redis.url, ScanOptions(), interval=3600)
    try:
        host, port = exp.serve(0, "127.0.0.1", web_config=cfg)
        assert b"kvguardian_redis" in assert_guarded(host, port, "/metrics", client_ctx(tmp_path))
    finally:
        exp.close()
        redis.stop()

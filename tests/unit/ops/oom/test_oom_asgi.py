"""The ASGI middleware on a real FastAPI app (httpx's ASGI transport): /ready, 503 + Retry-After while
draining, /drain waiting for in-flight requests, handlers raising Overloaded, exempt paths."""

import asyncio

import httpx
import pytest

from kvg_oom import Knob
from kvguardian.ops.oom.asgi import OOMMiddleware, install
from kvguardian.ops.oom.guard import OOMGuard, Overloaded

pytest.importorskip("fastapi")


def make_app(oom):
    from fastapi import FastAPI

    app = FastAPI()
    gate = asyncio.Event()

    @app.get("/slow")
    async def slow():
        await gate.wait()
        return {"ok": True}

    @app.get("/fast")
    async def fast():
        return {"ok": True}

    @app.get("/big")
    def big():
        oom.admit(10_000)  # more than the whole limit: refused
        return {"ok": True}

    @app.get("/metrics")
    async def metrics():
        return {"metrics": True}

    install(app, oom, drain_deadline=5.0)
    return app, gate


def client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def run_client(app, scenario):
    """``await scenario(c)`` with a client `c` on ``app``, in a fresh event loop."""

    async def go():
        async with client(app) as c:
            await scenario(c)

    asyncio.run(go())


def test_ready_and_admission_follow_the_pressure():
    knob = Knob(used=100)
    oom = OOMGuard([knob], retry_after=2.2)
    app, _ = make_app(oom)

    async def scenario(c):
        assert (await c.get("/ready")).status_code == 200
        assert (await c.get("/fast")).json() == {"ok": True}
        knob.used = 980
        oom.sample()
        r = await c.get("/ready")
        assert r.status_code == 503 and r.json()["draining"]
        r = await c.get("/fast")
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert r.json()["error"]["reason"] == "draining"
        assert (await c.get("/metrics")).status_code == 200  # exempt: scrapes go on while draining
        knob.used = 500
        oom.sample()
        assert (await c.get("/fast")).status_code == 200

    run_client(app, scenario)


def test_a_handler_raising_overloaded_gets_503_with_retry_after():
    oom = OOMGuard([Knob(used=100)])
    app, _ = make_app(oom)

    async def scenario(c):
        r = await c.get("/big")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["reason"] == "projected"

    run_client(app, scenario)


def test_drain_waits_for_in_flight_requests_then_reports_ready_to_stop():
    oom = OOMGuard([Knob(used=100)])
    app, gate = make_app(oom)

    async def scenario(c):
        slow = asyncio.create_task(c.get("/slow"))
        while oom.in_flight == 0:
            await asyncio.sleep(0.01)
        drain = asyncio.create_task(c.post("/drain"))
        await asyncio.sleep(0.3)
        assert not drain.done()  # one request is still in flight
        assert (await c.get("/fast")).status_code == 503  # no new admissions
        gate.set()
        assert (await slow).status_code == 200
        r = await drain
        assert r.status_code == 200 and r.json()["drained"] and r.json()["in_flight"] == 0
        assert (await c.get("/ready")).status_code == 503 and oom.ready_to_stop

    run_client(app, scenario)


def test_drain_deadline_answers_504_and_bad_deadline_400():
    oom = OOMGuard([Knob(used=100)])
    app, gate = make_app(oom)

    async def scenario(c):
        assert (await c.get("/drain?deadline=soon")).status_code == 400
        slow = asyncio.create_task(c.get("/slow"))
        while oom.in_flight == 0:
            await asyncio.sleep(0.01)
        r = await c.get("/drain?deadline=0.2")
        assert r.status_code == 504 and r.json() == {**r.json(), "drained": False, "in_flight": 1}
        gate.set()
        await slow

    run_client(app, scenario)


def test_plain_asgi_apps_work_and_lifespan_passes_through():
    oom = OOMGuard([Knob(used=100)])
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"hi"})

    mw = OOMMiddleware(app, oom)

    async def go():
        async with client(mw) as c:
            assert (await c.get("/x")).text == "hi"
            assert (await c.get("/ready")).json()["ready"]
        await mw({"type": "lifespan"}, None, None)

    asyncio.run(go())
    assert seen == ["http", "lifespan"]
    assert issubclass(Overloaded, Exception)

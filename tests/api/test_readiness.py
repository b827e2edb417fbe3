"""`/readyz` follows a remote encoder (`CNCLIP_ENCODER=triton://…`): 503 `encoder_unavailable` while its
server is unreachable, not ready or silent, 200 again when it answers; asked at most once per interval,
never waited on past the health check's timeout. And the named checks of api/readiness.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Response

from api.config import Settings
from api.errors import UNAVAILABLE_RETRY_AFTER_S
from api.readiness import Probe, Readiness
from indexer.errors import DatabaseUnavailable
from retrieval.errors import CnclipError, EncoderUnavailable
from retrieval.remote import HEALTH_TIMEOUT_S, TritonEncoder
from tests.support.api_helpers import api_client
from tests.support.kserve_server import ServerThread, local_encoder, v2_app
from tests.support.tcp_proxy import TcpProxy

INTERVAL_S = 0.2  # CNCLIP_READINESS_INTERVAL_S in these tests


class HealthRoute:
    """The remote's `/v2/health/ready`, as a test wants it: "ok" (200), "loading" (400, as Triton while
    its models load) or "stalled" (no answer for a minute); counts the questions."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.asked = 0

    def install(self, app: FastAPI) -> None:
        @app.get("/v2/health/ready")
        async def ready() -> Response:
            self.asked += 1
            if self.mode == "stalled":
                await asyncio.sleep(60)
            return Response(status_code=200 if self.mode == "ok" else 400)


@pytest.fixture
def remote_api(settings: Settings) -> Iterator[tuple[Any, TcpProxy, HealthRoute]]:
    """The API on a TritonEncoder that reaches a v2 server through a proxy a test can cut."""
    health = HealthRoute()
    with (
        ServerThread(v2_app(local_encoder(settings), health.install)) as server,
        TcpProxy(("127.0.0.1", server.port)) as proxy,
    ):
        fast = settings.model_copy(update={"readiness_interval_s": INTERVAL_S})
        encoder = TritonEncoder(fast, url=f"triton://127.0.0.1:{proxy.port}", timeout_s=10.0, retries=0)
        with api_client(fast, encoder=encoder) as client:
            yield client, proxy, health


def readyz_after_interval(client: Any) -> Any:
    time.sleep(INTERVAL_S * 1.5)  # past the probe's cache
    return client.get("/readyz")


def assert_encoder_unavailable(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "encoder_unavailable"
    assert response.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)


def test_readyz_is_503_while_the_remote_encoder_is_unreachable_and_200_when_it_is_back(
    remote_api: tuple[Any, TcpProxy, HealthRoute], caplog: pytest.LogCaptureFixture
) -> None:
    client, proxy, _ = remote_api
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client.post("/v1/embed/text", json={"texts": ["猫"]}).status_code == 200

    proxy.cut()
    with caplog.at_level(logging.WARNING, logger="cnclip.api"):
        assert_encoder_unavailable(readyz_after_interval(client))
    assert_encoder_unavailable(client.post("/v1/embed/text", json={"texts": ["一只狗"]}))  # what readyz foretold
    reasons = [r.getMessage() for r in caplog.records if r.getMessage().startswith("readiness:")]
    assert any("remote encoder" in m and f"cannot reach Triton server at 127.0.0.1:{proxy.port}" in m for m in reasons)

    proxy.restore()
    assert readyz_after_interval(client).json() == {"status": "ready"}
    assert client.post("/v1/embed/text", json={"texts": ["一只狗"]}).status_code == 200


def test_readyz_is_503_while_the_remote_server_says_it_is_not_ready(
    remote_api: tuple[Any, TcpProxy, HealthRoute],
) -> None:
    client, _, health = remote_api
    assert client.get("/readyz").status_code == 200
    health.mode = "loading"  # a restarted Triton whose models still load
    assert_encoder_unavailable(readyz_after_interval(client))
    health.mode = "ok"
    assert readyz_after_interval(client).status_code == 200


def test_a_silent_remote_makes_readyz_503_within_the_health_timeout_and_asks_once_per_interval(
    remote_api: tuple[Any, TcpProxy, HealthRoute],
) -> None:
    client, _, health = remote_api
    assert client.get("/readyz").status_code == 200
    time.sleep(INTERVAL_S * 1.5)
    asked, started = health.asked, time.monotonic()
    for _ in range(20):  # a load balancer's burst: a question to the remote per interval, the rest cached
        assert client.get("/readyz").status_code == 200
    assert 1 <= health.asked - asked <= 1 + (time.monotonic() - started) / INTERVAL_S

    health.mode = "stalled"
    time.sleep(INTERVAL_S * 1.5)
    started = time.monotonic()
    assert_encoder_unavailable(client.get("/readyz"))
    assert time.monotonic() - started < HEALTH_TIMEOUT_S + 3.0  # never the remote's minute (slack: a loaded CI)
    health.mode = "ok"
    deadline = time.monotonic() + HEALTH_TIMEOUT_S + 5
    while client.get("/readyz").status_code != 200:  # the stalled question gives up, the next one answers
        assert time.monotonic() < deadline, "readyz did not come back after the remote answered again"
        time.sleep(INTERVAL_S)


def test_readiness_answers_the_first_problem_of_its_named_checks_in_order() -> None:
    calls: list[str] = []

    def check(name: str, fails: bool) -> Any:
        async def run() -> None:
            calls.append(name)
            if fails:
                raise CnclipError(f"{name} is away")

        return run

    async def scenario() -> list[CnclipError | None]:
        readiness = Readiness()
        readiness.add(Probe("the database", check("db", False), DatabaseUnavailable, interval_s=60))
        readiness.add(Probe("the watcher", check("watch", True), EncoderUnavailable, interval_s=60))
        readiness.add(Probe("the encoder", check("enc", True), EncoderUnavailable, interval_s=60))
        return [await readiness.problem(), await readiness.problem()]

    first, again = asyncio.run(scenario())
    assert isinstance(first, EncoderUnavailable) and first.message == "the watcher: watch is away"
    assert isinstance(again, EncoderUnavailable) and again is not first  # a fresh error per answer
    assert sorted(calls) == ["db", "enc", "watch"]  # each asked once: the second answer came from the cache


class SlowEncoder:
    """Wraps an encoder: every text inference takes `delay_s` (a busy server)."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def embed_token_ids(self, ids: Any) -> Any:
        await asyncio.sleep(self.delay_s)
        return await self.inner.embed_token_ids(ids)


def test_a_busy_remote_is_not_reported_down(settings: Settings) -> None:
    """Inference holding every pooled connection (here the one of `connections=1`) must not starve the
    health check: it has a connection of its own, so a busy server is not "down" to a load balancer."""
    with ServerThread(v2_app(SlowEncoder(local_encoder(settings), delay_s=3.0))) as server:
        encoder = TritonEncoder(settings, url=f"triton://{server.url}", timeout_s=10.0, retries=0, connections=1)

        async def scenario() -> float:
            await encoder.start()
            try:
                busy = asyncio.create_task(encoder.embed_texts(["一只猫"]))
                await asyncio.sleep(0.3)  # the inference holds the pool's only connection
                started = time.monotonic()
                await encoder.check_health()
                took = time.monotonic() - started
                assert not busy.done()
                await busy
                return took
            finally:
                await encoder.close()

        assert asyncio.run(scenario()) < 1.0

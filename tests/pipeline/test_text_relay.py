"""Forwarded requests to text-only workers (pipeline/text_relay.py): load-only choice among
the workers that list the model, the slot held while the answer is read and freed however
it ends, the breaker told, one more worker tried when a connection is refused."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.pipeline.text_relay import TextRelay, takes_text
from gateway.protocol.errors import GatewayError
from gateway.workers.transport import CallCode, WorkerCallError
from tests.fake_transport import FakeTransport, fleet


@dataclass
class _Answer:
    status: int = 200
    failed: bool = False
    closed: bool = False
    on_data: Any = None

    def close(self) -> None:
        self.closed = True


@dataclass
class TextTransport(FakeTransport):
    """A fake OpenAI backend: lists ``models``, answers ``forward`` from ``answers``."""

    models: tuple[str, ...] = ("m",)
    answers: list[Any] = field(default_factory=list)
    forwarded: list[tuple[str, bytes]] = field(default_factory=list)
    lacks: frozenset[str] = frozenset({"token_ids"})

    async def forward(self, path: str, body: bytes, request_id: str | None = None) -> Any:
        self.forwarded.append((path, body))
        answer = self.answers.pop(0) if self.answers else _Answer()
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_only_text_workers_that_list_the_model_serve_it_and_token_workers_keep_their_pools() -> None:
    a, b = TextTransport("http://a:1", models=("m", "n")), TextTransport("http://b:1", models=("m",))
    tokens = FakeTransport("grpc://c:1")
    f = await fleet(a, b, tokens)
    relay = TextRelay(f.registry)
    assert relay.serves("m") and relay.serves("n") and not relay.serves("default") and not relay.serves(None)
    assert relay.models() == ["m", "n"]
    assert [takes_text(w) for w in f.registry.all()] == [True, True, False]
    assert [w.id for w in f.registry.pool(None, "regular")] == ["c:1"]  # never offered to token policies


async def test_the_least_loaded_worker_gets_it_and_its_slot_is_held_until_the_answer_is_done() -> None:
    a, b = TextTransport("http://a:1"), TextTransport("http://b:1")
    f = await fleet(a, b)
    relay = TextRelay(f.registry)
    busy = f.worker("a:1").load.acquire(0, 0)
    async with relay.relay("m", "/v1/completions", b"{}", "r1") as answer:
        assert f.worker("b:1").load.in_flight == 1
        progress = f.worker("b:1").progress
        verdict = progress.judge(time.monotonic(), in_flight=1, queued_prefill_tokens=0)
        assert not verdict.stalled and verdict.silent_s < 1.0  # the watchdog saw the answer begin
        before = progress.last_message_at
        answer.on_data()  # a piece of a streamed answer is progress too
        assert progress.last_message_at >= before
    assert answer.closed and f.worker("b:1").load.in_flight == 0
    assert b.forwarded == [("/v1/completions", b"{}")] and not a.forwarded
    busy.release()


async def test_a_refused_connection_moves_on_once_and_the_slot_is_freed_every_way() -> None:
    down = WorkerCallError(CallCode.UNAVAILABLE, "refused")
    a, b = TextTransport("http://a:1", answers=[down, down]), TextTransport("http://b:1", answers=[down, down])
    f = await fleet(a, b)
    relay = TextRelay(f.registry)
    with pytest.raises(GatewayError) as caught:
        async with relay.relay("m", "/v1/completions", b"{}", "r"):
            pass
    assert caught.value.status == 502 and len(a.forwarded) + len(b.forwarded) == 2  # each worker once
    assert all(w.load.in_flight == 0 for w in f.registry.all())
    assert all(w.breaker.consecutive_failures == 1 for w in f.registry.all())

    a.answers, b.answers = [], []
    with pytest.raises(RuntimeError):
        async with relay.relay("m", "/v1/completions", b"{}", "r2"):
            raise RuntimeError("the client's side failed")
    broken = _Answer(failed=True)
    a.answers, b.answers = [broken], [broken]
    async with relay.relay("m", "/v1/completions", b"{}", "r3"):
        pass  # the answer's body broke while it was read
    assert all(w.load.in_flight == 0 for w in f.registry.all())
    assert sum(w.breaker.consecutive_failures for w in f.registry.all()) == 3


async def test_no_available_worker_is_a_503() -> None:
    f = await fleet(TextTransport("http://a:1"))
    f.worker("a:1").draining = True
    with pytest.raises(GatewayError) as caught:
        TextRelay(f.registry).pick("m")
    assert caught.value.status == 503

"""Worker: the load view a policy reads is the last poll with its age."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from gateway.policies.base import LoadSnapshot, WorkerView
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers import worker as worker_module
from gateway.workers.worker import PAGE_SIZE_UNKNOWN, Roster, Worker, WorkerInfo
from tests.fake_transport import FakeTransport


def _worker() -> Worker:
    return Worker("grpc://127.0.0.1:5000", FakeTransport("grpc://127.0.0.1:5000"), WorkerInfo(model="m"))  # type: ignore[arg-type]


def test_no_poll_no_view() -> None:
    assert _worker().loads_view() is None


def test_the_view_is_the_last_poll_with_its_age(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _worker()
    clock = [100.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    w.polled, w.polled_at = LoadSnapshot(num_running_reqs=3), 98.0
    view = w.loads_view()
    assert view is not None and view.num_running_reqs == 3 and view.age_s == pytest.approx(2.0)
    assert w.loads_view() is view  # read again within the reuse window: the same copy
    clock[0] += 1.0
    later = w.loads_view()
    assert later is not None and later.age_s == pytest.approx(3.0)  # past it: the age moves on
    w.polled, w.polled_at = LoadSnapshot(num_running_reqs=7), clock[0]
    fresh = w.loads_view()  # a new poll is seen at once, whatever the window
    assert fresh is not None and fresh.num_running_reqs == 7 and fresh.age_s == 0.0
    assert worker_module.LOADS_VIEW_REUSE_S <= 0.05


def test_real_clock_view_age_is_not_negative() -> None:
    w = _worker()
    w.polled, w.polled_at = LoadSnapshot(), time.monotonic() + 5  # a clock that moved back
    view = w.loads_view()
    assert view is not None and view.age_s == 0.0


def _fresh_view(w: Worker) -> object:
    """The view built from nothing (what ``view`` returned before it reused views)."""
    w._view = None
    return w.view()


def test_a_view_is_reused_only_while_every_figure_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: 100.0)  # one clock tick: a loads copy's age stands
    w = _worker()
    first = w.view()
    assert w.view() is first  # nothing changed: the same object
    changes = [
        lambda: w.load.acquire(100, 8),
        lambda: setattr(w.remote_load, "in_flight", 2),
        lambda: setattr(w.remote_load, "queued_prefill_tokens", 40),
        lambda: setattr(w.remote_load, "running_decode_tokens", 9),
        lambda: setattr(w, "sibling_queued_prompt_tokens", 2176),
        lambda: setattr(w, "peer_queued_prompt_tokens", 640),
        lambda: setattr(w, "healthy", False),
        lambda: setattr(w, "healthy", True),
        lambda: setattr(w, "polled", LoadSnapshot(num_running_reqs=5)),
        lambda: setattr(w, "info", WorkerInfo(model="m", page_size=16, kv_capacity_tokens=4096, max_running_requests=3)),
        lambda: setattr(w, "bootstrap_port", 8998),
        lambda: w.trip("stalled"),
        lambda: (w.breaker.record_success(), setattr(w, "breaker", type(w.breaker)())),
        lambda: setattr(w, "draining", True),
    ]
    before = w.view()
    for change in changes:
        change()
        now = w.view()
        assert now == _fresh_view(w)  # always what a fresh build says
        assert now != before
        before = w.view()
        assert w.view() is before
    assert w.view().remote_queued_prompt_tokens == 2176 + 640  # the siblings' and the replicas' queued prompts reach the policy


def test_every_view_field_has_writers_and_the_view_sees_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every WorkerView field, changed the ways the gateway changes it (the load through its
    guard, the info in place and replaced, the breaker's cooldown and the loads' age as time
    passes), gives a view equal to a fresh build, and a new one; nothing else does."""
    clock = [100.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    w = _worker()
    guards = [w.load.acquire(100, 8)]

    def tick(seconds: float) -> None:
        clock[0] += seconds

    writers: dict[str, list[Callable[[], object]]] = {
        "worker_id": [lambda: setattr(w, "id", "127.0.0.1:5000@0")],
        "url": [lambda: setattr(w, "url", "grpc://localhost:5000")],
        "role": [lambda: setattr(w, "role", "prefill")],
        "available": [
            lambda: setattr(w, "healthy", False), lambda: setattr(w, "healthy", True),
            lambda: setattr(w, "draining", True), lambda: setattr(w, "draining", False),
            lambda: w.trip("stalled"), lambda: tick(w.breaker.cooldown_s),  # open; half-open by time alone
        ],
        "in_flight": [lambda: guards.append(w.load.acquire(10, 2)), lambda: setattr(w.remote_load, "in_flight", 2)],
        "queued_prefill_tokens": [lambda: guards[0].first_token()],
        "running_decode_tokens": [lambda: guards[0].release(), lambda: setattr(w.remote_load, "running_decode_tokens", 9)],
        "remote_prefill_tokens": [
            lambda: setattr(w.remote_load, "queued_prefill_tokens", 40), lambda: setattr(w, "remote_load", type(w.load)()),
        ],
        "loads": [
            lambda: setattr(w, "polled", LoadSnapshot(num_running_reqs=5)),
            lambda: tick(2 * worker_module.LOADS_VIEW_REUSE_S),  # the same poll, older
        ],
        "kv_capacity_tokens": [
            lambda: setattr(w.info, "kv_capacity_tokens", 4096),
            lambda: setattr(w, "info", dataclasses.replace(w.info, kv_capacity_tokens=8192)),
        ],
        "page_size": [lambda: w.info.learn_page_size(16), lambda: setattr(w.info, "page_size", 32)],
        "max_running_requests": [lambda: setattr(w.info, "max_running_requests", 3)],
        "bootstrap_port": [lambda: setattr(w, "bootstrap_port", 8998)],
        "remote_queued_prompt_tokens": [
            lambda: setattr(w, "sibling_queued_prompt_tokens", 2176), lambda: setattr(w, "peer_queued_prompt_tokens", 640),
        ],
    }
    assert list(writers) == [f.name for f in dataclasses.fields(WorkerView)]  # a new field needs its writers here
    before = w.view()
    for field, changes in writers.items():
        for change in changes:
            change()
            now = w.view()
            assert now == _fresh_view(w), field  # always what a fresh build says
            assert now != before and getattr(now, field) != getattr(before, field), field
            before = w.view()
            assert w.view() is before, field  # and nothing more changed: the same object again
    # Writes that leave every field as it was give the same figures (a view may be rebuilt).
    w.info.start_time = 5.0
    w.healthy = True
    assert w.view() == before


def test_writes_are_counted_where_views_and_pool_memos_read_them() -> None:
    """``version`` counts writes to the view's rare inputs; ``Roster.writes`` those that decide
    who is in a pool (an info's fields too, changed in place); per-request writes count in neither."""
    w = _worker()
    for name, value in [("id", "x:1"), ("url", "grpc://x:1"), ("role", "decode"), ("bootstrap_port", 1),
                        ("info", WorkerInfo(model="m")), ("sibling_queued_prompt_tokens", 3),
                        ("peer_queued_prompt_tokens", 4), ("healthy", False), ("draining", False)]:  # fmt: skip
        version = w.version
        setattr(w, name, value)
        assert w.version == version + 1, name
    for name, value in [("id", "y:1"), ("role", "regular"), ("info", WorkerInfo(model="n")), ("draining", True),
                        ("client", w.client)]:  # fmt: skip
        roster = Roster.writes
        setattr(w, name, value)
        assert Roster.writes > roster, name
    roster, version, info_version = Roster.writes, w.version, w.info.version
    w.info.page_size = 16
    assert Roster.writes > roster and w.info.version > info_version and w.version == version
    roster = Roster.writes
    w.last_ok_at, w.polled, w.polled_at = 1.0, LoadSnapshot(), 2.0
    w.load.acquire(10, 2).release()
    w.view()
    assert (Roster.writes, w.version) == (roster, version)


def _info(args: dict[str, object], sched: dict[str, object] | None = None, **model: object) -> WorkerInfo:
    server = pb.GetServerInfoResponse()
    server.server_args.update(args)
    if sched is not None:
        server.scheduler_info.update(sched)
    return WorkerInfo.from_replies(pb.GetModelInfoResponse(served_model_name="m", **model), server)  # type: ignore[arg-type]


def test_worker_info_keeps_placeholders_apart_and_reads_server_args() -> None:
    """GetModelInfo's max_context_length is the KV pool and its vocab/EOS are placeholders:
    kept only as 'reported'; null server arguments are unknown, not zero."""
    info = _info(
        {"page_size": None, "context_length": None, "sampling_defaults": "openai"},
        max_context_length=65536, vocab_size=128256, eos_token_ids=[], max_req_input_len=40954,
        default_sampling_params_json='{"temperature":0.6}',
    )
    assert info.kv_pool_tokens == 65536 and info.reported_vocab_size == 128256
    assert info.max_req_input_len == 40954 and info.context_length_arg is None
    assert info.sampling_defaults_mode == "openai" and info.default_sampling_json == '{"temperature":0.6}'
    assert (info.page_size, info.page_size_source) == (1, PAGE_SIZE_UNKNOWN)
    assert _info({"context_length": 8192}).context_length_arg == 8192


def test_page_size_comes_from_the_most_reliable_source() -> None:
    assert (_info({"page_size": 64}).page_size, _info({"page_size": 64}).page_size_source) == (64, "server_args.page_size")
    reported = _info({"page_size": None}, {"page_size": 32})
    assert (reported.page_size, reported.page_size_source) == (32, "scheduler_info.page_size")
    unknown = _info({})
    assert unknown.learn_page_size(16) and (unknown.page_size, unknown.page_size_source) == (16, "kv_events")
    assert not unknown.learn_page_size(16)
    assert not reported.learn_page_size(16) and reported.page_size == 32  # a report wins over events


def test_a_worker_matches_stop_strings_only_when_it_says_it_has_a_tokenizer() -> None:
    """SGLang reports skip_tokenizer_init: false means its scheduler matches stop strings;
    true, or not reported at all (other engines, the simulator), means it cannot."""
    assert _info({"skip_tokenizer_init": False}).matches_stop_strings is True
    assert _info({"skip_tokenizer_init": True}).matches_stop_strings is False
    assert _info({}).matches_stop_strings is False


def test_rank_ids_are_the_engine_id_and_the_rank() -> None:
    assert worker_module.rank_id("h:1", None) == "h:1" and worker_module.rank_id("h:1", 3) == "h:1@3"
    assert worker_module.engine_of("h:1@3") == "h:1" and worker_module.engine_of("h:1") == "h:1"
    assert worker_module.engine_of("[::1]:5@0") == "[::1]:5" and worker_module.engine_of("a@b:1") == "a@b:1"


def _ranked(client: FakeTransport, rank: int | None, dp: int = 4) -> Worker:
    return Worker(client.url, client, WorkerInfo(model="m", dp_size=dp), dp_rank=rank)  # type: ignore[arg-type]


def test_a_rank_is_a_target_of_its_own_sharing_the_engine() -> None:
    client = FakeTransport("grpc://127.0.0.1:5000")
    ranks = [_ranked(client, r) for r in range(4)]
    assert [w.id for w in ranks] == [f"127.0.0.1:5000@{r}" for r in range(4)]
    assert {w.engine_id for w in ranks} == {"127.0.0.1:5000"} and len({id(w.load) for w in ranks}) == 4
    other = _worker()
    assert worker_module.one_per_engine([*ranks, other, ranks[2]]) == [ranks[0], other]
    shown = ranks[2].describe()
    assert (shown["id"], shown["engine_id"], shown["dp_rank"], shown["dp_size"]) == ("127.0.0.1:5000@2", "127.0.0.1:5000", 2, 4)
    assert "kv_events" in shown["lacks"] and "kv_events" not in other.describe()["lacks"]
    with pytest.raises(ValueError, match="dp_rank 4"):
        _ranked(client, 4)


def test_a_rank_pins_its_requests_and_a_plain_worker_clears_a_stale_pin() -> None:
    client = FakeTransport("grpc://127.0.0.1:5000")
    req = pb.GenerateRequest(request_id="r")
    _ranked(client, 0).pin(req)
    assert req.HasField("data_parallel_rank") and req.data_parallel_rank == 0  # rank 0 is a pin too
    _ranked(client, 3).pin(req)
    assert req.data_parallel_rank == 3
    _worker().pin(req)  # a retry on an engine without ranks
    assert not req.HasField("data_parallel_rank")
    embed = pb.EmbedRequest(request_id="e")
    _ranked(client, 2).pin(embed)
    assert embed.data_parallel_rank == 2
    _worker().pin(embed)
    assert embed.data_parallel_rank == 0


def test_the_watchdog_figures_leave_unstreamed_calls_out() -> None:
    w = _worker()
    silent = w.load.acquire(40, 8, silent=True)
    streamed = w.load.acquire(10, 8)
    assert w.load_figures() == (1, 50)  # held prompts all count; the silent call is not judged
    streamed.release()
    assert w.load_figures() == (0, 40)
    silent.release()

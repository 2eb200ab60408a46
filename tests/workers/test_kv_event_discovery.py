"""KV-event publishers read from what the worker reports (workers/kv_event_discovery.py and
``--kv-events-zmq auto``): each engine's config in its real shape (SGLang's server argument on
both transports, vLLM's development-mode ``/server_info`` on its HTTP server, nothing on vLLM's
gRPC), the engine's bind rule with a wildcard meaning the worker's host, a report the gateway
cannot use shown, not failing the join; and end to end, a worker that joins reporting a real
loopback ZMQ publisher feeds each rank's share until it leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import vllm_engine_pb2 as vpb
from gateway.server.config import ServerConfig
from gateway.workers import vllm_grpc_wire
from gateway.workers.kv_event_discovery import discover
from gateway.workers.kv_events import KvEventFeeder
from gateway.workers.registry import grpc_connect_with, with_engine
from gateway.workers.sglang_http import SglangHttpClient
from gateway.workers.vllm_http import VllmHttpClient
from gateway.workers.worker import WorkerInfo
from gateway.workers.zmq_kv_events import BadZmqSource, parse_sources, wants_discovery
from tests.fake_transport import FakeTransport, Fleet, fleet
from tests.workers.test_sglang_http import reply, serving
from tests.workers.test_vllm_http import MODELS
from tests.workers.test_zmq_kv_events import (
    Publisher,
    _free_pair,
    _held,
    _payload,
    _stored,
    _until,
)

# SGLang's --kv-events-config as its server arguments report it: the JSON text it took.
SGLANG_CONFIG = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events",
                            "replay_endpoint": "tcp://*:5560"})
# vLLM's KVEventsConfig as its /server_info?config_format=json dumps it (every field).
VLLM_CONFIG = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
               "replay_endpoint": None, "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": ""}


def _sglang(config: dict[str, Any]) -> str:
    return json.dumps(config)


# --- what each engine reports, read --------------------------------------------------------


def test_sglangs_config_a_wildcard_is_the_workers_host_and_the_replay_too() -> None:
    found = discover(SGLANG_CONFIG, binds_unspecified=True)
    assert found is not None and found.for_rank(1, "10.0.0.5") == ("tcp://10.0.0.5:5558", False)
    assert found.replay is not None and found.replay.for_rank(1, "10.0.0.5") == "tcp://10.0.0.5:5561"
    # SGLang binds 0.0.0.0: the gateway connects to the worker's host, never binds a wildcard.
    zeros = discover(_sglang({"publisher": "zmq", "endpoint": "tcp://0.0.0.0:6000"}), binds_unspecified=True)
    assert zeros is not None and zeros.for_rank(0, "10.0.0.5") == ("tcp://10.0.0.5:6000", False)
    # Its bind key overrides the rule: it binds a named host, the gateway connects to that host.
    named = discover(_sglang({"publisher": "zmq", "endpoint": "tcp://worker-3:6000", "bind": True}), binds_unspecified=True)
    assert named is not None and named.for_rank(2, "10.0.0.5") == ("tcp://worker-3:6002", False)
    # It connects to one address: the gateway binds that address of its own host.
    out = discover(_sglang({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:6000"}), binds_unspecified=True)
    assert out is not None and out.for_rank(1, "10.0.0.5") == ("tcp://127.0.0.1:6001", True)


def test_vllms_config_and_no_publisher() -> None:
    found = discover(json.dumps(VLLM_CONFIG), binds_unspecified=False)
    assert found is not None and found.replay is None and found.for_rank(0, "h") == ("tcp://h:5557", False)
    assert discover(json.dumps({**VLLM_CONFIG, "enable_kv_cache_events": False}), binds_unspecified=False) is None
    assert discover(_sglang({"publisher": "null"}), binds_unspecified=True) is None
    assert discover("", binds_unspecified=True) is None and discover("null", binds_unspecified=True) is None
    # The engines' default endpoint when the config names a publisher and no endpoint.
    bare = discover(_sglang({"publisher": "zmq"}), binds_unspecified=True)
    assert bare is not None and bare.for_rank(0, "h") == ("tcp://h:5557", False)


@pytest.mark.parametrize(
    ("reported", "binds_unspecified", "why"),
    [
        (json.dumps({**VLLM_CONFIG, "endpoint": "tcp://0.0.0.0:5557"}), False, "never does"),  # vLLM connects to it
        (_sglang({"publisher": "zmq", "endpoint": "tcp://*:5557", "bind": False}), True, "never does"),
        (_sglang({"publisher": "zmq", "endpoint": "tcp://gateway-host:5557"}), True, "a name is not bound"),
        (_sglang({"publisher": "kafka"}), True, "ZMQ publishers only"),
        ("{not json", True, "not JSON"),
        ("[1]", True, "not an object"),
        (_sglang({"publisher": "zmq", "endpoint": "udp://h:1"}), True, "tcp://HOST:PORT"),
    ],
)
def test_what_the_gateway_cannot_use_says_why(reported: str, binds_unspecified: bool, why: str) -> None:
    with pytest.raises(BadZmqSource, match=why):
        discover(reported, binds_unspecified=binds_unspecified)


def test_auto_is_an_item_of_the_flag_not_an_entry() -> None:
    items = ["auto", "grpc://h:1=tcp://*:5557"]
    assert wants_discovery(items) and not wants_discovery(items[1:]) and list(parse_sources(items)) == ["h:1"]
    ServerConfig(worker_urls=["grpc://h:1"], kv_events=True, kv_events_zmq=["auto"])
    with pytest.raises(ValueError, match="needs --kv-events"):
        ServerConfig(worker_urls=["grpc://h:1"], kv_events_zmq=["auto"])


async def test_sglang_reports_it_on_both_transports() -> None:
    async with serving() as (p, url):
        p.routes["/get_server_info"] = reply({"served_model_name": "qwen", "dp_size": 2, "kv_events_config": SGLANG_CONFIG,
                                              "internal_states": [{}], "version": "0.5.23"})
        client = SglangHttpClient(url)
        try:
            over_http = WorkerInfo.from_replies(pb.GetModelInfoResponse(), await client.server_info())
        finally:
            await client.close()
    over_grpc = pb.GetServerInfoResponse()  # the servicer's server_args: every argument, the config as its text
    over_grpc.server_args.update({"served_model_name": "qwen", "dp_size": 2, "kv_events_config": SGLANG_CONFIG})
    for info in (over_http, WorkerInfo.from_replies(pb.GetModelInfoResponse(), over_grpc)):
        assert info.kv_events_config == SGLANG_CONFIG
    assert WorkerInfo.from_replies(pb.GetModelInfoResponse(), pb.GetServerInfoResponse()).kv_events_config == ""


async def test_sglang_0_5_23s_server_info_the_config_auto_reads_agrees_with_its_kv_events_block() -> None:
    """SGLang 0.5.23's ``/server_info`` (``/get_server_info`` answers the same) puts its resolved
    arguments at the top, ``kv_events_config`` among them as the flag's text, and adds a
    ``kv_events`` block for routers: host (a wildcard: the worker's own), port base, replay port
    base, ranks. The block leaves out who binds (``bind``) and is missing when the page size is
    unresolved, so auto reads the config; read by the engine's rule, it names the same sockets."""
    config = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv", "replay_endpoint": "tcp://*:5560"})
    block = {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "kv", "block_size": 16,
             "dp_size": 2, "replay_endpoint_port_base": 5560}
    async with serving() as (p, url):
        p.routes["/get_server_info"] = reply({
            "model_path": "/m", "served_model_name": "qwen", "page_size": 16, "dp_size": 2, "kv_events_config": config,
            "load_publish_endpoint": None, "launch_command": "python -m sglang.launch_server ...",
            "max_total_num_tokens": 4096, "kv_events": block, "startup_time": 1.0, "internal_states": [{}, {}],
            "version": "0.5.23", "frontend": "python",
        })
        client = SglangHttpClient(url)
        try:
            info = WorkerInfo.from_replies(pb.GetModelInfoResponse(), await client.server_info())
        finally:
            await client.close()
    found = discover(info.kv_events_config, binds_unspecified=True)
    assert found is not None and found.replay is not None and info.dp_size == block["dp_size"]
    for rank in range(info.dp_size):
        assert found.for_rank(rank, "10.0.0.5") == (f"tcp://10.0.0.5:{block['endpoint_port_base'] + rank}", False)
        assert found.replay.for_rank(rank, "10.0.0.5") == f"tcp://10.0.0.5:{block['replay_endpoint_port_base'] + rank}"


async def test_vllm_reports_it_over_http_in_development_mode_only() -> None:
    async with serving() as (p, url):
        p.routes["/v1/models"] = reply(MODELS)
        p.routes["/server_info"] = reply({"vllm_config": {"model_config": {"model": "qwen"}, "kv_events_config": VLLM_CONFIG},
                                          "vllm_env": {}, "system_env": {}})
        client = VllmHttpClient(url, kv_event_discovery=True)
        try:
            info = WorkerInfo.from_replies(pb.GetModelInfoResponse(), await client.server_info())
            assert json.loads(info.kv_events_config) == VLLM_CONFIG
            del p.routes["/server_info"]  # no development mode: the route is missing, asked once
            before = len(p.headers)
            assert "kv_events_config" not in (await client.server_info()).server_args
            assert "kv_events_config" not in (await client.server_info()).server_args
            assert len(p.headers) - before == 5  # /v1/models and /metrics twice, /server_info once
        finally:
            await client.close()
    # vLLM's gRPC GetServerInfo has no KV-event configuration at all.
    grpc = vllm_grpc_wire.server_info(vpb.GetServerInfoResponse(data_parallel_size=2), None, 0)
    assert WorkerInfo.from_replies(pb.GetModelInfoResponse(), grpc).kv_events_config == ""


async def test_vllm_is_not_asked_without_auto() -> None:
    """The development-mode route is a request of its own (and vLLM collects its host's
    environment there the first time): without ``--kv-events-zmq auto`` it is never asked, on
    the join's probe or after; the engine detection keeps the setting either way."""
    async with serving() as (p, url):
        p.routes["/v1/models"] = reply(MODELS)
        p.routes["/server_info"] = reply({"vllm_config": {"kv_events_config": VLLM_CONFIG}})
        quiet = await with_engine(grpc_connect_with("h2")(url, None, None), "auto", 5.0)
        asking = await with_engine(grpc_connect_with("h2", kv_event_discovery=True)(url, None, None), "auto", 5.0)
        try:
            assert isinstance(quiet, VllmHttpClient) and isinstance(asking, VllmHttpClient)
            p.paths.clear()
            for _ in range(2):
                assert "kv_events_config" not in (await quiet.server_info()).server_args
            assert "/server_info" not in p.paths and p.paths.count("/v1/models") == 2
            assert json.loads(WorkerInfo.from_replies(pb.GetModelInfoResponse(), await asking.server_info()).kv_events_config) == VLLM_CONFIG
            assert "/server_info" in p.paths
        finally:
            await quiet.close()
            await asking.close()


# --- end to end: a worker that joins reporting a real loopback publisher ------------------------


@pytest.fixture
async def empty() -> AsyncIterator[Fleet]:
    yield await fleet(policy="cache_aware")


def _engine(config: dict[str, Any], host_port: int = 1) -> FakeTransport:
    return FakeTransport(f"grpc://127.0.0.1:{host_port}", server_args={"dp_size": 2, "kv_events_config": json.dumps(config)})


async def _join(f: Fleet, t: FakeTransport) -> None:
    f.transports[t.url] = t
    await f.registry.add(t.url)


async def test_a_joining_worker_is_fed_from_the_publisher_it_reports_until_it_leaves(empty: Fleet) -> None:
    f, port = empty, _free_pair()
    feeder = KvEventFeeder(f.registry, f.router, discover=True)
    feeder.start()
    pubs = [Publisher(f"tcp://127.0.0.1:{port + r}", bind=True) for r in (0, 1)]  # SGLang binds tcp://*:PORT
    try:
        await _join(f, _engine({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}))
        zero, one = feeder.feeds["127.0.0.1:1@0"], feeder.feeds["127.0.0.1:1@1"]
        assert (zero.source, one.source) == (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
        assert zero.describe()["endpoint_from"] == "server_info"
        row = f.worker("127.0.0.1:1@1").describe()
        assert "kv_events" not in row["lacks"] and row["kv_events_problem"] is None  # type: ignore[operator]
        for pub in pubs:
            await pub.subscribed()
        await pubs[0].send(0, _payload(_stored([11], [1, 2]), rank=0))
        await pubs[1].send(0, _payload(_stored([21, 22], [3, 4, 5, 6]), rank=1))
        await _until(lambda: zero.batches == 1 and one.batches == 1)
        assert _held(f, "127.0.0.1:1@0", [1, 2]) == 2 and _held(f, "127.0.0.1:1@1", [3, 4, 5, 6]) == 4
        assert _held(f, "127.0.0.1:1@0", [3, 4]) == 0

        tasks = [feeder._tasks["127.0.0.1:1@0"], feeder._tasks["127.0.0.1:1@1"]]
        await f.registry.remove("127.0.0.1:1", drain_timeout_s=0)
        await _until(lambda: all(t.done() for t in tasks))
        assert not feeder.feeds and not feeder._tasks
    finally:
        for pub in pubs:
            pub.close()
        await feeder.close()


async def test_an_entry_wins_and_an_unusable_report_is_shown_not_fatal(empty: Fleet) -> None:
    f, port = empty, _free_pair()
    explicit = parse_sources([f"grpc://127.0.0.1:1=tcp://*:{port}"])
    feeder = KvEventFeeder(f.registry, f.router, zmq_sources=explicit, discover=True)
    feeder.start()
    try:
        # The worker reports another port; the operator's entry is read.
        await _join(f, _engine({"publisher": "zmq", "endpoint": "tcp://*:9"}))
        feed = feeder.feeds["127.0.0.1:1@1"]
        assert feed.source == f"tcp://127.0.0.1:{port + 1}" and feed.endpoint_from == "--kv-events-zmq"

        # A worker reporting a name it connects to: it joins, its ranks learn from routing, GET /workers says why.
        await _join(f, _engine({"publisher": "zmq", "endpoint": "tcp://gateway.example:7000"}, host_port=2))
        ranks = [f.worker(f"127.0.0.1:2@{r}") for r in (0, 1)]
        assert all(w.healthy for w in ranks)
        for w in ranks:
            row = w.describe()
            assert "a name is not bound" in str(row["kv_events_problem"]) and "kv_events" in row["lacks"]  # type: ignore[operator]
        assert "127.0.0.1:2@0" not in feeder.feeds

        # One rank, reporting nothing usable: it keeps the SubscribeKvEvents stream it would have had.
        single = FakeTransport("grpc://127.0.0.1:3", server_args={"kv_events_config": _sglang({"publisher": "kafka"})})
        await _join(f, single)
        assert feeder.feeds["127.0.0.1:3"].source == "SubscribeKvEvents"
        assert "ZMQ publishers only" in f.worker("127.0.0.1:3").kv_events_problem
    finally:
        await feeder.close()


async def test_vllms_report_unanswered_in_time_is_pending_and_read_when_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM collects its host's environment on the development route's first call (seconds on a
    loaded host): past the bound the client says the report is pending, and the next ask reads it."""
    monkeypatch.setattr("gateway.workers.vllm_http.DEV_INFO_TIMEOUT_S", 0.2)
    calls = 0

    async def slow_first(request: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(0.6)
        return await reply({"vllm_config": {"kv_events_config": VLLM_CONFIG}})(request)

    async with serving() as (p, url):
        p.routes["/v1/models"] = reply(MODELS)
        p.routes["/server_info"] = slow_first
        client = VllmHttpClient(url, kv_event_discovery=True)
        try:
            assert "kv_events_config" not in (await client.server_info()).server_args
            assert client.kv_events_report_pending
            info = WorkerInfo.from_replies(pb.GetModelInfoResponse(), await client.server_info())
            assert json.loads(info.kv_events_config) == VLLM_CONFIG and not client.kv_events_report_pending
        finally:
            await client.close()


async def test_a_report_answered_after_the_join_starts_the_feed(empty: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that joined with its report pending is asked again apart from the join; the
    publisher its later answer names becomes its feed."""
    monkeypatch.setattr("gateway.workers.kv_events.LATE_REPORT_WAITS_S", (0.05,) * 40)
    f, port = empty, _free_pair()
    feeder = KvEventFeeder(f.registry, f.router, discover=True)
    feeder.start()
    late = FakeTransport("grpc://127.0.0.1:4")
    late.kv_events_report_pending = True  # type: ignore[attr-defined]
    try:
        await _join(f, late)
        assert feeder.feeds["127.0.0.1:4"].source == "SubscribeKvEvents"  # nothing reported yet
        await asyncio.sleep(0.2)
        late.server_args["kv_events_config"] = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}"})
        late.kv_events_report_pending = False  # type: ignore[attr-defined]
        await _until(lambda: feeder.feeds["127.0.0.1:4"].source == f"tcp://127.0.0.1:{port}")
        feed = feeder.feeds["127.0.0.1:4"]
        assert feed.endpoint_from == "server_info" and f.worker("127.0.0.1:4").kv_events_source == feed.source
    finally:
        await feeder.close()

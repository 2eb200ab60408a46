"""Structured logs: one JSON object per line, the request id shared with the worker, access lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.observability.request_log import ACCESS_LOGGER, JsonFormatter, sane_request_id
from gateway.server.serve import setup_logging
from tests.e2e.http.conftest import Stack


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """Capture everything under the ``gateway`` logger as JSON lines."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gateway")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield buf
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def parse(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def spy_rids(stack: Stack) -> list[str]:
    """Record the request ids the simulated workers receive."""
    seen: list[str] = []
    for sim in stack.fleet.workers:
        original = sim.track

        def track(rid: str, seqs: Any, _orig: Any = original) -> None:
            seen.append(rid)
            _orig(rid, seqs)

        sim.track = track  # type: ignore[method-assign]
    return seen


async def test_access_line_carries_request_id_sent_to_worker(stack: Stack, json_lines: io.StringIO) -> None:
    seen = spy_rids(stack)
    r = await stack.http.post(
        "/v1/chat/completions",
        headers={"x-request-id": "client-trace.42"},
        json={"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "client-trace.42"
    assert r.json()["id"] == "chatcmpl-client-trace.42"
    assert seen == ["client-trace.42"]  # the worker's gRPC request id is the same id
    lines = parse(json_lines)
    access = [x for x in lines if x["logger"] == ACCESS_LOGGER]
    assert len(access) == 1
    a = access[0]
    assert a["request_id"] == "client-trace.42"
    assert a["endpoint"] == "/v1/chat/completions" and a["status"] == 200 and a["method"] == "POST"
    assert a["model"] == stack.model
    assert a["worker"] in {w.id for w in stack.state.registry.all()}
    assert a["prompt_tokens"] > 0 and a["completion_tokens"] > 0 and "cached_tokens" in a
    assert a["latency_ms"] > 0
    assert {"ts", "level", "msg"} <= a.keys()


@pytest.mark.parametrize("incoming", ["has spaces", "quote\"d", "x" * 129, "-leading-dash", ""])
async def test_insane_incoming_ids_are_replaced(stack: Stack, incoming: str) -> None:
    seen = spy_rids(stack)
    r = await stack.http.post(
        "/v1/completions", headers={"x-request-id": incoming},
        json={"model": stack.model, "prompt": "hello", "max_tokens": 2},
    )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert rid != incoming and sane_request_id(rid) == rid
    assert seen == [rid]


async def test_streaming_and_error_requests_are_logged(stack: Stack, json_lines: io.StringIO) -> None:
    stream = await stack.client.completions.create(model=stack.model, prompt="count", max_tokens=4, stream=True)
    async for _ in stream:
        pass
    await stack.http.post("/v1/completions", content=b"{not json")
    lines = parse(json_lines)
    access = [x for x in lines if x["logger"] == ACCESS_LOGGER]
    assert [a["status"] for a in access] == [200, 400]
    assert "ttft_ms" in access[0] and access[0]["completion_tokens"] > 0
    assert "model" not in access[1] and "worker" not in access[1]
    assert len({a["request_id"] for a in access}) == 2


@pytest.mark.stack(workers=2, retry={"max_attempts": 2, "backoff_base_s": 0.0})
async def test_pipeline_log_lines_carry_the_request_id(stack: Stack, json_lines: io.StringIO) -> None:
    stack.fleet.workers[0].faults.reject_status = "UNAVAILABLE"
    stack.fleet.workers[1].faults.reject_status = "UNAVAILABLE"
    r = await stack.http.post(
        "/v1/completions", headers={"x-request-id": "retry-me"},
        json={"model": stack.model, "prompt": "hello", "max_tokens": 2},
    )
    assert r.status_code >= 500 and r.json()["error"]["message"]
    lines = parse(json_lines)
    retry_lines = [x for x in lines if "retrying" in x["msg"]]
    assert retry_lines and all(x["request_id"] == "retry-me" for x in retry_lines)


def test_setup_logging_json_is_one_object_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", as_json=True)
        logging.getLogger("gateway.test").info("hello %s", "world", exc_info=False)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("gateway.test").exception("failed")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["msg"] == "hello world" and lines[0]["level"] == "info"
    assert lines[1]["level"] == "error" and "ValueError: boom" in lines[1]["exc"]


def test_setup_logging_skips_caller_lookups_and_the_line_reads_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    """Neither format prints a record's source, thread or process: the serve process's records
    do not look them up (a frame walk per line), and the text line is what it was."""
    root = logging.getLogger()
    knobs = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")
    saved = root.handlers[:], root.level, {k: getattr(logging, k) for k in knobs}
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    try:
        setup_logging("info", as_json=False)
        root.addHandler(Keep())
        logging.getLogger("gateway.test").info("hello %s", "world")
    finally:
        root.handlers[:], level, old = saved
        root.setLevel(level)
        for k, v in old.items():
            setattr(logging, k, v)
    (record,) = records
    assert (record.funcName, record.lineno, record.threadName, record.processName) == ("(unknown function)", 0, None, None)
    line = capsys.readouterr().err.strip()
    assert line.endswith(" INFO gateway.test: hello world") and "[" not in line


@pytest.mark.slow
async def test_serve_log_json_writes_access_lines(tmp_path: Any) -> None:
    """`token-gateway serve --log-json` as a real process: JSON access lines on stderr."""
    import httpx

    from gateway_lab.bench.serve_process import ServeProcess
    from gateway_lab.sim.config import SimConfig
    from gateway_lab.sim.fleet import SimFleet
    from tests.e2e.http.conftest import ZERO_COST

    async with SimFleet.start(1, SimConfig(**ZERO_COST)) as fleet:
        served = await ServeProcess.start(
            fleet.urls, "round_robin", log_dir=tmp_path,
            extra_args=["--log-json", "--tokenizer-cache-dir", str(tmp_path / "tok")],
        )
        try:
            async with httpx.AsyncClient(base_url=served.url, timeout=30, trust_env=False) as http:
                r = await http.post("/generate", headers={"x-request-id": "proc-1"},
                                    json={"text": "hello", "sampling_params": {"max_new_tokens": 3}})
                assert r.status_code == 200
                assert r.json()["meta_info"]["id"] == "proc-1"
        finally:
            await served.stop()
        records = []
        for line in served.log_path.read_text().splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        served.remove_log()
    access = [x for x in records if x.get("logger") == ACCESS_LOGGER]
    assert len(access) == 1, records
    assert access[0]["request_id"] == "proc-1" and access[0]["endpoint"] == "/generate"
    assert access[0]["status"] == 200 and access[0]["completion_tokens"] > 0

"""GET /metrics: request outcomes, pipeline stages, routing quality, live worker state."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.http.conftest import Stack

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


async def scrape(stack: Stack) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value)]} from the gateway's /metrics."""
    r = await stack.http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items()))


async def test_requests_stages_and_worker_state(stack: Stack) -> None:
    # A system prompt past the size the fast encoder takes whole, so the prompt cache is used.
    messages = [{"role": "system", "content": "You answer in one short line. " * 20},
                {"role": "user", "content": "Say something short."}]
    await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=8, extra_body=NO_THINK)
    stream = await stack.client.chat.completions.create(
        model=stack.model, messages=messages, max_tokens=8, stream=True, extra_body=NO_THINK
    )
    async for _ in stream:
        pass
    bad = await stack.http.post("/v1/chat/completions", json={"model": stack.model, "messages": "nope"})
    assert bad.status_code == 400
    missing = await stack.http.get("/no/such/path")
    assert missing.status_code == 404

    m = await scrape(stack)
    chat = "/v1/chat/completions"
    assert value(m, "token_gateway_requests_total", endpoint=chat, model=stack.model, status="200") == 2
    assert value(m, "token_gateway_requests_total", endpoint=chat, model="none", status="400") == 1
    assert value(m, "token_gateway_requests_total", endpoint="other", status="404") == 1
    assert value(m, "token_gateway_request_duration_seconds_count", endpoint=chat) == 3
    assert value(m, "token_gateway_time_to_first_token_seconds_count", endpoint=chat) == 1
    for stage in ("template", "tokenize", "select", "first_token", "relay"):
        assert value(m, "token_gateway_stage_duration_seconds_count", stage=stage) >= 2, stage
    assert value(m, "token_gateway_policy_decisions_total", policy="round_robin", reason="round_robin") == 2
    assert value(m, "token_gateway_completion_tokens_total", model=stack.model) > 0
    assert value(m, "token_gateway_prompt_tokens_total", model=stack.model) > 0
    assert value(m, "token_gateway_tokenizer_cache_lookups_total", model=stack.model) >= 2
    # Live worker state, read at scrape time: both idle, healthy, breakers closed.
    workers = stack.state.registry.all()
    assert len(m["token_gateway_worker_in_flight"]) == len(workers)
    assert value(m, "token_gateway_worker_in_flight") == 0
    assert value(m, "token_gateway_worker_healthy") == len(workers)
    assert value(m, "token_gateway_worker_breaker_state", state="closed") == len(workers)
    assert value(m, "token_gateway_worker_breaker_state", state="open") == 0
    assert value(m, "token_gateway_worker_dispatched_total") == 2
    assert value(m, "token_gateway_http_requests_in_flight") == 1  # this scrape itself
    # The hooks for admission control exist at zero until it uses them.
    assert value(m, "token_gateway_queue_depth") == 0
    assert value(m, "token_gateway_admission_rejections_total", reason="queue_full") == 0


@pytest.mark.stack(policy="cache_aware", workers=2)
async def test_predicted_and_reported_cached_tokens(stack: Stack) -> None:
    system = "You are a careful assistant. " * 60
    for q in ("first question?", "second question?", "third question?"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=4, extra_body=NO_THINK)
    m = await scrape(stack)
    worker_model = stack.state.registry.all()[0].model
    predicted = value(m, "token_gateway_cached_tokens_predicted_total", model=worker_model)
    reported = value(m, "token_gateway_cached_tokens_reported_total", model=worker_model)
    assert predicted > 0 and reported > 0  # the 2nd and 3rd reuse the system prompt
    assert value(m, "token_gateway_cached_tokens_prediction_error_tokens_count", model=worker_model) == 3
    reasons = {labels["reason"] for labels, v in m["token_gateway_policy_decisions_total"] if v}
    assert reasons and all(labels["policy"] == "cache_aware" for labels, _ in m["token_gateway_policy_decisions_total"])
    # live routing quality per (model, pool): the offered traffic's ideal, achieved, predicted
    pool = {"model": worker_model, "pool": "regular"}
    offered = value(m, "token_gateway_routing_offered_prompt_tokens_total", **pool)
    sent = value(m, "token_gateway_routing_prompt_tokens_total", **pool)
    assert offered > 0 and sent == offered  # three first attempts, three successful streams
    assert value(m, "token_gateway_routing_ideal_cached_tokens_total", **pool) > 0
    assert value(m, "token_gateway_routing_reported_cached_tokens_total", **pool) == reported
    assert value(m, "token_gateway_routing_predicted_cached_tokens_total", **pool) == predicted
    ideal = value(m, "token_gateway_routing_ideal_hit_ratio", **pool)
    achieved = value(m, "token_gateway_routing_achieved_hit_ratio", **pool)
    assert 0 < achieved <= ideal + 0.05 and ideal < 1
    assert value(m, "token_gateway_tokenizer_mismatch_total", **pool) == 0
    assert value(m, "token_gateway_routing_load_only", **pool) == 0
    assert "token_gateway_routing_tree_corrections_total" in m
    assert value(m, "token_gateway_routing_queued_prefill_weight", **pool) == 1.0  # too few requests seen yet
    assert 0 < value(m, "token_gateway_routing_decode_fill", **pool) <= 1.0


@pytest.mark.stack(workers=2, retry={"max_attempts": 3, "backoff_base_s": 0.0})
async def test_retries_and_breaker_state_show(stack: Stack) -> None:
    sick = stack.fleet.workers[0]
    sick.faults.reject_status = "UNAVAILABLE"
    sick_id = next(w.id for w in stack.state.registry.all() if w.url == sick.url)
    for _ in range(6):
        r = await stack.client.completions.create(model=stack.model, prompt="hello there", max_tokens=3)
        assert r.choices[0].text is not None
    m = await scrape(stack)
    assert value(m, "token_gateway_retries_total", worker=sick_id, code="UNAVAILABLE") >= 1
    assert value(m, "token_gateway_worker_streams_total", outcome="ok") == 6
    assert value(m, "token_gateway_worker_breaker_state", worker=sick_id, state="open") == 1
    assert value(m, "token_gateway_worker_available", worker=sick_id) == 0
    assert value(m, "token_gateway_worker_breaker_consecutive_failures", worker=sick_id) >= 3
    assert value(m, "token_gateway_worker_in_flight") == 0


@pytest.mark.stack(server={"api_keys": ["sk-very-secret-key"]})
async def test_no_secrets_or_client_strings_in_labels(stack: Stack) -> None:
    headers = {"authorization": "Bearer sk-very-secret-key", "x-request-id": "trace-id-4242"}
    await stack.http.post("/v1/completions", headers=headers, json={"model": "made-up-model-7", "prompt": "x", "max_tokens": 2})
    await stack.http.post("/v1/completions", headers=headers, json={"model": stack.model, "prompt": "top secret prompt", "max_tokens": 2})
    await stack.http.post("/v1/completions", json={"model": stack.model, "prompt": "x"})  # 401
    text = (await stack.http.get("/metrics")).text
    for secret in ("sk-very-secret-key", "trace-id-4242", "made-up-model-7", "top secret prompt"):
        assert secret not in text
    assert 'status="401"' in text


async def test_each_gateway_has_its_own_registry(stack: Stack) -> None:
    assert stack.state.metrics.registry is not REGISTRY
    stack.state.metrics.admission_rejections.labels(reason="queue_timeout").inc()
    m = await scrape(stack)
    assert value(m, "token_gateway_queue_depth") == 0  # read from this gateway's admission queue
    assert value(m, "token_gateway_admission_rejections_total", reason="queue_timeout") == 1
    assert "token_gateway_queue_depth" not in REGISTRY._names_to_collectors  # nothing leaked globally


async def test_worker_series_follow_the_registry() -> None:
    """Scrape-time collection: a worker that leaves takes its series with it."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.observability.collector import WorkerCollector
    from gateway.workers.client import WorkerClient
    from gateway.workers.worker import Worker, WorkerInfo

    workers = [
        Worker(url, WorkerClient(url), WorkerInfo(model="m"))
        for url in ("grpc://127.0.0.1:1", "grpc://127.0.0.1:2")
    ]
    registry = CollectorRegistry()
    registry.register(WorkerCollector(lambda: list(workers)))
    workers[0].load.acquire(10, 5)
    text = generate_latest(registry).decode()
    assert 'token_gateway_worker_in_flight{model="m",role="regular",worker="127.0.0.1:1"} 1.0' in text
    assert 'worker="127.0.0.1:2"' in text
    gone = workers.pop()
    assert 'worker="127.0.0.1:2"' not in generate_latest(registry).decode()
    for w in [*workers, gone]:
        await w.client.close()


async def test_generation_timings_by_model_and_worker(stack: Stack) -> None:
    """TTFT, time per output token, inter-token latency and e2e, labelled by model and worker."""
    stream = await stack.client.completions.create(
        model=stack.model, prompt="count with me", max_tokens=6, stream=True, extra_body={"ignore_eos": True}
    )
    async for _ in stream:
        pass
    m = await scrape(stack)
    workers = {w.id for w in stack.state.registry.all()}
    for name in ("token_gateway_worker_time_to_first_token_seconds", "token_gateway_e2e_request_latency_seconds",
                 "token_gateway_time_per_output_token_seconds"):
        rows = [(labels, v) for labels, v in m[name + "_count"] if v]
        assert len(rows) == 1, name
        assert rows[0][0]["model"] == stack.model and rows[0][0]["worker"] in workers
    itl = value(m, "token_gateway_inter_token_latency_seconds_count", model=stack.model)
    assert 1 <= itl <= 5  # one per token message after the first (6 tokens)
    ttft = value(m, "token_gateway_worker_time_to_first_token_seconds_sum")
    e2e = value(m, "token_gateway_e2e_request_latency_seconds_sum")
    assert 0 < ttft <= e2e


def test_observe_many_matches_observe() -> None:
    from gateway.observability.metrics import GatewayMetrics, observe_many

    m = GatewayMetrics()
    values = [0.0001, 0.0005, 0.001, 0.0049, 0.2, 0.2000001, 3.0, 99.0] * 3
    observe_many(m.itl.labels(model="a", worker="w"), values)
    one = m.itl.labels(model="b", worker="w")
    for v in values:
        one.observe(v)
    got: dict[str, dict[str, float]] = {"a": {}, "b": {}}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            if s.name.startswith("token_gateway_inter_token_latency_seconds") and not s.name.endswith("_created"):
                got[s.labels["model"]][s.name + s.labels.get("le", "")] = s.value
    assert got["a"].keys() == got["b"].keys()
    for key, v in got["b"].items():
        assert got["a"][key] == pytest.approx(v)

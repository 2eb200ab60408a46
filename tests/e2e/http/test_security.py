"""Security: inference vs admin keys, the start-up guard, operator limits, TLS to workers, no secrets in logs."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.security import InsecureAdminError, SecurityConfig, check_startup, is_loopback
from gateway.server.state import GatewayState
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.worker import SimTls
from tests.e2e.http.certs import make_pki
from tests.e2e.http.conftest import ZERO_COST, Stack, StackOptions, start_stack

KEYS = {"api_keys": ["inference-key"]}
ADMIN = {"security": {"admin_api_key": "admin-key"}}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# ---------------------------------------------------------------- keys


@pytest.mark.stack(workers=1, server=KEYS, sections=ADMIN)
async def test_inference_keys(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": "hi", "max_tokens": 1}
    for headers in ({}, bearer("wrong"), {"authorization": "Basic inference-key"}, {"authorization": "Bearer"}):
        resp = await stack.http.post("/v1/completions", json=body, headers=headers)
        assert resp.status_code == 401, headers
        assert resp.json()["error"]["type"] == "authentication_error"
    assert (await stack.http.post("/v1/completions", json=body, headers=bearer("inference-key"))).status_code == 200
    # The admin key may also do inference.
    assert (await stack.http.post("/v1/completions", json=body, headers=bearer("admin-key"))).status_code == 200
    # And the official client with the right key just works.
    done = await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=1)
    assert done.choices
    wrong = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.completions.create(model=stack.model, prompt="hi", max_tokens=1)
    await wrong.close()


@pytest.mark.stack(workers=1, server=KEYS, sections=ADMIN)
async def test_admin_endpoints_need_the_admin_key(stack: Stack) -> None:
    url = stack.fleet.urls[0]
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", "/workers", {"url": url}),
        ("DELETE", "/workers/127.0.0.1:1", None),
        ("POST", "/flush_cache", None),
    ]
    for method, path, body in calls:
        missing = await stack.http.request(method, path, json=body)
        assert missing.status_code == 401, path
        inference = await stack.http.request(method, path, json=body, headers=bearer("inference-key"))
        assert inference.status_code == 403, path
        assert inference.json()["error"]["type"] == "permission_error"
    ok = await stack.http.post("/workers", json={"url": url}, headers=bearer("admin-key"))
    assert ok.status_code == 200 and ok.json()["created"] is False
    # Read-only views name hosts and ports: the admin key only, as on the gRPC door.
    for path in ("/workers", "/get_loads", f"/workers/{stack.state.registry.all()[0].id}"):
        assert (await stack.http.get(path)).status_code == 401, path
        assert (await stack.http.get(path, headers=bearer("inference-key"))).status_code == 403, path
        assert (await stack.http.get(path, headers=bearer("admin-key"))).status_code == 200, path
    # Health probes stay open for load balancers.
    assert (await stack.http.get("/health")).status_code == 200


def test_startup_guard_for_unauthenticated_admin() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    check_startup("127.0.0.1", SecurityConfig())
    check_startup("0.0.0.0", SecurityConfig(admin_api_key="k"))
    check_startup("0.0.0.0", SecurityConfig(allow_unauthenticated_admin=True))
    with pytest.raises(InsecureAdminError, match="--admin-api-key"):
        check_startup("0.0.0.0", SecurityConfig())


def test_serve_refuses_to_start_open_on_a_public_address() -> None:
    argv = [sys.executable, "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", "0", "--worker-urls", "grpc://127.0.0.1:1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--allow-unauthenticated-admin" in done.stderr


# ---------------------------------------------------------------- limits

LIMITS = {"limits": {"max_prompt_tokens": 300, "max_tokens_cap": 20, "max_n": 2, "max_stop_sequences": 2, "max_tool_schema_bytes": 400}}


def _tool(size: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "description": "x" * size, "parameters": {"type": "object"}}}


LIMIT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {"prompt": "word " * 600, "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 21}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 3}, "n"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "stop": ["a", "b", "c"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [_tool(1000)]}, "tools"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 21}}, "max_tokens"),
]


async def test_operator_limits_are_400s(tmp_path: Path) -> None:
    async with start_stack(StackOptions(workers=1, sections=LIMITS), tmp_path) as stack:
        for path, body, param in LIMIT_CASES:
            resp = await stack.http.post(path, json={"model": stack.model, **body})
            assert resp.status_code == 400, (path, body, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == param, err
        # Within the limits all is well, and an unset max_tokens gets the cap.
        resp = await stack.http.post(
            "/v1/chat/completions",
            json={"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "tools": [_tool(10)], "ignore_eos": True},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 20
        assert (await stack.http.get("/health")).status_code == 200


@pytest.mark.stack(workers=1, sections=ADMIN)
async def test_only_worker_urls_of_known_schemes(stack: Stack) -> None:
    for url in ("ftp://127.0.0.1:1", "127.0.0.1:1", "grpc://127.0.0.1", "file:///etc/passwd", "grpc://u:p@127.0.0.1:1"):
        resp = await stack.http.post("/workers", json={"url": url}, headers=bearer("admin-key"))
        assert resp.status_code == 400, url
        assert resp.json()["error"]["param"] == "url"


# ---------------------------------------------------------------- TLS to workers


def _config(urls: list[str], tmp_path: Path, **security: Any) -> GatewayConfig:
    config = GatewayConfig(server=ServerConfig(worker_urls=urls, tokenizer_cache_dir=str(tmp_path / "tok"), probe_timeout_s=5))
    for k, v in security.items():
        setattr(config.security, k, v)
    return config


async def test_grpcs_to_a_tls_worker(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = SimTls(pki.server.cert, pki.server.key)
    async with SimFleet.start(1, SimConfig(**ZERO_COST), tls=tls) as fleet:
        assert fleet.urls[0].startswith("grpcs://")
        state = GatewayState(_config(fleet.urls, tmp_path, worker_tls_ca_file=pki.ca_file))
        await state.start()
        try:
            entry = state.catalog.get(None)
            prepared = state.engine.prepare(entry, entry.tokenizer.encode("hello", False), _sampling(), stream=False)
            gen = await state.engine.start(prepared)
            async for _ in gen.deltas():
                pass
            assert fleet.workers[0].counters.requests == 1
        finally:
            await state.stop()
        # Without the CA the worker's certificate is not trusted: registration fails (a
        # warning, the worker stays pending and /readiness says so; it is retried).
        untrusting = GatewayState(_config(fleet.urls, tmp_path))
        await untrusting.start()
        assert untrusting.registry.all() == [] and [p["url"] for p in untrusting.late.describe()] == fleet.urls
        await untrusting.stop()
        # Plain grpc:// to a TLS port fails too (no silent downgrade).
        plain = GatewayState(_config([fleet.urls[0].replace("grpcs://", "grpc://")], tmp_path))
        await plain.start()
        assert plain.registry.all() == [] and len(plain.late.describe()) == 1
        await plain.stop()


async def test_mutual_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = SimTls(pki.server.cert, pki.server.key, client_ca=pki.ca.cert)
    async with SimFleet.start(1, SimConfig(**ZERO_COST), tls=tls) as fleet:
        state = GatewayState(_config(
            fleet.urls, tmp_path, worker_tls_ca_file=pki.ca_file,
            worker_tls_cert_file=pki.client_cert_file, worker_tls_key_file=pki.client_key_file,
        ))
        await state.start()
        assert [w.healthy for w in state.registry.all()] == [True]
        await state.stop()
        no_client_cert = GatewayState(_config(fleet.urls, tmp_path, worker_tls_ca_file=pki.ca_file))
        await no_client_cert.start()  # refused by the worker: pending, retried, never registered
        assert no_client_cert.registry.all() == [] and len(no_client_cert.late.describe()) == 1
        await no_client_cert.stop()


def test_cert_without_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="go together"):
        SecurityConfig(worker_tls_cert_file="c.pem").tls()


def _sampling() -> Any:
    from gateway.protocol.sampling import SamplingOptions

    return SamplingOptions(max_new_tokens=3, temperature=0.0)


# ---------------------------------------------------------------- secrets stay out of logs


@pytest.mark.stack(workers=2, server={**KEYS, "worker_api_key": "worker-secret"}, sections=ADMIN)
async def test_no_secrets_in_logs_or_answers(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = stack.fleet.urls[1]
    worker_id = stack.state.registry.get(url).id  # type: ignore[union-attr]
    removed = await stack.http.delete(f"/workers/{worker_id}", headers=bearer("admin-key"))
    assert removed.status_code == 200
    added = await stack.http.post("/workers", json={"url": url, "api_key": "per-worker-secret"}, headers=bearer("admin-key"))
    assert added.status_code == 201, added.text
    await stack.http.post("/v1/completions", json={"model": stack.model, "prompt": "hi"}, headers=bearer("wrong-key"))
    await stack.http.post("/workers", json={"url": url}, headers=bearer("inference-key"))
    listing = await stack.http.get("/workers", headers=bearer("admin-key"))
    everything = caplog.text + added.text + listing.text + removed.text
    for secret in ("inference-key", "admin-key", "worker-secret", "per-worker-secret", "wrong-key"):
        assert secret not in everything, secret

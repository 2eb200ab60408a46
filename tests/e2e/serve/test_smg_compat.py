"""`smg launch` command lines start token-gateway.

The command lines below are SMG's own examples, from the SMG repository's docs
(lightseekorg/smg, ``docs/reference/configuration.md`` "Configuration Examples" and
``docs/getting-started/load-balancing.md`` "Cache-Aware"), with the worker URLs
replaced by simulated gRPC workers (SMG's docs give ``grpc://`` URLs for gRPC mode).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

from gateway.cli import build_parser
from gateway.server.serve import config_from_args
from gateway.server.smg_compat import map_value, warn_ignored
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from tests.e2e.http.conftest import ZERO_COST

W = ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]

HIGH_THROUGHPUT = ["--worker-urls", *W, "--policy", "cache_aware", "--max-concurrent-requests", "200",
                   "--queue-size", "400", "--queue-timeout-secs", "60", "--retry-max-retries", "3"]
LOW_LATENCY = ["--worker-urls", *W, "--policy", "power_of_two", "--max-concurrent-requests", "50",
               "--queue-size", "25", "--queue-timeout-secs", "5", "--health-check-interval-secs", "5",
               "--request-timeout-secs", "30"]
CACHE_AWARE = ["--policy", "cache_aware", "--worker-urls", *W, "--cache-threshold", "0.3",
               "--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5"]
PD = ["--pd-disaggregation", "--prefill", "grpc://127.0.0.1:3", "9001", "--prefill", "grpc://127.0.0.1:4", "9002",
      "--decode", "grpc://127.0.0.1:5", "--decode", "grpc://127.0.0.1:6",
      "--prefill-policy", "cache_aware", "--decode-policy", "round_robin"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TOKEN_GATEWAY_"):
            monkeypatch.delenv(key)


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_high_throughput_example() -> None:
    c = config_from_args(_parse(HIGH_THROUGHPUT))
    assert c.server.worker_urls == W
    assert c.admission.max_concurrent_requests == 200
    assert c.admission.max_queued_requests == 400
    assert c.admission.queue_timeout_s == 60
    assert c.retry.max_attempts == 4  # 3 retries + the first attempt


def test_low_latency_example() -> None:
    c = config_from_args(_parse(LOW_LATENCY))
    assert c.policy.policy == "power_of_two"
    assert c.health.health_check_interval_s == 5
    assert c.dispatch.request_timeout_s == 30


def test_kubernetes_service_discovery_example() -> None:
    c = config_from_args(_parse(["--service-discovery", "--selector", "app=sglang-worker",
                                 "--service-discovery-namespace", "inference", "--service-discovery-port", "8000",
                                 "--policy", "cache_aware", "--prefill-selector", "role=prefill"]))
    d = c.discovery
    assert d.k8s_discovery and d.k8s_selector == ["app=sglang-worker"] and d.k8s_prefill_selector == ["role=prefill"]
    assert (d.k8s_namespace, d.k8s_port) == ("inference", 8000)


def test_cache_aware_tuning_flags_are_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    args = _parse(CACHE_AWARE)
    c = config_from_args(args)
    assert c.policy.policy == "cache_aware"
    lines = warn_ignored(args)
    assert [line.split()[0] for line in lines] == ["--cache-threshold", "--balance-abs-threshold", "--balance-rel-threshold"]
    assert all("--prefill-weight" in line for line in lines)


def test_pd_example_with_none_bootstrap_port() -> None:
    c = config_from_args(_parse(PD))
    assert [(s.url, s.bootstrap_port) for s in c.pd.prefill] == [("grpc://127.0.0.1:3", 9001), ("grpc://127.0.0.1:4", 9002)]
    assert [s.url for s in c.pd.decode] == ["grpc://127.0.0.1:5", "grpc://127.0.0.1:6"]
    assert (c.pd.prefill_policy, c.pd.decode_policy) == ("cache_aware", "round_robin")
    c = config_from_args(_parse(["--prefill", "grpc://127.0.0.1:3", "none", "--decode", "grpc://127.0.0.1:5"]))
    assert c.pd.prefill[0].bootstrap_port is None


@pytest.mark.parametrize(("smg", "ours"), [
    ("consistent_hashing", "consistent_hash"), ("manual", "consistent_hash"), ("cache_aware", "cache_aware"),
    ("round_robin", "round_robin"), ("random", "random"), ("power_of_two", "power_of_two"),
])
def test_policy_names(smg: str, ours: str) -> None:
    assert config_from_args(_parse(["--policy", smg])).policy.policy == ours
    assert config_from_args(_parse(["--decode-policy", smg])).pd.decode_policy == ours


def test_refused_policy_names_our_equivalent(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["--policy", "bucket"])
    assert "least_load" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "check"), [
    (["--log-level", "warn"], lambda c: c.server.log_level == "warning"),
    (["--api-key", "wk"], lambda c: c.server.worker_api_key == "wk"),
    (["--eviction-interval", "120"], lambda c: c.policy.eviction_interval_s == 120.0),
    (["--max-tree-size", "67108864"], lambda c: c.policy.tree_max_tokens == 67108864),
    (["--cb-failure-threshold", "10"], lambda c: c.health.breaker_failure_threshold == 10),
    (["--cb-timeout-duration-secs", "60"], lambda c: c.health.breaker_cooldown_s == 60.0),
    (["--cb-success-threshold", "4"], lambda c: c.health.breaker_half_open_probes == 4),
    (["--cb-window-duration-secs", "20"], lambda c: c.health.breaker_window_s == 20.0),
    (["--retry-initial-backoff-ms", "50", "--retry-max-backoff-ms", "30000"],
     lambda c: (c.retry.backoff_base_s, c.retry.backoff_max_s) == (0.05, 30.0)),
    (["--disable-retries"], lambda c: c.retry.max_attempts == 1),
    (["--disable-health-check"], lambda c: c.health.health_check_interval_s == 0.0),
    (["--max-concurrent-requests", "-1"], lambda c: c.admission.max_concurrent_requests == 0),
    (["--max-payload-size", "1000"], lambda c: c.server.max_body_bytes == 1000),
    (["--shutdown-grace-period-secs", "180"], lambda c: c.server.shutdown_grace_s == 180.0),
    (["--prefix-token-count", "128"], lambda c: c.policy.hash_depth_tokens == 128),
    (["--tokenizer-path", "/tok"], lambda c: c.server.tokenizer_path == "/tok"),
    (["--model-path", "/models/llama"], lambda c: c.server.tokenizer_path == "/models/llama"),
    (["--host", "127.0.0.2", "--port", "8080"], lambda c: (c.server.host, c.server.port) == ("127.0.0.2", 8080)),
    (["--ca-cert-paths", "/ca.pem", "--client-cert-path", "/c.pem", "--client-key-path", "/k.pem"],
     lambda c: (c.security.worker_tls_ca_file, c.security.worker_tls_cert_file) == ("/ca.pem", "/c.pem")),
    (["--backend", "vllm"], lambda c: c.server.backend == "vllm"),  # our own flag: the engine named for the workers
    (["--backend", "openai"], lambda c: c.server.backend == "openai"),
])
def test_aliases(argv: list[str], check: object) -> None:
    assert check(config_from_args(_parse(argv)))  # type: ignore[operator]


@pytest.mark.parametrize(("argv", "hint"), [
    (["--enable-mesh"], "--sync-url"),
    (["--control-plane-api-keys", "k:a:admin:s"], "--admin-api-key"),
    (["--jwt-issuer", "https://x"], "--api-keys"),
    (["--log-dir", "/var/log"], "stderr"),
    (["--backend", "mlx"], "invalid choice"),
])
def test_refused_flags_name_our_equivalent(argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(argv)
    assert hint in capsys.readouterr().err


def test_explicit_target_beats_a_switch() -> None:
    c = config_from_args(_parse(["--max-attempts", "5", "--disable-retries"]))
    assert c.retry.max_attempts == 1  # the switch came later: it is just a flag
    c = config_from_args(_parse(["--disable-health-check", "--health-check-interval-s", "9"]))
    assert c.health.health_check_interval_s == 9


def test_env_takes_smg_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_GATEWAY_POLICY", "consistent_hashing")
    monkeypatch.setenv("TOKEN_GATEWAY_LOG_LEVEL", "warn")
    c = config_from_args(_parse([]))
    assert (c.policy.policy, c.server.log_level) == ("consistent_hash", "warning")
    assert map_value("policy", "manual") == "consistent_hash"


def test_smg_flags_stay_out_of_help() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    assert "--cache-threshold" not in text and "--queue-size" not in text


@pytest.mark.slow
async def test_gateway_starts_from_an_smg_command_line(tmp_path: Path) -> None:
    """SMG's cache-aware example, as a real process, serving a request."""
    async with SimFleet.start(2, SimConfig(**ZERO_COST)) as fleet:
        argv = [a for a in CACHE_AWARE if a not in W]
        argv[argv.index("--worker-urls") + 1:argv.index("--worker-urls") + 1] = fleet.urls
        argv += ["--host", "127.0.0.1", "--port", "0", "--log-level", "warn",
                 "--tokenizer-cache-dir", str(tmp_path / "tok")]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", *argv,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                line = await proc.stdout.readline()  # type: ignore[union-attr]
            assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            ready = json.loads(line)
            assert ready["workers"] == 2 and ready["policy"] == "cache_aware"
            async with httpx.AsyncClient(base_url=ready["url"], timeout=30) as http:
                model = (await http.get("/v1/models")).json()["data"][0]["id"]
                done = await http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
                assert done.status_code == 200, done.text
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    await proc.wait()
        stderr = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        assert "--cache-threshold has no effect" in stderr
        assert proc.returncode == 0


def test_every_smg_flag_is_documented() -> None:
    from gateway.server.smg_compat import ALIASES

    text = (Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    missing = [a.flag for a in ALIASES if f"`{a.flag}`" not in text]
    assert not missing, missing
